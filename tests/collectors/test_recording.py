"""Issue 2: `diagnose run` wraps an unmodified torchrun job and leaves crash-safe traces."""

import gzip
import json
import os
import re
import subprocess

import pyarrow.parquet as pq
import pytest

import diagnose
from tests.support.jobs import PYTHON, REPO, fixture_path, job_env, run_diagnose, torchrun


def _lines_of(path, pattern):
    return [i + 1 for i, line in enumerate(open(path).read().splitlines()) if re.search(pattern, line)]


def test_traces_hold_steps_phases_collectives_with_callsites(ddp_run):
    run = diagnose.load(ddp_run)
    assert run.ranks == [0, 1]
    events = run.events()
    sample = str(REPO / "samples" / "ddp_mlp.py")
    loss_all_reduce_line = _lines_of(sample, r"dist\.all_reduce\(loss_check\)")[0]
    for rank in (0, 1):
        mine = events[events["rank"] == rank]
        kinds = set(mine["kind"].astype(str))
        assert {"step", "forward", "backward", "optimizer", "data", "collective"} <= kinds
        assert (mine["kind"] == "step").sum() == 12
        ddp = mine[(mine["kind"] == "collective") & (mine["detail"] == "ddp backward")]
        # DDP's timer (CPU): one all-reduce per synchronizing backward, reported at the
        # next forward, so the last step's is not; each completes before its backward ends
        assert len(ddp) == 11 and set(ddp["step"]) == set(range(11))
        done = mine[(mine["kind"] == "done") & (mine["detail"] == "ddp backward")]
        backward = mine[mine["kind"] == "backward"]
        assert len(done) == 11 and (done["start_ns"].to_numpy() >= ddp["start_ns"].to_numpy()).all()
        assert all(((backward["start_ns"] < t) & (t <= backward["end_ns"] + 1_000_000)).any() for t in done["start_ns"])
        own = mine[(mine["kind"] == "collective") & (mine["callsite"] == f"{sample}:{loss_all_reduce_line}")]
        assert len(own) == 12, "the script's own loss all_reduce, at its line"
        assert set(mine["step"]) >= set(range(12))
    # every collective instance has both members, with consistent sequence numbers
    arrivals = run.arrivals()
    assert (arrivals["members"] == 2).all()


