"""NVTXT export: one text file per rank that Nsight's ImportNvtxt turns into a
report, or merges into that rank's own `nsys profile` report:

    ImportNvtxt --cmd create --nvtxt rank-00000.nvtxt -o rank0.nsys-rep
    ImportNvtxt --cmd merge -i rank0.nsys-rep --nvtxt rank-00000.nvtxt -o merged.nsys-rep

Format (NVTXT, as Nsight documents it): one instruction per line; `#` starts a
comment; `Name = value` sets a variable that applies to the instructions after
it (ProcessId, CategoryId, TimeBase); `@Instruction, Field, ...` declares the
fields of an instruction; then instruction lines give them in that order:

    @RangeStartEnd, Start, End, ThreadId, Message
    @Marker, Time, ThreadId, Message
    RangeStartEnd, 1042000155, 1042300871, 0, "forward"

Every recorded range is a start/end range (they overlap: steps contain phases,
async collectives stay in flight), markers are instants. Time base: `Manual`,
in ns on the rank's own recorded clock, CLOCK_MONOTONIC for a native run (the
clock nsys uses by default on Linux), the source profiler's clock for an
imported one. Thread ids are lanes as in the Chrome export: 0 main, 1 steps,
2 communication in flight, 3 host syncs, 4 GPU kernels. Categories: one id per
event kind, listed in each file's header.
"""

import os

from collectors.schema import KINDS, rank_dir_name

LANES = {"step": 1, "sync": 3, "kernel": 4}
CATEGORY_IDS = {kind: i + 1 for i, kind in enumerate(KINDS)}
INSTRUCTIONS = {"RangeStartEnd": ("Start", "End", "ThreadId", "Message"), "Marker": ("Time", "ThreadId", "Message")}


def quote(text: str) -> str:
    """A message as an NVTXT string literal: double quotes, none inside, one line."""
    clean = "".join(ch if ch.isprintable() else " " for ch in str(text)).replace('"', "'")
    return f'"{clean}"'


def rank_lines(run, rank: int) -> list[str]:
    events = run.events()
    ev = events[(events["rank"] == rank) & ~events["kind"].isin(["wait", "done"])]
    done = events[(events["rank"] == rank) & (events["kind"] == "done")]
    done_at = {(str(g), int(s)): int(t) for g, s, t in zip(done["group"], done["seq"], done["start_ns"])}
    to_rank_clock = int(run.t0_ns) + int(run.offsets_ns.get(rank, 0))
    meta = run.rank_meta.get(rank, {})
    pid = meta.get("pid") if isinstance(meta.get("pid"), int) else rank
    lines = [
        f"# diagnose NVTXT export: run {os.path.basename(run.root)}, rank {rank}",
        "# times: ns on this rank's recorded clock (CLOCK_MONOTONIC for a native run)",
        "# threads: 0 main, 1 steps, 2 communication in flight, 3 host syncs, 4 GPU kernels",
        "# categories: " + ", ".join(f"{i} {k}" for k, i in CATEGORY_IDS.items()),
        f"SetFileDisplayName, diagnose rank {rank}",
        "@RangeStartEnd, Start, End, ThreadId, Message",
        "@Marker, Time, ThreadId, Message",
        f"ProcessId = {pid}",
        "TimeBase = Manual",
    ]
    category = None
    rows = zip(
        ev["kind"].astype(str),
        ev["name"].astype(str),
        ev["start_ns"].tolist(),
        ev["end_ns"].tolist(),
        ev["group"].astype(str),
        ev["seq"].tolist(),
        ev["async_op"].tolist(),
    )
    for kind, name, start, end, group, seq, async_op in sorted(rows, key=lambda r: r[2]):
        if CATEGORY_IDS.get(kind) != category:
            category = CATEGORY_IDS.get(kind, CATEGORY_IDS["mark"])
            lines.append(f"CategoryId = {category}")
        lane = LANES.get(kind, 0)
        if kind in ("collective", "p2p") and async_op:
            end, lane = max(end, done_at.get((group, int(seq)), end)), 2
        start, end = start + to_rank_clock, end + to_rank_clock
        if kind == "mark" or (start == end and kind not in ("collective", "p2p", "kernel")):
            lines.append(f"Marker, {start}, {lane}, {quote(name)}")
        else:
            lines.append(f"RangeStartEnd, {start}, {max(end, start)}, {lane}, {quote(name)}")
    return lines


def write_nvtxt(run, out_dir: str | None = None) -> list[str]:
    """Write <out_dir>/rank-NNNNN.nvtxt for every rank; returns the paths."""
    out_dir = out_dir or os.path.join(run.root, "nvtxt")
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for rank in run.ranks:
        path = os.path.join(out_dir, f"{rank_dir_name(rank)}.nvtxt")
        tmp = f"{path}.tmp-{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write("\n".join(rank_lines(run, rank)) + "\n")
        os.replace(tmp, path)
        paths.append(path)
    return paths
