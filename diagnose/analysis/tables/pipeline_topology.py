"""Pipeline stages and micro-batches inferred from point-to-point traffic, for
jobs that mark none (no `collectors.phase(stage=...)`, no schedule object):
most jobs. Applied by the loader only when no row of the run carries a stage;
marked stages always win.

The model, and where it says "ambiguous" instead of guessing:

    links       each send row is a directed link rank -> peer
    direction   of the two links between a pair of ranks, the forward one
                (activations) carries the pair's first send of a step: a
                micro-batch's activation goes forward before its gradient
                can come back; decided by a majority over steps
    chains      forward links form chains, one per data-parallel replica;
                a rank's stage is its position in its chain. Ambiguous, and
                not inferred: a rank with two forward links in or out (a
                V-shaped or branching schedule), a ring (interleaved
                schedules: the last rank sends back to the first, and a
                rank's chunks cannot be told apart by links), chains of
                unequal length, or a rank whose batched p2p an import could
                not read (its fused exchanges name no peer: a chain without
                it would stage the others wrongly)
    micro-batch the n-th forward send of a step on a link is micro-batch n
                (and the n-th backward send). A forward compute row (module
                forward) belongs to the micro-batch of the next forward send
                its rank makes in that step, or on the last stage, which
                sends none, of the forward receive that came before it; a
                backward row to the next backward send, or on the first stage
                of the backward receive before it. Right for GPipe (all
                forwards then all backwards) and 1F1B, where each stage runs
                micro-batches in order

Every rank of a chain is stamped with its stage on all its rows; forward and
backward rows and the forward/backward sends and receives get their
micro-batch. The loader keeps what it did (Run.stage_source) and warns when
the traffic shows a pipeline it cannot read.
"""

import numpy as np
import pandas as pd

_COMPUTE = ("forward", "backward")
COALESCED = "coalesced"  # the op of a batched p2p call (torch's nccl:coalesced) left without peers


def _p2p(events: pd.DataFrame, name: str) -> pd.DataFrame:
    # compared on the categoricals as they are: no string per row (10^7 rows at 1,024 ranks)
    return events[
        events["kind"].isin(["p2p", "collective"])
        & (events["name"] == name)
        & (events["peer"] >= 0)
        & (events["step"] >= 0)
    ]


def _sends(events: pd.DataFrame) -> pd.DataFrame:
    rows = _p2p(events, "send")
    return pd.DataFrame(
        {
            "src": rows["rank"].to_numpy(np.int64),
            "dst": rows["peer"].to_numpy(np.int64),
            "step": rows["step"].to_numpy(np.int64),
            "start_ns": rows["start_ns"].to_numpy(),
            "index": rows.index.to_numpy(),
        }
    )


def forward_links(sends: pd.DataFrame) -> set:
    """{(src, dst)}: per pair of linked ranks, the direction of its first send
    in most steps."""
    first = sends.groupby(["src", "dst", "step"])["start_ns"].min().reset_index()
    first["a"], first["b"] = first[["src", "dst"]].min(axis=1), first[["src", "dst"]].max(axis=1)
    links = set()
    for (a, b), pair in first.groupby(["a", "b"]):
        earliest = pair.loc[pair.groupby("step")["start_ns"].idxmin()]
        votes = (earliest["src"] == a).sum(), (earliest["src"] == b).sum()
        links.add((int(a), int(b)) if votes[0] >= votes[1] else (int(b), int(a)))
    return links


def chains(links: set) -> tuple[list | None, str | None]:
    """The forward chains (lists of ranks, first stage first), or None and why."""
    out_of, into = {}, {}
    for src, dst in links:
        if src in out_of or dst in into:
            return None, f"rank {src if src in out_of else dst} has two forward links (a branching schedule)"
        out_of[src], into[dst] = dst, src
    heads = sorted(set(out_of) - set(into))
    if not heads:
        return None, "the forward links form a ring (an interleaved schedule, or ring exchanges such as ring attention)"
    found, seen = [], set()
    for head in heads:
        chain = [head]
        while chain[-1] in out_of:
            chain.append(out_of[chain[-1]])
        found.append(chain)
        seen.update(chain)
    if seen != set(out_of) | set(into):
        return None, "some forward links form a ring (an interleaved schedule, or ring exchanges)"
    if len({len(c) for c in found}) != 1:
        return None, f"pipelines of unequal length {sorted({len(c) for c in found})}"
    return found, None


def _unread_exchange_ranks(events: pd.DataFrame) -> set:
    """Ranks with batched p2p exchanges an import left as collectives (no peer
    resolved: diagnose/importers/kineto_structure.py): a chain without them
    would stage the others wrongly."""
    rows = events[(events["kind"] == "collective") & (events["name"] == COALESCED)]
    return {int(r) for r in rows["rank"].unique()}


def _nth_in_step(rows: pd.DataFrame) -> np.ndarray:
    """Each row's position among its link's sends of its step, in time order."""
    ordered = rows.sort_values(["src", "dst", "step", "start_ns"], kind="stable")
    return ordered.groupby(["src", "dst", "step"]).cumcount().reindex(rows.index).to_numpy()


