"""Issue 24 (part): today's stacks under `diagnose run` (tests/scripts/modern_stack.py,
2 ranks on gloo, 5 steps). Collectives issued through torch.distributed's
functional API (DTensor's tensor parallelism) are recorded as torch.distributed
calls are; FSDP2's name the unit they serve; torch.distributed.pipelining's
stages and micro-batches come from the schedule; no job's numbers change.
"""

import json
import subprocess

from tests.support.jobs import REPO, job_env, load_run, run_diagnose, torchrun

SCRIPT = "tests/scripts/modern_stack.py"


def _line_of(text: str) -> int:
    lines = (REPO / SCRIPT).read_text().splitlines()
    (number,) = [i + 1 for i, line in enumerate(lines) if text in line]
    return number


FORWARD_LINE, LOSS_LINE = _line_of("return self.down("), _line_of("loss = model(x)")


def _run_both(tmp_path, stack: str, report=False):
    """The job plain and under `diagnose run`: its loaded run, after checking the losses agree
    (`report`: the run writes report.html too)."""
    plain, traced = tmp_path / "plain.json", tmp_path / "traced.json"
    proc = subprocess.run(
        torchrun(2, SCRIPT, stack, plain), cwd=REPO, env=job_env(), capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_diagnose(
        ["run", "--out", tmp_path / "run", "--", *torchrun(2, SCRIPT, stack, traced)],
        env=job_env(outputs=report, DIAGNOSE_TRACKING="off"),
    )
    assert json.loads(traced.read_text()) == json.loads(plain.read_text())  # the job's numbers unchanged
    return load_run(tmp_path / "run")


def test_dtensor_all_reduces_are_recorded_matched_and_waited(tmp_path):
    """The row-parallel layer's output is a partial sum that DTensor all-reduces
    through funcol.all_reduce, once per forward; the result is an
    AsyncCollectiveTensor, waited when the loss first uses it."""
    run = _run_both(tmp_path, "dtensor")
    calls = run.collectives()
    functional = calls[calls["detail"] == "functional"]
    for rank in (0, 1):
        mine = functional[functional["rank"] == rank]
        # one all_reduce per step, issued from the model's forward, on the TP group of both ranks
        assert mine["name"].tolist() == ["all_reduce"] * 5 and mine["step"].tolist() == [0, 1, 2, 3, 4]
        assert set(mine["group_ranks"]) == {"0,1"} and (mine["bytes"] == 16 * 32 * 4).all()
        assert mine["callsite"].str.endswith(f"modern_stack.py:{FORWARD_LINE}").all(), mine["callsite"].tolist()
        # async, and waited where the loss first reads the result
        assert mine["async_op"].all() and mine["wait_start_ns"].notna().all()
        waited_at = mine["wait_callsite"]
        assert waited_at.str.endswith(f"modern_stack.py:{LOSS_LINE}").all(), waited_at.tolist()
        assert (mine["wait_start_ns"] >= mine["return_ns"]).all()
    # the two ranks' calls are one instance each: the same (group, seq) on both
    arrivals = run.arrivals()
    mine = arrivals[arrivals["seq"].isin(functional["seq"])]
    assert mine.groupby(["group", "seq"])["rank"].nunique().tolist() == [2] * 5 and (mine["members"] == 2).all()


def test_fsdp2_collectives_name_their_unit(tmp_path):
    """Three layers sharded as units of their own and the root (the head) as one
    more. Each all-gather and reduce-scatter row names the unit it serves
    (detail fsdp:<module>): a layer gathers twice a step (forward, then again
    for backward: resharded after forward), the root once (kept), and each
    reduces its gradients once."""
    run = _run_both(tmp_path, "fsdp2", report=True)
    calls = run.collectives()
    calls = calls[calls["step"].between(0, 4)]
    for rank in (0, 1):
        mine = calls[calls["rank"] == rank]
        per_step = mine.groupby([mine["name"].str.split("_").str[0], "detail"]).size() / 5
        assert per_step.to_dict() == {
            ("all", "fsdp:<root>"): 1,
            ("all", "fsdp:layers.0"): 2,
            ("all", "fsdp:layers.1"): 2,
            ("all", "fsdp:layers.2"): 2,
            ("reduce", "fsdp:<root>"): 1,
            ("reduce", "fsdp:layers.0"): 1,
            ("reduce", "fsdp:layers.1"): 1,
            ("reduce", "fsdp:layers.2"): 1,
        }, per_step
    # 32-wide layers: communication dominates, and the finding speaks FSDP2: its knobs, and
    # how long each unit's collectives blocked the training thread
    findings = json.loads((tmp_path / "run" / "analysis" / "findings.json").read_text())
    (exposed,) = [f for f in findings if f["kind"] == "exposed_comm"]
    for knob in ("set_modules_to_forward_prefetch", "reshard_after_forward", "fully_shard"):
        assert knob in exposed["recommendation"], exposed["recommendation"]
    units = {k: v for k, v in exposed["metrics"].items() if k.startswith("fsdp_blocked_ms_per_step")}
    assert set(units) == {f"fsdp_blocked_ms_per_step[{u}]" for u in ("<root>", "layers.0", "layers.1", "layers.2")}
    assert all(v > 0 for v in units.values())
    top = max(units, key=units.get)[len("fsdp_blocked_ms_per_step[") : -1]
    assert f"most exposed unit is {top} " in exposed["recommendation"]
    # prefetch overlap: on gloo FSDP2's all-gathers are synchronous calls, so nothing is in
    # flight while the thread computes: all of it exposed (the report says so per unit)
    table = run.fsdp_unit_comm()
    assert set(zip(table["unit"], table["op"])) == {
        (u, op)
        for u in ("<root>", "layers.0", "layers.1", "layers.2")
        for op in ("all_gather_single", "reduce_scatter_single")
    }
    assert (table["exposed_ms_per_step"] > 0).all() and (table["overlapped_ms_per_step"] == 0).all(), table
    for row in table[table["op"] == "all_gather_single"].itertuples():
        assert exposed["metrics"][f"fsdp_all_gather_overlapped_ms_per_step[{row.unit}]"] == 0.0
    assert 'id="fsdp-units"' in (tmp_path / "run" / "report.html").read_text()


def test_fsdp_unit_comm_splits_in_flight_time_from_blocked_time():
    """An async all-gather issued (1 ms), in flight 6 ms while the thread computes,
    then waited 2 ms: 3 ms exposed, 6 overlapped; a sync reduce-scatter of 4 ms: all
    exposed. Per step, median over ranks."""
    import numpy as np
    import pandas as pd

    from diagnose.analysis.tables.fsdp_units import fsdp_unit_comm

    ms = 1_000_000
    rows = []
    for rank in (0, 1):
        for step in (1, 2):
            t = step * 100 * ms
            rows.append(
                dict(
                    rank=rank,
                    step=step,
                    name="all_gather_into_tensor",
                    detail="fsdp:layers.0",
                    issue_ns=t,
                    return_ns=t + ms,
                    wait_start_ns=t + 7 * ms,
                    wait_end_ns=t + 9 * ms,
                )
            )
            rows.append(
                dict(
                    rank=rank,
                    step=step,
                    name="reduce_scatter_tensor",
                    detail="fsdp:layers.0",
                    issue_ns=t + 20 * ms,
                    return_ns=t + 24 * ms,
                    wait_start_ns=np.nan,
                    wait_end_ns=np.nan,
                )
            )
    rows.append(
        dict(
            rank=0,
            step=1,
            name="all_reduce",
            detail="",
            issue_ns=0,
            return_ns=5 * ms,
            wait_start_ns=np.nan,
            wait_end_ns=np.nan,
        )
    )  # not FSDP: left out
    table = fsdp_unit_comm(pd.DataFrame(rows), steady=[1, 2]).set_index("op")
    assert table.loc["all_gather_into_tensor", "exposed_ms_per_step"] == 3.0
    assert table.loc["all_gather_into_tensor", "overlapped_ms_per_step"] == 6.0
    assert table.loc["all_gather_into_tensor", "overlapped_frac"] == 6.0 / 9.0
    assert table.loc["reduce_scatter_tensor", "exposed_ms_per_step"] == 4.0
    assert table.loc["reduce_scatter_tensor", "overlapped_ms_per_step"] == 0.0
    assert list(table.index) == ["reduce_scatter_tensor", "all_gather_into_tensor"]  # most exposed first


def test_pipelining_schedules_give_stages_and_micro_batches(tmp_path):
    """torch.distributed.pipelining, 2 stages, 1F1B with 2 micro-batches, no
    phases marked by the job: each stage's forward and backward of each
    micro-batch is a phase carrying the schedule's stage index and micro-batch,
    the pipeline detectors judge the job by those stages, and the bubble's
    theory is the idle the schedule's own action order implies (1/3)."""
    run = _run_both(tmp_path, "pipelining")
    events = run.events()
    phases = events[(events["kind"] == "phase") & events["step"].between(0, 4)]
    for rank in (0, 1):
        for name in ("forward", "backward"):
            mine = phases[(phases["rank"] == rank) & (phases["name"] == name)]
            assert set(mine["stage"]) == {rank}, (rank, name)
            assert mine.groupby("step")["microbatch"].apply(sorted).tolist() == [[0, 1]] * 5, (rank, name)
    from diagnose.analysis.tables.pipeline_topology import rank_stages

    assert rank_stages(events) == {0: 0, 1: 1}
    compute = run.breakdown().groupby("rank")[["forward_ms", "backward_ms"]].sum()
    assert (compute > 0).all().all(), compute  # per-stage compute
    schedule = run.rank_meta[0]["pipeline_schedule"]
    assert schedule["schedule"] == "Schedule1F1B" and schedule["microbatches"] == 2
    findings = json.loads((tmp_path / "run" / "analysis" / "findings.json").read_text())
    (bubble,) = [f for f in findings if f["kind"] == "pipeline_bubble"]
    assert bubble["metrics"]["stages"] == 2 and bubble["metrics"]["microbatches"] == 2
    assert bubble["metrics"]["theory_from_schedule"] == 1.0
    assert abs(bubble["metrics"]["theoretical_bubble_frac"] - 1 / 3) < 1e-3  # (findings.json: 4 digits)
    assert "Schedule1F1B's own action order: 33%" in bubble["title"], bubble["title"]
