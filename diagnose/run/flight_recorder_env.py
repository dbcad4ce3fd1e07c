"""The Flight Recorder settings `diagnose run` gives every job.

The launcher cannot know the backend, so it sets them for every job; each is
left alone when the user set it (either generation of its name). torch >= 2.7
reads TORCH_FR_* (and warns about the old names; its debug pipe reads only the
new ones), older builds TORCH_NCCL_*: the launcher sets the generation of the
torch it finds beside itself, both when it finds none. Dumps go into the run dir:
<run>/flight_recorder/rank_<RANK> from the backend (on its watchdog's timeout,
TORCH_NCCL_DUMP_ON_TIMEOUT, or when a byte arrives on its debug-info pipe
<run>/flight_recorder/pipe_<RANK>.pipe, which NCCL's watchdog thread serves
even while the rank's main thread holds the GIL), and the same names from the
rank itself when diagnose asks (collectors/instrument/flight_recorder_dump.py).
TORCH_NCCL_ENABLE_TIMING records when each collective started on the device:
without it a dump cannot tell "stuck in the kernel" from "not started".
"""

import glob
import os
import shutil

from diagnose.rundir.flight_recorder_reader import FOLDER

BUFFER_ENTRIES = "2000"  # PyTorch's own suggestion; ~2000 x a few hundred bytes per rank


def settings(run_dir: str) -> list[tuple[tuple[str, ...], str]]:
    folder = os.path.join(run_dir, FOLDER)
    return [
        (("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"), BUFFER_ENTRIES),
        (("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"), os.path.join(folder, "rank_")),
        (("TORCH_NCCL_DUMP_ON_TIMEOUT",), "1"),
        (("TORCH_NCCL_ENABLE_TIMING",), "1"),
        (("TORCH_FR_DEBUG_INFO_PIPE_FILE", "TORCH_NCCL_DEBUG_INFO_PIPE_FILE"), os.path.join(folder, "pipe_")),
    ]


def _generations(torch_version: str | None) -> tuple[int, ...]:
    """Which names of each pair to set: 0 the new (TORCH_FR_*), 1 the old."""
    try:
        major, minor = (int(x) for x in (torch_version or "").split("+")[0].split(".")[:2])
    except ValueError:
        return (0, 1)
    return (0,) if (major, minor) >= (2, 7) else (1,)


def flight_recorder_env(run_dir: str, environ=os.environ, torch_version: str | None = None) -> tuple[dict, dict]:
    """(variables to add to the job's environment, the manifest's record of them)."""
    os.makedirs(os.path.join(run_dir, FOLDER), exist_ok=True)
    extra, record = {}, {"set_by_diagnose": [], "set_by_user": {}}
    use = _generations(torch_version)
    for names, value in settings(run_dir):
        mine = {n: environ[n] for n in names if n in environ}
        if mine:
            record["set_by_user"].update(mine)
            continue
        for name in [names[0]] if len(names) == 1 else [names[g] for g in use]:
            extra[name] = value
            record["set_by_diagnose"].append(name)
    prefix = next(
        (environ[n] for n in ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE") if n in environ), None
    )
    if prefix:
        record["user_dump_prefix"] = prefix
    return extra, record


def ask_backend_for_dumps(run_dir: str) -> int:
    """A byte on each rank's debug-info pipe (NCCL serves them; gloo makes none).
    Non-blocking: a pipe nobody reads is skipped. Returns how many were asked."""
    asked = 0
    for pipe in glob.glob(os.path.join(glob.escape(os.path.join(run_dir, FOLDER)), "pipe_*.pipe")):
        try:
            fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:  # ENXIO: no reader (the rank is gone)
            continue
        try:
            os.write(fd, b"1")
            asked += 1
        except OSError:
            pass
        finally:
            os.close(fd)
    return asked


def collect_user_dumps(run_dir: str, record: dict, since_wall_ns: int) -> list[str]:
    """Dumps the backend wrote under the user's own prefix during the job, copied in."""
    prefix = record.get("user_dump_prefix")
    if not prefix:
        return []
    copied = []
    for path in glob.glob(glob.escape(prefix) + "*"):
        rest = path[len(prefix) :].removesuffix(".json")
        try:
            if rest.isdigit() and os.path.getmtime(path) * 1e9 >= since_wall_ns:
                target = os.path.join(run_dir, FOLDER, f"rank_{rest}" + (".json" if path.endswith(".json") else ""))
                shutil.copyfile(path, target)
                copied.append(target)
        except OSError:
            continue
    return copied
