"""Put every rank on rank 0's clock.

1. Offsets measured in the rank (store ping at init_process_group, with an
   error bound) are used as they are; a rank without one falls back to its
   wall-clock anchor (NTP-grade: milliseconds across hosts).
2. Refinement: members of one synchronous collective return nearly together,
   so each rank's median lead over the instance's median return time is
   residual clock error. Its precision is the standard error of that median
   (from the spread of the leads: on a loaded host a process can be scheduled
   milliseconds after its data arrived), never better than 0.2 ms. Whichever
   estimate is tighter wins: a rank whose measured error bound is smaller keeps
   its measured offset; otherwise a residual above the precision is applied.
   The precision is the rank's and the reference rank's together (the residual
   is the difference of their leads). A measured round trip bounds the offset
   for sure (causality); a residual that would take a rank outside its bound
   shows the collectives' return times are biased, not noisy, and is dropped:
   on a loaded 2-core host, ranks 0 and 1 of one gloo job (one clock, pinged
   to 0.07 ms) returned from the same all-reduces 7 ms apart in the median.
3. Device traces (imported Kineto / Nsight): the members of one NCCL collective
   finish their kernels within microseconds of each other, whatever the hosts'
   clocks say, so when a run has collective kernels their ends ("done" rows of
   detail gpu*) are the samples instead, with a floor of DEVICE_PRECISION_NS.
   The precision reached is each refined rank's offset error (the residual the
   report states).
"""

import numpy as np
import pandas as pd

from diagnose.analysis.tables.device_collectives import EXACT_END_DETAILS

COLLECTIVE_PRECISION_NS = 200_000
DEVICE_PRECISION_NS = 5_000
WALL_CLOCK_ERROR_NS = 10_000_000  # NTP across hosts: milliseconds


def measured_offsets(rank_meta: dict) -> tuple[dict, dict, set]:
    """rank -> offset_ns and rank -> error_ns from meta.json, wall anchors as
    fallback; and the ranks whose error is a measured (hard) bound."""
    anchors = {r: m.get("clock", {}) for r, m in rank_meta.items() if isinstance(m.get("clock"), dict)}
    ref = min(anchors) if anchors else None
    offsets, errors, bounded = {}, {}, set()
    for rank in rank_meta:
        clock = anchors.get(rank, {})
        offset, error = clock.get("offset_to_rank0_ns"), clock.get("offset_error_ns")
        if isinstance(offset, (int, float)):
            offsets[rank], errors[rank] = int(offset), int(error or 0)
            bounded.add(rank)
            continue
        try:
            ref_clock = anchors[ref]
            offsets[rank] = int(
                (clock["mono_anchor_ns"] - clock["wall_anchor_ns"])
                - (ref_clock["mono_anchor_ns"] - ref_clock["wall_anchor_ns"])
            )
            errors[rank] = WALL_CLOCK_ERROR_NS
        except (KeyError, TypeError):
            offsets[rank], errors[rank] = 0, 10**12
    return offsets, errors, bounded


def _samples(events: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """(rank, group, seq, end_ns) of the times members finish together, and their precision floor."""
    device = events[(events["kind"] == "done") & (events["seq"] >= 0)] if "detail" in events else events[:0]
    device = device[device["detail"].isin(EXACT_END_DETAILS)] if len(device) else device
    if len(device):
        return device[["rank", "group", "seq", "start_ns"]].rename(columns={"start_ns": "end_ns"}), DEVICE_PRECISION_NS
    sync = events[(events["kind"] == "collective") & (~events["async_op"]) & (events["seq"] >= 0)]
    return sync[["rank", "group", "seq", "end_ns"]], COLLECTIVE_PRECISION_NS


def refine_offsets(
    events: pd.DataFrame, errors: dict, bounded: set = frozenset(), precision_out: dict | None = None
) -> dict:
    """rank -> correction_ns to subtract, from the end times of collectives
    (events already on the measured clock); a rank in `bounded` (its error a
    measured bound) is corrected within that bound or not at all. The precision
    of each rank's estimate goes into precision_out."""
    sync, floor_ns = _samples(events)
    if sync.empty:
        return {}
    size = sync.groupby(["group", "seq"], observed=True)["end_ns"].transform("size")
    sync = sync[size > 1]
    if sync.empty:
        return {}
    instance = [sync["group"], sync["seq"]]
    reference_rank = 0 if (sync["rank"] == 0).any() else int(sync["rank"].min())
    corrections: dict = {}
    for _ in range(3):
        shifted = sync["end_ns"] - sync["rank"].map(corrections).fillna(0)
        lead = shifted - shifted.groupby(instance, observed=True).transform("median")
        by_rank = lead.groupby(sync["rank"])
        residual = by_rank.median()
        spread = by_rank.apply(lambda x: 1.4826 * np.median(np.abs(x - np.median(x))))
        precision = np.maximum(1.25 * spread / np.sqrt(by_rank.size()), floor_ns)
        residual = residual - residual.get(reference_rank, 0.0)
        precision = np.sqrt(precision**2 + precision.get(reference_rank, 0.0) ** 2)
        changed = False
        for rank, value in residual.items():
            if rank in bounded and abs(corrections.get(rank, 0) + value) > errors[rank]:
                continue  # contradicts a round trip: biased returns, not noise
            tighter = errors.get(rank, WALL_CLOCK_ERROR_NS) > precision[rank]
            if tighter and np.isfinite(value) and abs(value) > precision[rank]:
                corrections[rank] = corrections.get(rank, 0) + int(value)
                changed = True
        if precision_out is not None:
            precision_out.update({int(r): int(p) for r, p in precision.items() if r != reference_rank})
        if not changed:
            break
    return corrections
