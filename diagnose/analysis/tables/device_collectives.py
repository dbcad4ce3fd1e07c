"""Collectives seen on the device (imported Kineto / Nsight traces): checking
that the members the importer numbered alike are one NCCL collective.

A trace that carries no sequence numbers (older PyTorch, every Nsight export)
is numbered per rank in the order of its NCCL kernels on each communicator's
stream (detail "gpu:order"). On a complete trace that order is the
communicator's, but a sampled or truncated trace, or a rank that issued one
collective more, shifts it, and matching by position alone would then pair
unrelated kernels and invent waits. So every position is checked:

    op      all members run the same collective
    bytes   and move the same amount, where the trace says and the op sends
            equal amounts on every member (not all_to_all, whose splits differ)
    time    all members of one NCCL collective finish together (microseconds on
            one node, tens of microseconds across nodes): on the aligned clock
            each member's kernel end is within END_TOLERANCE_NS of the
            instance's median end

A member that fails is unmatched (seq -1, so it joins no instance) and the
loader says how many were, per rank and communicator; it is never silently
matched. The time check must not depend on the hosts' clocks, which may be
milliseconds apart: each rank's lead over the others (its clock offset) is
estimated robustly from the instances that agree and taken out first. The
clock is then refined from the instances that are left
(diagnose.analysis.load.clock_align).
"""

import numpy as np
import pandas as pd

INFERRED = "gpu:order"
WAIT_BOUND = "gpu:wait"  # a live run's async call: its end is when the host waited (an upper bound)
# the detail of a collective seen on the device: an NCCL kernel (diagnose.importers)
# or a live run's CUDA events (collectors/instrument/collective_events.py)
EXACT_END_DETAILS = ("gpu", INFERRED)  # whose end is the kernel's: members end together
# a live async call timed by NCCL (TORCH_NCCL_ENABLE_TIMING): its end modelled from
# the kernel's duration, close to the kernel's but not used to refine clocks
NCCL_TIMED = "gpu:nccl"
# an imported trace's forward/backward passes on the device (diagnose/importers/kineto_structure.py):
# device time, never the host's (the host breakdown leaves them out)
INFERRED_PASS = "gpu:inferred"
DEVICE_DETAILS = (*EXACT_END_DETAILS, WAIT_BOUND, NCCL_TIMED, INFERRED_PASS)
END_TOLERANCE_NS = 1_000_000
_UNEQUAL_SIZES = ("all_to_all", "send_recv", "nccl")


def on_device(arrivals: pd.DataFrame) -> bool:
    """Whether the run's collectives are seen on the device (NCCL kernels of an
    imported trace, a live run's CUDA events), so that its detectors judge
    device time."""
    return bool(len(arrivals)) and bool(timed_on_device(arrivals["detail"]).any())


def timed_on_device(detail: pd.Series) -> np.ndarray:
    """Whether each row is a device row (its detail one of DEVICE_DETAILS): the
    test runs once per distinct value (the loader's details are categoricals)."""
    codes, uniques = pd.factorize(detail)
    device = np.append(np.isin(np.asarray(uniques, dtype=str), DEVICE_DETAILS), False)
    return device[codes]  # code -1 (missing) reads the appended False


def _inferred(events: pd.DataFrame) -> np.ndarray:
    return (
        (events["detail"] == INFERRED) & events["kind"].isin(["collective", "done"]) & (events["seq"] >= 0)
    ).to_numpy()


def unmatch_by_op(events: pd.DataFrame, warn) -> int:
    """Unmatch inferred members whose op or bytes differ from their instance's
    (its most common op; bytes where sizes must agree). Returns how many."""
    rows = events[_inferred(events) & (events["kind"] == "collective").to_numpy()]
    if rows.empty:
        return 0
    name = rows["name"].astype(str)
    key = [rows["group"].astype(str), rows["seq"]]
    common_op = name.groupby(key).transform(lambda s: s.mode().iloc[0])
    # no op held by more than half the members: nothing to trust, all unmatched
    majority = (name == common_op).groupby(key).transform("mean") > 0.5
    sized = (rows["bytes"] > 0) & ~name.isin(_UNEQUAL_SIZES)
    common_bytes = rows["bytes"].where(sized).groupby(key).transform("median")
    bad = (name != common_op) | ~majority | (sized & (rows["bytes"] != common_bytes))
    return _unmatch(events, rows[bad], "op or size", warn)


def unmatch_by_time(events: pd.DataFrame, warn) -> int:
    """Unmatch inferred members whose kernel end is more than END_TOLERANCE_NS
    off their instance's median end, once each rank's typical lead (its clock
    offset: the median over its instances, from those that agree) is taken out."""
    dones = events[_inferred(events) & (events["kind"] == "done").to_numpy()]
    if dones.empty:
        return 0
    key = [dones["group"].astype(str), dones["seq"]]
    shared = dones["start_ns"].groupby(key).transform("size") > 1
    lead = (dones["start_ns"] - dones["start_ns"].groupby(key).transform("median")).astype(float)
    agree = shared.copy()
    for _ in range(3):  # the rank's lead from the instances that agree, then agree again
        rank_lead = lead[agree].groupby(dones["rank"][agree]).median()
        off = (lead - dones["rank"].map(rank_lead).fillna(0.0)).abs()
        agree = shared & (off <= END_TOLERANCE_NS)
    return _unmatch(events, dones[shared & ~agree], "kernel end", warn)


def _unmatch(events: pd.DataFrame, bad: pd.DataFrame, why: str, warn) -> int:
    if bad.empty:
        return 0

    def keys(frame):
        return pd.MultiIndex.from_arrays(
            [frame["rank"].to_numpy(), frame["group"].astype(str).to_numpy(), frame["seq"].to_numpy()]
        )

    bad_keys = keys(bad).unique()
    rows = events[_inferred(events)]
    events.loc[rows.index[keys(rows).isin(bad_keys)], "seq"] = -1
    for (rank, group), n in bad.groupby([bad["rank"], bad["group"].astype(str)]).size().items():
        total = int(
            ((rows["rank"] == rank) & (rows["group"].astype(str) == group) & (rows["kind"] == "collective")).sum()
        )
        warn(
            f"rank {rank}, {group}: {n} of {total} collectives differ ({why}) from the other ranks' "
            "at the same position in the trace; left unmatched (a sampled or truncated trace?)"
        )
    return len(bad_keys)


def kernel_steps(run, steps) -> list[int]:
    """Of `steps`, those whose device time the kernels show: every rank has
    kernels launched in them. An import: all of them; a live run: none, or the
    few of a profiler window (the others would read as an idle device)."""
    kernels = run.kernels()
    if kernels.empty or not steps:
        return []
    ranks = kernels[kernels["step"].isin(list(steps))].groupby("step")["rank"].nunique()
    return sorted(int(s) for s in ranks[ranks == len(run.ranks)].index)
