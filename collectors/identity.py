"""This process's place in the job: rank, local rank, world size and the
launcher that said so, as the bootstrap found them in the launcher's variables
(collectors/bootstrap/sitecustomize.py sets DIAGNOSE_RANK, DIAGNOSE_LOCAL_RANK,
DIAGNOSE_WORLD_SIZE, DIAGNOSE_LAUNCHER). A process no launcher started is rank 0
of a world of one until its process group says otherwise
(collectors/instrument/process_group_identity.py). torchrun's own variables
are the fallback for a recorder started by hand (tests, `collectors` used as a
library)."""

import os


def _int(name: str, fallback: str, default: int) -> int:
    try:
        return int(os.environ.get(name) or os.environ.get(fallback) or default)
    except ValueError:
        return default


def rank() -> int:
    return _int("DIAGNOSE_RANK", "RANK", 0)


def local_rank() -> int:
    return _int("DIAGNOSE_LOCAL_RANK", "LOCAL_RANK", 0)


def world_size() -> int:
    return _int("DIAGNOSE_WORLD_SIZE", "WORLD_SIZE", 1)


def launcher() -> str:
    return os.environ.get("DIAGNOSE_LAUNCHER") or ("torchrun" if "RANK" in os.environ else "python")
