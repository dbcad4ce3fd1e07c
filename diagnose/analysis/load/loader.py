"""`diagnose.load(RUN)`: all ranks' traces merged onto one clock, as pandas tables.
Loading only: `diagnose.analyze(run)` (run_detectors.py) runs the detectors.

Times in every table are ns since the run's first event, on rank 0's clock
(`Run.wall_t0_ns` converts back to wall time). Derived tables are computed on
first use and cached (derived_tables.py).

A run over the event budget (diagnose/analysis/load/event_budget.py) is analyzed
over its last steps only: the per-rank pass drops the earlier steps' events on
its worker, and `Run.window` says which steps were kept.
"""

import functools
import os
import sys

import pandas as pd
import pyarrow as pa

from diagnose import rundir
from diagnose.analysis.load import clock_align, event_budget
from diagnose.analysis.load.derived_tables import DerivedTables, per_run
from diagnose.analysis.load.rank_pass import in_rank_order, ranks_per_task
from diagnose.analysis.load.rank_pass_engines import InProcess
from diagnose.analysis.tables import device_collectives, pipeline_topology, trace_windows
from diagnose.analysis.tables.breakdown import step_breakdown
from diagnose.analysis.tables.mfu import without_counted_step
from diagnose.analysis.tables.step_tables import (
    steady_state_steps,
    steps_table,
    window_shift,
    without_profiler_stop_step,
)
from diagnose.errors import UserError
from diagnose.rundir import storage


