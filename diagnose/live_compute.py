"""The live monitor's view of a rank's own compute: per completed step, the
step minus its waiting (data, exposed communication, pipeline wait, host
syncs), read from the event parts the rank has written so far, with the same
breakdown the analysis uses (diagnose.breakdown)."""
import glob
import os

from diagnose import rundir


class ComputeReader:
    """Per rank, compute ms (not waiting) of each completed step, read from the
    event part files the rank writes (parts are whole files, renamed into place)."""

    COLUMNS = ["kind", "name", "start_ns", "end_ns", "step", "detail", "async_op", "group", "seq"]

    def __init__(self, run_dir: str):
        self.run_dir = run_dir
        self.parts_read: dict = {}        # rank -> set of part names
        self.buffers: dict = {}           # rank -> DataFrame of not yet finished events
        self.done_step: dict = {}         # rank -> last step computed

    def poll(self, ranks) -> dict:
        """rank -> [(step, compute_ms, step_ms)] for steps completed since the last poll."""
        import pandas as pd
        import pyarrow.parquet as pq

        from diagnose.breakdown import busy_ms, step_breakdown
        out = {}
        for rank in ranks:
            rank_dir = os.path.join(self.run_dir, rundir.TRACES, f"rank-{rank:05d}")
            seen = self.parts_read.setdefault(rank, set())
            new = []
            for path in sorted(glob.glob(os.path.join(glob.escape(rank_dir), "events-*.parquet"))):
                name = os.path.basename(path)
                if name in seen:
                    continue
                seen.add(name)
                try:
                    table = pq.read_table(path)
                    columns = [c for c in self.COLUMNS if c in table.column_names]
                    new.append(table.select(columns).to_pandas())
                except Exception:
                    continue  # unreadable part: the analysis will say so
            if not new:
                continue
            frames = [f for f in [self.buffers.get(rank), *new] if f is not None and len(f)]
            if not frames:
                continue
            events = pd.concat(frames, ignore_index=True)
            for column in ("kind", "name", "detail", "group"):
                if column in events.columns:
                    events[column] = events[column].astype(str)
            events["rank"] = rank
            last = self.done_step.get(rank, -1)
            steps = events[(events["kind"] == "step") & (events["step"] > last)]
            steps = steps.drop_duplicates("step").sort_values("step")
            # the newest step waits for the next: a CPU DDP module's all-reduce of a
            # step is recorded at the next forward (collectors/instrument/ddp.py), and
            # without it the rank's wait in DDP's tail would count as its own compute
            steps = steps[steps["step"] < steps["step"].max()] if len(steps) else steps
            if steps.empty:
                self.buffers[rank] = events
                continue
            table = step_breakdown(events, steps[["rank", "step", "start_ns", "end_ns"]])
            compute = busy_ms(table)
            out[rank] = [(int(s), float(c), float(m)) for s, c, m in
                         zip(table["step"], compute, table["step_ms"])]
            self.done_step[rank] = int(steps["step"].max())
            cutoff = int(steps["end_ns"].max())
            self.buffers[rank] = events[events["end_ns"] > cutoff]
        return out

