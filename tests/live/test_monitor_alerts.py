"""Issue 6: the live monitor's alerts on synthetic snapshots, no job: a rank's
step time, data wait or compute departing from its own recent spread, a rank
that stops recording, how often events are polled, and the robust baseline.
The same during a real job: test_live.py."""

import io
import json

import pytest

from diagnose.live.baseline import Baseline
from diagnose.live.monitor import DEPARTING_POLL_S, EVENT_POLL_S, QUIET_POLL_S, LiveMonitor


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t

    def wall(self):
        return int(self.t * 1e9)


def monitor(tmp_path, clock):
    stream = io.StringIO()
    mon = LiveMonitor(
        str(tmp_path), manifest={}, stream=stream, track=False, read_events=False, now=clock, wall_ns=clock.wall
    )
    return mon, stream


def snapshot(steps_by_rank, totals, clock, data_wait=None):
    data_wait = data_wait or {}
    return {
        r: {
            "recent_steps": [[s, ms, data_wait.get((r, s), 1.0)] for s, ms in steps[-64:]],
            "events_total": totals[r],
            "wall_ns": clock.wall(),
        }
        for r, steps in steps_by_rank.items()
    }


def test_step_time_and_data_wait_departures_alert_once(tmp_path):
    clock = Clock()
    mon, stream = monitor(tmp_path, clock)
    steps = {0: [], 1: []}
    waits = {}
    for s in range(30):
        for r in (0, 1):
            slow = r == 1 and s >= 15
            steps[r].append((s, 100.0 + (s % 3) + (400.0 if slow else 0.0)))
            if r == 0 and s >= 20:
                waits[(r, s)] = 60.0
        clock.t += 0.3
        mon.tick(snapshot(steps, {0: s, 1: s}, clock, waits))
    text = stream.getvalue()
    lines = [line for line in text.splitlines() if "ALERT" in line]
    assert sum("ALERT rank 1:" in line and "step 16 took" in line for line in lines) == 1, text
    assert sum("ALERT rank 0:" in line and "data wait" in line for line in lines) == 1, text
    assert len(lines) == 2, text
    records = [json.loads(line) for line in (tmp_path / "alerts.jsonl").read_text().splitlines()]
    assert [(r["rank"], r["kind"]) for r in records] == [(1, "step_time"), (0, "data_wait")]


class ComputeFeed:
    """Stands in for ComputeReader: hands the monitor each rank's compute of the
    steps completed since its last poll (the test sets `latest`; the newest step
    is held back, as the reader does)."""

    def __init__(self, compute, silent_polls=0):
        self.compute, self.done_step, self.sent, self.latest = compute, {}, 0, 0
        self.polls, self.silent_polls = 0, silent_polls

    def poll(self, ranks):
        self.polls += 1
        if self.polls <= self.silent_polls:
            return {}  # no part written yet, or none readable
        out = {
            r: [(s, self.compute(r, s), self.compute(r, s) + 20.0) for s in range(self.sent, self.latest)]
            for r in ranks
        }
        self.sent = self.latest
        self.done_step = {r: self.sent - 1 for r in ranks}
        return out


@pytest.mark.parametrize(
    "slow_ranks, silent_polls, alerted",
    [
        ({1}, 0, [1]),
        ({0, 1, 2}, 0, []),
        # compute first read after the step times departed (CI's test_live failure)
        ({1}, 4, [1]),
    ],
)
def test_compute_names_one_slow_rank_but_not_a_job_wide_slowdown(tmp_path, slow_ranks, silent_polls, alerted):
    """One rank's own compute growing names it, and the others' step times,
    longer as they wait for it, are not alerts; most ranks' compute growing in
    the same steps is the machine or the job (a note, no alert)."""
    clock = Clock()
    mon, stream = monitor(tmp_path, clock)
    mon.reader = ComputeFeed(
        lambda r, s: 100.0 + (s % 3) + (300.0 if r in slow_ranks and 12 <= s < 20 else 0.0), silent_polls
    )
    steps = {0: [], 1: [], 2: [], 3: []}
    for s in range(32):
        for r in steps:
            steps[r].append((s, 120.0 + (300.0 if slow_ranks and 12 <= s < 20 else 0.0)))
        clock.t += 0.5
        mon.reader.latest = s
        mon.tick(snapshot(steps, {r: s for r in steps}, clock))
    mon.close(0)
    text = stream.getvalue()
    alerts = (
        [json.loads(line) for line in (tmp_path / "alerts.jsonl").read_text().splitlines()]
        if (tmp_path / "alerts.jsonl").exists()
        else []
    )
    assert [a["rank"] for a in alerts] == alerted, text
    assert all(a["kind"] == "compute" and 12 < a["step"] <= 16 for a in alerts), alerts
    assert ("slowed down together" in text) == (not alerted), text


def _steps_polled(tmp_path, n_steps, tick_s, step_ms, compute_ms):
    """Three ranks, one step each per tick of tick_s: step_ms(step) on every rank and
    compute_ms(rank, step) from a ComputeFeed. (steps at which events were polled, monitor)"""
    clock = Clock()
    mon, _ = monitor(tmp_path, clock)
    mon.reader = ComputeFeed(compute_ms)
    steps, polled_at = {0: [], 1: [], 2: []}, []
    for s in range(n_steps):
        for r in steps:
            steps[r].append((s, step_ms(s)))
        clock.t += tick_s
        mon.reader.latest = s
        polls = mon.reader.polls
        mon.tick(snapshot(steps, {r: s for r in steps}, clock))
        if mon.reader.polls > polls:
            polled_at.append(s)
    return polled_at, mon