def test_loss_is_bitwise_unchanged_by_diagnose(ddp_run, tmp_path):
    wrapped = json.loads((ddp_run.parent / "result.json").read_text())
    plain_result = tmp_path / "plain.json"
    proc = subprocess.run(
        torchrun(2, "samples/ddp_mlp.py", "--steps", 12, "--result-json", plain_result),
        cwd=REPO,
        env=job_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    plain = json.loads(plain_result.read_text())
    assert wrapped["loss"] == plain["loss"]
    assert wrapped["param_sha256"] == plain["param_sha256"]


def test_breakdown_parts_sum_to_step_time(ddp_run):
    run = diagnose.load(ddp_run)
    breakdown = run.breakdown()
    parts = breakdown[[c for c in breakdown.columns if c.endswith("_ms") and c != "step_ms"]].sum(axis=1)
    assert set(breakdown["rank"]) == {0, 1}
    assert ((parts - breakdown["step_ms"]).abs() <= 0.02 * breakdown["step_ms"]).all()
    assert (breakdown["forward_ms"] > 0).all() and (breakdown["backward_ms"] > 0).all()


def test_analyze_writes_tables_and_findings_and_prints_breakdown(ddp_run):
    proc = run_diagnose(["analyze", ddp_run])
    assert "data_wait" in proc.stdout and "exposed_comm" in proc.stdout
    findings = json.loads((ddp_run / "analysis" / "findings.json").read_text())
    assert isinstance(findings, list)
    for table in ("steps", "breakdown", "collectives", "arrivals"):
        assert pq.read_table(ddp_run / "analysis" / f"{table}.parquet").num_rows > 0


def test_chrome_export_has_one_process_per_rank(ddp_run, tmp_path):
    out = tmp_path / "trace.json.gz"
    run_diagnose(["export", ddp_run, "--format", "chrome", "--out", out])
    trace = json.load(gzip.open(out, "rt"))["traceEvents"]
    pids = {e["pid"] for e in trace if e["ph"] == "X"}
    names = {e["name"] for e in trace if e["ph"] == "X"}
    assert pids == {0, 1}
    assert {"forward", "backward", "all_reduce", "optimizer", "step", "data_wait"} <= names


@pytest.mark.parametrize("kill_signal", ["KILL", "ABRT"])
def test_sigkilled_rank_leaves_readable_parts_up_to_one_second_before(tmp_path, kill_signal):
    """SIGKILL, and SIGABRT as NCCL's async error handling sends on a collective
    timeout (issue 44 W8: no Python runs, the timer's flushes are what survive)."""
    out, marker = tmp_path / "run", tmp_path / "killed_at"
    proc = run_diagnose(
        [
            "run",
            "--out",
            out,
            "--no-analyze",
            "--",
            *torchrun(2, "tests/scripts/kill_self.py", 40, marker, kill_signal),
        ],
        check=False,
    )
    assert proc.returncode != 0
    killed_at_ns = int(marker.read_text())
    for rank_dir in sorted((out / "traces").iterdir()):
        for part in rank_dir.glob("*.parquet"):
            pq.read_table(part)  # every part on disk is whole
    rank1 = out / "traces" / "rank-00001"
    last_ns = max(pq.read_table(p).column("end_ns").to_pylist()[-1] for p in rank1.glob("events-*.parquet"))
    assert last_ns >= killed_at_ns - 1_000_000_000
    # the steps done are exact: the counter mapped into memory outlives the kill,
    # where progress.json trails by up to a quarter second (12 steps of this job)
    from diagnose.rundir.progress import read_progress

    assert read_progress(str(out))[1]["steps_done"] == 41


def test_nvtx_ranges_are_mirrored_only_where_a_tool_is_attached(tmp_path):
    """Without NVTX_INJECTION64_PATH every NVTX call is a no-op, so the ranks skip
    them; with it (nsys sets it), ranges are pushed and popped, even when the
    tool library fails to load."""
    script = (
        "from collectors import nvtx_ranges\n"
        "nvtx_ranges.push('forward', 'forward'); nvtx_ranges.pop()\n"
        "print(nvtx_ranges.MIRRORING)"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVTX_INJECTION")}
    for injection, expected in ((None, "False"), (str(tmp_path / "libmissing-tool.so"), "True")):
        run_env = dict(env, **({"NVTX_INJECTION64_PATH": injection} if injection else {}))
        out = subprocess.run([PYTHON, "-c", script], cwd=REPO, env=run_env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and out.stdout.strip() == expected, out.stdout + out.stderr


def test_collector_threads_run_as_batch_and_never_above_their_creator():
    """A woken collector thread must not preempt the training thread (SCHED_BATCH),
    the clock-sync thread keeps its wake-up latency (SCHED_OTHER), and a thread
    started from an idle-priority one (the live monitor's) stays idle."""
    script = """
import os
from collectors.daemon_thread import start_daemon
seen = {}
def probe(key): seen[key] = os.sched_getscheduler(0)
start_daemon(lambda: probe("writer"), "diagnose-writer").join()
start_daemon(lambda: probe("clock"), "diagnose-clock-sync", batch=False).join()
os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
start_daemon(lambda: probe("under_idle"), "diagnose-live-mlflow").join()
print(seen["writer"] == os.SCHED_BATCH, seen["clock"] == os.SCHED_OTHER, seen["under_idle"] == os.SCHED_IDLE)
"""
    out = subprocess.run([PYTHON, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.split() == ["True", "True", "True"], out.stdout + out.stderr


def test_progress_is_rewritten_in_place_and_always_whole_json(tmp_path):
    """progress.json: one pwrite per step end on the same file (no temporary file
    and rename); a shorter content is padded, and readers parse every version."""
    from collectors.part_writer import PartWriter
    from diagnose.rundir.progress import read_progress

    rank_dir = tmp_path / "traces" / "rank-00003"
    writer = PartWriter(str(rank_dir), live=True)
    long = {"step": 64, "recent_steps": [[i, 50.0 + i, 0.5] for i in range(64)]}
    writer.overwrite_json("progress.json", long)
    inode = (rank_dir / "progress.json").stat().st_ino
    assert read_progress(str(tmp_path)) == {3: long}
    writer.overwrite_json("progress.json", {"step": 65, "recent_steps": []})
    assert (rank_dir / "progress.json").stat().st_ino == inode
    assert read_progress(str(tmp_path)) == {3: {"step": 65, "recent_steps": []}}
    assert sorted(p.name for p in rank_dir.iterdir()) == ["progress.json"]


def test_writing_parts_and_parsing_kineto_never_import_pandas(tmp_path):
    """pa.array() imports pandas at its first call (0.3 s of CPU holding the GIL):
    a rank's writer thread and the Kineto parse workers build Arrow arrays
    without it, and keep the same values (non-ASCII strings too)."""
    kineto = sorted(fixture_path("kineto").glob("**/*.json*"))
    assert kineto
    script = f"""
import sys
from collectors.part_writer import PartWriter
from collectors.schema import event_row
writer = PartWriter({str(tmp_path / "rank-00000")!r})
writer.write_events([event_row("step", "step", 1, 2, step=0, callsite="été.py:7"),
                     event_row("sync", "item", 3, 4, async_op=True, detail="cuda", callsite="t.py:1")])
writer.write_samples([(5, "gpu_util", 0.5)])
import tempfile
from diagnose.importers.kineto import _stage_file
_stage_file(tempfile.mkdtemp(dir={str(tmp_path)!r}), {str(kineto[0])!r})
print(sorted(m for m in sys.modules if m.split(".")[0] == "pandas")[:3])
"""
    out = subprocess.run([PYTHON, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr
    events = pq.read_table(next((tmp_path / "rank-00000").glob("events-*.parquet"))).to_pylist()
    assert events[0]["callsite"] == "été.py:7" and events[0]["detail"] == ""
    assert events[1] == {
        "kind": "sync",
        "name": "item",
        "start_ns": 3,
        "end_ns": 4,
        "step": -1,
        "microbatch": -1,
        "stage": -1,
        "group": "",
        "group_ranks": "",
        "seq": -1,
        "peer": -1,
        "bytes": 0,
        "async_op": True,
        "callsite": "t.py:1",
        "detail": "cuda",
        "queued_ns": -1,
    }
    samples = pq.read_table(next((tmp_path / "rank-00000").glob("samples-*.parquet"))).to_pylist()
    assert samples == [{"ts_ns": 5, "metric": "gpu_util", "value": 0.5}]


def test_failing_collector_does_not_stop_the_job_and_is_recorded(tmp_path):
    """Also: DIAGNOSE_DISABLE leaves an instrumentor out and nothing else; DDP's
    timing comm hook (DIAGNOSE_DDP_TIMING=hook, the path for GPU modules) records
    every bucket and leaves the parameters bitwise as a plain run leaves them."""
    out = tmp_path / "run"
    proc = run_diagnose(
        [
            "run",
            "--out",
            out,
            "--no-analyze",
            "--",
            *torchrun(2, "samples/ddp_mlp.py", "--steps", 4, "--result-json", tmp_path / "hook.json"),
        ],
        env=job_env(
            DIAGNOSE_TEST_FAIL_COLLECTOR="host_sync", DIAGNOSE_DISABLE="dataloader, steps", DIAGNOSE_DDP_TIMING="hook"
        ),
    )
    assert "final loss" in proc.stdout
    meta = json.loads((out / "traces" / "rank-00000" / "meta.json").read_text())
    assert [e["collector"] for e in meta["collector_errors"]] == ["host_sync"]
    assert {"dataloader", "steps"}.isdisjoint(meta["instrumentors"])
    assert {"ddp", "collectives", "forward_backward"} <= set(meta["instrumentors"])
    run = diagnose.load(out)
    events = run.events()
    errors = events[events["kind"] == "error"]
    assert set(errors["name"]) == {"host_sync"} and set(errors["rank"]) == {0, 1}
    assert (events["kind"] == "backward").sum() == 2 * 4 * 2  # the job's own work was all recorded
    assert not events["kind"].isin(["data", "step"]).any()
    buckets = events[(events["kind"] == "collective") & events["detail"].astype(str).str.startswith("ddp bucket")]
    assert len(buckets) >= 2 * 4
    plain = subprocess.run(
        torchrun(2, "samples/ddp_mlp.py", "--steps", 4, "--result-json", tmp_path / "plain.json"),
        cwd=REPO,
        env=job_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert plain.returncode == 0, plain.stderr[-3000:]
    hooked, plain = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("hook", "plain"))
    assert hooked["param_sha256"] == plain["param_sha256"] and hooked["loss"] == plain["loss"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["run"], "no command"),
        (["run", "--bogus", "--", "true"], "unknown option"),
        (["analyze", "--bogus", "x"], "no such option"),
        (["analyze", "/nonexistent/run"], "does not exist"),
        (["export", "README.md"], "not a directory"),
        (["demo", "--scenario", "nope"], "unknown scenario"),
    ],
)
def test_misuse_is_one_line_and_exit_2(args, message):
    proc = run_diagnose(args, check=False)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0].lower(), proc.stderr


def test_out_dir_is_never_overwritten(tmp_path):
    (tmp_path / "keep.txt").write_text("precious")
    proc = run_diagnose(["run", "--out", tmp_path, "--", "true"], check=False)
    assert proc.returncode == 2 and "not empty" in proc.stderr
    assert (tmp_path / "keep.txt").read_text() == "precious"


def test_bootstrap_chains_an_existing_sitecustomize(tmp_path):
    other = tmp_path / "site"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import os\nos.environ['OTHER_SITE_RAN'] = '1'\n")
    out = tmp_path / "run"
    env = job_env(PYTHONPATH=str(other))
    proc = run_diagnose(
        [
            "run",
            "--out",
            out,
            "--no-analyze",
            "--",
            PYTHON,
            "-c",
            "import os; print('other', os.environ.get('OTHER_SITE_RAN'))",
        ],
        env=env,
    )
    assert "other 1" in proc.stdout


def test_live_row_parts_read_like_parquet_and_become_parquet_after_the_job(tmp_path):
    """The recorder's parts are JSON rows (no Arrow table built in the rank); the
    loader reads them as it reads Parquet, a corrupt one is one warning, and
    merge_row_parts (run by the launcher when the job ends) leaves Parquet only,
    even after a merge cut short left both a part and its Parquet copy."""
    from collectors.part_writer import PartWriter, files_to_read, merge_row_parts, write_parquet_atomic
    from collectors.schema import event_row, events_table
    from diagnose.rundir.rank_reader import read_events, read_samples

    rank_dir = tmp_path / "rank-00000"
    writer = PartWriter(str(rank_dir), live=True)
    rows = [event_row("phase", f"ph{i}", 10**15 + i, 10**15 + i + 5, step=i, callsite="é.py:1") for i in range(6)]
    for part in (rows[:2], rows[2:4], rows[4:]):
        writer.write_events(part)
    writer.write_samples([(10**15, "cpu_util", 0.5), (10**15 + 1, "rss_mb", float("nan"))])
    assert sorted(p.name for p in rank_dir.glob("*-0*")) == [
        "events-000001.json",
        "events-000002.json",
        "events-000003.json",
        "samples-000001.json",
    ]

    def rows_of(table):
        return [tuple(map(str, r.values())) for r in table.to_pylist()]

    warnings = []
    expected = rows_of(events_table(rows))
    assert rows_of(read_events(str(rank_dir), warnings.append)) == expected
    samples = read_samples(str(rank_dir), warnings.append).to_pylist()
    assert samples[0]["value"] == 0.5 and samples[1]["value"] != samples[1]["value"]  # NaN kept
    # a merge cut short after its Parquet file was renamed into place: counted once
    write_parquet_atomic(events_table(rows[4:]), str(rank_dir / "events-000003.parquet"))
    assert "events-000003.json" not in files_to_read(p.name for p in rank_dir.iterdir())
    assert rows_of(read_events(str(rank_dir), warnings.append)) == expected
    merge_row_parts(str(rank_dir))
    assert sorted(p.name for p in rank_dir.glob("*-0*")) == [
        "events-000001-000002.parquet",
        "events-000003.parquet",
        "samples-000001.parquet",
    ]
    assert rows_of(read_events(str(rank_dir), warnings.append)) == expected and not warnings
    (rank_dir / "events-000004.json").write_bytes(b'{"columns": ["kind"], "rows": [[')
    assert rows_of(read_events(str(rank_dir), warnings.append)) == expected
    assert len(warnings) == 1 and "events-000004.json: skipped" in warnings[0]


def test_outermost_forwards_after_step_0_cost_inner_modules_nothing(tmp_path):
    """Step 0 learns which classes are called outermost; from then on only they
    are wrapped, so inner module calls run no collector code, and every step
    still has its forward (one per outermost call) and backward."""
    script = f"""
import sys, collections, torch
from collectors.recorder import start_recorder
from collectors.instrument import forward_backward
rec = start_recorder({str(tmp_path)!r})
original = torch.nn.Module.__call__
forward_backward.install(rec)
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(5)])
    def forward(self, x):
        return self.layers(x)
net, loss_fn = Net(), torch.nn.MSELoss()
opt = torch.optim.SGD(net.parameters(), lr=0.1)
calls = collections.Counter()
def count(frame, event, arg):
    if event == "call" and frame.f_code.co_filename == forward_backward.__file__:
        calls[frame.f_code.co_name] += 1
for step in range(3):
    if step == 2:
        sys.setprofile(count)
    loss_fn(net(torch.randn(4, 8)), torch.zeros(4, 8)).backward()
    sys.setprofile(None)
    opt.step()
kinds = collections.Counter(row[0] for row in rec.events)
print(torch.nn.Module.__call__ is original, Net.__call__ is not original,
      torch.nn.MSELoss.__call__ is not original, torch.nn.Linear.__call__ is original,
      calls["__call__"], kinds["forward"], kinds["backward"])
"""
    out = subprocess.run([PYTHON, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    # step 2: two outermost calls (net, loss) and no inner ones; 2 forwards x 3 steps
    assert out.stdout.split() == ["True", "True", "True", "True", "2", "6", "3"], out.stdout
