"""Where the members of a process group diverge, from Flight Recorder dumps.

Each rank's `pg_status` says, per local `pg_id`, the last collective it
enqueued, started (needs TORCH_NCCL_ENABLE_TIMING, else -1) and completed. The
`pg_id` is local to the rank; the group's global name (the `pg_config` key, the
same on every member) is linked to it by the rank's entries (`pg_id`,
`process_group`), and, for the groups its buffer holds no entry of, by creation
order: a rank numbers its groups as it makes them, and torch names a group (not
hashed) by how many groups were made before it, so where the rank's
`pg_config` has as many groups as its `pg_status`, all named by numbers, and
its entries agree, the n-th id is the n-th name (true of every id the entries
tie on both real 16-rank dump sets). A rank whose counters cannot be placed
that way has numbers that stay unplaced: that is said, not guessed.

Per group, with C = the furthest any member completed and W = C + 1:
- a member that completed less than C while its peers went on:
  `stuck` if it started the next one (its kernel runs and never ends),
  `device stopped` if it enqueued it (its device stopped completing work),
  `missing` if it never enqueued it;
- members that completed C and enqueued W are waiting in W; a member that
  completed C and never enqueued W is `missing` (its host never got there),
  unless it is itself waiting in another group: then it is a victim of that
  wait (a cascade), as a member with an empty buffer or no dump is counted
  missing only when it waits nowhere;
- members holding W with another op (or, for ops whose inputs must agree,
  other sizes) than the majority: `desync`.
Groups carrying point-to-point traffic are not compared: their counters count
pairs, not the group; a rank with a send or receive pending is waiting there
(not missing). A rank another witness saw blocked (diagnose's own dump: gloo's
point-to-point calls are not in its Flight Recorder) is waiting too, and one
it saw blocked inside a call of the group it lags in is waiting there (gloo
marks a collective completed only when its work is retired, after its peers saw
it end: found on the `hang` demo, where a waiting rank looked "device stopped").
"""

from collections import Counter, defaultdict

from diagnose.analysis.tables.flight_recorder_headline import headline, pg_status_sentence

ROLE_ORDER = ("desync", "stuck", "device stopped", "missing")
# ops whose input sizes are the same on every member (all_to_all and gather/scatter may differ)
_SAME_SIZES = ("all_reduce", "allreduce", "broadcast", "reduce", "all_gather", "allgather", "reduce_scatter", "barrier")


def _pg_names(dump: dict) -> tuple[dict, bool]:
    """(local pg_id -> (group name, description), consistent?) from the rank's entries."""
    names, ok = {}, True
    for e in dump["entries"]:
        seen = names.setdefault(e["pg_id"], (e["group"], e["group_desc"]))
        ok &= seen[0] == e["group"]
    return names, ok


def _names_by_creation_order(dump: dict, from_entries: dict) -> dict:
    """local pg_id -> (group name, description) for every pg_status id, when the
    rank's pg_config and pg_status pair up in creation order and agree with its
    entries (`from_entries`); else {}."""
    config, ids = list(dump["groups"]), list(dump["pg_status"])
    if len(config) != len(ids) or not all(n.isdigit() for n in config + ids):
        return {}
    tied = {
        pg_id: (name, dump["groups"][name]["desc"])
        for pg_id, name in zip(sorted(ids, key=int), sorted(config, key=int))
    }
    agree = all(tied[pg_id][0] == name for pg_id, (name, _) in from_entries.items())
    return tied if agree else {}


def _sizes_must_agree(op: str) -> bool:
    base = op.split(":")[-1].strip("_").lower()
    return not base.startswith(("all_to_all", "alltoall")) and base.startswith(_SAME_SIZES)


def group_progress(dumps: dict[int, dict], world_size: int | None = None):
    """(progress: group -> rank -> {enqueued, started, completed}, groups: group ->
    {desc, ranks, p2p}, notes: what the buffers cannot tell)."""
    progress, groups, notes = defaultdict(dict), {}, []
    for rank, dump in sorted(dumps.items()):
        names, consistent = _pg_names(dump)
        if not consistent:
            notes.append(f"rank {rank}: one pg_id names two groups in its entries; its numbers are not used")
            continue
        by_order = _names_by_creation_order(dump, names)
        names = {**by_order, **names}
        for name, config in dump["groups"].items():
            groups.setdefault(name, {"desc": config["desc"], "ranks": config["ranks"], "p2p": False})
        for pg_id, status in dump["pg_status"].items():
            if pg_id in names:
                name, desc = names[pg_id]
                groups.setdefault(name, {"desc": desc, "ranks": None, "p2p": False})["desc"] = desc
                progress[name][rank] = status
        unplaced = sorted(set(dump["pg_status"]) - set(names), key=lambda p: int(p) if p.isdigit() else p)
        if unplaced and not dump["entries"]:
            notes.append(
                f"rank {rank}'s buffer is empty: its pg_status ({len(unplaced)} groups) cannot be tied to group names"
            )
        elif by_order and not dump["entries"]:
            notes.append(
                f"rank {rank}'s buffer is empty: its pg_status is tied to group names by creation order (its pg_config)"
            )
        for e in dump["entries"]:
            if e["is_p2p"]:
                groups[e["group"]]["p2p"] = True
    everyone = sorted(set(dumps) | set(range(world_size or 0)))
    for name, group in groups.items():
        if group["ranks"] is None:
            if group["desc"] == "default_pg":
                group["ranks"] = everyone
            else:
                group["ranks"] = sorted(progress.get(name, {}))
                notes.append(
                    f"group {name} ({group['desc']}): no pg_config ranks in the dumps; its members "
                    "are taken as the ranks whose buffers name it"
                )
    return progress, groups, notes


