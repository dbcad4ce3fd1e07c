"""A small torchtitan-style job: residual MLP blocks, tensor-parallel inside each
block with DTensor (`parallelize_module`: the up projection column-parallel, the
down projection row-parallel, so each block's output is one all-reduce over
the TP group, issued by DTensor as a functional collective), data-parallel with
FSDP2 (`fully_shard` per block on the DP dimension of a 2-D mesh), optionally
`torch.compile` per block, as torchtitan does. Public PyTorch APIs only; it
knows nothing of diagnose. On CPU with gloo:

    torchrun --standalone --nproc-per-node 4 samples/titan_style.py --tp 2 --steps 20
    torchrun --standalone --nproc-per-node 4 samples/titan_style.py --tp 2 --compile

Its own flags create problems diagnose should find: --slow-rank/--slow-ms (a
rank slower inside its TP region: its TP peer waits in the block's
all-reduce), --slow-data-ms (a slow dataset). Attention is left out for size:
its TP layout (heads split, output row-parallel) issues the same collectives.
"""

import argparse
import gc
import json
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.utils.data import DataLoader, Dataset


class Block(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.up, self.down = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class Model(nn.Module):
    def __init__(self, dim: int, layers: int):
        super().__init__()
        self.blocks = nn.ModuleList(Block(dim) for _ in range(layers))
        self.head = nn.Linear(dim, 1)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class Tokens(Dataset):
    """Synthetic inputs, the same on the TP ranks of one DP replica (seeded by DP rank)."""

    def __init__(self, n: int, seq: int, dim: int, seed: int, delay_ms: float):
        gen = torch.Generator().manual_seed(seed)
        self.x = torch.randn(min(n, 256), seq, dim, generator=gen)
        self.n, self.delay_s = n, delay_ms / 1000

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.delay_s:
            time.sleep(self.delay_s)
        x = self.x[i % len(self.x)]
        return x, x.mean(dim=-1, keepdim=True)


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--compile", action="store_true", help="torch.compile each block")
    p.add_argument(
        "--fullgraph", action="store_true", help="compile each block with fullgraph=True (a graph break raises)"
    )
    p.add_argument(
        "--compile-backend",
        default="aot_eager",
        help="aot_eager needs no C++ toolchain (CPU); inductor is torchtitan's",
    )
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--slow-ms", type=float, default=0.0)
    p.add_argument("--slow-data-ms", type=float, default=0.0)
    p.add_argument(
        "--log-step-times",
        default="",
        metavar="PATH",
        help="rank 0 writes each step's wall time (s) and its end (Unix s), one step per line",
    )
    p.add_argument(
        "--compile-stats",
        default="",
        metavar="PATH",
        help="rank 0 writes torch._dynamo's counters (graphs, graph breaks, recompiles) as JSON",
    )
    return p.parse_args()


def build(args, mesh) -> nn.Module:
    torch.manual_seed(0)
    model = Model(args.dim, args.layers)
    for i, block in enumerate(model.blocks):
        parallelize_module(block, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
        if args.slow_ms and dist.get_rank() == args.slow_rank:
            # inside the TP region: between the column- and the row-parallel matmul
            block.down.register_forward_pre_hook(lambda module, inputs: time.sleep(args.slow_ms / 1000))
        fully_shard(block, mesh=mesh["dp"])
        if args.compile:
            model.blocks[i] = torch.compile(block, backend=args.compile_backend, fullgraph=args.fullgraph)
    fully_shard(model, mesh=mesh["dp"])
    return model


def write_compile_stats(path: str) -> None:
    from torch._dynamo.utils import counters

    stats = {
        "unique_graphs": counters["stats"]["unique_graphs"],
        "calls_captured": counters["stats"]["calls_captured"],
        "graph_breaks": dict(counters["graph_break"]),
        "recompiles": dict(counters["recompiles"]),
    }
    with open(path, "w") as f:
        json.dump(stats, f, sort_keys=True)


def main():
    args = parse_args()
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    mesh = init_device_mesh("cpu", (world // args.tp, args.tp), mesh_dim_names=("dp", "tp"))
    model = build(args, mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    dp_rank = mesh["dp"].get_local_rank()
    loader = DataLoader(
        Tokens(args.steps * args.batch_size, args.seq, args.dim, dp_rank, args.slow_data_ms), batch_size=args.batch_size
    )
    step_times = []
    for x, y in loader:
        t_step = time.perf_counter()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        step_times.append((time.perf_counter() - t_step, time.time()))
    if dist.get_rank() == 0:
        print(f"final loss {loss.item():.4f}")
        if args.log_step_times:
            with open(args.log_step_times, "w") as f:
                f.writelines(f"{t:.6f} {end:.4f}\n" for t, end in step_times)
        if args.compile_stats:
            write_compile_stats(args.compile_stats)
    # the model, its optimizer and the gloo work objects they hold go before the group:
    # one still alive at interpreter exit aborted an FSDP2 job in ~1 of 8 runs here
    # ("terminate called without an active exception"; tests/scripts/modern_stack.py)
    del model, optimizer, loss
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
