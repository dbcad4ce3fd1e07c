"""A 3-rank gloo ring of batched exchanges (issue 46): per step, M micro-batches,
each one's compute then ONE batch_isend_irecv (send to the next rank, receive
from the previous), its works waited; then the gradients' all_reduce and an
optimizer step (how diagnose marks a step, zero-code). Each micro-batch's
compute is a small matmul plus an emulated device time (a sleep) so that the
step is paced by the sleep, not by contention for the box's few cores
(bench/whatif_accuracy.py: --emulated-device-ms-per-sample). --slow-rank R
--factor F: rank R's emulated time is F times the others'; every exchange waits
for it, so the ring slows down with its slowest member.

    torchrun --standalone --nproc-per-node 3 tests/scripts/ring_job.py --slow-rank 1 --factor 1.5
"""

import argparse
import time

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=14)
parser.add_argument("--microbatches", type=int, default=4)
parser.add_argument("--device-ms", type=float, default=8.0, help="emulated device time per micro-batch")
parser.add_argument("--slow-rank", type=int, default=-1)
parser.add_argument("--factor", type=float, default=1.0)
args = parser.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(rank)
model = torch.nn.Linear(32, 32)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
device_s = args.device_ms / 1000 * (args.factor if rank == args.slow_rank else 1.0)
x = torch.randn(8, 32)
for _step in range(args.steps):
    for _micro in range(args.microbatches):
        model(x).square().mean().backward()
        time.sleep(device_s)
        send, recv = torch.full((256,), float(rank)), torch.empty(256)
        ops = [dist.P2POp(dist.isend, send, (rank + 1) % world), dist.P2POp(dist.irecv, recv, (rank - 1) % world)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
    # the gradient sync: one small all_reduce of the flattened gradients
    grads = torch.cat([p.grad.flatten() for p in model.parameters()])
    dist.all_reduce(grads)
    optimizer.step()
    optimizer.zero_grad()
dist.destroy_process_group()
