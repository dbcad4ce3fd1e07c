"""A 2-rank job of today's stacks on gloo, trained for a few steps; writes the
loss of each step to argv[2] (rank 0), so a test can check that diagnose did
not change the numbers. argv[1] picks the parallelism:

- dtensor: an MLP split column- then row-parallel by DTensor. Its all-reduces
  are functional collectives (the row-parallel output's Partial -> Replicate),
  issued by DTensor, not through torch.distributed's functions.
- fsdp2: `fully_shard` over a 3-layer MLP, each layer a unit of its own and
  the root a unit for what is left (the head).
"""
import json
import sys

import torch
import torch.distributed as dist


class DTensorMLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = torch.nn.Linear(32, 64), torch.nn.Linear(64, 32)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


class LayeredMLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(32, 32) for _ in range(3))
        self.head = torch.nn.Linear(32, 4)

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return self.head(x)


def dtensor_model():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("tp",))
    return parallelize_module(DTensorMLP(), mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()}), 0


def fsdp2_model():
    from torch.distributed.fsdp import fully_shard
    model = LayeredMLP()
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)
    return model, dist.get_rank()  # data parallel: each rank its own batch


def main():
    stack, out = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model, data_seed = {"dtensor": dtensor_model, "fsdp2": fsdp2_model}[stack]()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for step in range(5):
        x = torch.randn(16, 32, generator=torch.Generator().manual_seed(10 * step + data_seed))
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(round(float(loss), 6))
    if dist.get_rank() == 0:
        with open(out, "w") as f:
            json.dump(losses, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
