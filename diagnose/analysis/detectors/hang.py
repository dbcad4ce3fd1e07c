"""hang: the job stopped making progress; say who never arrived where.

Signal: the launcher's watchdog saw no new event on any rank for
--hang-timeout seconds and asked every rank for a dump (in-flight collectives
with group and sequence number, and every thread's stack). Ranks blocked in
the same (group, seq) are the waiters; members of that group not blocked there
never arrived. Each missing rank's innermost user frame is where it is stuck.
Without dumps (a rank too wedged to write one), the traces still say who fell
behind: the members of a group whose last sequence number is lowest.
Severity: always critical, the job did not finish.
"""
from collections import defaultdict

from diagnose.analysis.findings import Finding


def _main_thread_frame(dump: dict) -> str | None:
    for thread in dump.get("threads", []):
        if thread.get("main"):
            return thread.get("innermost_user_frame")
    return None


def _blocking(dump: dict) -> list[dict]:
    return [row for row in dump.get("in_flight", []) if row.get("state") == "blocking"]


def _instance_key(row):
    return (str(row.get("group")), int(row.get("seq", -1)), str(row.get("op")),
            str(row.get("group_ranks", "")))


def _from_dumps(ctx, dumps):
    """Waiters per instance; the root cause is a missing member that is not itself
    blocked in another collective (those are victims of a cascade)."""
    waiting = defaultdict(list)  # instance -> ranks blocked there
    blocked_in = {}              # rank -> the instance it is blocked in
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
            frame = _main_thread_frame(dump) if dump else None
            state = f"it is stuck at {ctx.relpath(frame)}" if frame else "it left no dump"
        callsite = ctx.relpath(frame) if frame else None
        victims = sorted({r for k in waiting for r in waiting[k]})
        findings.append(Finding(
            kind="hang", severity="critical", ranks=[rank], callsite=callsite,
            title=(f"rank {rank} never entered {op} #{seq} of group {group} (ranks {group_ranks}); "
                   f"{state}; {len(victims)} rank{'s' if len(victims) != 1 else ''} "
                   f"({','.join(map(str, victims))}) waited on it"),
            recommendation=("Make every member issue the same collectives in the same order: look at "
                            "the stuck line for a rank-dependent branch, early exit, exception or "
                            "blocking I/O before the collective."),
            metrics={"seq": seq, "waiting_ranks": len(victims), "direct_waiters": len(waiting[key]),
                     "root_cause": float(rank in roots), "stalled_s": stalled_s}))
    return findings


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
        findings.append(Finding(
            kind="hang", severity="critical", ranks=ranks,
            title=f"rank{'s' if len(ranks) > 1 else ''} {','.join(map(str, ranks))} fell behind in group {group}: "
                  f"the others reached collective #{seq}",
            recommendation="Check those ranks for a rank-dependent branch or a stall before the collective.",
            metrics={"seq": seq, "missing_ranks": len(ranks)}))
    return findings


def detect(ctx):
    hung = bool(ctx.run.manifest.get("hang"))
    dumps = ctx.run.watchdog_dumps
    if not hung and not dumps:
        return []
    findings = _from_dumps(ctx, dumps) if dumps else []
    return findings or _from_traces(ctx)
