#!/usr/bin/env bash
# GPU checks for issue 7, on a machine with one NVIDIA GPU (run from the repo root):
#   1. a single-rank NCCL run of the reference trainer under `diagnose run
#      --torch-profiler 3-4`: profiler kernels imported, temporal breakdown,
#      NVML samples, CUDA-event spans, sync-debug events;
#   2. a 1-rank NCCL script of sync and async all-reduces under
#      `--torch-profiler 3-4`: their device rows (CUDA events,
#      collective_events.py) and the clock anchors; (a) in steps 3-4 each
#      device row agrees with the profiler's NCCL kernel of the same call
#      within the mapping bound (the largest anchor residual + 50 us);
#   4. (b) the cuda*Synchronize calls of the training thread in a profiler
#      window of a 1-rank DDP script: the same count with and without
#      `diagnose run` (device events add no host sync);
#      a 2-rank gloo run on CUDA tensors (both ranks on GPU 0): collectives
#      matched, no device rows (gloo's work is the host's), NVML on both ranks;
#      the collectives' sequence numbers are the NCCL group's own (1..N); the
#      GPU's GEMM kernel names are in kernel_precision.py's table;
#      the reference trainer with the unpinned_copies fault in a profiler window:
#      copy_stall names pageable host-device copies on the critical path;
#   3. with nsys on PATH: `diagnose run --nsys`, export, import.
# Issue 44 (the job is never broken, figures right on GPUs), each plain and under
# `diagnose run`, the job's printed result and exit code compared:
#   B1  coalesced.py: async all_reduces and a sync all_gather_into_tensor inside
#       _coalescing_manager on a 1-rank NCCL group; one row per coalesced group,
#       and its sequence numbers are the group's own counter (one per group);
#   B3  graph.py: a forward/backward captured with torch.cuda.graph (global mode)
#       while the event poller runs every 1 ms, replayed 20 times: the capture
#       stays valid, 20 gpu:graph_replay spans;
#   W1  two_devices.py, where two GPUs are visible: all_reduces on cuda:1 while
#       the current device is 0 get device rows and a device-1 anchor; with one
#       GPU a line says it was not checked;
#   W7  nccl_timing.py: step time of compute overlapped with an async all_reduce,
#       TORCH_NCCL_ENABLE_TIMING=0 vs 1 (printed; one rank's NCCL kernel is a local
#       copy, so the overlap cost reported on multi-GPU jobs cannot show here);
#   one_rank.py: which kernels a 1-rank group launches for all_reduce(AVG),
#       out-of-place all_gather, all_gather_into_tensor, reduce_scatter_tensor
#       (printed: a 1-rank group may launch no NCCL kernel, which bounds what the
#       device-row checks above can show on one GPU).
# One GPU cannot host two NCCL ranks ("Duplicate GPU detected"): everything
# between ranks (stragglers, matching across ranks, p2p) is the CPU suite's.
# `--preflight` (and any machine without CUDA): writes every script, compiles
# it, checks the CLI answers, lists the checks and exits 0, running nothing.
# Prints one line per check and exits non-zero if any failed.
# Runs where only torch, pyarrow, pandas, numpy, typer, rich and nvidia-ml-py are
# installed (no mlflow, plotly, nvtx, msgspec, orjson): runs use --no-analyze and
# the checks read the runs with diagnose.load; PYTHON picks the interpreter
# (default: .venv/bin/python, else python3).
set -u
cd "$(dirname "$0")/.."
if [ -x .venv/bin/python ]; then PY=${PYTHON:-.venv/bin/python}; else PY=${PYTHON:-python3}; fi
DIAG=("$PY" -m diagnose)
T=$(mktemp -d /tmp/gpu_check.XXXXXX)
export OMP_NUM_THREADS=1 DIAGNOSE_NVML_INTERVAL_S=0.2
fail=0
echo "gpu_check: work dir $T"
PREFLIGHT=0
[ "${1:-}" = "--preflight" ] && PREFLIGHT=1
. scripts/gpu_check_jobs.sh   # the issue-44 job scripts, written into $T
if [ "$PREFLIGHT" = 0 ] && ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_check: no CUDA here: preflight only"; PREFLIGHT=1
fi

cat > "$T/gloo_cuda.py" <<'PYEOF'
import os, torch, torch.distributed as dist
dist.init_process_group("gloo")
torch.cuda.set_device(0)
model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 512)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
for step in range(8):
    loss = model(torch.randn(64, 512, device="cuda")).square().mean()
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
    opt.step(); opt.zero_grad()
    print("loss", loss.item()) if dist.get_rank() == 0 else None
