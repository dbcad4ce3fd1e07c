"""A stand-in for SLURM's `srun -n N COMMAND` on one node: N tasks, each given
only the variables srun gives a task (SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS,
SLURM_NPROCS, SLURM_NODEID, SLURM_JOB_ID, SLURM_STEP_ID), none of torchrun's.
Exits with the first non-zero task status, as srun does."""

import os
import subprocess
import sys


def main():
    argv = sys.argv[1:]
    if len(argv) < 3 or argv[0] != "-n":
        raise SystemExit("usage: fake_srun.py -n N COMMAND...")
    n, command = int(argv[1]), argv[2:]
    tasks = []
    for task in range(n):
        env = dict(
            os.environ,
            SLURM_PROCID=str(task),
            SLURM_LOCALID=str(task),
            SLURM_NTASKS=str(n),
            SLURM_NPROCS=str(n),
            SLURM_NODEID="0",
            SLURM_JOB_ID="4242",
            SLURM_STEP_ID="0",
        )
        tasks.append(subprocess.Popen(command, env=env))
    statuses = [t.wait() for t in tasks]
    sys.exit(next((s for s in statuses if s), 0))


if __name__ == "__main__":
    main()
