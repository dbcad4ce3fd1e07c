"""Issue 24 (part): under `diagnose run` a torch.compile job compiles exactly as
it does without it, and its compiled modules are recorded from the outside.

tests/scripts/compile_counts.py compiles a module with an all_reduce inside
(fullgraph=True), a function with dist.all_reduce and a functional all_reduce
(fullgraph=True: a graph break would raise), and a model trained for four
optimizer steps; it prints dynamo's and AOTAutograd's counters and its outputs.
"""

import json
import subprocess

from tests.support.jobs import REPO, job_env, load_run, run_diagnose, torchrun

SCRIPT = "tests/scripts/compile_counts.py"


def test_a_compiled_job_compiles_the_same_under_diagnose_and_its_steps_are_recorded(tmp_path):
    plain_json, diag_json = tmp_path / "plain.json", tmp_path / "diagnose.json"
    subprocess.run(
        torchrun(1, SCRIPT, plain_json), cwd=REPO, env=job_env(), check=True, capture_output=True, timeout=300
    )
    run_diagnose(["run", "--no-analyze", "--out", tmp_path / "run", "--", *torchrun(1, SCRIPT, diag_json)])
    plain, diag = json.loads(plain_json.read_text()), json.loads(diag_json.read_text())
    assert (plain["diagnose"], diag["diagnose"]) == (False, True)
    # the same graphs, no graph break and no recompile either way, the same numbers out
    for key in (
        "unique_graphs",
        "calls_captured",
        "aot_graphs",
        "graph_breaks",
        "recompiles",
        "outputs",
        "fsdp_modules",
    ):
        assert diag[key] == plain[key], (key, plain[key], diag[key])
    assert plain["graph_breaks"] == {} and plain["recompiles"] == {} and plain["unique_graphs"] >= 2

    # seen from the outside: every call of a compiled module is an outermost
    # forward (3 a step), the backward and the optimizer step of each of the 4 steps
    events = load_run(tmp_path / "run").events()
    counts = events.groupby("kind").size().to_dict()
    assert counts.get("forward") == 12 and counts.get("backward") == 4 and counts.get("step") == 4, counts


def test_a_graph_break_that_synchronises_is_a_host_sync_with_its_callsite(tmp_path):
    """Issue 24: `.item()` inside a compiled function breaks the graph; dynamo runs it
    eagerly, where host_sync records it: one sync per step at the user's line (on
    CUDA its detail is the device, and hidden_sync reports it inside forward)."""
    script = "tests/scripts/compile_item_break.py"
    line = [i + 1 for i, text in enumerate((REPO / script).read_text().splitlines()) if ".item() > 0" in text][0]
    run_diagnose(["run", "--no-analyze", "--out", tmp_path / "run", "--", *torchrun(1, script)])
    events = load_run(tmp_path / "run").events()
    syncs = events[events["kind"] == "sync"]
    assert set(syncs["name"]) == {"item"} and set(syncs["callsite"]) == {f"{REPO / script}:{line}"}, syncs
    assert sorted(syncs["step"]) == list(range(8))
