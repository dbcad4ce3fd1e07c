"""The live monitor's view of a rank's own compute: per completed step, the
step minus its waiting (data, exposed communication, pipeline wait, host
syncs, and its compute's waits for a CPU core: diagnose.analysis.tables.run_delay), read from the event parts the ranks have written so far, with the same
breakdown the analysis uses (diagnose.analysis.tables.breakdown). On the way, each
rank's exposed-communication share of its newest step (for the Prometheus
metrics) and the collectives' arrivals (diagnose.live.arrivals: who the others
wait for).

One poll reads every rank's new parts and runs one breakdown for all of them:
the breakdown's cost is almost all fixed per call (pandas), so a call per rank
made a poll of a 2-rank job cost ~50 ms of CPU here, which a saturated machine
takes from the job."""

import glob
import os

from diagnose import rundir
from diagnose.live.arrivals import ArrivalLags


class ComputeReader:
    """Per rank, compute ms (not waiting) of each completed step, read from the
    event part files the ranks write (parts are whole files, renamed into place)."""

    COLUMNS = [
        "kind",
        "name",
        "start_ns",
        "end_ns",
        "step",
        "detail",
        "async_op",
        "group",
        "group_ranks",
        "seq",
        "queued_ns",
    ]
    STRINGS = ("kind", "name", "detail", "group", "group_ranks")

    def __init__(self, run_dir: str, warn=lambda message: None):
        self.run_dir, self.warn = run_dir, warn
        self.parts_read: dict = {}  # rank -> set of part names
        self.pending = None  # DataFrame: events of steps not yet computed
        self.done_step: dict = {}  # rank -> last step computed
        self.arrivals = ArrivalLags()  # who the others wait for (None once it failed)
        self.exposed_comm_frac: dict = {}  # rank -> exposed comm / step of its newest step computed

    def _new_parts(self, ranks):
        """The parts written since the last poll, as one Arrow table with a rank column."""
        import pyarrow as pa

        from collectors.part_writer import read_part
        from collectors.schema import EVENT_PART_GLOBS

        tables = []
        for rank in ranks:
            rank_dir = os.path.join(self.run_dir, rundir.TRACES, f"rank-{rank:05d}")
            seen = self.parts_read.setdefault(rank, set())
            paths = [p for pattern in EVENT_PART_GLOBS for p in glob.glob(os.path.join(glob.escape(rank_dir), pattern))]
            for path in sorted(paths):
                name = os.path.basename(path)
                if name in seen:
                    continue
                seen.add(name)
                try:
                    table = read_part(path, self.COLUMNS)
                except Exception:
                    continue  # unreadable part: the analysis will say so
                tables.append(table.append_column("rank", pa.array([rank] * table.num_rows, pa.int64())))
        return pa.concat_tables(tables, promote_options="permissive") if tables else None

    def poll(self, ranks) -> dict:
        """rank -> [(step, compute_ms, step_ms)] for steps completed since the last poll."""
        import pandas as pd

        from diagnose.analysis.tables.breakdown import busy_ms, step_breakdown
        from diagnose.analysis.tables.run_delay import core_wait_per_step

        new = self._new_parts(ranks)
        if new is None or new.num_rows == 0:
            return {}
        new = new.to_pandas(use_threads=False)  # (loader._to_pandas says why)
        for column in self.STRINGS:
            new[column] = new[column].astype(str)
        if self.arrivals is not None:
            try:
                self.arrivals.add(new, ranks)
            except Exception as exc:  # the compute alerts go on without it
                self.arrivals = None
                self.warn(f"arrival lags off: {type(exc).__name__}: {exc}")
        events = new if self.pending is None else pd.concat([self.pending, new], ignore_index=True)
        last = events["rank"].map(self.done_step).fillna(-1)
        steps = events[(events["kind"] == "step") & (events["step"] > last)]
        steps = steps.drop_duplicates(["rank", "step"])
        # a rank's newest step waits for the next: a CPU DDP module's all-reduce of a
        # step is recorded at the next forward (collectors/instrument/ddp.py), and
        # without it the rank's wait in DDP's tail would count as its own compute
        steps = steps[steps["step"] < steps.groupby("rank")["step"].transform("max")]
        if steps.empty:
            self.pending = events
            return {}
        table = step_breakdown(events, steps[["rank", "step", "start_ns", "end_ns"]])
        # its own work: less the time its compute waited for a CPU core (run delay, as
        # the straggler detector judges it: a rank kept off a core by its neighbours
        # did not slow down; one alerted at 106 ms of "compute" against a 104 ms limit
        # in a loaded suite, beside the slowed rank)
        core_wait = core_wait_per_step(events).set_index(["rank", "step"])["core_wait_ms"]
        waited = core_wait.reindex(pd.MultiIndex.from_frame(table[["rank", "step"]])).fillna(0.0).to_numpy()
        table["compute_ms"] = (busy_ms(table) - waited).clip(lower=0.0)
        newest = table.sort_values("step").groupby("rank").tail(1)
        self.exposed_comm_frac.update(
            {
                int(r): float(e / m) if m > 0 else 0.0
                for r, e, m in zip(newest["rank"], newest["exposed_comm_ms"], newest["step_ms"])
            }
        )
        out = {
            int(rank): [
                (int(s), float(c), float(m)) for s, c, m in zip(rows["step"], rows["compute_ms"], rows["step_ms"])
            ]
            for rank, rows in table.groupby("rank")
        }
        self.done_step.update({int(r): int(s) for r, s in steps.groupby("rank")["step"].max().items()})
        cutoff = events["rank"].map(steps.groupby("rank")["end_ns"].max()).fillna(-1)
        self.pending = events[events["end_ns"] > cutoff].reset_index(drop=True)
        return out
