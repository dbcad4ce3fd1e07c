"""2 ranks, FSDP2 (`fully_shard`) over a 3-layer MLP: each layer a unit of its
own, the root a unit for what is left (the head); 4 steps on gloo. Writes the
loss of each step to argv[1] (rank 0)."""
import json
import sys

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(32, 32) for _ in range(3))
        self.head = torch.nn.Linear(32, 4)

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return self.head(x)


def main():
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = MLP()
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for step in range(4):
        x = torch.randn(8, 32, generator=torch.Generator().manual_seed(10 * step + dist.get_rank()))
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
