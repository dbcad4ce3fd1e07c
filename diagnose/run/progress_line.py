"""The one-line progress display of `diagnose run`: steps per rank and the
slowest rank, from rundir.progress.read_progress snapshots."""
import sys
import time


class ProgressLine:
    """Steps per rank and the slowest rank, at most once a second on a terminal
    (rewritten in place), every 10 s otherwise (so logs stay readable)."""

    def __init__(self, stream=sys.stderr):
        self.stream = stream
        self.tty = stream.isatty()
        self.every_s = 1.0 if self.tty else 10.0
        self.last_print = 0.0
        self.last_text = ""

    def tick(self, progress: dict[int, dict]) -> None:
        now = time.monotonic()
        if not progress or now - self.last_print < self.every_s:
            return
        steps = {r: p.get("steps_done", 0) for r, p in progress.items()}
        slowest = min(steps, key=lambda r: (steps[r], r))
        step_ms = [p.get("last_step_ms") for p in progress.values() if p.get("last_step_ms")]
        text = (f"diagnose: {len(progress)} ranks, step {min(steps.values())}-{max(steps.values())}, "
                f"slowest rank {slowest}" + (f", last step {max(step_ms):.0f} ms" if step_ms else ""))
        if text == self.last_text and not self.tty:
            return
        self.last_print, self.last_text = now, text
        if self.tty:
            self.stream.write("\r" + text.ljust(100)[:120])
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty and self.last_text:
            self.stream.write("\n")
