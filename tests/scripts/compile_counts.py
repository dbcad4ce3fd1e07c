"""A torch.compile job's compile statistics, printed as one JSON line: run
plain and under `diagnose run`, the two must agree (issue 24: diagnose never
changes how a model compiles). One rank on gloo; backend "aot_eager" (no C++
toolchain needed, and graph breaks are dynamo's, not the backend's).

The job: a module compiled as a whole (fullgraph=True) with an all_reduce of
its activations inside its forward, a function compiled with fullgraph=True
that calls dist.all_reduce and a functional all_reduce, and an ordinary
compiled module trained for a few optimizer steps (forward, backward, step:
diagnose's step and forward/backward instrumentation in play).
"""

import json
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch._dynamo.utils import counters


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(16, 32), torch.nn.Linear(32, 16)

    def forward(self, x):
        y = torch.relu(self.a(x)) + 0  # (relu keeps its output for backward: reduce a copy)
        dist.all_reduce(y)  # a tensor-parallel style reduction inside the graph
        return self.b(y)


def reduce_both(x):
    dist.all_reduce(x)
    return funcol.all_reduce(x * 2, "sum", dist.group.WORLD) + 1


def main():
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    whole = torch.compile(Block(), backend="aot_eager", fullgraph=True)
    fn = torch.compile(reduce_both, backend="aot_eager", fullgraph=True)
    model = Block()
    compiled = torch.compile(model, backend="aot_eager")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    outs = []
    for _ in range(4):
        x = torch.randn(8, 16)
        outs.append(float(whole(x).sum()))
        outs.append(float(fn(x.clone()).sum()))
        loss = compiled(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    stats = {
        "unique_graphs": counters["stats"]["unique_graphs"],
        "calls_captured": counters["stats"]["calls_captured"],
        "aot_graphs": counters["aot_autograd"]["total"],
        "graph_breaks": dict(counters["graph_break"]),
        "recompiles": dict(counters["recompiles"]),
        "outputs": [round(o, 6) for o in outs],
        # diagnose imports no part of torch the job does not (FSDP2's costs 0.6 s)
        "fsdp_modules": sorted(m for m in sys.modules if m.startswith("torch.distributed.fsdp")),
        "diagnose": "DIAGNOSE_RUN_DIR" in os.environ,
    }
    with open(sys.argv[1], "w") as f:
        json.dump(stats, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
