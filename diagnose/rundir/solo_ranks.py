"""Naming the processes recorded without a launcher, once the job is over.

A process that no launcher started (plain `python train.py`, mp.spawn's
workers, a shell script's `python ... &`) is recorded under traces/solo-<pid>
(collectors/bootstrap/sitecustomize.py): its rank is not known when recording
starts. After the job each becomes a rank folder:

* by its process group's rank (meta.json `process_group`, written when it
  created one: collectors/instrument/process_group_identity.py), when no other
  folder has that rank;
* with no rank folder at all, the one process without a process group that
  trained (ended optimizer steps), or the only one recorded, is rank 0 of a
  world of one: a lone training process. Others (helpers that imported torch,
  a spawning parent that never trained) stay as they are and are not analyzed.

Several processes that trained without a process group cannot be told apart
(recorded ones, or unrecorded ones started by a recorded process, which leave
a note in <run>/unrecorded/): none is named, and `why_no_rank` says so. Renaming is one `os.rename` per
folder (atomic); meta.json is rewritten to the rank it now has.
"""

import os

from collectors.part_writer import atomic_write_json, read_counter
from collectors.schema import SOLO_DIR_PREFIX, STEPS_DONE_FILE, rank_dir_name
from diagnose import rundir

UNRECORDED = "unrecorded"  # <run>/unrecorded/<pid>.json: a process that trained unrecorded


def solo_dirs(run_dir: str) -> list[str]:
    traces = os.path.join(run_dir, rundir.TRACES)
    try:
        names = sorted(os.listdir(traces))
    except OSError:
        return []
    return [
        os.path.join(traces, n)
        for n in names
        if n.startswith(SOLO_DIR_PREFIX) and os.path.isdir(os.path.join(traces, n))
    ]


def unrecorded_pids(run_dir: str) -> list[str]:
    """Processes started by a recorded one that trained without creating a process
    group (collectors/bootstrap/sitecustomize.py notes them at their first step)."""
    try:
        names = os.listdir(os.path.join(run_dir, UNRECORDED))
    except OSError:
        return []
    return sorted(n[:-5] for n in names if n.endswith(".json"))


def steps_done(folder: str) -> int:
    return read_counter(os.path.join(folder, STEPS_DONE_FILE)) or 0


def _meta(folder: str) -> dict:
    return rundir.read_json_dict(os.path.join(folder, "meta.json")) or {}


def _pg_rank(meta: dict) -> int | None:
    pg = meta.get("process_group")
    rank = pg.get("rank") if isinstance(pg, dict) else None
    return rank if isinstance(rank, int) and rank >= 0 else None


def _name(folder: str, meta: dict, rank: int, world_size: int) -> None:
    target = os.path.join(os.path.dirname(folder), rank_dir_name(rank))
    os.rename(folder, target)
    atomic_write_json(
        os.path.join(target, "meta.json"),
        {**meta, "rank": rank, "world_size": world_size, "provisional": False, "named_from": os.path.basename(folder)},
    )


def name_solo_ranks(run_dir: str) -> list[str]:
    """Rename what can be named; returns one note per folder named."""
    notes = []
    taken = {rundir.rank_of_dir(d) for d in rundir.rank_dirs(run_dir)}
    unnamed = []
    for folder in solo_dirs(run_dir):
        meta = _meta(folder)
        rank = _pg_rank(meta)
        if rank is None or rank in taken:
            unnamed.append((folder, meta))
            continue
        _name(folder, meta, rank, int(meta["process_group"].get("world_size") or 1))
        taken.add(rank)
        notes.append(f"{os.path.basename(folder)} is rank {rank} (its process group's)")
    if taken or not unnamed:
        return notes
    trained = [(f, m) for f, m in unnamed if _pg_rank(m) is None and steps_done(f) > 0]
    others = unrecorded_pids(run_dir)
    lone = trained if trained else (unnamed if len(unnamed) == 1 and not others else [])
    if len(lone) == 1 and not (trained and others):
        _name(lone[0][0], lone[0][1], 0, 1)
        notes.append(f"{os.path.basename(lone[0][0])} is rank 0 of a world of one (a lone training process)")
    return notes


def why_no_rank(run_dir: str) -> str:
    """One line: why a run directory holds no rank folder."""
    solos = solo_dirs(run_dir)
    trained = [os.path.basename(f)[len(SOLO_DIR_PREFIX) :] for f in solos if steps_done(f) > 0]
    trained += unrecorded_pids(run_dir)
    if len(trained) > 1:
        pids = ", ".join(trained)
        return (
            f"{len(trained)} processes trained without a launcher or a process group (pids {pids}), "
            "so diagnose cannot tell their ranks: start them with torchrun, srun or mpirun, "
            "or create a process group (torch.distributed.init_process_group) in each"
        )
    if solos:
        return (
            f"{len(solos)} process(es) imported torch but none trained or created a process group that names its rank"
        )
    return (
        "no process of the job was recorded: diagnose records Python processes started by "
        "torchrun, srun, mpirun, accelerate or deepspeed, or run directly (`python train.py`); "
        "check that the job runs Python and that PYTHONPATH or `python -S`/`-I` do not drop "
        "diagnose's bootstrap"
    )