def _held(dumps, name, seq, ranks) -> dict:
    """rank -> its entry of collective (group, seq), for the ranks whose buffers hold it."""
    held = {}
    for r in ranks:
        entry = next(
            (e for e in dumps[r]["entries"] if e["group"] == name and e["seq"] == seq and not e["is_p2p"]), None
        )
        if entry is not None:
            held[r] = entry
    return held


def diverge(dumps: dict[int, dict], world_size: int | None = None, blocked_in=None) -> dict:
    """Culprits, victims and the headline group of a hang, from the dumps.
    `blocked_in`: rank -> the groups another witness (diagnose's own dump) saw it
    blocked in, the dumps' group names; those ranks are waiting."""
    blocked_in = blocked_in or {}
    blocked_elsewhere = set(blocked_in)
    progress, groups, notes = group_progress(dumps, world_size)
    roles = defaultdict(dict)  # rank -> group -> (role, seq)
    waiting = defaultdict(set)  # group -> ranks waiting in its W
    absent = defaultdict(list)  # group -> (rank, why) never enqueued W, to judge once waits are known
    waited = {}  # group -> W
    for name, group in groups.items():
        known = progress.get(name, {})
        if group["p2p"] or not known:
            continue
        done = max(s["completed"] for s in known.values())
        lagging = set()  # behind, but blocked inside a call of this very group
        for rank, s in known.items():
            if s["completed"] < done:
                if name in blocked_in.get(rank, ()) and s["enqueued"] > s["completed"]:
                    # its host waits in this group's call: on gloo a collective is
                    # marked completed only when its work is retired, after peers
                    # saw it end; a lag in bookkeeping, not a stopped device
                    lagging.add(rank)
                    continue
                role = (
                    "stuck"
                    if s["started"] > s["completed"]
                    else "device stopped"
                    if s["enqueued"] > s["completed"]
                    else "missing"
                )
                roles[rank][name] = (role, s["completed"] + 1)
        here = {r for r, s in known.items() if s["completed"] == done and s["enqueued"] > done} | lagging
        if not here:
            continue
        waiting[name], waited[name] = here, done + 1
        for rank in group["ranks"]:
            s = known.get(rank)
            if s is not None:
                if s["completed"] == done and s["enqueued"] == done:
                    absent[name].append((rank, "it never enqueued it"))
            elif rank not in dumps:
                absent[name].append((rank, "it left no dump"))
            elif not dumps[rank]["entries"]:
                absent[name].append((rank, "its buffer is empty"))
            else:
                notes.append(
                    f"rank {rank} holds no entry of group {name} ({group['desc']}): whether it "
                    f"enqueued #{done + 1} is unknown"
                )
        _desync(dumps, name, done + 1, here, roles)
    p2p = [
        f"{n} ({g['desc']})"
        for n, g in groups.items()
        if g["p2p"] and any(s["enqueued"] > s["completed"] for s in progress.get(n, {}).values())
    ]
    if p2p:
        notes.append(
            "groups carrying point-to-point traffic with work pending are not compared (their "
            f"counters count pairs): {', '.join(p2p)}"
        )
    in_p2p = {
        r
        for r, d in dumps.items()
        if any(e["is_p2p"] and not e["retired"] and e["state"] != "completed" for e in d["entries"])
    }
    outside = set(blocked_elsewhere) - in_p2p - set().union(*waiting.values()) if waiting else set()
    if outside:
        notes.append(
            f"rank{'s' if len(outside) > 1 else ''} {', '.join(map(str, sorted(outside)))} "
            "wait in an operation Flight Recorder did not record (diagnose's own dump saw it)"
        )
    blocked = set().union(*waiting.values(), in_p2p, blocked_elsewhere)
    candidates = {(rank, name, why) for name, items in absent.items() for rank, why in items}
    roots = {c for c in candidates if c[0] not in blocked}
    cycle = not roles and not roots and bool(candidates)
    for rank, name, _why in candidates if cycle else roots:
        roles[rank].setdefault(name, ("missing", waited[name]))
    reasons = {(rank, name): why for rank, name, why in candidates}
    culprits = {}
    for rank, per_group in roles.items():
        role = min((r for r, _ in per_group.values()), key=ROLE_ORDER.index)
        culprits[rank] = {
            "role": role,
            "groups": sorted(per_group, key=lambda g: per_group[g][1]),
            "seq": {g: seq for g, (_, seq) in per_group.items()},
            "why": {g: reasons.get((rank, g)) for g in per_group},
        }
    for rank, culprit in culprits.items():
        if rank in dumps and not dumps[rank]["entries"]:  # its counters are all there is of it
            culprit["pg_status_says"] = {
                g: pg_status_sentence(rank, g, progress.get(g, {}).get(rank), roles[rank][g][0], seq)
                for g, seq in culprit["seq"].items()
            }
    victims = sorted(blocked - set(culprits))
    pending = {name: _held(dumps, name, waited[name], sorted(ranks)) for name, ranks in waiting.items()}
    return {
        "culprits": culprits,
        "victims": victims,
        "cycle": cycle,
        "notes": notes,
        "headline": headline(groups, culprits, waiting, waited, pending),
        "groups": groups,
        "progress": progress,
    }


def _desync(dumps, name, seq, ranks, roles) -> None:
    """Members holding (group, seq) with another op (or sizes where they must agree)."""
    held = {
        r: (e["op"], tuple(map(tuple, e["input_sizes"])) if _sizes_must_agree(e["op"]) else None)
        for r, e in _held(dumps, name, seq, ranks).items()
    }
    if len(set(held.values())) < 2:
        return
    majority, _ = Counter(held.values()).most_common(1)[0]
    for r, value in held.items():
        if value != majority:
            roles[r][name] = ("desync", seq)
