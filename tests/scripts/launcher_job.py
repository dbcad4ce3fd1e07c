"""A small training job started the ways large and small jobs are started
(tests/cli/test_launchers.py), with no code for diagnose:

    launcher_job.py env     rank and world from the launcher's own variables
                            (SLURM_PROCID/SLURM_NTASKS under srun, OMPI_COMM_WORLD_*
                            under Open MPI's mpirun), a gloo process group from
                            MASTER_ADDR/MASTER_PORT, DDP; --slow-rank computes slower
    launcher_job.py lone    one process, no process group: a DataLoader whose
                            samples take --slow-data-ms to load
    launcher_job.py spawn   starts --procs processes itself (multiprocessing), each
                            training alone without a process group (what diagnose
                            cannot tell apart)
    launcher_job.py mpspawn torch.multiprocessing.spawn of --procs ranks that each
                            create a process group with the rank spawn gave them
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as tmp
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset

DIM = 64


class Slow(Dataset):
    def __init__(self, n, delay_ms):
        self.x, self.delay_s = torch.randn(n, DIM), delay_ms / 1000

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        if self.delay_s:
            time.sleep(self.delay_s)  # the scenario: a slow dataset
        return self.x[i], self.x[i, :1]


def train(args, rank: int, ddp: bool) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(DIM, 256), nn.GELU(), nn.Linear(256, 1))
    if ddp:
        model = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    loader = DataLoader(Slow(args.steps * 8, args.slow_data_ms), batch_size=8)
    for x, y in loader:
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        if rank == args.slow_rank:
            time.sleep(args.slow_ms / 1000)  # the scenario: a slow rank
        optimizer.step()
        optimizer.zero_grad()


def teardown() -> None:
    """train() has returned, so its DDP (and the reducer's hooks) is freed; every rank
    reaches the barrier before any destroys the group: a gloo rank destroying its group
    while a slow peer still works can abort the peer ("terminate called without an
    active exception")."""
    dist.barrier()
    dist.destroy_process_group()


def launcher_rank() -> tuple[int, int]:
    for rank, world in (("SLURM_PROCID", "SLURM_NTASKS"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")):
        if rank in os.environ:
            return int(os.environ[rank]), int(os.environ[world])
    raise SystemExit("launcher_job.py env: no SLURM_PROCID or OMPI_COMM_WORLD_RANK")


def spawned(rank: int, args) -> None:
    dist.init_process_group("gloo", rank=rank, world_size=args.procs)
    train(args, rank, ddp=True)
    teardown()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=("env", "lone", "spawn", "mpspawn"))
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--procs", type=int, default=2)
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--slow-ms", type=float, default=0.0)
    p.add_argument("--slow-data-ms", type=float, default=0.0)
    args = p.parse_args()
    if args.mode == "env":
        rank, world = launcher_rank()
        dist.init_process_group("gloo", rank=rank, world_size=world)
        train(args, rank, ddp=True)
        teardown()
    elif args.mode == "lone":
        train(args, 0, ddp=False)
    elif args.mode == "spawn":
        ctx = tmp.get_context("spawn")
        procs = [ctx.Process(target=train, args=(args, r, False)) for r in range(args.procs)]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join()
    else:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        tmp.spawn(spawned, args=(args,), nprocs=args.procs)


if __name__ == "__main__":
    main()