class Run(DerivedTables):
    """One loaded run: its aligned tables (the derived ones: DerivedTables), windows and metadata."""

    def __init__(self, run_dirs, warn=None, on_rank=None, engine=None, max_events=None, window=None):
        """on_rank(done, total): called as each rank's parts are read (a progress bar).
        engine: where the per-rank pass runs (diagnose/analysis/load/rank_pass_engines.py; default
        in this process). max_events: the event budget (event_budget.py: None is its
        MAX_EVENTS, 0 none). window: {"from_step", "last_step", "warmup"}: those steps
        only, the step tables' too, and no budget (a window of `--every-step`; warmup:
        whether its first steps are the run's warm-up)."""
        if isinstance(run_dirs, (str, os.PathLike)):
            run_dirs = [run_dirs]
        self.run_dirs = [rundir.require_run_dir(str(d)) for d in run_dirs]
        if not self.run_dirs:
            raise UserError("no run directory given")
        self.root = self.run_dirs[0]
        self.warnings: list[str] = []
        # the findings analyze(run) gave in this process (run_detectors.py); None before
        self.analyzed: list[dict] | None = None
        # measured, replayed and ideal step figures (diagnose/analysis/replay/whatif.py): an
        # earlier analysis's, then run_detectors.detect's; None when the replay cannot run
        self.step_figures: dict | None = rundir.read_json_dict(os.path.join(self.root, rundir.STEP_FIGURES))
        self._warn_sink = warn
        self.manifest = rundir.read_manifest(self.root)
        self.rank_meta: dict[int, dict] = {}
        # the steps analyzed when not all of them are: event_budget.window's dict when
        # the budget cut the run to its last steps, or the window asked for
        self.window: dict | None = window
        todo, self.rank_dirs = rundir.rank_folders(self.run_dirs)
        event_tables, sample_tables = self._read_ranks(todo, engine or InProcess(), on_rank, max_events)
        self._events = _to_pandas(event_tables, _empty_events())
        self._samples = _to_pandas(sample_tables, None)
        trace_windows.stamp(self._events, self._steps)  # a rank without steps: one window
        self.offsets_ns, self.offset_errors_ns, bounded = clock_align.measured_offsets(self.rank_meta)
        self._shift(self._events, self.offsets_ns, ("start_ns", "end_ns"))
        self.refinements_ns = self._refine(bounded)
        self._shift(self._events, self.refinements_ns, ("start_ns", "end_ns"))
        for rank, extra in self.refinements_ns.items():
            self.offsets_ns[rank] = self.offsets_ns.get(rank, 0) + extra
        self._shift(self._steps, self.offsets_ns, ("start_ns", "end_ns"))
        # the first event, or a step before the window of a run over the budget
        starts = [int(t["start_ns"].min()) for t in (self._events, self._steps) if len(t)]
        self.t0_ns = min(starts) if starts else 0
        for table in (self._events, self._steps):
            table["start_ns"] -= self.t0_ns
            table["end_ns"] -= self.t0_ns
        # stages the job did not mark, from its sends and receives
        self.stage_source = pipeline_topology.stamp_inferred_stages(self._events, self.warn)
        if self._samples is not None:
            self._shift(self._samples, self.offsets_ns, ("ts_ns",))
            self._samples["ts_ns"] -= self.t0_ns
        self.wall_t0_ns = self._wall_of(self.t0_ns)
        if (
            self.window is not None
            and "message" in self.window
            and (shift := window_shift(self._steps, self.window["from_step"]))
        ):
            self.warn(shift)

    def _refine(self, bounded: set) -> dict:
        """Clock corrections from collective end times, after the device
        collectives numbered by position are checked (op and size, then kernel
        ends: diagnose.analysis.tables.device_collectives)."""
        device_collectives.unmatch_by_op(self._events, self.warn)
        device_collectives.unmatch_by_time(self._events, self.warn)
        precision: dict = {}
        corrections = clock_align.refine_offsets(self._events, self.offset_errors_ns, bounded, precision)
        for rank, error_ns in precision.items():  # the residual: what the refinement could resolve
            if rank in corrections or error_ns < self.offset_errors_ns.get(rank, error_ns + 1):
                self.offset_errors_ns[rank] = error_ns
        return corrections

    def _read_ranks(self, todo: list, engine, on_rank, max_events) -> tuple[list, list]:
        """The per-rank pass over `todo` ((rank, rank_dir) or a warning), on the
        engine: (event tables, sample tables); the step tables go to self._steps
        and self._breakdown. Its own method so that nothing else holds the
        per-rank tables once the caller's lists let them go: a leftover
        reference kept all of them alive while they were converted (1,024 ranks
        x 200 steps: +850 MB at the peak)."""
        ranks_todo = [item for item in todo if not isinstance(item, str)]
        total = len(ranks_todo)
        to_step = None
        if self.window is not None:  # asked for: those steps only
            from_step, to_step = self.window["from_step"], self.window["last_step"]
        else:
            self.window = event_budget.window(ranks_todo, max_events)
            if self.window is not None:
                self.warn(self.window["message"])
            from_step = self.window["from_step"] if self.window else None
        size = ranks_per_task(total)
        batches = [ranks_todo[i : i + size] for i in range(0, total, size)]
        done = [0]

        def on_done(index):
            done[0] += len(batches[index])
            on_rank(done[0], total)

        results = engine.map_tasks([(batch, from_step, to_step) for batch in batches], on_rank and on_done)
        per_rank = [entry for result in results for entry in result[0]]
        per_rank.reverse()  # popped in rank order
        event_tables, sample_tables, step_frames, breakdown_frames = [], [], [], []
        for _, events, samples, steps, breakdown in results:
            event_tables += [events] if events is not None else []
            sample_tables += [samples] if samples is not None else []
            step_frames += [steps] if steps is not None else []
            breakdown_frames += [breakdown] if breakdown is not None else []
        del results[:]
        for item in todo:  # warnings in the order a sequential read would have said them
            if isinstance(item, str):
                self.warn(item)
                continue
            (rank, rank_dir), (meta, has_events, notes) = item, per_rank.pop()
            for note in notes:
                self.warn(note)
            self.rank_meta[rank] = meta
            if not has_events:
                self.warn(f"{rank_dir}: no readable events")
        self._steps = in_rank_order(step_frames, lambda: steps_table(_empty_events()), ["rank", "step"])
        self._breakdown = in_rank_order(
            breakdown_frames, lambda: step_breakdown(_empty_events(), self._steps), ["rank"]
        )
        return event_tables, sample_tables

    # -- plumbing -----------------------------------------------------------
    def warn(self, message: str) -> None:
        self.warnings.append(message)
        if self._warn_sink is not None:
            self._warn_sink(message)

    @staticmethod
    def _shift(frame, offsets: dict, columns) -> None:
        if frame is None or not offsets or frame.empty:
            return
        shift = frame["rank"].map(offsets).fillna(0).astype("int64")
        for column in columns:
            frame[column] -= shift

    def _wall_of(self, t_ns: int) -> int | None:
        for rank in sorted(self.rank_meta):
            clock = self.rank_meta[rank].get("clock") or {}
            try:
                return int(clock["wall_anchor_ns"] + (t_ns + self.offsets_ns.get(rank, 0) - clock["mono_anchor_ns"]))
            except (KeyError, TypeError):
                continue
        return None

    @property
    def ranks(self) -> list[int]:
        return sorted(self.rank_dirs)

    @property
    def world_size(self) -> int:
        sizes = [m.get("world_size") for m in self.rank_meta.values() if isinstance(m.get("world_size"), int)]
        return max(sizes + [len(self.rank_dirs), self.manifest.get("world_size") or 0])

    def cwd(self) -> str:
        for meta in self.rank_meta.values():
            if isinstance(meta.get("cwd"), str):
                return meta["cwd"]
        return self.manifest.get("cwd", os.getcwd())

    # -- tables -------------------------------------------------------------
    def events(self) -> pd.DataFrame:
        """Every recorded row, aligned."""
        return self._events

    def spans(self) -> pd.DataFrame:
        """Ranges (not the wait/done bookkeeping rows), with duration."""
        spans = self._events[~self._events["kind"].isin(["wait", "done"])]  # a new frame already
        return spans.assign(dur_ms=(spans["end_ns"] - spans["start_ns"]) / 1e6)

    def samples(self) -> pd.DataFrame:
        return (
            self._samples
            if self._samples is not None
            else pd.DataFrame({"ts_ns": [], "metric": [], "value": [], "rank": []})
        )

    def steps(self) -> pd.DataFrame:
        """One row per (rank, step): every step recorded, also those before the
        window of a run over the event budget (in_window keeps the analyzed ones)."""
        return self._steps

    def breakdown(self) -> pd.DataFrame:
        """Where each rank's step time went (diagnose/analysis/tables/breakdown.py), per
        (rank, step), made by the per-rank pass: every step, as steps()."""
        return self._breakdown

    def in_window(self, frame: pd.DataFrame) -> pd.DataFrame:
        """The rows of a per-step table (a `step` column) in the steps whose events
        are analyzed: all of them unless the event budget cut the run or a window was asked for."""
        if self.window is None or frame.empty:
            return frame
        step = frame["step"]
        return frame[(step >= self.window["from_step"]) & (step <= self.window["last_step"])]

    @per_run
    def steady_steps(self) -> list[int]:
        # less the step each rank counted FLOPs in (several times slower: diagnose/analysis/tables/mfu.py)
        steps = without_profiler_stop_step(self.in_window(self.steps()), self.kernels())
        return without_counted_step(
            steady_state_steps(steps, warmup=self.window is None or self.window.get("warmup", False)),
            self.rank_meta,
        )

    def rank_stages(self) -> dict[int, int]:
        """rank -> pipeline stage (the most frequent one of its rows), for a run with stages."""
        return dict(self._rank_stages)

    @functools.cached_property
    def _rank_stages(self) -> dict[int, int]:
        return pipeline_topology.rank_stages(self._events)

    @functools.cached_property
    def progress(self) -> dict[int, dict]:
        """rank -> its last progress.json (steps done, recent step times)."""
        from diagnose.rundir.progress import read_progress

        return {r: p for r, p in read_progress(self.root).items() if r in self.rank_dirs}

    @functools.cached_property
    def watchdog_dumps(self) -> dict[int, dict]:
        """rank -> what it left on a hang: its writer thread's dump (in-flight collectives,
        stacks) and its faulthandler stacks (diagnose/rundir/hang_dumps.py)."""
        from diagnose.rundir.hang_dumps import read_hang_dumps

        return read_hang_dumps(self.rank_dirs, self.warn)

    @functools.cached_property
    def flight_recorder(self) -> dict[int, dict]:
        """rank -> its Flight Recorder dump (flight_recorder/ of the run: what the backend
        wrote on a timeout, what diagnose asked for on a hang, or `diagnose import
        flight-recorder`), read by diagnose.rundir.flight_recorder_reader."""
        from diagnose.rundir.flight_recorder_reader import FOLDER, DumpError, read_dumps

        folder = os.path.join(self.root, FOLDER)
        if not storage.isdir(folder):
            return {}
        if storage.is_url(folder):
            self.warn(f"{folder}: Flight Recorder dumps are read from a local path only; not read")
            return {}
        try:
            return read_dumps([folder], on_error=lambda why: self.warn(f"flight recorder: {why}; skipped"))
        except DumpError as exc:  # e.g. two dumps of one rank in one format
            self.warn(f"flight recorder: {exc}; no dump is used")
            return {}

    @property
    def findings(self) -> list[dict]:
        """analyze(run)'s findings (diagnose.analyze) in this process, else the run's
        analysis/findings.json; only reads (rundir.read_findings: NotAnalyzed where
        neither is): the detectors never run behind the caller's back."""
        return self.analyzed if self.analyzed is not None else rundir.read_findings(self.root)

    def __repr__(self) -> str:
        return f"Run({self.root!r}, ranks={len(self.rank_dirs)}, events={len(self._events)})"


