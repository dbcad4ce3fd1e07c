"""Issue 49, typed event records: what naming the collectives' rows
(schema.EventRow) costs, side by side with a commit before it, in one process.

    .venv/bin/python -m bench.event_rows [--before fa430ec] [--runs 5]

"before": collectors/instrument/{collectives,collective_tracker,collective_events}.py
at that commit, loaded from git (they run on the working tree's other modules); "after":
the working tree. Measured:
- Tracker.issued for a synchronous call, and for async work with its wait and
  done rows (Tracker.waited): min over interleaved repeats, ns;
- device_rows / stall_row, which the CUDA-event poller runs per completed pair;
- the patched dist.all_reduce on a 1-rank gloo group with a real recorder
  (writer thread on): median over alternating batches of (after - before);
- a JSON row part's orjson call per row: plain tuples vs EventRows.
bench/event_cost.py gives the absolute per-event figures; this one, the
difference that run-to-run noise on a shared box hides there.
"""

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def load(rev: str, name: str, imports: dict | None = None):
    """collectors/instrument/<name>.py at `rev`, None where it has no such file;
    `imports`: modules it imports to take from `rev` too (name -> module)."""
    path = f"collectors/instrument/{name}.py"
    shown = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=REPO, capture_output=True, text=True)
    if shown.returncode:
        return None
    mod = importlib.util.module_from_spec(importlib.util.spec_from_loader(f"before_{name}", loader=None))
    saved = {k: sys.modules.get(k) for k in imports or {}}
    sys.modules.update(imports or {})
    try:
        exec(compile(shown.stdout, path, "exec"), mod.__dict__)
    finally:
        for k, m in saved.items():
            if m is None:
                del sys.modules[k]
            else:
                sys.modules[k] = m
    return mod


class Rec:
    def __init__(self):
        self.state = types.SimpleNamespace(step=3, microbatch=0, stage=0)
        self.events = []

    def add(self, row):
        self.events.append(row)
        if len(self.events) > 10_000:
            self.events.clear()

    def record_error(self, *args):
        pass


class Work:  # takes weak references, as torch's Work does
    pass


def tracker_cases(mod) -> dict:
    tracker, work = mod.Tracker(Rec(), None), Work()

    def issued_async_waited():
        tracker.issued("collective", "all_reduce", "0", "0,1", 5, -1, 4096, "x.py:1", 10, 20, work, True)
        tracker.waited(work, 30, 40, "x.py:2", False)

    return {
        "Tracker.issued, sync (ns)": lambda: tracker.issued(
            "collective", "all_reduce", "0", "0,1", 5, -1, 4096, "x.py:1", 10, 20, None, False
        ),
        "Tracker.issued + waited, async (ns)": issued_async_waited,
    }


def device_cases(mod) -> dict:
    from collectors.schema import event_row

    row = event_row("collective", "all_reduce", 1, 2, 3, group="0", group_ranks="0,1", seq=5, nbytes=4096)
    return {
        "device_rows (ns)": lambda: mod.device_rows(row, 10, 20, "gpu:wait"),
        "stall_row (ns)": lambda: mod.stall_row(row, 10, 20, "x.py:2"),
    }


def min_ns(sides: dict, repeats: int = 30, number: int = 5000) -> dict:
    best = {}
    for _ in range(repeats):
        for side, cases in sides.items():
            for name, fn in cases.items():
                t = timeit.timeit(fn, number=number) / number * 1e9
                best[side, name] = min(best.get((side, name), float("inf")), t)
    return best


def all_reduce_deltas_us(before_mod, after_mod, runs: int, batches: int = 80, calls: int = 300) -> list:
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    import torch
    import torch.distributed as dist

    from collectors.recorder import start_recorder

    rec = start_recorder(tempfile.mkdtemp(prefix="diagnose-eventrows-"))
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    c10d = sys.modules["torch.distributed.distributed_c10d"]
    orig, wrapped = dist.all_reduce, {}
    for side, mod in (("before", before_mod), ("after", after_mod)):
        mod.install(rec)
        wrapped[side] = dist.all_reduce
        dist.all_reduce = c10d.all_reduce = orig
    t = torch.ones(4)
    deltas = []
    for _ in range(runs):
        per = {"before": [], "after": []}
        for b in range(batches):
            for side in ("before", "after") if b % 2 == 0 else ("after", "before"):
                fn = wrapped[side]
                t0 = time.perf_counter_ns()
                for _ in range(calls):
                    fn(t)
                per[side].append((time.perf_counter_ns() - t0) / calls / 1000)
        deltas.append(statistics.median(a - b for a, b in zip(per["after"], per["before"])))
    dist.destroy_process_group()
    rec.close()
    return deltas


def orjson_us_per_row() -> dict:
    import orjson

    from collectors.schema import EVENT_COLUMNS, event_row

    rows = [
        event_row("collective", "all_reduce", i, i + 5, 3, group="0", group_ranks="0,1", seq=i, nbytes=4096)
        for i in range(5000)
    ]
    plain = [tuple(r) for r in rows]
    out = {}
    for name, part in (("plain tuples", plain), ("EventRows (default=tuple)", rows)):
        fn = lambda part=part: orjson.dumps({"columns": EVENT_COLUMNS, "rows": part}, default=tuple)  # noqa: E731
        out[name] = min(timeit.repeat(fn, number=20, repeat=7)) / 20 / len(rows) * 1e6
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", default="fa430ec")
    ap.add_argument("--runs", type=int, default=5, help="all_reduce comparisons (each 80 batches)")
    args = ap.parse_args()
    from collectors.instrument import collective_events, collective_tracker, collectives

    events = load(args.before, "collective_events")
    # Tracker moved to collective_tracker.py (70f1aeb); before that it was in collectives.py
    theirs = {"collectors.instrument.collective_events": events}
    tracker = load(args.before, "collective_tracker", theirs)
    theirs["collectors.instrument.collective_tracker"] = tracker or collective_tracker
    before = {"collectives": load(args.before, "collectives", theirs), "collective_events": events}
    best = min_ns(
        {
            "before": {**tracker_cases(tracker or before["collectives"]), **device_cases(events)},
            "after": {**tracker_cases(collective_tracker), **device_cases(collective_events)},
        }
    )
    print(f"before = {args.before}, after = the working tree\n")
    print("| | before | after | after - before |\n|---|---|---|---|")
    for name in dict.fromkeys(name for _, name in best):
        b, a = best["before", name], best["after", name]
        print(f"| {name} | {b:.0f} | {a:.0f} | {a - b:+.0f} |")
    deltas = all_reduce_deltas_us(before["collectives"], collectives, args.runs)
    print(
        f"\npatched all_reduce, after - before per call (us), {args.runs} runs: "
        f"{', '.join(f'{d:+.2f}' for d in deltas)}; median {statistics.median(deltas):+.2f}"
    )
    print("orjson per row (us): " + ", ".join(f"{k} {v:.3f}" for k, v in orjson_us_per_row().items()))


if __name__ == "__main__":
    main()
