"""Flight Recorder dumps on a suspected hang, from inside the rank.

When the launcher asks for a hang dump (collectors.recorder), this writes the
rank's Flight Recorder buffer next to the watchdog dump: the pickle
(`_dump_fr_trace`, the backend's own format) and the JSON form
(`_dump_fr_trace_json`) as <run>/flight_recorder/rank_<RANK>[.json], the names
the backend's own dump-on-timeout uses (TORCH_FR_DUMP_TEMP_FILE, set by `diagnose
run`), so one reader serves both. It runs on the recorder's writer thread: a
rank blocked in a gloo collective has released the GIL. A rank whose main
thread holds the GIL cannot run this; on NCCL the launcher also asks through
the debug-info pipe, which NCCL's watchdog thread serves without the GIL.
Quiet unless Flight Recorder is on (TORCH_FR_BUFFER_SIZE /
TORCH_NCCL_TRACE_BUFFER_SIZE > 0) and torch.distributed is initialised.
"""

import os
import sys

from collectors.part_writer import atomic_write_bytes

FOLDER = "flight_recorder"  # diagnose.rundir.flight_recorder_reader.FOLDER
# (new name, old name) of each entry point, torch >= 2.7 first
_PICKLE = ("_dump_fr_trace", "_dump_nccl_trace")
_JSON = ("_dump_fr_trace_json", "_dump_nccl_trace_json")


def enabled(environ=os.environ) -> bool:
    size = environ.get("TORCH_FR_BUFFER_SIZE") or environ.get("TORCH_NCCL_TRACE_BUFFER_SIZE") or "0"
    return size.strip().isdigit() and int(size) > 0


def write_dumps(run_dir: str) -> list[str]:
    """Write this rank's dumps; returns the paths written."""
    dist = sys.modules.get("torch.distributed")
    if not enabled() or dist is None or not dist.is_available() or not dist.is_initialized():
        return []
    import torch._C._distributed_c10d as c10d

    folder = os.path.join(run_dir, FOLDER)
    os.makedirs(folder, exist_ok=True)
    rank = dist.get_rank()
    written = []
    # stacks stay out: the watchdog dump has them, and the pickle is read as data only
    for names, suffix, options in ((_PICKLE, "", {"includeStackTraces": False}), (_JSON, ".json", {})):
        dump = next((getattr(c10d, n) for n in names if hasattr(c10d, n)), None)
        if dump is None:
            continue
        data = dump(includeCollectives=True, onlyActive=False, **options)
        path = os.path.join(folder, f"rank_{rank}{suffix}")
        atomic_write_bytes(path, data if isinstance(data, bytes) else str(data).encode())
        written.append(path)
    return written


def install(rec) -> None:
    run_dir = os.path.dirname(os.path.dirname(rec.rank_dir))
    rec.dump_hooks.append(lambda: write_dumps(run_dir))