dist.destroy_process_group()
PYEOF
cat > "$T/nccl_calls.py" <<'PYEOF'
import torch, torch.distributed as dist
dist.init_process_group("nccl")
torch.cuda.set_device(0)
model = torch.nn.Linear(4096, 4096, bias=False).cuda()
opt = torch.optim.SGD(model.parameters(), lr=1e-6)
x = torch.randn(4096, 4096, device="cuda")
for step in range(8):
    y = model(x)                                # compute queued ahead of the collectives
    y.sum().backward()
    y = y.detach()
    dist.all_reduce(y)                          # synchronous: device rows "gpu"
    work = dist.all_reduce(y, async_op=True)    # async, waited at once: "gpu:nccl" (NCCL timing) or "gpu:wait"
    work.wait()
    opt.step(); opt.zero_grad()
print("done", float(y.sum()))
print("GROUP_SEQ", dist.group.WORLD._get_sequence_number_for_group())  # 16: NCCL's own count
dist.destroy_process_group()
PYEOF
cat > "$T/sync_count.py" <<'PYEOF'
import json, threading, torch, torch.distributed as dist
from torch.profiler import ProfilerActivity, profile
dist.init_process_group("nccl")
torch.cuda.set_device(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2048, 2048).cuda())
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(256, 2048, device="cuda")
def step():
    loss = model(x).square().mean()
    loss.backward()
    opt.step(); opt.zero_grad()
    return loss.item()                          # the job's own sync, one per step
for _ in range(5):
    step()
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    for _ in range(5):
        step()
main = threading.get_native_id()
syncs = [e for e in prof.events() if "Synchronize" in e.name]
print("SYNCS " + json.dumps({"main": sum(e.thread == main for e in syncs), "all": len(syncs),
                             "names": sorted({e.name for e in syncs})}))
dist.destroy_process_group()
PYEOF
if [ "$PREFLIGHT" = 1 ]; then
    for f in "$T"/*.py; do
        "$PY" -m py_compile "$f" && echo "gpu_check: preflight ok   $(basename "$f") compiles" \
            || { echo "gpu_check: preflight FAIL $(basename "$f")"; fail=1; }
    done
    "${DIAG[@]}" run --help > /dev/null 2>&1 && echo "gpu_check: preflight ok   diagnose run answers" \
        || { echo "gpu_check: preflight FAIL diagnose run --help"; fail=1; }
    sed -n 's/^#   \([A-Z0-9]*[0-9]\) *\([a-z_]*\.py\)[:,].*/gpu_check: would check \1 (\2)/p' "$0"
    rm -rf "$T"
    exit "$fail"
fi
echo "gpu_check: device $("$PY" -c 'import torch; print(torch.cuda.get_device_name(0), "torch", torch.__version__)')"

"${DIAG[@]}" run --out "$T/nccl" --torch-profiler 3-4 --no-analyze -- \
    "$PY" -m torch.distributed.run --standalone --nproc-per-node 1 -m reference_trainer --steps 8 \
    > "$T/nccl.log" 2>&1 || { echo "gpu_check: FAIL nccl run (see $T/nccl.log)"; fail=1; }

"${DIAG[@]}" run --out "$T/copies" --torch-profiler 3-4 --no-analyze -- \
    "$PY" -m torch.distributed.run --standalone --nproc-per-node 1 -m reference_trainer --steps 6 \
    --fault unpinned_copies:mb=256 > "$T/copies.log" 2>&1 || { echo "gpu_check: FAIL copies run (see $T/copies.log)"; fail=1; }

run_issue44_jobs   # scripts/gpu_check_jobs.sh

"$PY" -m torch.distributed.run --standalone --nproc-per-node 1 "$T/sync_count.py" \
    > "$T/sync_plain.log" 2>&1 || { echo "gpu_check: FAIL sync count, plain (see $T/sync_plain.log)"; fail=1; }
"${DIAG[@]}" run --out "$T/sync_count" --no-analyze -- \
    "$PY" -m torch.distributed.run --standalone --nproc-per-node 1 "$T/sync_count.py" \
    > "$T/sync_diag.log" 2>&1 || { echo "gpu_check: FAIL sync count, under diagnose (see $T/sync_diag.log)"; fail=1; }
