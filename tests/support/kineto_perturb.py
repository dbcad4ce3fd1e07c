"""Test aid: real Kineto traces perturbed the way a real fault would change them.

shift_clock: one rank's host clock off by a constant (every timestamp moves).
stretch_compute: one rank's compute kernels take `factor` times as long, and
everything that follows on its GPU moves with them; at every collective the
two ranks' NCCL kernels then end together again, `transfer` after the later of
the two starts (the NCCL model: a collective's kernels finish when the last
member has arrived and the data moved). A pair of NCCL kernels is one
collective when the original trace has them ending within 1 ms of each other.
The host side is left as it was: the host runs ahead of the GPU.
"""

import gzip
import json

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
# The trace_filter set is sampled: on each rank's two communicators, 6 of its 8
# and 0 of its 2 collectives are at a position that is not one collective
# (their other instances were sampled away): 3 run another op or size than the
# other rank's (ops from the nccl:<op> ranges that launched them: every kernel
# is named SendRecv), 3 more do not end together. The loader must say so and
# leave them unmatched.
TRACE_FILTER_UNMATCHED = ("3 of 8 collectives differ (op or size)", "3 of 5 collectives differ (kernel end)")
SAME_COLLECTIVE_US = 1000


def read(path) -> dict:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def write(trace: dict, path) -> str:
    with open(path, "w") as f:
        json.dump(trace, f)
    return str(path)


def shift_clock(trace: dict, shift_us: float) -> dict:
    for e in trace["traceEvents"]:
        if isinstance(e.get("ts"), (int, float)):
            e["ts"] += shift_us
    return trace


def _gpu(trace):
    return sorted(
        (e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") in GPU_CATS), key=lambda e: e["ts"]
    )


def _nccl(e) -> bool:
    return e["name"].startswith("nccl")


def _compute(e) -> bool:
    return e.get("cat") == "kernel" and not _nccl(e) and "Memcpy" not in e["name"] and "Memset" not in e["name"]


def stretch_compute(slow: dict, other: dict, factor: float) -> tuple[dict, dict]:
    """(slow, other) with slow's compute kernels `factor` times as long."""
    gpu_s, gpu_o = _gpu(slow), _gpu(other)
    end = {id(e): e["ts"] + e["dur"] for e in gpu_s + gpu_o}
    pairs = sorted(
        (
            (a, b)
            for a in gpu_s
            if _nccl(a)
            for b in gpu_o
            if _nccl(b)
            if abs(end[id(a)] - end[id(b)]) < SAME_COLLECTIVE_US
        ),
        key=lambda p: end[id(p[0])],
    )
    state = {"s": [0, 0.0], "o": [0, 0.0]}  # next index, shift (us)

    def advance(which, events, upto, stretch):
        i, shift = state[which]
        while i < len(events) and events[i] is not upto:
            e = events[i]
            e["ts"] += shift
            if stretch and _compute(e):
                shift += (factor - 1) * e["dur"]
                e["dur"] *= factor
            i += 1
        state[which] = [i + (upto is not None), shift]

    for a, b in pairs:
        advance("s", gpu_s, a, True)
        advance("o", gpu_o, b, False)
        start_a, start_b = a["ts"] + state["s"][1], b["ts"] + state["o"][1]
        last, last_before = max(start_a, start_b), max(a["ts"], b["ts"])
        for which, e, start in (("s", a, start_a), ("o", b, start_b)):
            new_end = last + (end[id(e)] - last_before)
            state[which][1] = new_end - end[id(e)]
            e["ts"], e["dur"] = start, new_end - start
    advance("s", gpu_s, None, True)
    advance("o", gpu_o, None, False)
    return slow, other
