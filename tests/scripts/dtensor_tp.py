"""A 2-rank tensor-parallel MLP (DTensor's ColwiseParallel then RowwiseParallel)
trained for a few steps on gloo: its all-reduces are functional collectives
(the row-parallel output's Partial -> Replicate, and the column-parallel
input's gradient), issued by DTensor, not through torch.distributed's
functions. Writes the loss of each step to argv[1] (rank 0), so a test can
check that diagnose did not change the numbers."""
import json
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = torch.nn.Linear(32, 64), torch.nn.Linear(64, 32)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


def main():
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("tp",))
    model = parallelize_module(MLP(), mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for step in range(5):
        x = torch.randn(16, 32, generator=torch.Generator().manual_seed(step))
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(round(float(loss), 6))
    if dist.get_rank() == 0:
        with open(sys.argv[1], "w") as f:
            json.dump(losses, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
