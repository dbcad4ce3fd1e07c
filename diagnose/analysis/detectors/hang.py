"""hang: the job stopped making progress; say who never arrived where.

Signal, first witness: PyTorch Flight Recorder dumps in the run dir (the
backend's on a watchdog timeout, diagnose's on a hang, or imported), on any
backend. Per process group, the collective each member enqueued, started and
completed (diagnose/analysis/tables/collective_divergence.py): the ranks that stopped
where their peers went on are the culprits, each with its role (missing,
device stopped, stuck, desync; for one whose buffer is empty, what its
pg_status says); one finding names them all, with the op the job stalled on
(the waiters' earliest-created pending op some culprit never reached: see
diagnose/analysis/tables/flight_recorder_headline.py), its sizes and who waits there,
and the other such ops in that order (`also_pending`).

Second witness (gloo, and NCCL without dumps): the launcher's watchdog saw no new event on any rank for
--hang-timeout seconds and asked every rank for a dump (in-flight collectives
with group and sequence number, and every thread's stack). Ranks blocked in
the same (group, seq) are the waiters; members of that group not blocked there
never arrived. Each missing rank's innermost user frame is where it is stuck.
Without dumps (a rank too wedged to write one), the traces still say who fell
behind: the members of a group whose last sequence number is lowest.
Severity: always critical, the job did not finish.
"""

from collections import defaultdict

from diagnose.analysis.detectors.finding_record import Finding
from diagnose.analysis.tables.collective_divergence import diverge
from diagnose.analysis.tables.stuck_frames import describe, sentence


def _main_thread_frame(dump: dict) -> str | None:
    for thread in dump.get("threads", []):
        if thread.get("main"):
            return thread.get("innermost_user_frame")
    return None


def _stuck_at(ctx, dump: dict | None) -> tuple[str | None, str | None]:
    """(file:line, what it is in as a phrase) of a culprit: from its faulthandler
    stacks where it left them (they need no GIL), else its watchdog dump's main thread."""
    if dump and dump.get("fault_stacks"):
        where = describe(dump["fault_stacks"], bool(dump.get("watchdog_dumped")))
        if where is not None:
            return where["frame"], sentence(where, ctx.relpath)
    frame = _main_thread_frame(dump) if dump else None
    return frame, (f"at {ctx.relpath(frame)}" if frame else None)


def waiters_by_place(ctx, dumps: dict) -> str:
    """ "3 ranks wait in all_reduce at train.py:120; ...": the blocked ranks grouped by op and line."""
    places = defaultdict(list)
    for rank, dump in sorted(dumps.items()):
        rows = _blocking(dump)
        if rows:
            places[(str(rows[0].get("op")), rows[0].get("callsite") or "")].append(rank)
    return "; ".join(
        f"{len(ranks)} rank{'s wait' if len(ranks) > 1 else ' waits'} in {op}"
        + (f" at {ctx.relpath(site)}" if site else "")
        for (op, site), ranks in sorted(places.items(), key=lambda p: -len(p[1]))
    )


def _blocking(dump: dict) -> list[dict]:
    return [row for row in dump.get("in_flight", []) if row.get("state") == "blocking"]


def _instance_key(row):
    return (str(row.get("group")), int(row.get("seq", -1)), str(row.get("op")), str(row.get("group_ranks", "")))


