"""Issue 25: the per-rank pass runs on an engine (in-process, local processes,
Dask distributed) and the results are the same whatever the engine. Real Dask:
a LocalCluster of 2 worker processes, its scheduler's task log read back. And
the event budget: a run over it is analyzed over its last steps, whatever the engine."""

import json
import os
import shutil
import signal
import threading

import distributed
import pandas as pd
import pytest
from pandas.testing import assert_frame_equal

import diagnose
from tests.support.jobs import fixture_path, load_run, run_diagnose
from tests.support.synthetic_run import write_synthetic_run

TABLES = ("steps", "breakdown", "collectives", "arrivals")


@pytest.fixture(scope="module")
def cluster():
    with (
        distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as local,
        distributed.Client(local) as client,
    ):
        yield local, client


@pytest.fixture(scope="module")
def synthetic_64(tmp_path_factory):
    """64 data-parallel ranks, rank 37 1.6x slow."""
    return write_synthetic_run(
        str(tmp_path_factory.mktemp("engines") / "run64"), ranks=64, steps=30, slow_rank=37, slow_factor=1.6
    )


@pytest.fixture(scope="module")
def in_process_64(synthetic_64, tmp_path_factory):
    return _analyzed(synthetic_64, tmp_path_factory.mktemp("engines") / "in_process")


def _analyzed(source, dest, *engine_args, warnings=()) -> tuple[list, dict]:
    """A copy of `source` analyzed by the CLI with the engine options: (findings, tables).
    warnings: the stderr lines expected, each a substring of its own line."""
    shutil.copytree(source, dest)
    shutil.rmtree(os.path.join(dest, "analysis"), ignore_errors=True)
    proc = run_diagnose(["analyze", dest, "--quiet", "--no-outputs", *engine_args])
    # no other loader or detector warning: a detector that failed would only say so there
    said = [line for line in proc.stderr.splitlines() if "warning" in line]
    assert len(said) == len(warnings) and all(w in line for w, line in zip(warnings, said)), proc.stderr
    findings = json.loads(open(os.path.join(dest, "analysis", "findings.json"), encoding="utf-8").read())
    tables = {name: pd.read_parquet(os.path.join(dest, "analysis", f"{name}.parquet")) for name in TABLES}
    return findings, tables


def _assert_same(a, b):
    assert a[0] == b[0]
    for name in TABLES:
        assert_frame_equal(a[1][name], b[1][name], obj=name)


def _rank_tasks(stream) -> list:
    """The per-rank pass' tasks of a task stream, keyed by their first rank (keys:
    rank_batch-RANK-TOKEN; up to 64 ranks, a task reads one rank)."""
    return [
        dict(task, key=str(task["key"]).rsplit("-", 1)[0])
        for task in stream.data
        if str(task["key"]).startswith("rank_batch-")
    ]


def test_a_dask_cluster_reads_every_rank_and_the_findings_are_the_in_process_ones(
    synthetic_64, in_process_64, cluster, tmp_path
):
    local, client = cluster
    with distributed.get_task_stream(client) as stream:
        on_dask = _analyzed(synthetic_64, tmp_path / "dask", "--scheduler", local.scheduler_address)
    _assert_same(in_process_64, on_dask)
    tasks = _rank_tasks(stream)
    # one task per rank, each run by one of the cluster's worker processes (not the CLI)
    assert sorted(t["key"] for t in tasks) == sorted(f"rank_batch-{r}" for r in range(64))
    assert {t["worker"] for t in tasks} <= set(local.scheduler_info["workers"])
    assert len({t["worker"] for t in tasks}) == 2  # both workers took a share
    assert [(f["kind"], f["ranks"]) for f in on_dask[0] if f["kind"] == "straggler"] == [("straggler", [37])]


def test_local_processes_give_the_in_process_findings(synthetic_64, in_process_64, tmp_path):
    _assert_same(in_process_64, _analyzed(synthetic_64, tmp_path / "processes", "--processes", "2"))