def _empty_events() -> pd.DataFrame:
    from collectors.schema import EVENT_SCHEMA

    frame = EVENT_SCHEMA.empty_table().to_pandas()
    frame["rank"] = pd.Series([], dtype="int32")
    return frame


def _to_pandas(tables, empty):
    """One frame for all ranks: the per-rank pass's dictionary columns become
    categoricals, its plain string columns plain objects.
    Converted on this thread: Arrow's thread pool made a process's first
    conversion cost 0.16 s of CPU instead of 0.014 s (8 Kineto ranks, 210k rows:
    its threads touch fresh memory), and was no faster on 9.8 M rows (2.6-2.8 s
    either way, 2 cores)."""
    if not tables:
        return empty
    table = pa.concat_tables(tables, promote_options="none")
    del tables[:]  # the per-rank tables are in `table` now; let them go as it converts
    table = table.unify_dictionaries()
    frame = table.to_pandas(split_blocks=True, self_destruct=True, use_threads=False)
    del table
    pa.default_memory_pool().release_unused()
    return frame


def stderr_warning(message: str) -> None:
    print(f"diagnose: warning: {message}", file=sys.stderr)


def load(*run_dirs, warn=None, on_rank=None, engine=None, max_events=None, window=None) -> Run:
    """Load one run (or one per node of a multi-node run) for analysis;
    on_rank(done, total) follows the reading of the ranks, which run on
    `engine` (diagnose.analysis.load.rank_pass_engines; default: this process);
    max_events: the event budget (event_budget.py: None is its MAX_EVENTS; 0 every
    step, whatever it costs); window: some steps only (Run's)."""
    return Run(
        list(run_dirs),
        warn=warn or stderr_warning,
        on_rank=on_rank,
        engine=engine,
        max_events=max_events,
        window=window,
    )