def _assign(events, compute_mask, anchors: pd.DataFrame, after: bool, microbatch: np.ndarray) -> None:
    """Give each compute row of a rank the micro-batch of the anchor (a send
    after its end when `after`, else a receive before its start) in its step."""
    selected = np.flatnonzero(compute_mask)
    ranks = events["rank"].to_numpy()[selected]
    at_all = events["end_ns" if after else "start_ns"].to_numpy()[selected]
    step_all = events["step"].to_numpy()[selected]
    by_rank = pd.Series(np.arange(len(selected))).groupby(ranks).indices  # rank -> positions
    for rank, mine in anchors.groupby("rank"):
        pos = by_rank.get(rank)
        if pos is None:
            continue
        mine = mine.sort_values("t_ns")
        t, steps, mbs = mine["t_ns"].to_numpy(), mine["step"].to_numpy(), mine["mb"].to_numpy()
        if after:
            j = np.searchsorted(t, at_all[pos], side="left")
            ok = j < len(t)
        else:
            j = np.searchsorted(t, at_all[pos], side="right") - 1
            ok = j >= 0
        j = np.clip(j, 0, max(len(t) - 1, 0))
        ok &= steps[j] == step_all[pos]
        microbatch[selected[pos[ok]]] = mbs[j[ok]]


def infer(events: pd.DataFrame):
    """(stage per rank, micro-batch per row or -1), or (None, why), or (None, None)
    when the run has no sends."""
    sends = _sends(events)
    if sends.empty:
        return None, None
    unread = _unread_exchange_ranks(events)
    if unread:
        return None, (
            f"rank {min(unread)}'s batched p2p (nccl:coalesced) names no peer the import could "
            "resolve (its meta.json device_structure says why), so its links are unknown"
        )
    found, why = chains(forward_links(sends))
    if found is None:
        return None, why
    stage = {rank: s for chain in found for s, rank in enumerate(chain)}
    if not set(sends["src"]) <= set(stage):
        return None, "sends between ranks outside the pipelines"
    forward = {(c[i], c[i + 1]) for c in found for i in range(len(c) - 1)}
    sends["mb"] = _nth_in_step(sends)
    sends["forward"] = [(s, d) in forward for s, d in zip(sends["src"], sends["dst"])]
    microbatch = np.full(len(events), -1, dtype=np.int32)
    position = pd.Series(np.arange(len(events)), index=events.index)
    microbatch[position[sends["index"]].to_numpy()] = sends["mb"].to_numpy()
    # the receive of each send: the same directed link (recv rows carry the sender as peer)
    recvs = _p2p(events, "recv")
    recvs = pd.DataFrame(
        {
            "src": recvs["peer"].to_numpy(np.int64),
            "dst": recvs["rank"].to_numpy(np.int64),
            "step": recvs["step"].to_numpy(np.int64),
            "start_ns": recvs["start_ns"].to_numpy(),
            "index": recvs.index.to_numpy(),
        }
    )
    recvs["mb"] = _nth_in_step(recvs) if len(recvs) else []
    recvs["forward"] = [(s, d) in forward for s, d in zip(recvs["src"], recvs["dst"])]
    if len(recvs):
        microbatch[position[recvs["index"]].to_numpy()] = recvs["mb"].to_numpy()
    kinds = events["kind"]
    last = {c[-1] for c in found}
    first = {c[0] for c in found}
    for phase, fwd in (("forward", True), ("backward", False)):
        mask = (kinds == phase).to_numpy()
        # the anchor: the next send in this direction, else (the end of the chain) the receive before
        sent = sends[sends["forward"] == fwd].rename(columns={"src": "rank", "start_ns": "t_ns"})
        _assign(
            events, mask & ~np.isin(events["rank"].to_numpy(), list(last if fwd else first)), sent, True, microbatch
        )
        got = recvs[recvs["forward"] == fwd].rename(columns={"dst": "rank", "start_ns": "t_ns"})
        _assign(events, mask & np.isin(events["rank"].to_numpy(), list(last if fwd else first)), got, False, microbatch)
    return stage, microbatch


def stamp_inferred_stages(events: pd.DataFrame, warn) -> str | None:
    """In place: stages and micro-batches from the traffic when the run marks no
    stage. Returns what the stages are: "marked", "inferred: <n> stages x <m>
    pipelines", or None (no pipeline; an ambiguous one is also a warning)."""
    if events.empty:
        return None
    if (events["stage"] >= 0).any():
        return "marked"
    stage, microbatch = infer(events)
    if stage is None:
        if microbatch is not None:  # why: there is traffic, but no pipeline can be read from it
            warn(f"pipeline stages not inferred: {microbatch}; each rank is analysed on its own")
        return None
    events["stage"] = events["rank"].map(stage).fillna(-1).astype(events["stage"].dtype)
    marked = microbatch >= 0
    if (events["microbatch"] >= 0).any():  # micro-batches marked without stages: keep them
        marked &= events["microbatch"].to_numpy() < 0
    values = events["microbatch"].to_numpy().copy()
    values[marked] = microbatch[marked]
    events["microbatch"] = values
    n_stages = max(stage.values()) + 1
    return f"inferred: {n_stages} stages x {len(stage) // n_stages} pipelines"


def rank_stages(events: pd.DataFrame) -> dict[int, int]:
    """rank -> pipeline stage, from the stage its rows were stamped with (marked
    or, after stamp_inferred_stages, inferred)."""
    staged = events.loc[events["stage"] >= 0, ["rank", "stage"]]
    if staged.empty:
        return {}
    # the most frequent stage of each rank, the lowest on a tie (as Series.mode)
    counts = staged.groupby(["rank", "stage"]).size().sort_values(ascending=False, kind="stable")
    return {int(r): int(s) for r, s in counts.groupby(level="rank").head(1).index}
