"""The launcher's hang watchdog.

Signal: no rank recorded a new event or ended a step for the hang timeout
while the job is alive. The timeout is the job's own: HANG_STEP_MULTIPLE x its
median step (what the ranks report in progress.json), never under the floor
(`--hang-floor`, 300 s: half NCCL's default 600 s watchdog, so diagnose looks
first; 300 s before any step has ended), so a checkpoint or an evaluation of a few steps' length does not trip
it; `--hang-timeout SECONDS` fixes it instead.

Then: ask every rank for dumps (a file the ranks' writer threads poll, so a
main thread stuck in C++ cannot prevent it: in-flight collectives, every
thread's stack, and the Flight Recorder buffer; plus a byte on each NCCL
debug-info pipe, served by NCCL's own watchdog thread even while a rank holds
the GIL; and a real-time signal to each rank's faulthandler, which writes every
thread's stack without the GIL: diagnose/run/stack_signal.py), wait a few
seconds for them, and hand over to the launcher, which
analyzes and reports while the job is still hung. The job is not ended: that
stays with the backend's watchdog or the user, unless `--kill-on-hang` (SIGTERM,
then SIGKILL). Progress after the report (a stall, not a hang) is noted.
"""

import glob
import json
import os
import signal
import socket
import statistics
import time
from collections import deque

from collectors.recorder import DUMP_REQUEST
from diagnose.run.flight_recorder_env import ask_backend_for_dumps
from diagnose.run.stack_signal import signal_marked_ranks
from diagnose.rundir.flight_recorder_reader import FOLDER

DUMP_WAIT_S = 5.0
TERM_GRACE_S = 5.0
HANG_STEP_MULTIPLE = 10.0
HANG_FLOOR_S = 300.0
STARTUP_S = 300.0  # before a first step ends (imports, compilation, loading a checkpoint)
_STEP_SAMPLES = 512  # the median of the recent steps, all ranks together


def kill_rank_processes(run_dir: str) -> None:
    """torchrun starts each rank in a session of its own: a rank wedged in C++
    survives the signals sent to the launcher's group, so end it by pid."""
    host = socket.gethostname()
    for meta_path in glob.glob(os.path.join(run_dir, "traces", "rank-*", "meta.json")):
        try:
            with open(meta_path, encoding="utf-8") as f:
                meta = json.load(f)
            if meta.get("host") == host and isinstance(meta.get("pid"), int):
                os.kill(meta["pid"], signal.SIGKILL)
        except (OSError, ValueError):
            continue


class HangWatchdog:
    def __init__(
        self,
        run_dir: str,
        proc,
        timeout_s: float | None,
        floor_s: float = HANG_FLOOR_S,
        kill_on_hang: bool = False,
        on_hang=None,
        flight_recorder: bool = True,
    ):
        self.run_dir = run_dir
        self.proc = proc
        self.fixed_timeout_s = timeout_s  # None: derived from the job's median step
        self.floor_s = floor_s
        self.kill_on_hang = kill_on_hang
        self.on_hang = on_hang
        self.flight_recorder = flight_recorder
        self.last_total = None
        self.last_change = time.monotonic()
        self.report = None
        self._steps_seen: dict[int, int] = {}
        self._step_s: deque = deque(maxlen=_STEP_SAMPLES)

    def timeout_s(self) -> float:
        if self.fixed_timeout_s is not None:
            return self.fixed_timeout_s
        if not self._step_s:
            return max(self.floor_s, STARTUP_S)
        return max(self.floor_s, HANG_STEP_MULTIPLE * self.median_step_s())

    def median_step_s(self) -> float | None:
        return statistics.median(self._step_s) if self._step_s else None

    def summary(self) -> dict:
        """For the manifest: the rule and what it came to."""
        median = self.median_step_s()
        return {
            "rule": "fixed"
            if self.fixed_timeout_s is not None
            else f"max({self.floor_s:g} s, {HANG_STEP_MULTIPLE:g} x median step); {STARTUP_S:g} s before a step ends",
            "median_step_s": None if median is None else round(median, 4),
            "timeout_s": round(self.timeout_s(), 3),
            "kill_on_hang": self.kill_on_hang,
        }

    def _note_steps(self, progress: dict) -> None:
        for rank, p in progress.items():
            done, last_ms = p.get("steps_done"), p.get("last_step_ms")
            if isinstance(done, int) and done != self._steps_seen.get(rank) and isinstance(last_ms, (int, float)):
                self._steps_seen[rank] = done
                self._step_s.append(last_ms / 1e3)

    def tick(self, progress: dict[int, dict]) -> None:
        if not progress:
            return
        self._note_steps(progress)
        steps = sum(p.get("steps_done") or 0 for p in progress.values())
        total = sum(p.get("events_total") or 0 for p in progress.values()) + steps
        now = time.monotonic()
        if self.report is not None:
            # after the report only a step ended counts: the dumps and the ranks'
            # timeout errors are events too
            if steps > self.report["steps_done"] and "resumed_after_s" not in self.report:
                self.report["resumed_after_s"] = round(now - self.last_change, 1)
                print("diagnose: a step ended again: that was a stall, not a hang", flush=True)
            return
        if total != self.last_total:
            self.last_total, self.last_change = total, now
            return
        timeout_s = self.timeout_s()
        if timeout_s > 0 and now - self.last_change >= timeout_s:
            self.handle_hang(progress, timeout_s, steps)

    def _dumps_in(self, live_ranks: int) -> bool:
        native = glob.glob(os.path.join(self.run_dir, "traces", "rank-*", "watchdog-*.json"))
        if len(native) < live_ranks:
            return False
        if not self.flight_recorder:
            return True
        recorded = glob.glob(os.path.join(glob.escape(self.run_dir), FOLDER, "rank_*"))
        pickles = [p for p in recorded if p.rsplit("_", 1)[-1].isdigit()]
        return len(pickles) >= live_ranks and len(recorded) - len(pickles) >= live_ranks

    def handle_hang(self, progress, timeout_s: float, steps_done: int) -> None:
        stalled_s = time.monotonic() - self.last_change
        then = "ending the job" if self.kill_on_hang else "the job is left to its backend's watchdog or you"
        print(
            f"diagnose: no progress on any rank for {stalled_s:.0f} s (hang timeout {timeout_s:.0f} s): "
            f"asking every rank for dumps; {then}",
            flush=True,
        )
        open(os.path.join(self.run_dir, DUMP_REQUEST), "w").close()
        asked = ask_backend_for_dumps(self.run_dir)
        stacks_asked = signal_marked_ranks(self.run_dir)  # every thread, even a GIL holder's
        deadline = time.monotonic() + DUMP_WAIT_S
        while time.monotonic() < deadline and not self._dumps_in(len(progress)):
            time.sleep(0.2)
        self.report = {
            "stalled_s": round(stalled_s, 1),
            "timeout_s": round(timeout_s, 3),
            "timeout_rule": self.summary()["rule"],
            "wall_ns": time.time_ns(),
            "pipes_asked": asked,
            "stacks_asked": len(stacks_asked),
            "steps_done": steps_done,
            "killed_by_diagnose": self.kill_on_hang,
        }
        if self.on_hang is not None:
            self.on_hang(self.report)
        if self.kill_on_hang:
            self.end_job()

    def end_job(self) -> None:
        self._signal(signal.SIGTERM)
        deadline = time.monotonic() + TERM_GRACE_S
        while self.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        if self.proc.poll() is None:
            self._signal(signal.SIGKILL)
        kill_rank_processes(self.run_dir)

    def _signal(self, sig) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
