"""A plain DDP training script: an MLP on synthetic regression data, DataLoader,
AdamW, gradient accumulation. Public PyTorch APIs only; it knows nothing of
diagnose. Run with:

    torchrun --standalone --nproc-per-node 2 samples/ddp_mlp.py --steps 20

Its own flags create the problems diagnose should find in a script it has never
seen: --slow-rank/--slow-ms (a rank that computes slower), --slow-data-ms (a
slow dataset), --log-every-microbatch (a logging all_reduce + .item() inside the
micro-batch loop), --jitter-ms (random per-rank noise).
"""

import argparse
import hashlib
import json
import random
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class SyntheticRegression(Dataset):
    """n_samples long, backed by at most 4096 distinct rows (memory stays small)."""

    def __init__(self, n_samples, dim, seed, delay_ms):
        gen = torch.Generator().manual_seed(seed)
        distinct = min(n_samples, 4096)
        self.x = torch.randn(distinct, dim, generator=gen)
        w = torch.randn(dim, 1, generator=gen)
        self.y = torch.tanh(self.x @ w) + 0.05 * torch.randn(distinct, 1, generator=gen)
        self.n_samples = n_samples
        self.delay_s = delay_ms / 1000

    def __len__(self):
        return self.n_samples

    def __getitem__(self, i):
        if self.delay_s:
            time.sleep(self.delay_s)
        return self.x[i % len(self.x)], self.y[i % len(self.y)]


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--microbatches", type=int, default=2)
    p.add_argument("--num-workers", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--slow-ms", type=float, default=0.0)
    p.add_argument("--slow-from-step", type=int, default=0)
    p.add_argument("--slow-data-ms", type=float, default=0.0)
    p.add_argument("--log-every-microbatch", action="store_true")
    p.add_argument(
        "--sync-every-microbatch",
        action="store_true",
        help="leave out no_sync(): DDP all-reduces after every micro-batch",
    )
    p.add_argument("--jitter-ms", type=float, default=0.0)
    p.add_argument("--result-json", default="")
    p.add_argument(
        "--log-step-times",
        default="",
        metavar="PATH",
        help="rank 0 writes each step's wall time (s) and its end (Unix s), one step per line (for bench/overhead.py)",
    )
    return p.parse_args()


def main():
    args = parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)
    random.seed(args.seed + rank)

    model = nn.Sequential(
        nn.Linear(args.dim, args.hidden),
        nn.GELU(),
        nn.Linear(args.hidden, args.hidden),
        nn.GELU(),
        nn.Linear(args.hidden, 1),
    )
    ddp_model = DDP(model)
    optimizer = torch.optim.AdamW(ddp_model.parameters(), lr=1e-3)
    n_samples = args.steps * args.microbatches * args.batch_size * world
    dataset = SyntheticRegression(n_samples, args.dim, args.seed, args.slow_data_ms)
    sampler = DistributedSampler(dataset, shuffle=True, seed=args.seed)
    loader = DataLoader(
        dataset, batch_size=args.batch_size, sampler=sampler, num_workers=args.num_workers, drop_last=True
    )
    batches = iter(loader)

    loss_value = float("nan")
    step_times = []
    for step in range(args.steps):
        t_step = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        for micro in range(args.microbatches):
            x, y = next(batches)
            last = micro == args.microbatches - 1
            if last or args.sync_every_microbatch:  # the latter: the mistake accumulation_sync finds
                loss = nn.functional.mse_loss(ddp_model(x), y) / args.microbatches
                loss.backward()
            else:
                with ddp_model.no_sync():
                    loss = nn.functional.mse_loss(ddp_model(x), y) / args.microbatches
                    loss.backward()
            if rank == args.slow_rank and step >= args.slow_from_step and args.slow_ms:
                time.sleep(args.slow_ms / 1000)
            if args.jitter_ms:
                time.sleep(random.uniform(0, args.jitter_ms) / 1000)
            if args.log_every_microbatch:
                logged = loss.detach().clone()
                dist.all_reduce(logged)
                loss_value = logged.item() / world
        optimizer.step()
        loss_check = loss.detach().clone()
        dist.all_reduce(loss_check)
        loss_value = loss_check.item() / world
        step_times.append((time.perf_counter() - t_step, time.time()))

    if rank == 0:
        print(f"final loss {loss_value!r}")
        if args.log_step_times:
            with open(args.log_step_times, "w") as f:
                f.writelines(f"{t:.6f} {end:.4f}\n" for t, end in step_times)
        if args.result_json:
            params = torch.cat([p.detach().flatten() for p in model.parameters()])
            with open(args.result_json, "w") as f:
                json.dump(
                    {
                        "loss": loss_value,
                        "param_sum": float(params.double().sum()),
                        "param_sha256": hashlib.sha256(params.numpy().tobytes()).hexdigest(),
                    },
                    f,
                )
    # all ranks reach the teardown together: a gloo rank destroying its group while
    # its peer still works aborted the process ("terminate called without an active
    # exception") in 2 of 25 plain runs here
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
