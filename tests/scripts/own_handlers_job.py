"""A 2-rank gloo job that installs its own handlers on SIGUSR1, SIGUSR2 and
SIGRTMIN+1 (before torch is imported, as SLURM-aware jobs do), records any call
to them in HANDLED_LOG, then hangs: rank 1 sleeps, rank 0 waits in all_reduce
(issue 47: diagnose's stack signal must reach only its own handler)."""

import os
import signal
import sys
import time


def handled(signum, frame):
    with open(os.environ["HANDLED_LOG"], "a") as f:
        f.write(f"{os.environ.get('RANK')} {signum}\n")


for sig in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGRTMIN + 1):
    signal.signal(sig, handled)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

dist.init_process_group("gloo")
x = torch.ones(4)
dist.all_reduce(x)
if dist.get_rank() == 1:
    time.sleep(600)
dist.all_reduce(x)
sys.exit(0)
