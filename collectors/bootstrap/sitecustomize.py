"""Bootstrap that `diagnose run` puts on PYTHONPATH.

It first runs any other sitecustomize the environment has (we must not shadow
it), then decides whether this process of a diagnose run is a rank to record,
and only this process, not the processes it starts (DataLoader workers inherit
the environment; DIAGNOSE_ACTIVE_PID names the recorded ancestor):

* a launcher's worker: its rank, local rank and world size from the variables
  of the launcher that started it (torchrun, `accelerate launch` and
  `deepspeed` set RANK; SLURM's `srun` SLURM_PROCID; Open MPI's `mpirun`
  OMPI_COMM_WORLD_RANK; MPICH and Intel MPI PMI_RANK), recorded from the start
  (the process group, once created, checks the rank: collectors/instrument/
  process_group_identity.py);
* a launcher itself (torchrun's agent, `accelerate`, `deepspeed`'s runner):
  never recorded, its workers are;
* a Python process no launcher started (plain `python train.py`, or processes
  a script starts itself): recorded once it imports torch (a helper that never
  does leaves nothing), under a provisional name `solo-<pid>` until its process
  group says which rank it is; a process started by a recorded one is recorded
  only if it creates a process group (mp.spawn's workers), and one that trains
  without leaves a note (`<run>/unrecorded/<pid>.json`). After the job,
  diagnose/rundir/solo_ranks.py names each by its process group's rank, or a
  lone process as rank 0 of a world of one.

The identity goes to the process's own DIAGNOSE_RANK, DIAGNOSE_LOCAL_RANK,
DIAGNOSE_WORLD_SIZE and DIAGNOSE_LAUNCHER (never to RANK or the like, which
the job may read). Nothing here imports torch or the collectors package before
it decides (a DataLoader worker that is not recorded pays a few environment
lookups).
"""

import os
import sys

# (launcher, rank, local rank, world size): the first whose rank variable is set wins.
# RANK first: `srun torchrun ...` gives a worker both, and torchrun's is the rank
RANK_VARIABLES = (
    ("torchrun", "RANK", "LOCAL_RANK", "WORLD_SIZE"),  # also accelerate, deepspeed
    ("slurm", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS"),
    ("openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE"),
    ("pmi", "PMI_RANK", "MPI_LOCALRANKID", "PMI_SIZE"),
)
# Python programs that start ranks: `python -m MODULE` or a script of that name
LAUNCHER_PROGRAMS = frozenset(
    {
        "torchrun",
        "torch.distributed.run",
        "torch.distributed.launch",
        "accelerate",
        "accelerate.commands.launch",
        "accelerate.commands.accelerate_cli",
        "deepspeed",
        "deepspeed.launcher.runner",
        "deepspeed.launcher.launch",
    }
)


def launcher_identity(environ) -> tuple | None:
    """(launcher, rank, local_rank, world_size) from a launcher's variables, or None."""
    for launcher, rank, local_rank, world in RANK_VARIABLES:
        try:
            if environ.get(rank, "") != "":
                return (launcher, int(environ[rank]), int(environ.get(local_rank) or 0), int(environ.get(world) or 1))
        except ValueError:
            continue
    return None


def program_of(argv) -> str:
    """What this Python process runs: the module of `-m`, else the script's name."""
    args = list(argv[1:])
    while args:
        arg = args.pop(0)
        if arg == "-m" and args:
            return args[0]
        if arg.startswith("-m") and len(arg) > 2:
            return arg[2:]
        if arg in ("-c", "-"):
            return arg
        if arg in ("-W", "-X", "-Q"):  # options that take a value
            args = args[1:]
        elif not arg.startswith("-"):
            name = os.path.basename(arg)
            return name[:-3] if name.endswith(".py") else name
    return ""


def _chain_other_sitecustomize():
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    others = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", others)
    if spec is not None and spec.loader is not None and spec.origin != os.path.abspath(__file__):
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


def _activate():
    env = os.environ
    run_dir = env.get("DIAGNOSE_RUN_DIR")
    if not run_dir:
        return
    if program_of(getattr(sys, "orig_argv", sys.argv)) in LAUNCHER_PROGRAMS:
        return
    if env.get("DIAGNOSE_ACTIVE_PID") not in (None, "", str(os.getpid())):
        _when_process_group(run_dir)  # started by a recorded process
        return
    identity = launcher_identity(env)
    if identity is not None:
        launcher, rank, local_rank, world = identity
        env.update(
            DIAGNOSE_LAUNCHER=launcher,
            DIAGNOSE_RANK=str(rank),
            DIAGNOSE_LOCAL_RANK=str(local_rank),
            DIAGNOSE_WORLD_SIZE=str(world),
        )
    _start(run_dir, "now" if identity is not None else "torch")


def _start(run_dir: str, when: str) -> None:
    try:
        import collectors  # noqa: F401
    except ImportError:
        sys.path.append(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    try:
        from collectors.activate import activate

        activate(run_dir, when)
    except Exception as exc:  # never break the user's job
        sys.stderr.write(f"diagnose: collectors not active in process {os.getpid()}: {exc}\n")


def _when_process_group(run_dir: str) -> None:
    """Record this process from the moment it creates a process group (and not
    before: most such processes are DataLoader workers, which never do). One
    that trains without creating one leaves a note, `<run>/unrecorded/<pid>.json`,
    at its first optimizer step, so that `diagnose run` can say what it could not
    record. The import hook is loaded from its file: importing the collectors
    package costs ~0.2 s, which a DataLoader worker must not pay."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "after_import.py")
    spec = importlib.util.spec_from_file_location("_diagnose_after_import", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    said = []  # recording started, or the note written: nothing more to do

    def note_training(optimizer, args, kwargs):
        if said:
            return
        said.append(True)
        try:
            import json

            folder = os.path.join(run_dir, "unrecorded")
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, f"{os.getpid()}.json"), "w") as f:
                json.dump({"pid": os.getpid(), "argv": list(getattr(sys, "orig_argv", sys.argv))}, f)
        except OSError:
            pass

    def patch():
        try:
            import functools

            import torch.distributed as dist
            import torch.optim.optimizer as optimizer

            optimizer.register_optimizer_step_post_hook(note_training)
            c10d = dist.distributed_c10d
            orig = c10d.init_process_group

            @functools.wraps(orig)
            def init_process_group(*args, **kwargs):
                result = orig(*args, **kwargs)
                c10d.init_process_group = dist.init_process_group = orig
                if not said:
                    said.append(True)
                    _start(run_dir, "process_group")
                return result

            c10d.init_process_group = dist.init_process_group = init_process_group
        except Exception as exc:  # never break the user's job
            sys.stderr.write(f"diagnose: process {os.getpid()} not watched for a process group: {exc}\n")

    module.after_import("torch", patch)


try:
    _chain_other_sitecustomize()
except Exception as exc:
    sys.stderr.write(f"diagnose: the environment's own sitecustomize failed: {exc}\n")
_activate()
