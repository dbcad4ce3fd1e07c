"""A 2-rank gloo job (torchrun) that queues collectives inside
torch.distributed._coalescing_manager, as Megatron's DDP and distributed optimizer
do: async all-reduces waited through the manager, sync all-reduces, then
batch_isend_irecv and destroy_process_group. Meanwhile a second thread runs
all-reduces on a group of its own (an async checkpoint upload's, a communication
thread's). Writes every result to --out (rank 0)."""

import argparse
import json
import threading

import torch
import torch.distributed as dist

STEPS = 4


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    side_group = dist.new_group(backend="gloo")
    side = []

    def upload():  # the second thread: its own group, so its calls never interleave with the main ones
        for i in range(3 * STEPS):
            t = torch.full((8,), float(rank + i))
            dist.all_reduce(t, group=side_group)
            side.append(t.tolist())

    thread = threading.Thread(target=upload)
    thread.start()
    results = []
    for step in range(STEPS):
        grads = [torch.full((4 + i,), float(rank + i + step)) for i in range(3)]
        with dist._coalescing_manager(async_ops=True) as cm:
            for t in grads:
                dist.all_reduce(t, async_op=True)  # an _IllegalWork: nothing runs yet
        cm.wait()
        norms = [torch.full((2,), float(rank * 10 + i)) for i in range(2)]
        with dist._coalescing_manager():
            for t in norms:
                dist.all_reduce(t)  # None; runs at the manager's exit
        send, recv = torch.full((3,), float(rank + step)), torch.empty(3)
        ops = [dist.P2POp(dist.isend, send, (rank + 1) % world), dist.P2POp(dist.irecv, recv, (rank - 1) % world)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        results.append([t.tolist() for t in grads + norms + [recv]])
    thread.join()
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump({"main": results, "side": side}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
