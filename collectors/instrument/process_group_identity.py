"""The rank the job's default process group gives this process, into meta.json
as `process_group` {rank, world_size}: the rank that counts. A process no
launcher started is recorded under a provisional name (traces/solo-<pid>) and
named after the job by this rank (diagnose/rundir/solo_ranks.py); a launcher's
worker whose process group disagrees with its launcher's variables (a script
that maps ranks itself) keeps its folder and says so as a collector error, so
the mismatch is on record rather than silently mislabelled."""

from collectors import identity
from collectors.instrument import on_process_group


def _note(rec) -> None:
    import torch.distributed as dist

    try:
        rank, world_size = dist.get_rank(), dist.get_world_size()
    except Exception as exc:  # a process group the job created in a way we cannot read
        rec.record_error("process_group_identity", exc)
        return
    rec.meta["process_group"] = {"rank": rank, "world_size": world_size}
    if rec.meta.get("provisional"):
        rec.meta.update(rank=rank, world_size=world_size)
    elif rank != rec.meta.get("rank"):
        rec.record_error(
            "process_group_identity",
            ValueError(
                f"the process group's rank {rank} differs from the launcher's {rec.meta.get('rank')} "
                f"({identity.launcher()}): this folder is named for the launcher's"
            ),
        )
    rec.write_meta()


def install(rec):
    on_process_group(lambda: _note(rec))
