"""Offset of this rank's clock to rank 0's, measured right after
init_process_group without touching the user's process groups: each rank opens
its own client to the rendezvous TCPStore and plays NTP with rank 0 over it.

offset = (t1 + t2) / 2 - t0 for a ping sent at t1, answered by rank 0 at t0 and
received at t2; the error bound is half the round trip. The best of a few rounds
is kept. Start-up is when a node is busiest (every rank importing, CUDA and
data workers starting): on a loaded 2-core host 16 rounds back to back all
took 3-16 ms, so while the best round trip is above GOOD_RTT_NS the peer goes
on with rounds spaced SPACING_S apart, for at most EXTRA_ROUNDS, to catch a
quiet moment. The peer decides when it is done and tells rank 0, which serves
the peers one after another. It runs in a background thread, so the job never
waits for it; the analyzer refines offsets further from collective completion
times (on a loaded host only to a few ms: a sound ping is worth more).

A job shorter than the pings ends while the thread is blocked in a store get
(rank 0 waits for a peer that has exited). Left there, the interpreter's
teardown destroyed the store client under it and the process aborted
("terminate called without an active exception", SIGABRT: a 4-step gloo job
failed in 5 of 6 runs under `diagnose run`, 0 of 6 without). At exit the
thread is stopped: the key it waits on is set from a second client, and it is
joined before the interpreter tears down; a peer keeps its best round so far.
"""

import atexit
import os
import time
from datetime import timedelta

from collectors.clock import now_ns
from collectors.daemon_thread import start_daemon
from collectors.instrument import on_process_group

ROUNDS = 16  # the best round wins; more rounds ride out a busy rank 0
GOOD_RTT_NS = 1_000_000
EXTRA_ROUNDS = 10
SPACING_S = 0.05
TIMEOUT_S = 300  # a peer waits while rank 0 serves the peers before it
DONE = "done"


class _Stopped(Exception):
    pass


class ClockSync:
    """The ping thread's state, shared with the exit hook that stops it."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.stopping = False
        self.waiting_for = None  # the store key the thread is blocked on, if any
        self.thread = None

    def _client(self, timeout_s: float):
        import torch.distributed as dist

        return dist.TCPStore(
            self.host, self.port, is_master=False, timeout=timedelta(seconds=timeout_s), wait_for_workers=False
        )

    def get(self, store, key: str) -> bytes:
        self.waiting_for = key
        try:
            value = store.get(key)
        finally:
            self.waiting_for = None
        if self.stopping:
            raise _Stopped
        return value

    def stop(self, join_s: float = 5.0) -> None:
        """At exit: unblock the thread (its key set from a second client) and join it."""
        self.stopping = True
        deadline = time.monotonic() + join_s
        unblocked = None
        while self.thread is not None and self.thread.is_alive() and time.monotonic() < deadline:
            key = self.waiting_for
            if key is not None and key != unblocked:
                try:
                    self._client(2).set(key, DONE)
                    unblocked = key
                except Exception:
                    return  # the store is gone: nothing to unblock with
            self.thread.join(0.05)


def _measure(rec, sync, rank, world_size):
    store = sync._client(TIMEOUT_S)
    prefix = (
        f"diagnose/clock/{os.environ.get('TORCHELASTIC_RUN_ID', '')}/"
        f"{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/"
    )
    if rank == 0:
        rec.meta["clock"].update(offset_to_rank0_ns=0, offset_error_ns=0, offset_method="reference")
        rec.write_meta()
        for peer in range(1, world_size):
            i = 0
            while sync.get(store, f"{prefix}{peer}/{i}/ping").decode() != DONE:
                store.set(f"{prefix}{peer}/{i}/pong", str(now_ns()))
                i += 1
        return
    best = None
    i = 0
    try:
        while i < ROUNDS or (best[1] > GOOD_RTT_NS and i < ROUNDS + EXTRA_ROUNDS):
            if i >= ROUNDS:
                time.sleep(SPACING_S)
            t1 = now_ns()
            store.set(f"{prefix}{rank}/{i}/ping", "1")
            t0 = int(sync.get(store, f"{prefix}{rank}/{i}/pong"))
            t2 = now_ns()
            if best is None or t2 - t1 < best[1]:
                best = ((t1 + t2) // 2 - t0, t2 - t1)
            i += 1
        store.set(f"{prefix}{rank}/{i}/ping", DONE)
    except _Stopped:
        pass
    if best is not None:
        rec.meta["clock"].update(offset_to_rank0_ns=best[0], offset_error_ns=best[1] // 2, offset_method="store-ping")
        rec.write_meta()


def _start(rec) -> None:
    import torch.distributed as dist

    try:
        rank, world_size = dist.get_rank(), dist.get_world_size()
        host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
        if not host or not port:
            rec.meta["clock"]["offset_method"] = "wall"
            return
        sync = ClockSync(host, int(port))

        def run():
            try:
                _measure(rec, sync, rank, world_size)
            except _Stopped:
                pass
            except Exception as exc:
                if not sync.stopping:
                    rec.record_error("clock_sync", exc)

        sync.thread = start_daemon(run, "diagnose-clock-sync", batch=False)  # round trips are its measure
        atexit.register(sync.stop)
    except Exception as exc:
        rec.record_error("clock_sync", exc)


def install(rec):
    on_process_group(lambda: _start(rec))
