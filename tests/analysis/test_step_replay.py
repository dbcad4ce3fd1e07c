"""Issue 23: the step's dependency model, replayed, gives the recorded steps back,
and a what-if saving is what removing the cause saves (synthetic runs whose
answer is known; the reference trainer's scenarios in test_scenarios.py)."""

import pandas as pd
import pytest

from diagnose.analysis.findings.run_detectors import detect
from diagnose.analysis.replay.step_replay import StepModel, job_step_ms, recorded_ends
from diagnose.analysis.replay.whatif import WhatIf
from diagnose.analysis.tables.p2p_exchanges import exchange_partners
from diagnose.analysis.tables.pipeline_topology import rank_stages
from tests.support.jobs import load_run
from tests.support.synthetic_run import write_synthetic_run


def _replay_error(run):
    model = StepModel(run.collectives(), run.steps())
    assert model.ok, model.why
    steps = run.steady_steps()
    recorded, replayed = job_step_ms(recorded_ends(model), steps), job_step_ms(model.replay(), steps)
    assert set(recorded) == set(replayed) and len(recorded) >= 10
    return max(abs(replayed[s] - recorded[s]) / recorded[s] for s in recorded)


@pytest.mark.parametrize("pp", [1, 2])
def test_replay_gives_the_recorded_steps_back(tmp_path, pp):
    run = load_run(write_synthetic_run(str(tmp_path / "run"), ranks=4, steps=20, pp=pp, slow_rank=1))
    assert _replay_error(run) <= 0.05


def test_a_stragglers_whatif_saving_is_its_excess_compute(tmp_path):
    """Rank 2 computes 1.6x as long; the others wait for it at the step's
    all-reduces: making it as fast as them saves about its excess compute."""
    run = load_run(write_synthetic_run(str(tmp_path / "run"), ranks=4, steps=30, slow_rank=2, slow_factor=1.6))
    spans = run.spans()
    compute = spans[
        (spans["kind"] == "phase")
        & spans["name"].isin(["forward", "backward", "optimizer"])
        & spans["step"].isin(run.steady_steps())
    ]
    per_rank = compute.groupby(["rank", "step"])["dur_ms"].sum().groupby("rank").mean()
    excess_ms = float(per_rank[2] - per_rank.drop(2).median())
    w = WhatIf(run, run.steady_steps(), rank_stages(run.events()))
    saving_ms, after_ms = w.straggler(2)
    assert 0.8 * excess_ms <= saving_ms <= 1.1 * excess_ms, (saving_ms, excess_ms)
    assert after_ms == pytest.approx(w.step_ms() - saving_ms)
    # a rank that is not slow saves nothing
    assert abs(w.straggler(0)[0]) < 0.1 * excess_ms
    (found,) = [f for f in detect(run) if f["kind"] == "straggler"]
    assert found["impact_ms_per_step"] == pytest.approx(saving_ms, rel=1e-3)
    assert found["metrics"]["estimate_ms_per_step"] > 0  # the detector's own figure, kept
    assert w.ideal_step_ms() < w.step_ms()


def _call(rank, name, group, seq, issue, ret, async_op=False, wait=None, exit_ns=None, peers="0,1"):
    return {
        "rank": rank,
        "kind": "p2p" if name in ("send", "recv") else "collective",
        "name": name,
        "group": group,
        "group_ranks": peers,
        "seq": seq,
        "async_op": async_op,
        "step": 0,
        "callsite": "",
        "issue_ns": issue,
        "return_ns": ret,
        "wait_start_ns": None if wait is None else wait[0],
        "wait_end_ns": None if wait is None else wait[1],
        "exit_ns": exit_ns if exit_ns is not None else (ret if wait is None else wait[1]),
    }


def test_a_send_and_its_receive_are_a_rendezvous():
    """Rank 0 computes 10 then sends; rank 1 posts its receive at 2 and waits: the
    receive ends when the send arrives. Shrink rank 0's compute and rank 1's wait
    shrinks with it."""
    ms = 1_000_000
    calls = pd.DataFrame(
        [
            _call(0, "send", "0->1", 0, 10 * ms, 11 * ms),
            _call(1, "recv", "0->1", 0, 2 * ms, 11 * ms),
        ]
    )
    steps = pd.DataFrame({"rank": [0, 1], "step": [0, 0], "start_ns": [0, 0], "end_ns": [12 * ms, 13 * ms]})
    model = StepModel(calls, steps)
    ends = model.replay()
    assert ends[0][0] == 12 * ms and ends[1][0] == 13 * ms
    faster = {0: model.gaps[0].copy(), 1: model.gaps[1]}
    faster[0][0] -= 6 * ms  # rank 0 sends at 4 instead of 10
    ends = model.replay(gaps=faster)
    assert ends[0][0] == 6 * ms and ends[1][0] == 7 * ms


def _p2p(rank, name, group, issue, wait, peer):
    return {**_call(rank, name, group, 0, issue, issue, async_op=True, wait=wait), "peer": peer}


