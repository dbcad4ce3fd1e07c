"""The per-rank recorder: a bounded in-memory buffer and a background writer.

The hot path is one `list.append` of a tuple (no lock: appends are atomic under
the GIL). A daemon thread swaps the list out every `flush_interval_s` and writes
it as a part file (JSON rows, collectors.part_writer), on a fixed cadence (a
slow write or a late wake-up does not push the next one back). FLUSH_INTERVAL_S
is 0.8 s: the design allows at most the last second lost to a SIGKILL, and the
0.2 s left is the margin for the write itself and a late wake-up on a busy box
(when parts were Parquet, each cost the writer 3.6-4.3 ms of CPU and 0.5 s parts
took 1.1-1.6% of a core per rank). No
signal handlers are installed: a Python SIGTERM handler would delay the death of
a rank blocked in C++, which changes how the user's job tears down. When
the buffer is full, new rows are counted as dropped rather than growing memory.
"""

import atexit
import os
import socket
import sys
import threading
import time

from collectors import clock, identity
from collectors.daemon_thread import start_daemon
from collectors.instrument import rank_environment
from collectors.part_writer import PartWriter
from collectors.schema import STEPS_DONE_FILE, rank_dir_name, solo_dir_name

DUMP_REQUEST = "dump-request"  # file in the run dir the launcher creates on a suspected hang


class StepState:
    """What every event is stamped with: the step in progress and the innermost
    explicit phase's micro-batch and stage."""

    __slots__ = ("step", "step_start_ns", "microbatch", "stage", "data_wait_ns")

    def __init__(self):
        self.step = 0
        self.step_start_ns = None
        self.microbatch = -1
        self.stage = -1
        self.data_wait_ns = 0  # data wait so far in this step, for live progress


FLUSH_INTERVAL_S = 0.8  # (module docstring: why)
# progress.json is rewritten this often while steps end (the launcher polls every
# 0.25 s), on the writer's own clock: waking it at every step end cost the
# training thread a wake-up per step (Recorder.step_done says what replaced it)
PROGRESS_INTERVAL_S = 0.25


