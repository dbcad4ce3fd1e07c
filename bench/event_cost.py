"""Cost per recorded event of the collectors' hot paths, in microseconds.

Each hot path is timed side by side with the same call unrecorded, in
alternating batches (so machine noise hits both alike); the figure is the
median over batches of (recorded - plain) per call:

    phase        `with collectors.phase(...)` (explicit range) vs an empty `with`
    forward      a 3-module MLP's forward with the Module.__call__ wrapper vs without
                 (one event per outermost forward; inner modules pay one Python call)
    all_reduce   the patched dist.all_reduce vs the original, 1-rank gloo group
    item         the patched Tensor.item vs the original
    data         the patched DataLoader __next__ vs the original
    nvtx         nvtx_ranges.push + pop with no tool attached (part of each above)

The recorder is real (writer thread, 0.8 s parts to a temporary folder), so
the flushes' share of the GIL is included.

    .venv/bin/python -m bench.event_cost
"""

import contextlib
import os
import statistics
import tempfile
import time

BATCHES, CALLS = 15, 2000


def paired(plain, recorded, calls=CALLS, batches=BATCHES, setup=None) -> float:
    """Median over alternating batches of the extra microseconds per call;
    setup(recorded: bool), if given, switches the instrumentation per batch."""
    extra = []
    for _ in range(batches):
        times = []
        for on, fn in ((False, plain), (True, recorded)):
            if setup:
                setup(on)
            t0 = time.perf_counter_ns()
            for _ in range(calls):
                fn()
            times.append(time.perf_counter_ns() - t0)
        extra.append((times[1] - times[0]) / calls / 1000)
    return statistics.median(extra)


def measure() -> dict:
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    import collectors
    from collectors import nvtx_ranges
    from collectors.instrument import collectives, dataloader, forward_backward, host_sync
    from collectors.recorder import start_recorder

    out = {}
    tmp = tempfile.mkdtemp(prefix="diagnose-eventcost-")
    rec = start_recorder(tmp)

    out["nvtx_push_pop_us"] = paired(lambda: None, lambda: (nvtx_ranges.push("x", "phase"), nvtx_ranges.pop()))

    def with_phase():
        with collectors.phase("forward", microbatch=0, stage=0):
            pass

    out["phase_us"] = paired(lambda: contextlib.nullcontext().__enter__(), with_phase)

    # forward: install once, then switch Module.__call__ per batch
    plain_call = torch.nn.Module.__call__
    forward_backward.install(rec)
    recorded_call = torch.nn.Module.__call__
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.Linear(8, 1))
    x = torch.randn(2, 8)

    def use(recorded):
        torch.nn.Module.__call__ = recorded_call if recorded else plain_call

    with torch.no_grad():
        out["forward_us"] = paired(lambda: model(x), lambda: model(x), calls=500, setup=use)
    use(False)

    # all_reduce on a 1-rank gloo group: original vs patched
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    original_all_reduce = dist.all_reduce
    collectives.install(rec)
    patched_all_reduce = dist.all_reduce  # calls original_all_reduce inside
    t = torch.ones(4)
    out["all_reduce_us"] = paired(lambda: original_all_reduce(t), lambda: patched_all_reduce(t), calls=300)

    original_item = torch.Tensor.item
    host_sync.install(rec)
    patched_item = torch.Tensor.item
    out["item_us"] = paired(lambda: original_item(t[0]), lambda: patched_item(t[0]))

    original_next = _BaseDataLoaderIter.__next__
    dataloader.install(rec)
    patched_next = _BaseDataLoaderIter.__next__
    data = list(range(10**6))

    it = iter(DataLoader(data, batch_size=None))
    out["data_us"] = paired(lambda: original_next(it), lambda: patched_next(it), calls=500)
    dist.destroy_process_group()
    rec.close()
    return out


def main() -> None:
    for name, value in measure().items():
        print(f"{name:20s} {value:6.2f} us")


if __name__ == "__main__":
    main()