def test_events_are_polled_rarely_until_a_step_time_departs(tmp_path):
    """A poll's pandas breakdown was half this process's CPU: while no step time
    departs it runs every QUIET_POLL_S, and at once (then every DEPARTING_POLL_S)
    when one does, so the slow rank is still named within a few steps."""
    polled_at, _ = _steps_polled(
        tmp_path,
        170,
        0.5,
        lambda s: 120.0 + (s % 3) + (300.0 if s >= 150 else 0.0),
        lambda r, s: 100.0 + (s % 3) + (300.0 if r == 1 and s >= 150 else 0.0),
    )
    quiet = [b - a for a, b in zip(polled_at, polled_at[1:]) if 20 <= a and b < 150]
    assert quiet and min(quiet) * 0.5 >= QUIET_POLL_S >= 5 * EVENT_POLL_S, polled_at
    departed = [p for p in polled_at if p >= 150]
    assert departed[0] - 150 <= DEPARTING_POLL_S / 0.5 and departed[1] - departed[0] <= DEPARTING_POLL_S / 0.5, (
        polled_at
    )
    alerts = [json.loads(line) for line in (tmp_path / "alerts.jsonl").read_text().splitlines()]
    assert [(a["rank"], a["kind"]) for a in alerts] == [(1, "compute")] and alerts[0]["step"] <= 156, alerts


def test_a_doubled_step_under_the_step_alert_polls_fast_and_names_the_rank_soon(tmp_path):
    """A rank whose compute more than doubles doubles the job's step: under the step
    alert's limit (median + 5 x 25%), so only WATCH_RATIO brings the polls forward;
    before, the alert waited for a quiet poll (5 s on average, bench/live_alert_latency.py)."""
    from diagnose.live.monitor import WATCH_RATIO

    # ~4 steps a second: one tick a step
    polled_at, mon = _steps_polled(
        tmp_path,
        115,
        0.25,
        lambda s: 70.0 + (s % 3) + (70.0 if s >= 100 else 0.0),
        lambda r, s: 50.0 + (s % 3) + (70.0 if r == 1 and s >= 100 else 0.0),
    )
    assert not mon.pending_step_alerts and WATCH_RATIO < 1.9  # the steps never alerted: a watch only
    after = [p for p in polled_at if p >= 100]
    assert after and after[0] - 100 <= DEPARTING_POLL_S / 0.25, polled_at
    alerts = [json.loads(line) for line in (tmp_path / "alerts.jsonl").read_text().splitlines()]
    assert [(a["rank"], a["kind"]) for a in alerts] == [(1, "compute")], alerts
    assert alerts[0]["step"] <= 101 + 2 * DEPARTING_POLL_S / 0.25, alerts  # within ~2 s


def test_a_rank_that_stops_recording_while_others_go_on_is_reported(tmp_path):
    clock = Clock()
    mon, stream = monitor(tmp_path, clock)
    steps = {0: [], 1: []}
    totals = {0: 0, 1: 0}
    for i in range(80):
        for r in (0, 1):
            if r == 1 and i >= 40:
                continue  # rank 1 is stuck from here on
            steps[r].append((i, 200.0))
            totals[r] += 10
        clock.t += 0.25
        mon.tick(snapshot(steps, totals, clock))
    alerts = [line for line in stream.getvalue().splitlines() if "ALERT" in line]
    assert len(alerts) == 1 and "diagnose: ALERT rank 1:" in alerts[0], alerts
    assert "recorded nothing" in alerts[0]


def test_the_monitor_never_raises(tmp_path):
    clock = Clock()
    mon, stream = monitor(tmp_path, clock)
    for bad in (
        {0: {"recent_steps": "garbage"}},
        {0: {"recent_steps": [[1, "x", None]]}},
        {0: None},
        {0: {"events_total": object()}},
    ):
        mon.tick(bad)
    mon.close(0)
    warnings = [line for line in stream.getvalue().splitlines() if "warning" in line]
    assert len(warnings) <= 1


def test_baseline_is_robust_and_floored():
    base = Baseline(k=5.0, rel_floor=0.25, abs_floor=5.0)
    for v in [100, 102, 98, 101, 99, 500, 100]:
        assert base.update(v) is None  # one outlier is not an episode
    assert base.update(400) is None and base.update(420) is not None
    flat = Baseline(k=5.0, rel_floor=0.25, abs_floor=5.0)
    for v in [10.0] * 10:
        flat.update(v)
    assert flat.threshold()[1] == 10.0 + 5 * 5.0  # the floor, not MAD = 0


def test_the_compute_read_from_parts_is_net_of_the_ranks_waits_for_a_core(tmp_path):
    """A rank's compute is its own work: in step 1 its forward waited 60 ms of its 80
    for a core (runnable, not running: queued_ns, Linux's run delay). Kept off a core
    by its neighbours it did not slow down: the step's 100 ms less 60, not 100 (the
    live alert once named a rank beside the slowed one at 106 ms of such "compute"
    in a loaded suite)."""
    import pyarrow.parquet as pq

    from collectors.schema import event_row, events_table
    from diagnose.live.compute_reader import ComputeReader

    ms = 1_000_000
    rank_dir = tmp_path / "traces" / "rank-00000"
    rank_dir.mkdir(parents=True)
    rows = []
    for step in range(3):
        t0 = step * 100 * ms
        rows.append(event_row("step", "step", t0, t0 + 100 * ms, step=step))
        rows.append(event_row("forward", "forward", t0, t0 + 80 * ms, step=step, queued_ns=60 * ms if step == 1 else 0))
    pq.write_table(events_table(rows), rank_dir / "events-000001.parquet")
    computed = {step: compute for step, compute, _ in ComputeReader(str(tmp_path)).poll([0])[0]}
    # (the newest step is held back until the next one)
    assert computed == {0: pytest.approx(100.0), 1: pytest.approx(40.0)}