def test_a_lone_send_waited_at_once_is_waited_at_the_schedules_end():
    """Rank 0 computes 10 ms, sends and waits: rank 1 posts the receive at 20, so the
    send ends at 21; rank 0 computes 10 more and receives the answer rank 1 sent at 25
    (1 ms each). Waited at the end of the schedule instead (its last p2p op), the send
    frees rank 0 at 10: it receives at 20, gets the answer at 26, and the step ends 6 ms
    sooner. The send still ends only when its receiver arrived."""
    ms = 1_000_000
    calls = pd.DataFrame(
        [
            _p2p(0, "send", "0->1", 10 * ms, (10 * ms, 21 * ms), 1),
            _p2p(0, "recv", "1->0", 31 * ms, (31 * ms, 32 * ms), 1),
            _p2p(1, "recv", "0->1", 20 * ms, (20 * ms, 21 * ms), 0),
            _p2p(1, "send", "1->0", 25 * ms, (25 * ms, 32 * ms), 0),
        ]
    )
    steps = pd.DataFrame({"rank": [0, 1], "step": [0, 0], "start_ns": [0, 0], "end_ns": [33 * ms, 33 * ms]})
    model = StepModel(calls, steps)
    assert model.replay() == {0: {0: 33 * ms}, 1: {0: 33 * ms}}
    assert model.defer_p.sum() == 1  # rank 0's send: its receive comes after 10 ms of compute
    assert model.replay(defer=model.defer_p) == {0: {0: 27 * ms}, 1: {0: 27 * ms}}


def test_a_send_exchanged_with_its_peers_receive_becomes_one_batch():
    """Rank 0 sends then receives from rank 1, rank 1 receives then sends, one after
    the other (0.3 ms of host time between the two calls), 2 ms each: posted as one
    batch, both transfers run at once, the second call and the time before it go with
    the first, and the step ends 2.3 ms sooner. A receive from another peer, or one
    after compute, is no exchange."""
    ms = 1_000_000
    later = 12 * ms + 3 * ms // 10
    calls = pd.DataFrame(
        [
            _p2p(0, "send", "0->1", 10 * ms, (10 * ms, 12 * ms), 1),
            _p2p(0, "recv", "1->0", later, (later, later + 2 * ms), 1),
            _p2p(1, "recv", "0->1", 10 * ms, (10 * ms, 12 * ms), 0),
            _p2p(1, "send", "1->0", later, (later, later + 2 * ms), 0),
        ]
    )
    steps = pd.DataFrame({"rank": [0, 1], "step": [0, 0], "start_ns": [0, 0], "end_ns": [later + 3 * ms] * 2})
    assert list(exchange_partners(calls)) == [1, -1, 3, -1]
    model = StepModel(calls, steps)
    assert model.replay() == {0: {0: later + 3 * ms}, 1: {0: later + 3 * ms}}
    assert model.replay(defer=model.defer_p) == {0: {0: 13 * ms}, 1: {0: 13 * ms}}
    other_peer = calls.assign(peer=[1, 2, 0, 0])
    assert list(exchange_partners(other_peer)) == [-1, -1, 3, -1]
    after_compute = calls.assign(issue_ns=calls["issue_ns"] + [0, ms // 2, 0, 0])
    assert list(exchange_partners(after_compute)) == [-1, -1, 3, -1]


def test_async_collectives_queue_on_their_group():
    """Two bucket all-reduces issued at 1 and 2 ms run one after the other (1-9,
    9-17): the second's own length starts at the first's end, not at its issue;
    the rank waits for them at 5 ms and ends its step 1 ms after the second."""
    ms = 1_000_000
    calls = pd.DataFrame(
        [
            _call(r, "all_reduce", "g", seq, issue, issue + ms // 10, async_op=True, wait=wait, exit_ns=wait[1])
            for r in (0, 1)
            for seq, issue, wait in ((0, 1 * ms, (5 * ms, 9 * ms)), (1, 2 * ms, (9 * ms + ms // 10, 17 * ms)))
        ]
    )
    steps = pd.DataFrame({"rank": [0, 1], "step": [0, 0], "start_ns": [0, 0], "end_ns": [18 * ms, 18 * ms]})
    model = StepModel(calls, steps)
    assert list(model.length_ns) == [8 * ms, 8 * ms]
    assert model.replay()[0][0] == 18 * ms
    # communication fully overlapped: the waits end as they start
    assert model.replay(length_ns=model.length_ns * 0)[0][0] == pytest.approx(6.1 * ms)


def test_a_bubbles_whatif_is_the_schedules_fill_and_drain():
    """p stages fill and drain in (p - 1) micro-batch times of the slowest stage:
    4 stages busy 80 ms per step in 2 micro-batches idle 3 x 40 ms; in 8, 3 x 10 ms."""
    from diagnose.analysis.detectors.pipeline_bubble import schedule_saving_ms

    assert schedule_saving_ms(80.0, 4, 2, 8) == pytest.approx(120.0 - 30.0)
    assert schedule_saving_ms(80.0, 4, 8, 8) == 0.0
