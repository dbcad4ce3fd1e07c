"""The rank's clock: CLOCK_MONOTONIC in ns, anchored once to wall time.

`DIAGNOSE_TEST_CLOCK_SKEW_NS="RANK:NS,..."` adds a fixed offset to one rank's
clock. It exists only so tests can prove that alignment removes real skew
between hosts; it is read once at import.
"""

import os
import time

from collectors import identity


def _skew_for_this_rank() -> int:
    spec = os.environ.get("DIAGNOSE_TEST_CLOCK_SKEW_NS", "")
    rank = str(identity.rank())
    for item in filter(None, spec.split(",")):
        r, _, ns = item.partition(":")
        if r.strip() == rank:
            return int(ns)
    return 0


SKEW_NS = _skew_for_this_rank()

if SKEW_NS:

    def now_ns() -> int:
        return time.monotonic_ns() + SKEW_NS
else:
    now_ns = time.monotonic_ns


def anchors() -> dict:
    """A (monotonic, wall) pair taken back to back: the wall clock of any event is
    wall_anchor_ns + (t - mono_anchor_ns)."""
    mono = now_ns()
    wall = time.time_ns()
    # A skewed test host is off in wall time too, as a real badly-synced host is.
    return {"mono_anchor_ns": mono, "wall_anchor_ns": wall + SKEW_NS}
