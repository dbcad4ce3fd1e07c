"""Offset of this rank's clock to rank 0's, measured right after
init_process_group without touching the user's process groups: each rank opens
its own client to the rendezvous TCPStore and plays NTP with rank 0 over it.

offset = (t1 + t2) / 2 - t0 for a ping sent at t1, answered by rank 0 at t0 and
received at t2; the error bound is half the round trip. The best of a few rounds
is kept. It runs in a background thread, so the job never waits for it; the
analyzer refines offsets further from collective completion times.
"""
import functools
import os
from datetime import timedelta

from collectors.clock import now_ns
from collectors.daemon_thread import start_daemon

ROUNDS = 16  # the best round wins; more rounds ride out a busy rank 0
TIMEOUT_S = 60


def _measure(rec, rank, world_size):
    import torch.distributed as dist
    host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not host or not port:
        rec.meta["clock"]["offset_method"] = "wall"
        return
    store = dist.TCPStore(host, int(port), is_master=False,
                          timeout=timedelta(seconds=TIMEOUT_S), wait_for_workers=False)
    prefix = f"diagnose/clock/{os.environ.get('TORCHELASTIC_RUN_ID', '')}/" \
             f"{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/"
    if rank == 0:
        rec.meta["clock"].update(offset_to_rank0_ns=0, offset_error_ns=0, offset_method="reference")
        rec.write_meta()
        for peer in range(1, world_size):
            for i in range(ROUNDS):
                store.get(f"{prefix}{peer}/{i}/ping")
                store.set(f"{prefix}{peer}/{i}/pong", str(now_ns()))
        return
    best = None
    for i in range(ROUNDS):
        t1 = now_ns()
        store.set(f"{prefix}{rank}/{i}/ping", "1")
        t0 = int(store.get(f"{prefix}{rank}/{i}/pong"))
        t2 = now_ns()
        if best is None or t2 - t1 < best[1]:
            best = ((t1 + t2) // 2 - t0, t2 - t1)
    rec.meta["clock"].update(offset_to_rank0_ns=best[0], offset_error_ns=best[1] // 2,
                             offset_method="store-ping")
    rec.write_meta()


def install(rec):
    import torch.distributed as dist
    c10d = dist.distributed_c10d
    orig = c10d.init_process_group

    @functools.wraps(orig)
    def init_process_group(*args, **kwargs):
        result = orig(*args, **kwargs)
        try:
            rank, world_size = dist.get_rank(), dist.get_world_size()

            def run():
                try:
                    _measure(rec, rank, world_size)
                except Exception as exc:
                    rec.record_error("clock_sync", exc)

            start_daemon(run, "diagnose-clock-sync")
        except Exception as exc:
            rec.record_error("clock_sync", exc)
        return result

    for mod in (c10d, dist):
        if getattr(mod, "init_process_group", None) is orig:
            mod.init_process_group = init_process_group