"${DIAG[@]}" run --out "$T/nccl_calls" --torch-profiler 3-4 --no-analyze -- \
    "$PY" -m torch.distributed.run --standalone --nproc-per-node 1 "$T/nccl_calls.py" \
    > "$T/nccl_calls.log" 2>&1 || { echo "gpu_check: FAIL nccl calls run (see $T/nccl_calls.log)"; fail=1; }

"${DIAG[@]}" run --out "$T/gloo" --no-analyze -- \
    "$PY" -m torch.distributed.run --standalone --nproc-per-node 2 "$T/gloo_cuda.py" \
    > "$T/gloo.log" 2>&1 || { echo "gpu_check: FAIL gloo-on-CUDA run (see $T/gloo.log)"; fail=1; }

"$PY" - "$T" <<'PYEOF' || fail=1
import sys
import diagnose
T = sys.argv[1]
failed = []
def check(name, ok, detail=""):
    print(f"gpu_check: {'ok  ' if ok else 'FAIL'} {name} {detail}")
    ok or failed.append(name)
try:
    r = diagnose.load(f"{T}/nccl", warn=lambda m: None)
    k = r.kernels()
    check("nccl: profiler kernels imported", len(k) > 0, f"({len(k)} GPU activities, kinds {sorted(set(k['kind']))})")
    check("nccl: kernels carry steps 3 and 4", {3, 4} <= set(k["step"]), str(sorted(set(k["step"]))))
    tb = r.temporal_breakdown()
    check("nccl: temporal breakdown", len(tb) == 1, tb.round(3).to_dict("records").__str__())
    s = r.samples()
    check("nccl: NVML samples", {"gpu_util_pct", "power_w", "sm_clock_mhz"} <= set(s["metric"]), str(sorted(set(s["metric"]))[:12]))
    ev = r.events()
    gpu = ev[ev["detail"].astype(str) == "cuda_event"]
    check("nccl: CUDA-event spans", {"gpu:step", "gpu:forward"} <= set(gpu["name"].astype(str)), str(sorted(set(gpu["name"].astype(str)))))
    sd = ev[ev["detail"].astype(str) == "sync_debug"]
    check("nccl: sync-debug events (trainer syncs)", len(sd) > 0, f"({len(sd)}, e.g. {sd['callsite'].astype(str).head(1).tolist()})")
    # this GPU's GEMM kernel names are in fp32_math's table (a new generation renames them)
    from diagnose.analysis.tables.kernel_precision import classify
    gemms = sorted({n for n in k["name"].astype(str) if classify(n)[0] is not None})
    unknown = [n for n in gemms if classify(n)[1] is None]
    check("nccl: GEMM/conv kernel names carry a known precision", bool(gemms) and not unknown,
          f"({len(gemms)} names; unknown: {[n[:80] for n in unknown[:3]]}; e.g. {[n[:60] for n in gemms[:2]]})")
except Exception as exc:
    check("nccl: load", False, repr(exc))
try:
    g = diagnose.load(f"{T}/gloo", warn=lambda m: None)
    a = g.arrivals()
    check("gloo/CUDA: collectives matched on 2 ranks", len(a) > 0 and (a["members"] == 2).all(), f"({len(a)} arrivals)")
    ev = g.events()
    gpu = ev[ev["detail"].astype(str).isin(["gpu", "gpu:wait", "gpu:nccl"])]
    check("gloo/CUDA: no device rows for gloo (its work is the host's)", len(gpu) == 0, f"({len(gpu)})")
    s = g.samples()
    check("gloo/CUDA: NVML samples on both ranks", set(s[s["metric"] == "gpu_util_pct"]["rank"]) == {0, 1})
except Exception as exc:
    check("gloo: load", False, repr(exc))
