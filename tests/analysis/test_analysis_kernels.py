"""The analyzer's vectorized kernels against plain per-row Python on small
random tables: the step breakdown's painting, DDP tails, rank -> stage, and the
"started inside a window" test of hidden_sync. Plus the analyzer process's
allocator settings (diagnose/cli/allocator.py)."""

import random
import subprocess
import sys

import pandas as pd

from diagnose.analysis.tables.breakdown import CATEGORIES, PRIORITY, ddp_tail_intervals, step_breakdown
from diagnose.analysis.tables.per_rank import started_inside
from diagnose.analysis.tables.pipeline_topology import rank_stages

UNIT_NS = 1000  # every time is a multiple: the brute force checks each unit
KINDS = ("data", "sync", "optimizer", "backward", "forward", "collective")


def _events(rows):
    columns = ["rank", "kind", "name", "group", "detail", "start_ns", "end_ns"]
    frame = pd.DataFrame(rows, columns=columns)
    for column in ("kind", "name", "group", "detail"):
        frame[column] = frame[column].astype("category")
    return frame


def _random_run(rng, ranks=(0, 3, 7), steps=3, step_units=60):
    events, steps_rows = [], []
    for rank in ranks:
        for step in range(steps):
            begin = (step * (step_units + 5) + rank) * UNIT_NS
            steps_rows.append((rank, step, begin, begin + step_units * UNIT_NS))
            for _ in range(12):
                a = rng.randrange(-5, step_units + 5)
                b = a + rng.randrange(0, 20)
                events.append((rank, rng.choice(KINDS), "op", "", "", begin + a * UNIT_NS, begin + b * UNIT_NS))
    steps_table = pd.DataFrame(steps_rows, columns=["rank", "step", "start_ns", "end_ns"])
    return _events(events), steps_table.sample(frac=1, random_state=1)  # any row order


def _brute_force_breakdown(events, steps):
    prio = {
        "data": "data_wait",
        "sync": "host_sync",
        "collective": "exposed_comm",
        "optimizer": "optimizer",
        "backward": "backward",
        "forward": "forward",
    }
    out = {}
    for rank, step, begin, end in steps.itertuples(index=False):
        mine = events[events["rank"] == rank]
        ms = dict.fromkeys(CATEGORIES, 0.0)
        for t in range(begin, end, UNIT_NS):
            active = [
                PRIORITY[prio[k]] for k, s, e in zip(mine["kind"], mine["start_ns"], mine["end_ns"]) if s <= t < e
            ]
            if active:
                ms[CATEGORIES[min(active)]] += UNIT_NS / 1e6
        out[(rank, step)] = ms
    return out


def test_breakdown_paints_each_instant_with_its_highest_priority_category():
    rng = random.Random(7)
    for _ in range(5):
        events, steps = _random_run(rng)
        table = step_breakdown(events, steps)
        expected = _brute_force_breakdown(events, steps)
        assert len(table) == len(steps)
        assert list(table["rank"]) == sorted(table["rank"])  # rank, then start order
        for row in table.itertuples(index=False):
            want = expected[(row.rank, row.step)]
            for category in CATEGORIES:
                assert abs(getattr(row, f"{category}_ms") - want[category]) < 1e-9, (row, category)
            assert abs(row.other_ms - (row.step_ms - sum(want.values()))) < 1e-9


def test_ddp_tail_runs_from_last_bucket_issue_to_its_completion_within_backward():
    u = UNIT_NS
    events = _events(
        [
            # rank 0: backward [0, 100); buckets issued (row end) at 30 and 60, last done at 80
            (0, "backward", "backward", "", "", 0, 100 * u),
            (0, "collective", "all_reduce", "dp", "ddp backward", 20 * u, 30 * u),
            (0, "collective", "all_reduce", "dp", "ddp backward", 50 * u, 60 * u),
            (0, "done", "all_reduce", "dp", "ddp backward", 80 * u, 80 * u),
            # rank 1: a bucket done after backward ended: the tail stops at the backward's end
            (1, "backward", "backward", "", "", 0, 100 * u),
            (1, "collective", "all_reduce", "dp", "ddp backward", 40 * u, 70 * u),
            (1, "done", "all_reduce", "dp", "ddp backward", 130 * u, 130 * u),
            # rank 2: a bucket outside any backward has no tail; not a DDP row either
            (2, "backward", "backward", "", "", 0, 10 * u),
            (2, "collective", "all_reduce", "dp", "ddp backward", 40 * u, 50 * u),
            (2, "collective", "all_reduce", "tp", "", 2 * u, 5 * u),
        ]
    )
    tails = ddp_tail_intervals(events)
    assert [tuple(map(int, row)) for row in tails[["rank", "start_ns", "end_ns"]].itertuples(index=False)] == [
        (0, 60 * u, 80 * u),
        (1, 70 * u, 100 * u),
    ]


def test_rank_stage_is_the_most_frequent_stage_lowest_on_a_tie():
    events = pd.DataFrame({"rank": [0, 0, 0, 1, 1, 2, 2, 2], "stage": [1, 1, 0, 3, 2, -1, -1, 5]})
    assert rank_stages(events) == {0: 1, 1: 2, 2: 5}
    assert rank_stages(events[events["stage"] < 0]) == {}


def test_started_inside_matches_a_per_row_check():
    rng = random.Random(3)
    windows = pd.DataFrame(
        [(r, s, s + rng.randrange(1, 30)) for r in (0, 1, 5) for s in rng.sample(range(0, 500, 40), 8)],
        columns=["rank", "start_ns", "end_ns"],
    )
    rows = pd.DataFrame(
        [(rng.choice((0, 1, 2, 5)), rng.randrange(0, 520)) for _ in range(300)], columns=["rank", "start_ns"]
    )
    expected = []
    for rank, t in rows.itertuples(index=False):
        mine = windows[(windows["rank"] == rank) & (windows["start_ns"] <= t)].sort_values("start_ns")
        expected.append(bool(len(mine)) and t <= mine["end_ns"].iloc[-1])
    assert list(started_inside(rows, windows)) == expected
    assert len(started_inside(rows.iloc[:0], windows)) == 0


def test_cli_process_keeps_freed_memory_for_reuse():
    """The `diagnose` command sets the allocator up; a plain import does not."""
    code = (
        "import atexit, sys, pyarrow as pa\n"
        "from numpy._core import multiarray\n"
        "state = lambda: (pa.default_memory_pool().backend_name, multiarray._get_madvise_hugepage())\n"
        "import diagnose.cli\n"
        "print(state())\n"
        "atexit.register(lambda: print(state()))\n"
        "diagnose.cli.main(['--help'])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    lines = out.strip().splitlines()
    assert lines[0] != "('system', False)"  # the libraries' defaults (mimalloc or jemalloc, huge pages)
    assert lines[-1] == "('system', False)"
