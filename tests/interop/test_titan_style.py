"""Issue 24: samples/titan_style.py (FSDP2 x DTensor TP, optionally compiled per
block) under `diagnose run`: its tensor-parallel all-reduces (functional
collectives issued by DTensor) are recorded and matched across the TP group; a
rank slow inside its TP region is the straggler; a slow dataset is an input
stall; compiled, it compiles as it does without diagnose."""

import json
import subprocess

from tests.support.jobs import REPO, job_env, load_run, run_diagnose, torchrun

SAMPLE = "samples/titan_style.py"


def _findings(out):
    return json.loads((out / "analysis" / "findings.json").read_text())


def _serious(out, kind):
    return [f for f in _findings(out) if f["kind"] == kind and f["severity"] != "info"]


def _tp_all_reduces(run):
    calls = run.collectives()
    return calls[(calls["name"] == "all_reduce") & (calls["detail"] == "functional")]


def test_tp_straggler_in_an_fsdp2_x_tp_job(tmp_path):
    """dp2 x tp2: rank 1 sleeps between its column- and row-parallel matmuls."""
    out = tmp_path / "tp"
    run_diagnose(
        ["run", "--out", out, "--", *torchrun(4, SAMPLE, "--tp", 2, "--steps", 14, "--slow-rank", 1, "--slow-ms", 25)]
    )
    run = load_run(out)
    tp = _tp_all_reduces(run)
    assert set(tp["group_ranks"]) == {"0,1", "2,3"}, set(tp["group_ranks"])
    per_instance = tp.groupby(["group", "seq"])["rank"].nunique()
    assert len(per_instance) >= 2 * 14 * 2 and (per_instance == 2).all()  # 2 blocks x 14 steps x 2 groups
    arrivals = run.arrivals()
    assert set(tp["group"]) <= set(arrivals["group"])
    calls = run.collectives()
    fsdp = calls[calls["detail"].astype(str).str.startswith("fsdp:")]
    assert set(fsdp["name"].str.split("_").str[:2].str.join("_")) == {"all_gather", "reduce_scatter"}, set(fsdp["name"])
    stragglers = _serious(out, "straggler")
    assert stragglers and stragglers[0]["ranks"] == [1], _findings(out)


def test_slow_dataset_in_a_tp_job_is_an_input_stall(tmp_path):
    out = tmp_path / "data"
    run_diagnose(["run", "--out", out, "--", *torchrun(2, SAMPLE, "--tp", 2, "--steps", 12, "--slow-data-ms", 6)])
    stalls = _serious(out, "input_stall")
    assert stalls and stalls[0]["ranks"] == [0, 1], _findings(out)


def test_compiled_blocks_compile_as_without_diagnose(tmp_path):
    """--compile (aot_eager): the same graphs, graph breaks and recompiles with and
    without `diagnose run`, and the blocks compile with fullgraph=True under it. Inside a compiled block the TP all-reduce is part of
    the graph and leaves no row (docs/instrumentation.md#compiled-code); FSDP2's
    collectives run in its hooks, outside the graphs, and are recorded."""
    args = [SAMPLE, "--tp", 2, "--steps", 8, "--compile"]
    plain, traced = tmp_path / "plain.json", tmp_path / "traced.json"
    proc = subprocess.run(
        torchrun(2, *args, "--compile-stats", plain),
        cwd=REPO,
        env=job_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = tmp_path / "run"
    run_diagnose(["run", "--out", out, "--", *torchrun(2, *args, "--compile-stats", traced)], timeout=600)
    stats = json.loads(plain.read_text())
    assert json.loads(traced.read_text()) == stats and stats["unique_graphs"] >= 1, stats
    run = load_run(out)
    assert _tp_all_reduces(run).empty  # pinned: compiled TP collectives are not seen
    assert len(run.steady_steps()) >= 4
    # fullgraph=True: a graph break would raise, so this compiles only if diagnose's
    # wrappers stay out of the graph; without breaks it counts what the plain run did
    whole = tmp_path / "fullgraph.json"
    run_diagnose(
        ["run", "--out", tmp_path / "fullgraph", "--", *torchrun(2, *args, "--fullgraph", "--compile-stats", whole)],
        timeout=600,
    )
    assert stats["graph_breaks"] == {} and json.loads(whole.read_text()) == stats
