"""A 2-rank gloo job (torchrun) that queues collectives inside
torch.distributed._coalescing_manager, as Megatron's DDP and distributed optimizer
do: async all-reduces waited through the manager, sync all-reduces, then
batch_isend_irecv and destroy_process_group. Writes every result to --out (rank 0)."""
import argparse
import json

import torch
import torch.distributed as dist

STEPS = 4


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    results = []
    for step in range(STEPS):
        grads = [torch.full((4 + i,), float(rank + i + step)) for i in range(3)]
        with dist._coalescing_manager(async_ops=True) as cm:
            for t in grads:
                dist.all_reduce(t, async_op=True)    # an _IllegalWork: nothing runs yet
        cm.wait()
        norms = [torch.full((2,), float(rank * 10 + i)) for i in range(2)]
        with dist._coalescing_manager():
            for t in norms:
                dist.all_reduce(t)                   # None; runs at the manager's exit
        send, recv = torch.full((3,), float(rank + step)), torch.empty(3)
        ops = [dist.P2POp(dist.isend, send, (rank + 1) % world), dist.P2POp(dist.irecv, recv, (rank - 1) % world)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        results.append([t.tolist() for t in grads + norms + [recv]])
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump(results, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
