"""A 2-rank job of today's stacks on gloo, trained for a few steps; writes the
loss of each step to argv[2] (rank 0), so a test can check that diagnose did
not change the numbers. argv[1] picks the parallelism:

- dtensor: an MLP split column- then row-parallel by DTensor. Its all-reduces
  are functional collectives (the row-parallel output's Partial -> Replicate),
  issued by DTensor, not through torch.distributed's functions.
- fsdp2: `fully_shard` over a 3-layer MLP, each layer a unit of its own and
  the root a unit for what is left (the head).
- pipelining: the same MLP cut in two stages of torch.distributed.pipelining
  (rank 0: layers 0-1, rank 1: layer 2 and the head), Schedule1F1B with 2
  micro-batches (a bubble of 1/3 by its own order), no phases marked by the job.
"""

import gc
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


def pipelined_steps(steps: int) -> list:
    """The losses of `steps` 1F1B steps, on the last stage (empty on the first)."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    rank, model = dist.get_rank(), LayeredMLP()
    part = (
        torch.nn.Sequential(model.layers[0], torch.nn.ReLU(), model.layers[1], torch.nn.ReLU())
        if rank == 0
        else torch.nn.Sequential(model.layers[2], torch.nn.ReLU(), model.head)
    )
    stage = PipelineStage(part, rank, dist.get_world_size(), torch.device("cpu"))
    schedule = Schedule1F1B(stage, n_microbatches=2, loss_fn=lambda out, target: (out - target).square().mean())
    opt = torch.optim.SGD(part.parameters(), lr=0.05)
    losses = []
    for step in range(steps):
        x = torch.randn(16, 32, generator=torch.Generator().manual_seed(10 * step))
        if rank == 0:
            schedule.step(x)
        else:
            mb_losses = []
            schedule.step(target=torch.zeros(16, 4), losses=mb_losses)
            losses.append(round(float(sum(mb_losses)), 6))
        opt.step()
        opt.zero_grad()
    return losses


def eager_steps(stack: str, steps: int) -> list:
    """The losses of `steps` steps of the DTensor or FSDP2 job."""
    model, data_seed = {"dtensor": dtensor_model, "fsdp2": fsdp2_model}[stack]()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for step in range(steps):
        x = torch.randn(16, 32, generator=torch.Generator().manual_seed(10 * step + data_seed))
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(round(float(loss.detach()), 6))
    return losses


def main():
    stack, out = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    losses = pipelined_steps(5) if stack == "pipelining" else eager_steps(stack, 5)
    if dist.get_rank() == dist.get_world_size() - 1:
        with open(out, "w") as f:
            json.dump(losses, f)
    # The model, its optimizer and the work objects they keep go before the group
    # does: a gloo work object still alive at interpreter exit aborted the process
    # ("terminate called without an active exception") in 1 of ~8 FSDP2 runs here
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