try:
    n = diagnose.load(f"{T}/nccl_calls", warn=lambda m: None)
    ev = n.events()
    dev = ev[ev["detail"].astype(str).isin(["gpu", "gpu:wait", "gpu:nccl"])]
    kinds = dev.groupby([dev["kind"].astype(str), dev["detail"].astype(str)]).size().to_dict()
    async_rows = kinds.get(("collective", "gpu:wait"), 0) + kinds.get(("collective", "gpu:nccl"), 0)
    check("nccl calls: device rows, sync and async", kinds.get(("collective", "gpu"), 0) >= 6
          and async_rows >= 6 and kinds.get(("done", "gpu"), 0) >= 6, str(kinds))
    calls = n.collectives()
    group_seq = int(open(f"{T}/nccl_calls.log").read().split("GROUP_SEQ")[1].split()[0])
    seqs = sorted(calls[calls["kind"] == "collective"]["seq"].astype(int))
    check("nccl calls: sequence numbers are the group's own (Flight Recorder's)",
          seqs == list(range(1, group_seq + 1)), f"(recorded {seqs[:3]}..{seqs[-1:]}, group's {group_seq})")
    lag = (calls["exit_ns"] - calls["issue_ns"]) / 1e6
    check("nccl calls: each ends after it arrives on the device", bool((lag >= 0).all()),
          f"(ms: median {lag.median():.3f}, max {lag.max():.3f})")
    anchors = n.rank_meta[0].get("gpu", {}).get("clock_anchors", [])
    check("nccl calls: clock anchors with residual", len(anchors) >= 1, str(anchors[:2]))
    # (a) device rows against the profiler's NCCL kernels of the same calls (steps 3-4)
    bound_ns = max([a["residual_ns"] for a in anchors] or [0]) + 50_000
    k = n.kernels()
    k = k[(k["kind"] == "communication") & k["step"].isin([3, 4])].sort_values("start_ns")
    rows = ev[ev["detail"].astype(str).isin(["gpu", "gpu:wait", "gpu:nccl"]) & ev["step"].isin([3, 4])]
    arrive = rows[rows["kind"].astype(str) == "collective"].sort_values("start_ns")
    done = rows[rows["kind"].astype(str) == "done"].sort_values("start_ns")
    pairs = list(zip(arrive.itertuples(), done.itertuples(), k.itertuples()))
    err_us = []
    for a, d, kern in pairs:   # arrival <= kernel start (+bound); end ~ kernel end (an upper bound for gpu:wait)
        late_start = (a.start_ns - kern.start_ns) / 1e3
        end_off = (d.start_ns - kern.end_ns) / 1e3
        exact = str(d.detail) != "gpu:wait"
        err_us.append((str(d.detail), round(late_start, 1), round(end_off, 1)))
        if late_start > bound_ns / 1e3 or end_off < -bound_ns / 1e3 or (exact and end_off > bound_ns / 1e3):
            err_us[-1] += ("OUT",)
    check("nccl calls: (a) device rows agree with the profiler's kernels", len(pairs) == 4 and len(k) == 4
          and not any(len(e) == 4 for e in err_us),
          f"(bound {bound_ns / 1e3:.0f} us; detail, arrival-kernel start, end-kernel end in us: {err_us})")
except Exception as exc:
    check("nccl calls: load", False, repr(exc))
try:
    from diagnose.analysis.detectors import copy_stall
    from diagnose.analysis.findings.run_detectors import Context
    found = copy_stall.detect(Context(diagnose.load(f"{T}/copies", warn=lambda m: None)))
    m = found[0].metrics if found else {}
    check("copies: copy_stall names the fault's pageable copies", len(found) == 1
          and m.get("pageable_frac", 0) > 0.9, f"({[f.title for f in found]}; {m})")
except Exception as exc:
    check("copies: load", False, repr(exc))
import json, re
def syncs(log):
    try:
        m = re.search(r"^SYNCS (.*)$", open(log).read(), re.M)
        return json.loads(m.group(1)) if m else None
    except OSError:
        return None
plain, under = syncs(f"{T}/sync_plain.log"), syncs(f"{T}/sync_diag.log")
check("sync count: (b) training thread's cuda*Synchronize the same with and without diagnose",
      plain is not None and under is not None and plain["main"] >= 5 and plain["main"] == under["main"],
      f"(plain {plain}, under diagnose {under})")
sys.exit(1 if failed else 0)
PYEOF

"$PY" scripts/gpu_check_results.py "$T" || fail=1

if command -v nsys >/dev/null; then
    "${DIAG[@]}" run --out "$T/nsys" --nsys --no-analyze -- \
        "$PY" -m torch.distributed.run --standalone --nproc-per-node 1 -m reference_trainer --steps 4 \
        > "$T/nsys.log" 2>&1 && nsys export --type sqlite -o "$T/rank0.sqlite" "$T/nsys/nsys/rank0.nsys-rep" >> "$T/nsys.log" 2>&1 \
        && "${DIAG[@]}" import nsys "$T/rank0.sqlite" --out "$T/nsys_import" >> "$T/nsys.log" 2>&1 \
        && echo "gpu_check: ok   nsys: profile, export, import" \
        || { echo "gpu_check: FAIL nsys (see $T/nsys.log)"; fail=1; }
else
    echo "gpu_check: skip nsys: not on PATH"
fi
[ "$fail" = 0 ] && echo "gpu_check: all checks passed" || echo "gpu_check: some checks FAILED"
exit "$fail"
