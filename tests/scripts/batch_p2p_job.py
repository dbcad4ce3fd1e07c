"""A 2-rank gloo job of 4 batched exchanges (batch_isend_irecv), then
destroy_process_group: shorter than diagnose's clock-sync pings, so it ends
while their thread is still blocked in a store get (issue 44 B2)."""

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
for _step in range(4):
    send, recv = torch.full((3,), float(rank)), torch.empty(3)
    ops = [dist.P2POp(dist.isend, send, (rank + 1) % world), dist.P2POp(dist.irecv, recv, (rank - 1) % world)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    assert recv.tolist() == [float((rank - 1) % world)] * 3
dist.destroy_process_group()