def _from_dumps(ctx, dumps):
    """Waiters per instance; the root cause is a missing member that is not itself
    blocked in another collective (those are victims of a cascade)."""
    waiting = defaultdict(list)  # instance -> ranks blocked there
    blocked_in = {}  # rank -> the instance it is blocked in
    for rank, dump in dumps.items():
        for row in _blocking(dump):
            key = _instance_key(row)
            waiting[key].append(rank)
            blocked_in.setdefault(rank, key)
    missing_from = defaultdict(list)  # rank -> instances it never entered
    for key, waiters in waiting.items():
        expected = [int(r) for r in key[3].split(",") if r.strip().lstrip("-").isdigit()]
        for r in expected:
            if r not in waiters:
                missing_from[r].append(key)
    roots = [r for r in sorted(missing_from) if r not in blocked_in]
    stalled_s = float((ctx.run.manifest.get("hang") or {}).get("stalled_s", 0) or 0)
    findings = []
    for rank in roots or sorted(missing_from):
        key = max(missing_from[rank], key=lambda k: (len(waiting[k]), -k[1]))
        group, seq, op, group_ranks = key
        dump = dumps.get(rank)
        if rank in blocked_in:
            other = blocked_in[rank]
            frame = next((r.get("callsite") for r in _blocking(dump)), None) if dump else None
            state = f"it is blocked in {other[2]} #{other[1]} of group {other[0]} instead"
        else:
            frame, where = _stuck_at(ctx, dump)
            state = f"it is stuck {where}" if where else "it left no dump"
        callsite = ctx.relpath(frame) if frame else None
        victims = sorted({r for k in waiting for r in waiting[k]})
        grouped = waiters_by_place(ctx, dumps)
        findings.append(
            Finding(
                kind="hang",
                severity="critical",
                ranks=[rank],
                callsite=callsite,
                title=(
                    f"rank {rank} never entered {op} #{seq} of group {group} (ranks {group_ranks}); "
                    f"{state}; {len(victims)} rank{'s' if len(victims) != 1 else ''} "
                    f"({','.join(map(str, victims))}) waited on it" + (f" ({grouped})" if grouped else "")
                ),
                recommendation=(
                    "Make every member issue the same collectives in the same order: look at "
                    "the stuck line for a rank-dependent branch, early exit, exception or "
                    "blocking I/O before the collective."
                ),
                metrics={
                    "source": "watchdog",
                    "group": group,
                    "group_ranks": group_ranks,
                    "op": op,
                    "seq": seq,
                    "waiting_ranks": len(victims),
                    "waiting_rank_list": _ranks_text(victims),
                    "direct_waiters": len(waiting[key]),
                    "root_cause": float(rank in roots),
                    "waiters": grouped,
                    "stalled_s": stalled_s,
                },
            )
        )
    return findings


def _ranks_text(ranks) -> str:
    return ",".join(map(str, ranks))


def _from_flight_recorder(ctx, dumps, witness):
    # diagnose's own dumps see gloo's point-to-point waits, which Flight Recorder does not record
    blocked_in = {
        r: {str(row.get("group")) for row in _blocking(d)} for r, d in ctx.run.watchdog_dumps.items() if _blocking(d)
    }
    result = diverge(dumps, ctx.run.manifest.get("world_size"), blocked_in=blocked_in)
    culprits, head = result["culprits"], result["headline"]
    if not culprits:
        return []
    stalled_s = float((ctx.run.manifest.get("hang") or {}).get("stalled_s", 0) or 0)
    groups = result["groups"]
    metrics = {
        "source": "flight_recorder",
        "stalled_s": stalled_s,
        "victim_ranks": len(result["victims"]),
        "cycle_of_waits": float(result["cycle"]),
    }
    parts = []
    for rank in sorted(culprits):
        c = culprits[rank]
        named = [f"{g} ({groups[g]['desc']})" for g in c["groups"]]
        # where it stopped: in the headline group when it is a member, else its first group
        first = head["group"] if head and head["group"] in c["seq"] else c["groups"][0]
        metrics[f"rank{rank}_role"] = c["role"]
        metrics[f"rank{rank}_groups"] = "; ".join(named)
        metrics[f"rank{rank}_seq"] = c["seq"][first]
        why = c["why"].get(first)
        # a culprit with an empty buffer: what its pg_status says of that group, or that it cannot say
        said = c.get("pg_status_says", {}).get(first)
        _, where = _stuck_at(ctx, ctx.run.watchdog_dumps.get(rank))
        parts.append(
            (
                said
                or f"rank {rank} {c['role']} at #{c['seq'][first]}"
                + (f" ({why})" if why and c["role"] == "missing" else "")
            )
            + (f", also in {len(named) - 1} more group{'s' if len(named) > 2 else ''}" if len(named) > 1 else "")
            + (f"; its host is {where}" if where else "")
        )
    if head:
        what = f"{head['op'] or 'a collective'} #{head['seq']}"
        if head["sizes"]:
            what += f" ({head['sizes']}{' ' + head['dtype'] if head['dtype'] else ''})"
        # torch names a group made without a description "undefined"
        label = head["desc"] if head["desc"] not in ("", "undefined") else "a process group"
        title = (
            f"hang in {label} (group {head['group']}, ranks {_ranks_text(head['ranks'])}): "
            f"{what}, waited for by rank{'s' if len(head['waiting']) > 1 else ''} "
            f"{_ranks_text(head['waiting'])}; " + "; ".join(parts)
        )
        metrics.update(
            group=head["group"],
            group_desc=head["desc"],
            group_ranks=_ranks_text(head["ranks"]),
            op=head["op"],
            sizes=head["sizes"],
            dtype=head["dtype"],
            seq=head["seq"],
            waiting_ranks=len(head["waiting"]),
            waiting_rank_list=_ranks_text(head["waiting"]),
        )
        if head["also_pending"]:
            # the other ops culprits left peers waiting in, in the order the waiters entered them
            metrics["also_pending"] = "; ".join(
                f"{o['op'] or 'a collective'} #{o['seq']} in group {o['group']} ({o['desc']})"
                for o in head["also_pending"]
            )
    else:
        title = "hang: " + "; ".join(parts)
    if result["notes"]:
        metrics["buffers_cannot_tell"] = " | ".join(result["notes"])
    if witness is not None:  # the in-flight table of diagnose's own dumps (gloo)
        metrics["watchdog_dump_agrees"] = float(witness == sorted(culprits))
    roles = {c["role"] for c in culprits.values()}
    advice = []
    if roles & {"device stopped", "stuck"}:
        advice.append(
            "a rank whose device stopped or whose kernel never ended: check that GPU and its "
            "links (Xid errors in dmesg, nvidia-smi, NCCL_DEBUG=INFO) and take it out of the job"
        )
    if "missing" in roles:
        advice.append(
            "a rank that never enqueued the collective: its host is stuck before it (the line "
            "above; every thread's stack is in its rank folder, stacks-PID.txt) or took another branch"
        )
    if "desync" in roles:
        advice.append("a desync: make every member issue the same collectives, with the same sizes, in the same order")
    grouped = waiters_by_place(ctx, ctx.run.watchdog_dumps)
    if grouped:
        title += f" ({grouped})"
        metrics["waiters"] = grouped
    # where a culprit's host is (its stacks, else diagnose's own dump of its main thread)
    frames = [_stuck_at(ctx, ctx.run.watchdog_dumps.get(r))[0] for r in sorted(culprits)]
    frame = next((f for f in frames if f), None)
    return [
        Finding(
            kind="hang",
            severity="critical",
            ranks=sorted(culprits),
            title=title,
            callsite=ctx.relpath(frame) if frame else None,
            recommendation=("Fix the culprit, not the waiters: " + "; ".join(advice) + "."),
            metrics=metrics,
        )
    ]


