"""The issue-44 checks of scripts/gpu_check.sh, over the logs and runs that
scripts/gpu_check_jobs.sh left in the work dir: one line per check, exit 1 if
any failed. Reads runs with diagnose.load only (the device image has no mlflow
or plotly)."""

import re
import sys

import diagnose

T = sys.argv[1]
failed = []


def check(name, ok, detail=""):
    print(f"gpu_check: {'ok  ' if ok else 'FAIL'} {name} {detail}")
    if not ok:
        failed.append(name)


def log(name):
    try:
        return open(f"{T}/{name}", encoding="utf-8", errors="replace").read()
    except OSError:
        return ""


def field(text, key):
    m = re.search(rf"^{key} (.*)$", text, re.M)
    return m.group(1).strip() if m else None


def same_job(job):
    """The job's result and exit code, plain vs under diagnose."""
    plain, under = log(f"{job}.plain.log"), log(f"{job}.diag.log")
    got = (field(plain, "RESULT"), field(plain, "EXIT")), (field(under, "RESULT"), field(under, "EXIT"))
    check(
        f"{job}: result and exit code unchanged by diagnose",
        got[0] == got[1] and got[0][1] == "0" and got[0][0] is not None,
        f"(plain {got[0]}, under diagnose {got[1]})",
    )
    return got[0] == got[1]


def device_rows(run):
    ev = run.events()
    return ev[ev["detail"].astype(str).isin(["gpu", "gpu:wait", "gpu:nccl"])]


if same_job("coalesced"):  # B1
    try:
        run = diagnose.load(f"{T}/coalesced", warn=lambda m: None)
        calls = run.collectives()
        names = sorted(set(calls["name"].astype(str)))
        seqs = sorted(set(calls["seq"].astype(int)))
        group_seq = int(field(log("coalesced.plain.log"), "GROUP_SEQ") or -1)
        check(
            "B1 coalesced: one row per coalesced group",
            len(calls) == 8 and names == ["all_gather_into_tensor_coalesced", "all_reduce_coalesced"],
            f"({len(calls)} rows, {names})",
        )
        check(
            "B1 coalesced: sequence numbers are the group's own counter",
            seqs == list(range(1, group_seq + 1)),
            f"(recorded {seqs}, the group counted {group_seq})",
        )
        check("B1 coalesced: device rows", len(device_rows(run)) > 0, f"({len(device_rows(run))})")
    except Exception as exc:
        check("B1 coalesced: load", False, repr(exc))

if same_job("graph"):  # B3
    try:
        run = diagnose.load(f"{T}/graph", warn=lambda m: None)
        ev = run.events()
        replays = ev[ev["name"].astype(str) == "gpu:graph_replay"]
        check("B3 graph: every replay is a span", len(replays) == 20, f"({len(replays)} gpu:graph_replay rows)")
        errors = [e for m in run.rank_meta.values() for e in m.get("collector_errors", [])]
        check("B3 graph: no collector error", not errors, str(errors[:2]))
    except Exception as exc:
        check("B3 graph: load", False, repr(exc))

if field(log("two_devices.plain.log"), "RESULT") == "one-device":  # W1
    print("gpu_check: skip W1 two devices: one GPU visible")
elif same_job("two_devices"):
    try:
        run = diagnose.load(f"{T}/two_devices", warn=lambda m: None)
        anchors = run.rank_meta[0].get("gpu", {}).get("clock_anchors", [])
        check(
            "W1 two devices: device rows from cuda:1's own anchor",
            len(device_rows(run)) >= 12 and any(a.get("device") == 1 for a in anchors),
            f"({len(device_rows(run))} rows, anchors {anchors[:3]})",
        )
    except Exception as exc:
        check("W1 two devices: load", False, repr(exc))

steps = {t: field(log(f"nccl_timing.{t}.log"), "STEP_MS") for t in "01"}  # W7
if None in steps.values():
    check("W7 NCCL timing: both runs", False, str(steps))
else:
    off, on = (float(steps[t].split()[0]) for t in "01")
    print(
        f"gpu_check: info W7 TORCH_NCCL_ENABLE_TIMING: step {off:.3f} ms off, {on:.3f} ms on ({on / off:.3f}x; "
        "one rank: the all-reduce is a local copy)"
    )

launches = re.findall(r"^LAUNCHES (.*)$", log("one_rank.log"), re.M)
check("one rank: what each call launches", len(launches) == 5, "")
for line in launches:
    print(f"gpu_check: info {line}")
sys.exit(1 if failed else 0)
