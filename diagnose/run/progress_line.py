"""The one-line progress display of `diagnose run`: steps across ranks and the
rank the others wait for, from rundir.progress.read_progress snapshots.

The rank named is the one the live monitor's child found the others waiting
for at collectives (arrival lag, diagnose/live/arrivals.py, via <run>/live.json),
not the lowest index among ranks tied on step count: in a synchronous job every
rank finishes every step, so step counts tie whoever is slow. Until every rank
that started (its folder exists) has reported, the line says which it waits for."""

import sys
import time

from diagnose import rundir
from diagnose.live.rank_gauges import read_live_state


class ProgressLine:
    """At most once a second on a terminal (rewritten in place), every 10 s
    otherwise (so logs stay readable)."""

    def __init__(self, stream=sys.stderr, run_dir: str | None = None):
        self.stream, self.run_dir = stream, run_dir
        self.tty = stream.isatty()
        self.every_s = 1.0 if self.tty else 10.0
        self.last_print = 0.0
        self.last_text = ""

    def tick(self, progress: dict[int, dict]) -> None:
        now = time.monotonic()
        if now - self.last_print < self.every_s:
            return
        text = self.text(progress)
        if text is None or (text == self.last_text and not self.tty):
            return
        self.last_print, self.last_text = now, text
        if self.tty:
            self.stream.write("\r" + text.ljust(100)[:120])
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def text(self, progress: dict[int, dict]) -> str | None:
        steps = {r: int(p.get("steps_done") or 0) for r, p in progress.items()}
        started = self._started_ranks() | set(steps)
        if not started:
            return None
        waiting = sorted(started - set(steps))
        if waiting:
            return (
                f"diagnose: {len(steps)} of {len(started)} ranks reporting, waiting for "
                f"rank{'s' if len(waiting) > 1 else ''} {rank_spans(waiting)}"
            )
        low, high = min(steps.values()), max(steps.values())
        text = f"diagnose: {len(steps)} ranks, step {low}" + (f"-{high}" if high != low else "")
        state = read_live_state(self.run_dir) if self.run_dir else None
        waited_for = (state or {}).get("waited_for")
        if waited_for and len(steps) > 1:
            text += (
                f", the others wait for rank {waited_for['rank']} (+{waited_for['lag_ms']:.0f} ms/step at collectives)"
            )
        elif high - low >= 2:  # not a tie: a rank really is steps behind
            text += f", behind: rank {rank_spans(sorted(r for r in steps if steps[r] == low))}"
        step_ms = [p.get("last_step_ms") for p in progress.values() if p.get("last_step_ms")]
        return text + (f", last step {max(step_ms):.0f} ms" if step_ms else "")

    def _started_ranks(self) -> set:
        """Ranks whose folder exists: a launcher's worker makes it as its Python
        starts (collectors/activate.py), long before its first progress.json."""
        if self.run_dir is None:
            return set()
        ranks = (rundir.rank_of_dir(d) for d in rundir.rank_dirs(self.run_dir))
        return {r for r in ranks if r is not None}

    def close(self) -> None:
        if self.tty and self.last_text:
            self.stream.write("\n")


def rank_spans(ranks) -> str:
    """Sorted ranks as spans: [1, 2, 3, 5] -> "1-3,5"."""
    spans: list = []
    for rank in ranks:
        if spans and rank == spans[-1][1] + 1:
            spans[-1][1] = rank
        else:
            spans.append([rank, rank])
    return ",".join(f"{a}-{b}" if b > a else f"{a}" for a, b in spans)