class Recorder:
    def __init__(self, rank_dir: str | None, flush_interval_s: float = FLUSH_INTERVAL_S, max_buffered: int = 2_000_000):
        self.rank_dir = rank_dir
        self.flush_interval_s = flush_interval_s
        self.max_buffered = max_buffered
        self.events: list = []
        self.samples: list = []
        self.dropped = 0
        self.state = StepState()
        self.errors: list[dict] = []
        self.meta: dict = {}
        # Read by the launcher while the job runs: live progress, alerts, hang watchdog.
        self.progress: dict = {"step": 0, "steps_done": 0, "last_step_ms": None, "events_total": 0, "recent_steps": []}
        self.latest_samples: dict = {}  # metric -> its newest value (samplers' threads write it)
        self.dump_providers: list = []  # callables -> dict, merged into a watchdog dump
        self.dump_hooks: list = []  # callables run after it (Flight Recorder's own dumps)
        self.periodic_hooks: list = []  # callables the writer thread runs at each flush (never the job's)
        self.close_hooks: list = []  # callables run once at close, before the last flush
        self._writer = PartWriter(rank_dir, live=True) if rank_dir else None
        self.active = self._writer is not None  # an attribute, not a property: read by every phase
        self._flush_lock = threading.Lock()  # serialises writers, never taken on the hot path
        self._stop = threading.Event()
        self._steps_done_cell = None  # int64 view of the mapped STEPS_DONE_FILE
        self._published_steps = None  # steps_done in the last progress.json written
        self._thread = None
        self._env_final = False  # meta["env"] holds the probe after the first step (or later)
        self._env_nvml = None  # NVML's part of the first probe, reused by the second
        # meta.json is now written from two threads (the writer's probes, the main
        # thread's instrumentors and exit): one at a time, so the last file renamed
        # into place is always the latest dict, never an older copy overtaking it
        self._meta_lock = threading.RLock()

    # -- hot path ---------------------------------------------------------
    def add(self, row: tuple) -> None:
        if len(self.events) < self.max_buffered:
            self.events.append(row)
        else:
            self.dropped += 1

    def add_sample(self, ts_ns: int, metric: str, value: float) -> None:
        if len(self.samples) < self.max_buffered:
            self.samples.append((ts_ns, metric, float(value)))
        self.latest_samples[metric] = float(value)  # for the live monitor (progress.json)

    # -- failures ---------------------------------------------------------
    def record_error(self, collector: str, exc: BaseException) -> None:
        """A collector failed: note it once per collector and carry on."""
        if any(e["collector"] == collector for e in self.errors):
            return
        text = f"{type(exc).__name__}: {exc}"
        self.errors.append({"collector": collector, "error": text, "wall_ns": time.time_ns()})
        t = clock.now_ns()
        self.add(("error", collector, t, t, self.state.step, -1, -1, "", "", -1, -1, 0, False, "", text, -1))

    # -- lifecycle --------------------------------------------------------
    def start(self, meta: dict) -> None:
        self.meta = {
            "rank": identity.rank(),
            "local_rank": identity.local_rank(),
            "world_size": identity.world_size(),
            "launcher": identity.launcher(),
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "argv": list(sys.argv),
            "cwd": os.getcwd(),
            "clock": {**clock.anchors(), "offset_to_rank0_ns": None, "offset_error_ns": None, "offset_method": None},
            "start_wall_ns": time.time_ns(),
            **meta,
        }
        self.write_meta()
        try:
            self._steps_done_cell = self._writer.map_counter(STEPS_DONE_FILE)
        except (OSError, ValueError) as exc:
            self.record_error("writer", exc)
        self._thread = start_daemon(self._run, "diagnose-writer")
        atexit.register(self.close)
        os.register_at_fork(after_in_child=self._disable_in_child)

    def _disable_in_child(self) -> None:
        # A forked DataLoader worker inherits the buffer but not the writer thread.
        self._writer = None
        self.active = False
        self._steps_done_cell = None
        self.max_buffered = 0
        self.events, self.samples = [], []

    def _probe_env(self, stage: str) -> None:
        """This rank's environment into meta.json (collectors/instrument/rank_environment.py:
        when and why). Called on the writer thread only (and at exit): never a cost per step."""
        with self._meta_lock:
            if self._env_final:  # a later probe (first step, exit) already landed
                return
            try:
                if self._env_nvml is None:
                    self._env_nvml = rank_environment.nvml_facts()
                self.meta["env"] = rank_environment.probe(stage, nvml_part=self._env_nvml)
            except Exception as exc:  # the probe guards itself; this is the last net
                self.record_error("rank_environment", exc)
            self._env_final = stage != "start"
            self.write_meta()

    def _run(self) -> None:
        dump_request = os.path.join(os.path.dirname(os.path.dirname(self.rank_dir)), DUMP_REQUEST)
        dumped = False
        self._probe_env("start")
        next_flush = time.monotonic() + self.flush_interval_s
        while not self._stop.wait(max(0.0, min(PROGRESS_INTERVAL_S, next_flush - time.monotonic()))):
            if not self._env_final and self.progress["steps_done"] > 0:  # two reads, no lock
                self._probe_env("first_step")
            now = time.monotonic()
            if now < next_flush:
                if self.progress["steps_done"] != self._published_steps:
                    self.write_progress()  # one pwrite of ~2 KB; events keep their own cadence
                continue
            next_flush += self.flush_interval_s
            if next_flush <= now:  # far behind (a stalled process): start afresh
                next_flush = now + self.flush_interval_s
            self.flush()
            for hook in list(self.periodic_hooks):
                try:
                    hook()
                except Exception as exc:  # once: a failing hook is dropped, not retried every flush
                    self.periodic_hooks.remove(hook)
                    self.record_error("periodic", exc)
            if not dumped and os.path.exists(dump_request):
                # The launcher saw no progress: say where every thread is. This
                # thread does it because the main one may be stuck inside C++.
                dumped = True
                self._probe_env("hang_dump")  # a hang before step 1: what the stuck rank had set
                self.dump()

    def dump(self) -> None:
        from collectors.stacks import thread_stacks

        report = {
            "rank": self.meta.get("rank"),
            "pid": os.getpid(),
            "wall_ns": time.time_ns(),
            "step": self.state.step,
            "mono_ns": clock.now_ns(),
            "threads": thread_stacks(),
        }
        for provider in self.dump_providers:
            try:
                report.update(provider())
            except Exception as exc:
                self.record_error("watchdog", exc)
        try:
            self._writer.write_json(f"watchdog-{os.getpid()}.json", report)
        except Exception as exc:
            self.record_error("watchdog", exc)
        for hook in self.dump_hooks:
            try:
                hook()
            except Exception as exc:
                self.record_error("flight_recorder_dump", exc)

    def flush(self) -> None:
        if self._writer is None:
            return
        with self._flush_lock:
            events, self.events = self.events, []
            samples, self.samples = self.samples, []
            self.progress["events_total"] += len(events)
            try:
                self._writer.write_events(events)
                self._writer.write_samples(samples)
            except Exception as exc:  # a full disk must not kill the job
                self.record_error("writer", exc)
        self.write_progress()

    def step_done(self) -> None:
        """A step ended: its count goes into a file mapped into memory, one store
        with no system call and no thread woken (a kill leaves the page in the
        page cache, so a SIGKILLed rank's last step is exact on disk);
        progress.json follows on the writer's own clock."""
        cell = self._steps_done_cell
        if cell is not None:
            cell[0] = self.progress["steps_done"]

    def write_progress(self) -> None:
        if self._writer is None:
            return
        self._published_steps = self.progress["steps_done"]
        try:
            self._writer.overwrite_json(
                "progress.json",
                {
                    **self.progress,
                    "wall_ns": time.time_ns(),
                    "dropped": self.dropped,
                    "errors": len(self.errors),
                    "samples": dict(self.latest_samples),
                },
            )
        except Exception as exc:
            self.record_error("writer", exc)

    def write_meta(self) -> None:
        if self._writer is None:
            return
        with self._meta_lock:
            self.meta["collector_errors"] = self.errors
            self.meta["dropped_events"] = self.dropped
            try:
                self._writer.write_meta(self.meta)
            except Exception as exc:
                self.record_error("meta", exc)

    def close(self, exit_status: str = "exit") -> None:
        if self._writer is None:
            return
        self._stop.set()
        hooks, self.close_hooks = self.close_hooks, []  # once, though atexit may close again
        for hook in hooks:
            try:
                hook()
            except Exception as exc:
                self.record_error("close", exc)
        self.flush()
        with self._flush_lock:
            self._writer.compact()  # a clean exit: one file per rank, not one per flush
        self._probe_env("exit")  # a no-op when a step ended while the writer ran
        self.meta["end_wall_ns"] = time.time_ns()
        self.meta["exit"] = exit_status
        self.write_meta()


_RECORDER = Recorder(None)


def get_recorder() -> Recorder:
    return _RECORDER


def start_recorder(run_dir: str, meta: dict | None = None, provisional: bool = False) -> Recorder:
    """Turn recording on for this process: traces go to <run_dir>/traces/rank-NNNNN,
    or to traces/solo-<pid> while no launcher has said which rank it is
    (`provisional`: named after the job by diagnose/rundir/solo_ranks.py)."""
    global _RECORDER
    name = solo_dir_name(os.getpid()) if provisional else rank_dir_name(identity.rank())
    interval = float(os.environ.get("DIAGNOSE_FLUSH_INTERVAL_S", FLUSH_INTERVAL_S))
    rec = Recorder(os.path.join(run_dir, "traces", name), flush_interval_s=interval)
    if provisional:
        meta = {**(meta or {}), "provisional": True}
    rec.state = _RECORDER.state
    _RECORDER = rec
    rec.start(meta or {})
    return rec
