"""Issue 24: a pipeline schedule's bubble from its own per-rank action order
(diagnose/analysis/tables/schedule_slots.py), on the orders torch's own schedules
write. The multi-stage schedules' order generators need only the sizes, so they
are called without building stages (no process group here)."""

import torch.distributed.pipelining.schedules as torch_schedules

from diagnose.analysis.tables.schedule_slots import recorded_schedule_idle_frac


def _torch_order(cls, ranks: int, stages_per_rank: int, microbatches: int) -> dict:
    schedule = object.__new__(cls)
    schedule.pp_group_size, schedule.n_local_stages = ranks, stages_per_rank
    schedule._n_microbatches, schedule._num_stages = microbatches, ranks * stages_per_rank
    schedule.number_of_rounds = max(1, microbatches // ranks)
    schedule.microbatches_per_round = microbatches // schedule.number_of_rounds
    return {
        str(r): [str(a) for a in schedule._calculate_single_rank_operations(r) if a is not None] for r in range(ranks)
    }


def _recorded(name, order, microbatches):
    return {"schedule": name, "microbatches": microbatches, "order": order}


def test_single_stage_schedules_give_the_textbook_bubble():
    # torch 2.13's Schedule1F1B order is not what its loop runs (rank 1: 1F1 1B0 1F2 1B1):
    # the loop's own order is played
    for p, m in ((2, 2), (4, 8), (8, 4)):
        for name in ("Schedule1F1B", "ScheduleGPipe"):
            broken = {str(r): [f"{r}F{i + 1}" for i in range(m)] for r in range(p)}
            assert abs(recorded_schedule_idle_frac(_recorded(name, broken, m)) - (p - 1) / (m + p - 1)) < 1e-9


def test_interleaved_and_zero_bubble_orders_give_their_own_smaller_bubble():
    for p, v, m in ((2, 2, 4), (4, 2, 8)):
        order = _torch_order(torch_schedules.ScheduleInterleaved1F1B, p, v, m)
        # interleaving v stages per rank divides the fill and drain by v
        assert (
            abs(recorded_schedule_idle_frac(_recorded("ScheduleInterleaved1F1B", order, m)) - (p - 1) / (v * m + p - 1))
            < 1e-9
        ), (p, v, m)
    order = _torch_order(torch_schedules.ScheduleInterleavedZeroBubble, 4, 2, 8)
    zero_bubble = recorded_schedule_idle_frac(_recorded("ScheduleInterleavedZeroBubble", order, 8))
    assert 0 < zero_bubble < 3 / 19 / 2, zero_bubble  # under half the interleaved 1F1B's


def test_an_order_that_cannot_be_played_gives_no_figure():
    assert recorded_schedule_idle_frac(_recorded("MySchedule", {"0": ["0F0"], "1": ["1F1"]}, 2)) is None
    assert recorded_schedule_idle_frac({"schedule": "Schedule1F1B", "order": "x"}) is None
