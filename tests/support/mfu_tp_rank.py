"""One rank of tests/collectors/test_mfu.py's DTensor tensor-parallel count, in a module of
its own: torch.multiprocessing.spawn imports the target's module in each child,
and this one imports torch and the counter only (the test module's imports,
pandas and the analysis among them, cost each child seconds)."""

import json
import os

import torch

from collectors.instrument import flop_count


def tp_block():
    """LayerNorm, a column-parallel up projection, GELU, a row-parallel down projection."""
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.LayerNorm(32), torch.nn.Linear(32, 128), torch.nn.GELU(), torch.nn.Linear(128, 32)
    )


def count_step(step_fn) -> dict:
    count = flop_count.StepCount(1)
    count.begin()
    try:
        step_fn()
    finally:
        result = count.end()
    return result


def tp_rank(rank: int, port: int, out: str) -> None:
    import gc

    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        _count_tp_step(rank, out)
        # the DTensor module, its gradients and the work objects they hold go before
        # the group does, and both ranks are past their last collective: a gloo work
        # object alive at interpreter exit, or a peer still in a collective when the
        # group goes, aborts the rank ("terminate called without an active exception",
        # SIGABRT: once in this suite on 2026-12-06; tests/scripts/modern_stack.py)
        gc.collect()
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _count_tp_step(rank: int, out: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    block = parallelize_module(
        tp_block(), init_device_mesh("cpu", (2,)), {"1": ColwiseParallel(), "3": RowwiseParallel()}
    )
    x = torch.randn(16, 32)
    count = count_step(lambda: block(x).sum().backward())
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(count, f)