def test_a_run_over_the_event_budget_is_analyzed_over_its_last_steps(synthetic_64, in_process_64, tmp_path):
    """--max-events: the run's last steps that fit the budget, cut on the workers (local
    processes here), the user told which; the straggler is still found there, and
    the step tables (steps, breakdown: made by the per-rank pass) cover every step."""
    full = load_run(synthetic_64)
    budget = len(full.events()) // 3  # ~10 of the 30 steps
    first_rank = full.events()[full.events()["rank"] == 0]
    per_step = (first_rank["step"] >= 0).sum() / first_rank["step"].nunique()
    keep = int((budget - 64 * (first_rank["step"] < 0).sum()) // (64 * per_step))
    assert 8 <= keep < 30
    said = (
        f"64 ranks x 30 steps is ~{len(full.events()):,} events, over the analysis' budget of {budget:,} "
        f"(--max-events): analyzing the last {keep} steps ({30 - keep}-29) only"
    )
    cut = _analyzed(synthetic_64, tmp_path / "cut", "--max-events", budget, warnings=[said])
    assert set(cut[1]["collectives"]["step"]) <= set(range(30 - keep, 30)) | {-1}
    for name in ("steps", "breakdown"):  # every step, as without a budget
        assert_frame_equal(cut[1][name], in_process_64[1][name], obj=name)
    # none of the window is taken as warm-up: every step of it is a steady one
    assert load_run(tmp_path / "cut", max_events=budget, expected_warnings=[said]).steady_steps() == list(
        range(30 - keep, 30)
    )
    assert [(f["kind"], f["ranks"]) for f in cut[0] if f["kind"] == "straggler"] == [("straggler", [37])]
    _assert_same(
        cut,
        _analyzed(
            synthetic_64, tmp_path / "cut_processes", "--max-events", budget, "--processes", "2", warnings=[said]
        ),
    )
    # under the budget, nothing is cut
    _assert_same(in_process_64, _analyzed(synthetic_64, tmp_path / "whole", "--max-events", len(full.events())))


@pytest.fixture(scope="module")
def early_straggler(tmp_path_factory):
    """16 ranks x 30 steps, rank 5 1.6x slow in steps 0-14 only."""
    return write_synthetic_run(
        str(tmp_path_factory.mktemp("early") / "run"),
        ranks=16,
        steps=30,
        slow_rank=5,
        slow_factor=1.6,
        slow_steps=range(15),
    )


def test_a_window_unlike_the_steps_before_it_is_said(early_straggler):
    """A straggler in the first half of the run only: a budget that keeps the last
    10 steps cannot see it, so the loader says that the earlier steps (their step
    times come from the step table, which covers every step) were slower."""
    run_dir = early_straggler
    full = load_run(run_dir)
    assert [f["ranks"] for f in diagnose.analyze(full) if f["kind"] == "straggler"] == [[5]]
    per_step = full.steps().groupby("step")["dur_ms"].median()
    before, window = per_step.loc[2:19].median(), per_step.loc[20:].median()
    assert before / window - 1 > 0.3  # the planted slowdown, as the step table has it
    budget = len(full.events()) * 10 // 30 + 16  # the last 10 steps
    said = (
        f"steps 2-19, before the analyzed window, took a median {before:.1f} ms per step, the window "
        f"{window:.1f} ms (+{before / window - 1:.0%}): the findings describe the window "
        "(--max-events 0 analyzes every step)"
    )
    cut = load_run(run_dir, max_events=budget, expected_warnings=["analyzing the last 10 steps (20-29)", said])
    assert sorted(cut.steps()["step"].unique()) == list(range(30))
    assert not [f for f in diagnose.analyze(cut) if f["kind"] == "straggler"]
    # a window like the steps before it: nothing said (the 64-rank test above: one warning)


def test_every_step_analyzes_the_run_window_by_window_and_finds_the_early_cause(early_straggler, tmp_path):
    """--every-step: the same budget, the run's 30 steps in 3 windows of 10 analyzed
    one after the other; the early straggler is found, with the steps it was found
    in, and its impact is the run's average per step."""
    import diagnose
    from diagnose.analysis.findings.run_detectors import detect

    run_dir = str(tmp_path / "run")
    shutil.copytree(early_straggler, run_dir)
    full = load_run(run_dir)
    events = len(full.events())
    budget = events * 10 // 30 + 16
    proc = run_diagnose(["analyze", run_dir, "--quiet", "--no-outputs", "--max-events", budget, "--every-step"])
    assert [line for line in proc.stderr.splitlines() if "warning" in line] == [
        f"diagnose: warning: 16 ranks x 30 steps is ~{events:,} events, over the analysis' budget of {budget:,} "
        "(--max-events): analyzing it in 3 windows of steps, one after the other (0-9, 10-19, 20-29)"
    ]
    analysis = os.path.join(run_dir, "analysis")
    findings = json.loads(open(os.path.join(analysis, "findings.json"), encoding="utf-8").read())
    [straggler] = [f for f in findings if f["kind"] == "straggler"]
    # each window alone, as --every-step loads it
    per_window = {}
    for first in (0, 10, 20):
        window = diagnose.load(
            run_dir, warn=None, window={"from_step": first, "last_step": first + 9, "warmup": first == 0}
        )
        assert set(window.collectives()["step"]) <= set(range(first, first + 10)) | {-1}
        per_window[first] = [f for f in detect(window) if f["kind"] == "straggler"]
    found = [first for first, fs in per_window.items() if fs]
    assert found and 20 not in found and all(fs[0]["ranks"] == [5] for fs in per_window.values() if fs)
    spans = ", ".join(f"{a}-{a + 9}" for a in found)
    assert straggler["ranks"] == [5] and straggler["title"].endswith(f"(steps {spans} of 0-29)")
    assert straggler["metrics"]["windows_found"] == spans
    assert straggler["impact_ms_per_step"] == pytest.approx(
        sum(per_window[a][0]["impact_ms_per_step"] * 10 for a in found) / 30, abs=1e-3
    )
    # the step tables cover every step, as the whole run's
    for name in ("steps", "breakdown"):
        assert_frame_equal(
            pd.read_parquet(os.path.join(analysis, f"{name}.parquet")),
            getattr(full, name)().reset_index(drop=True),
            obj=name,
            check_dtype=False,
        )
    assert sorted(os.listdir(os.path.join(analysis, "windows"))) == ["steps-0-9", "steps-10-19", "steps-20-29"]
    assert not os.path.exists(os.path.join(analysis, "collectives.parquet"))


def test_a_run_is_freed_with_its_tables(synthetic_64):
    """Run's derived tables are kept by the run, not by a cache of its class: a run
    let go is freed, tables and all (--every-step loads one window after the other)."""
    import gc
    import weakref

    run = load_run(synthetic_64)
    run.collectives(), run.arrivals(), run.steady_steps()
    gone = weakref.ref(run)
    del run
    gc.collect()
    assert gone() is None


def test_merged_findings_keep_a_crash_critical_and_weigh_a_partial_cause_by_its_steps():
    from diagnose.analysis.findings.window_findings import merge

    def finding(kind, severity, impact, ranks=(3,)):
        return {
            "kind": kind,
            "severity": severity,
            "impact_ms_per_step": impact,
            "ranks": list(ranks),
            "stage": None,
            "callsite": None,
            "title": kind,
            "recommendation": "",
            "metrics": {},
        }

    merged = merge(
        [
            ((0, 9), [finding("straggler", "critical", 40.0), finding("exposed_comm", "warning", 4.0, [])]),
            ((10, 29), [finding("rank_failure", "critical", 0.0), finding("exposed_comm", "warning", 7.0, [])]),
        ],
        step_ms=100.0,
    )
    by_kind = {f["kind"]: f for f in merged}
    # found in 10 of 30 steps: 40 ms there is 13.3 ms per step of the run: warning, not critical
    assert (
        by_kind["straggler"]["impact_ms_per_step"],
        by_kind["straggler"]["severity"],
        by_kind["straggler"]["title"],
    ) == (13.333, "warning", "straggler (steps 0-9 of 0-29)")
    assert by_kind["rank_failure"]["severity"] == "critical"  # the job did not end: whatever its steps
    # in every window: one finding, the heaviest window's text, the steps' weighted impact
    assert (by_kind["exposed_comm"]["impact_ms_per_step"], by_kind["exposed_comm"]["title"]) == (6.0, "exposed_comm")
    assert [f["kind"] for f in merged] == ["rank_failure", "straggler", "exposed_comm"]  # by severity, impact


def test_a_real_run_on_a_local_cluster_of_the_clis_own(tmp_path):
    """A real 4-rank torchrun (the straggler demo's recorded run), --dask-workers: the
    CLI starts and stops its own LocalCluster."""
    source = fixture_path("runs", "straggler")
    in_process = _analyzed(source, tmp_path / "in_process")
    on_dask = _analyzed(source, tmp_path / "dask", "--dask-workers", "2")
    _assert_same(in_process, on_dask)
    assert [(f["kind"], f["ranks"]) for f in on_dask[0] if f["kind"] == "straggler"] == [("straggler", [2])]


def test_a_worker_killed_mid_pass_is_replaced_and_the_result_is_unchanged(synthetic_64, cluster):
    from diagnose.analysis.load.rank_pass_engines import Dask

    local, client = cluster
    expected = load_run(synthetic_64)
    pids = client.run(os.getpid)  # worker address -> its process
    killed = []

    def kill_one_worker(done, total):
        if not killed:
            address, pid = sorted(pids.items())[0]
            os.kill(pid, signal.SIGKILL)
            killed.append((address, done, total))

    import diagnose

    # the module's own client (one client per process: two clients' futures in one
    # process wait on each other's event loops)
    with distributed.get_task_stream(client) as stream:
        warnings = []
        run = _within(
            120,
            lambda: diagnose.load(
                synthetic_64, warn=warnings.append, on_rank=kill_one_worker, engine=Dask(client=client)
            ),
        )
    assert warnings == []
    address, done_at_kill, total = killed[0]
    assert done_at_kill < total  # killed mid-pass
    assert_frame_equal(run.events(), expected.events())
    assert_frame_equal(run.samples(), expected.samples())
    # the scheduler saw the worker go with ranks in its hands, and another worker ran those
    # (not its computed results: one the client had just taken may count as lost there)
    removed = [event for _, event in client.get_events(address) if event.get("action") == "remove-worker"]
    lost = {str(key).rsplit("-", 1)[0] for event in removed for key in event["processing-tasks"]}
    assert lost, removed
    finished_on = {t["key"]: t["worker"] for t in _rank_tasks(stream)}
    assert set(finished_on) == {f"rank_batch-{r}" for r in range(64)}
    assert all(finished_on[key] != address for key in lost), (lost, finished_on)
    client.wait_for_workers(2, timeout=60)  # the nanny restarted it (the module's cluster stays whole)


def _within(seconds, fn):
    """fn() on a daemon thread: a pass that never ends fails the test instead of hanging the suite."""
    out = []
    thread = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    thread.start()
    thread.join(seconds)
    assert out, f"the per-rank pass did not end within {seconds} s"
    return out[0]


def test_a_run_at_a_memory_url_is_analyzed_as_at_its_local_path(synthetic_64, in_process_64):
    """An fsspec URL (memory://, in this process): the same findings and tables,
    written back at the URL."""
    import fsspec

    from diagnose.analysis.findings.run_detectors import write_analysis

    fs = fsspec.filesystem("memory")
    fs.put(synthetic_64, "/url-run64", recursive=True)
    try:
        run = load_run("memory://url-run64")
        assert run.root == "memory://url-run64" and len(run.ranks) == 64
        assert write_analysis(run) == in_process_64[0]
        with fs.open("/url-run64/analysis/findings.json") as f:
            assert json.loads(f.read()) == in_process_64[0]
        for name in TABLES:
            assert_frame_equal(
                pd.read_parquet(f"memory://url-run64/analysis/{name}.parquet"), in_process_64[1][name], obj=name
            )
    finally:
        fs.rm("/url-run64", recursive=True)


def test_dask_workers_read_a_run_at_a_file_url(synthetic_64, in_process_64, cluster, tmp_path):
    """--scheduler with a file:// URL: the cluster's worker processes read the rank
    folders through fsspec; the CLI writes findings and tables at the URL."""
    local, client = cluster
    dest = tmp_path / "at_url"
    shutil.copytree(synthetic_64, dest)
    with distributed.get_task_stream(client) as stream:
        proc = run_diagnose(
            ["analyze", f"file://{dest}", "--quiet", "--no-outputs", "--scheduler", local.scheduler_address]
        )
    assert "warning" not in proc.stderr, proc.stderr
    assert {t["key"] for t in _rank_tasks(stream)} == {f"rank_batch-{r}" for r in range(64)}
    findings = json.loads(open(dest / "analysis" / "findings.json", encoding="utf-8").read())
    assert findings == in_process_64[0]
    # a URL no fsspec protocol serves, a command other than analyze given a URL: one line each
    proc = run_diagnose(["analyze", "nosuchprotocol://runs/x", "--quiet"], check=False)
    assert (proc.returncode, proc.stderr.strip()) == (
        2,
        "diagnose: error: nosuchprotocol://runs/x: Protocol not known: nosuchprotocol",
    )
    proc = run_diagnose(["report", f"file://{dest}"], check=False)
    assert (proc.returncode, proc.stderr.strip()) == (
        2,
        f"diagnose: error: file://{dest}: diagnose report needs a local run directory "
        "(a run at a URL is analyzed by `diagnose analyze`)",
    )


@pytest.mark.parametrize(
    "options, message",
    [
        (
            ["--scheduler", "head-node"],
            "cannot reach the Dask scheduler head-node: missing port number in address 'head-node'",
        ),
        (["--processes", "2", "--dask-workers", "2"], "give one of --processes, --scheduler and --dask-workers"),
        (["--max-events", "-1"], "--max-events must be >= 0 (0: no budget)"),
    ],
)
def test_a_bad_engine_option_is_one_line(synthetic_64, options, message):
    proc = run_diagnose(["analyze", synthetic_64, "--quiet", "--no-outputs", *options], check=False)
    assert (proc.returncode, proc.stderr.strip()) == (2, f"diagnose: error: {message}")