def _from_traces(ctx):
    calls = ctx.run.collectives()
    calls = calls[calls["kind"] == "collective"]
    if calls.empty:
        return []
    last = calls.groupby(["group", "rank"])["seq"].max().reset_index()
    findings = []
    for group, frame in last.groupby("group"):
        behind = frame[frame["seq"] < frame["seq"].max()]
        if behind.empty:
            continue
        ranks = sorted(int(r) for r in behind["rank"])
        seq = int(frame["seq"].max())
        findings.append(
            Finding(
                kind="hang",
                severity="critical",
                ranks=ranks,
                title=f"rank{'s' if len(ranks) > 1 else ''} {','.join(map(str, ranks))} fell behind in group {group}: "
                f"the others reached collective #{seq}",
                recommendation="Check those ranks for a rank-dependent branch or a stall before the collective.",
                metrics={"seq": seq, "missing_ranks": len(ranks)},
            )
        )
    return findings


def detect(ctx):
    hung = bool(ctx.run.manifest.get("hang"))
    dumps, recorder = ctx.run.watchdog_dumps, ctx.run.flight_recorder
    if not hung and not dumps and not recorder:
        return []
    if not hung and (ctx.run.manifest.get("exit_status") == 0 or ctx.run.manifest.get("stall")):
        return []  # dumps of a stall the job came out of, or of a job that ended well
    native = _from_dumps(ctx, dumps) if dumps else []
    if recorder:
        witness = sorted(r for f in native for r in f.ranks) if dumps else None
        found = _from_flight_recorder(ctx, recorder, witness)
        # Flight Recorder sees only the ranks that could dump: one whose threads could not run
        # (a GIL held in C) is absent, and the buffers then blame its victims (a cycle of
        # waits, or a gloo call not yet retired behind a point-to-point wait). When diagnose's
        # own dumps saw every such "culprit" blocked, and their root left no buffer, the root
        # is the cause
        unseen = sorted(r for f in native for r in f.ranks if r not in recorder and f.metrics.get("root_cause"))
        seen_blocked = {r for r, d in dumps.items() if _blocking(d)}
        if found and unseen and set(found[0].ranks) <= seen_blocked:
            for f in native:
                f.metrics["flight_recorder_view"] = (
                    f"rank(s) {_ranks_text(found[0].ranks)}, which diagnose's "
                    f"dumps saw waiting; rank(s) {_ranks_text(unseen)} left no "
                    "buffer"
                )
            return native
        if found:
            return found
    return native or (_from_traces(ctx) if len(ctx.run.ranks) else [])
