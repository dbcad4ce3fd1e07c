"""The live monitor's heartbeat alerts: a rank that recorded nothing for a
while as the other ranks went on ("stalled": stuck), and a rank whose recorder
stopped writing progress.json while the others still write ("heartbeat": the
process is frozen, stopped or gone). A rank that ended its script is neither.
"""

import json
import os

import numpy as np

from diagnose import rundir


class HeartbeatWatch:
    """Ticked by the LiveMonitor, whose step-time baselines say how long a stall
    is for each rank and whose `alert` records what it finds."""

    def __init__(self, run_dir: str, baselines, last_step: dict, alert, wall_ns):
        self.run_dir = run_dir
        self.baselines = baselines  # the monitor's: rank -> its baselines (the step time's typical length)
        self.last_step = last_step  # the monitor's: rank -> last step seen in progress
        self.alert = alert  # the monitor's _alert(rank, kind, step, value, median, limit, text)
        self.wall_ns = wall_ns
        self.heartbeat: dict = {}  # rank -> [events_total, changed_at, alerted]
        self.stale_alerted: set = set()

    def tick(self, progress: dict, now: float) -> None:
        """After the monitor's tick has taken in `progress` (its last_step)."""
        wall = self.wall_ns()
        for rank, snap in progress.items():
            total = snap.get("events_total")
            state = self.heartbeat.get(rank)
            if state is None or total != state[0]:
                self.heartbeat[rank] = [total, now, False]
        if len(self.heartbeat) < 2:
            return
        for rank, (_total, changed_at, alerted) in self.heartbeat.items():
            if alerted:
                continue
            base = self.baselines[rank]["step"]
            typical_s = (float(np.median(base.values)) / 1000) if base.values else 1.0
            stall_s = max(10.0, 5 * typical_s)
            others = [s[1] for r, s in self.heartbeat.items() if r != rank]
            lead_s = max(2.0, 2 * typical_s)
            if now - changed_at >= stall_s and max(others) - changed_at >= lead_s:
                self.heartbeat[rank][2] = True
                if self.rank_finished(rank):
                    continue  # it ended its script earlier than the others: not stuck
                self.alert(
                    rank,
                    "stalled",
                    self.last_step.get(rank, -1) + 1,
                    (now - changed_at) * 1000,
                    typical_s * 1000,
                    stall_s * 1000,
                    f"recorded nothing for {now - changed_at:.0f} s (in step "
                    f"{self.last_step.get(rank, -1) + 1}) while the other ranks went on "
                    f"for {max(others) - changed_at:.0f} s more: it is stuck",
                )
        fresh = {r: (wall - int(s.get("wall_ns") or 0)) / 1e9 for r, s in progress.items()}
        for rank, age in fresh.items():
            if age < 15.0 or rank in self.stale_alerted:
                continue
            if not any(a < 5.0 for r, a in fresh.items() if r != rank):
                continue  # nobody writes: the whole job (or machine) paused or ended
            if self.rank_finished(rank):
                continue
            self.stale_alerted.add(rank)
            self.alert(
                rank,
                "heartbeat",
                self.last_step.get(rank, -1) + 1,
                age * 1000,
                500.0,
                15000.0,
                f"its recorder has not written for {age:.0f} s while the others "
                "do: the process is frozen, stopped or gone",
            )

    def rank_finished(self, rank) -> bool:
        """Whether the rank's recorder closed its run (meta.json's end time)."""
        path = os.path.join(self.run_dir, rundir.TRACES, f"rank-{rank:05d}", "meta.json")
        try:
            with open(path, encoding="utf-8") as f:
                return "end_wall_ns" in json.load(f)
        except (OSError, ValueError):
            return False
