"""Issue 44, O1: what the CUDA-event timing of collectives costs with 10^5 pairs
pending (a device far behind its host, or a job that never waits), before and
after the poll took only each stream's head, side by side in one process.

    .venv/bin/python -m bench.event_poll [--before 36e4045] [--pending 100000]

"before": collectors/instrument/collective_events.py and CudaEventTimer's file
(cuda_event_timer.py; cuda_events.py before it had its own) at that commit,
loaded from git; "after": the working tree. Events are fakes with
torch.cuda.Event's methods (a Python call each, cheaper than a real
cudaEventQuery, so the query-bound figures are lower bounds). Measured:
- one poll pass while `--pending` pairs wait and 1% of them have completed;
- the training thread's cost per async collective (mark, return, wait) with
  the same backlog and a poller thread running every 0.25 s beside it;
- events recorded per async collective.
Writes bench/results/<date>-event-poll.md.
"""

import argparse
import datetime
import gc
import importlib.util
import statistics
import subprocess
import threading
import time
import types
from pathlib import Path

from collectors.schema import event_row

REPO = Path(__file__).resolve().parents[1]


class Clock:
    done_until = 0  # events recorded at or before this count have run


class Event:
    recorded = 0

    def __init__(self, enable_timing=True):
        self.n, self.side = None, False

    def record(self, stream=None):
        Event.recorded += 1
        self.n, self.side = Event.recorded, stream == "side"  # the idle side stream runs it at once

    def query(self):
        return self.side or self.n <= Clock.done_until

    def elapsed_time(self, other):
        return float(other.n - self.n)

    def synchronize(self):
        pass


class Tensor:
    is_cuda = True


class Work:
    pass


ROW = event_row("collective", "all_reduce", 0, 0, 0, group="pg", group_ranks="0,1", seq=0, nbytes=4096)


def source(rev: str | None, path: str) -> str | None:
    """The file at `rev` (None: the working tree), or None where it does not exist."""
    if rev is None:
        return (REPO / path).read_text() if (REPO / path).exists() else None
    out = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=REPO, capture_output=True, text=True)
    return out.stdout if out.returncode == 0 else None


def load(rev: str | None) -> types.SimpleNamespace:
    """.timer: CudaEventTimer's module (cuda_event_timer.py, cuda_events.py before
    the split); .collective_events."""
    mods = {}
    for name, files in (("timer", ("cuda_event_timer", "cuda_events")), ("collective_events", ("collective_events",))):
        path, src = next(
            (p, text) for p in (f"collectors/instrument/{f}.py" for f in files) if (text := source(rev, p)) is not None
        )
        spec = importlib.util.spec_from_loader(f"bench_{name}_{rev or 'now'}", loader=None)
        mod = importlib.util.module_from_spec(spec)
        exec(compile(src, path, "exec"), mod.__dict__)
        mods[name] = mod
    return types.SimpleNamespace(**mods)


def build(mods, pending: int):
    """`pending` pairs waiting: pending // 2 async calls (a call and its stall each)."""
    mods.timer.MAX_PENDING = 10 * pending  # the measured calls add to the backlog, not dropped
    timer = mods.timer.CudaEventTimer(Event, side_stream="side")
    timer.set_anchor()
    Clock.done_until = Event.recorded
    events = mods.collective_events.CollectiveEvents(timer, ready=lambda: True, capturing=lambda: False)
    works = []
    for _ in range(pending // 2):  # async calls waited on the host, their device events not run yet
        work = Work()
        works.append(work)
        events.returned(events.mark(Tensor(), False), ROW, work)
        events.waited(work, events.before_wait(work), "")
    return timer, events, works


def poll_pass_s(mods, pending: int) -> float:
    timer, _, _ = build(mods, pending)
    first = Clock.done_until
    Clock.done_until = first + (Event.recorded - first) // 100  # 1% of the backlog has run
    t0 = time.perf_counter()
    timer.poll()
    return time.perf_counter() - t0


def per_call_us(mods, pending: int, calls: int = 5_000) -> tuple[float, float]:
    timer, events, works = build(mods, pending)
    stop = threading.Event()

    def poller():
        while not stop.wait(0.25):
            timer.poll()  # nothing more runs on the device: the backlog stays

    thread = threading.Thread(target=poller)
    thread.start()
    before = Event.recorded
    t0 = time.perf_counter()
    for _ in range(calls):
        work = Work()
        events.returned(events.mark(Tensor(), False), ROW, work)
        events.waited(work, events.before_wait(work), "")
    elapsed = time.perf_counter() - t0
    stop.set()
    thread.join()
    return elapsed / calls * 1e6, (Event.recorded - before) / calls


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", default="36e4045")
    ap.add_argument("--pending", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    sides = {"before": load(args.before), "after": load(None)}
    res = {k: {"poll": [], "call": [], "events": None} for k in sides}
    for repeat in range(args.repeats):
        # alternated, the first side swapped each repeat: drift on the box hits both
        # alike; a collection first: a backlog's pending closures hold reference cycles
        # (closure -> CollectiveEvents -> timer -> pending), and whichever side ran
        # second would otherwise pay the first side's garbage in its timed loop
        for name in ("before", "after") if repeat % 2 == 0 else ("after", "before"):
            mods = sides[name]
            gc.collect()
            res[name]["poll"].append(poll_pass_s(mods, args.pending))
            gc.collect()
            us, ev = per_call_us(mods, args.pending)
            res[name]["call"].append(us)
            res[name]["events"] = ev
    lines = [
        f"# {datetime.date.today()} CUDA-event poll with {args.pending:,} pending pairs (issue 44, O1)",
        "",
        f"`python -m bench.event_poll --before {args.before} --pending {args.pending}`; fake events "
        "(torch.cuda.Event's methods, a Python call each); median of "
        f"{args.repeats} alternated repeats.",
        "",
        "| | before | after | after/before |",
        "|---|---|---|---|",
    ]
    for key, label, fmt in (
        ("poll", "one poll pass, 1% of the backlog done (ms)", 1e3),
        ("call", "training thread per async collective, poller running (us)", 1.0),
    ):
        b, a = statistics.median(res["before"][key]) * fmt, statistics.median(res["after"][key]) * fmt
        lines.append(f"| {label} | {b:.2f} | {a:.2f} | {a / b:.3f} |")
    lines.append(
        f"| events recorded per async collective | {res['before']['events']:.0f} | {res['after']['events']:.0f} | |"
    )
    text = "\n".join(lines) + "\n"
    print(text)
    out = REPO / "bench" / "results" / f"{datetime.date.today()}-event-poll.md"
    out.write_text(text)


if __name__ == "__main__":
    main()
