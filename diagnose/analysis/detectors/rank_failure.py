"""rank_failure: a rank died (exception, exit or signal) and took the job down.

Signal: the job exited non-zero. Each rank that raised or did not exit cleanly
has a time of death: the earlier of its uncaught exception (meta.json) and the
moment the launcher saw its process die (polled every 20 ms; torchrun reacts
only every 100 ms), else the end of its trace. The first to die is the
failure; the others died of it (a peer's death surfaces as "connection closed
by peer" in gloo/NCCL, a peer that stopped as the backend watchdog's timeout,
or torchrun's SIGTERM) and are counted, not blamed; when every rank died of a
peer and Flight Recorder dumps are there, it is a hang and `hang` names it. Evidence: its last step, last user
callsite, and the exception or "killed by a signal".
Severity: always critical.
"""

import re

from diagnose.analysis.detectors.finding_record import Finding

# How a peer's death or stall looks from a surviving rank (gloo, NCCL, the TCP
# store): a connection closed under it, or its backend's watchdog giving up on a
# collective the peer never joined (NCCL's watchdog abort, gloo's recv timeout).
PEER_FAILURE = re.compile(
    r"closed by peer|reset by peer|Broken pipe|Read error|remote (worker|process)|"
    r"communicator was aborted|DistNetworkError|Socket Timeout|"
    r"Watchdog caught collective operation timeout|milliseconds before timing out|"
    r"NCCL operations have failed or timed out|ProcessGroupNCCL's watchdog|"
    r"Timed out waiting \d+ ?ms for (recv|send)",
    re.IGNORECASE,
)


def _death_times(ctx) -> dict[int, int]:
    """rank -> aligned ns of its death, for ranks that did not exit cleanly."""
    events = ctx.run.events()
    last = events.groupby("rank")["end_ns"].max().to_dict() if len(events) else {}
    exits = (ctx.run.manifest.get("rank_exits") or {}).get("exited_wall_ns") or {}
    wall_t0 = ctx.run.wall_t0_ns
    deaths = {}
    for rank, meta in ctx.run.rank_meta.items():
        exception = meta.get("exception") if isinstance(meta.get("exception"), dict) else None
        if meta.get("exit") and not exception:
            continue
        candidates = []
        if exception and isinstance(exception.get("mono_ns"), int):
            candidates.append(exception["mono_ns"] - ctx.run.offsets_ns.get(rank, 0) - ctx.run.t0_ns)
        if str(rank) in exits and wall_t0 is not None:
            candidates.append(int(exits[str(rank)]) - wall_t0)
        if not candidates and rank in last:
            candidates.append(int(last[rank]))
        if candidates:
            deaths[rank] = min(candidates)
    return deaths


def _died_of_a_peer(meta: dict) -> bool:
    exception = meta.get("exception")
    return isinstance(exception, dict) and bool(PEER_FAILURE.search(str(exception.get("message", ""))))


def detect(ctx):
    status = ctx.run.manifest.get("exit_status")
    if not status or ctx.run.manifest.get("hang"):
        return []
    deaths = _death_times(ctx)
    if not deaths:
        return []
    primary = {r: t for r, t in deaths.items() if not _died_of_a_peer(ctx.run.rank_meta.get(r, {}))}
    if not primary and ctx.run.flight_recorder:
        return []  # every rank died waiting for another: a hang, which the dumps name (hang)
    rank = min(primary or deaths, key=(primary or deaths).get)
    meta = ctx.run.rank_meta.get(rank, {})
    done = ctx.steps[ctx.steps["rank"] == rank]["step"]
    steps_done = (ctx.run.progress.get(rank) or {}).get("steps_done", 0)
    last_step = max(int(done.max()) + 1 if len(done) else 0, steps_done if isinstance(steps_done, int) else 0)
    exception = meta.get("exception") if isinstance(meta.get("exception"), dict) else None
    events = ctx.run.events()
    mine = events[(events["rank"] == rank) & (events["callsite"].astype(str) != "")]
    callsite = (exception or {}).get("callsite") or (
        str(mine.sort_values("end_ns")["callsite"].iloc[-1]) if len(mine) else None
    )
    callsite = ctx.relpath(callsite) if callsite else None
    cause = (
        f"raised {exception.get('type')}: {exception.get('message')}"
        if exception
        else "was killed by a signal (no Python exception; e.g. SIGKILL or the OOM killer)"
    )
    return [
        Finding(
            kind="rank_failure",
            severity="critical",
            ranks=[rank],
            callsite=callsite,
            title=f"rank {rank} died at step {last_step}: it {cause}" + (f"; last at {callsite}" if callsite else ""),
            recommendation=(
                "Read that rank's own log for the error; for a signal, check the kernel log for "
                "the OOM killer (dmesg) and the host's health. The other ranks' traces are intact."
            ),
            metrics={"last_step": last_step, "job_exit_status": status, "ranks_died_after": len(deaths) - 1},
        )
    ]
