"""Injected faults: the problems `diagnose` must find, produced with ordinary
training-code mistakes and accidents so they show up in a trace the way the
real ones do (longer phases, extra collectives, a missing rank).

    straggler:rank=R,factor=F      rank R's forward/backward take F times as long
    slow_stage:stage=S,factor=F    every rank of pipeline stage S computes F times slower
    slow_input:ms=M                each sample takes M ms to load (Dataset.__getitem__)
    hidden_sync:every=microbatch   loss all_reduce + .item() inside the micro-batch loop
    blocking_p2p                   pipeline sends/receives issued one at a time and waited at once
    hang:rank=R,step=K[,gil=1]     rank R stops for good right before its first collective of step K
                                   (gil=1: deadlocked in a C call that holds the GIL, as a C
                                   extension or a lock taken in C does: its Python threads stop too)
    crash:rank=R,step=K            rank R SIGKILLs itself at the same point
    comm_bound[:mb=N,repeat=K]     K extra N-MB all-reduces per step make communication dominate
    slowdown:pct=P                 every step of every rank P% longer (a pause of P% of its median
                                   step so far, host time): a regression for a CI gate to catch
    checkpoint:every=N,factor=F    every N steps all ranks pause F x their median step so far (a
                                   checkpoint save: no collective, no event; not a hang)
    checkpoint:every=N,mode=M[,slow_rank=R,slow_ms=S]  real saves instead (reference_trainer/
                                   checkpointing.py: torch, dcp, dcp_async), rank R's disk slow
    varlen:spread=S[,seed=K]       each micro-batch's forward/backward takes L times as long, L drawn
                                   uniformly in [1, 1+S] per (step, micro-batch, dp replica)
    varlen:spread=S,tail=P[,seed=K]  real data's long tail instead: a fraction P of micro-batches
                                   1+S times as long, the rest 1-1.1x (spread=6.5,tail=0.1: 1 in
                                   10 at 7.5x, the production job of issue 45)
    accum_sync                     gradients all-reduced after every micro-batch's backward, not
                                   only the last one's (DDP without no_sync(): a round per backward)
    unpinned_copies[:mb=N]         batches copied to the GPU from pageable memory and waited for
                                   (no pin_memory, no non_blocking), and N MB of offloaded optimizer
                                   state moved device -> host -> device the same way each step
                                   (ZeRO-Offload done naively); CUDA only: a CPU run has no
                                   host-device copy, and the trainer says so and stops

On CUDA the compute faults slow the device, not the host (device_slowdown.py):
no torch.cuda.synchronize() and no time.sleep in the step; a hung rank blocks
on a lock that is never released. varlen is what variable sequence lengths do
without token-balanced packing: a micro-batch of longer sequences computes
longer, a different replica holds the longest ones at every step, and all of a
replica's pipeline stages (and tensor-parallel ranks) see the same micro-batch,
so the draw is keyed by the dp replica, not the rank. slow_input still sleeps in
Dataset.__getitem__: loading runs on the host, on CPU and CUDA alike.
"""

import ctypes
import os
import random
import signal
import sys
import threading
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from reference_trainer.checkpointing import MODES as CHECKPOINT_MODES
from reference_trainer.checkpointing import Checkpointer
from reference_trainer.device_slowdown import DeviceSlowdown

SHORT_SPREAD = 0.1  # varlen's tail mode: the short micro-batches' lengths, 1-1.1x

# name -> {key: (type, default)}; a default of None means the key is required
_SCHEMA: dict[str, dict[str, tuple]] = {
    "straggler": {"rank": (int, None), "factor": (float, 2.0)},
    "slow_stage": {"stage": (int, None), "factor": (float, 2.0)},
    "slow_input": {"ms": (float, None)},
    "hidden_sync": {"every": (str, "microbatch")},
    "blocking_p2p": {},
    "hang": {"rank": (int, None), "step": (int, None), "gil": (int, 0)},
    "crash": {"rank": (int, None), "step": (int, None)},
    "comm_bound": {"mb": (float, 32.0), "repeat": (int, 1)},
    "varlen": {"spread": (float, None), "seed": (int, 0), "tail": (float, 0.0)},
    "checkpoint": {
        "every": (int, None),
        "factor": (float, 0.0),
        "mode": (str, "sleep"),
        "slow_rank": (int, -1),
        "slow_ms": (float, 0.0),
    },
    "slowdown": {"pct": (float, None)},
    "accum_sync": {},
    "unpinned_copies": {"mb": (float, 64.0)},
}


@dataclass(frozen=True)
class FaultSpec:
    name: str
    params: dict = field(default_factory=dict)


def parse_fault(text: str) -> FaultSpec:
    name, _, rest = text.partition(":")
    name = name.strip()
    if name not in _SCHEMA:
        raise ValueError(f"unknown fault {name!r}; known: {', '.join(_SCHEMA)}")
    schema, given = _SCHEMA[name], {}
    for item in filter(None, (s.strip() for s in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq or key not in schema:
            raise ValueError(f"fault {name}: bad parameter {item!r}; expected {list(schema) or 'none'}")
        given[key] = schema[key][0](value)
    params = {}
    for key, (_, default) in schema.items():
        if key not in given and default is None:
            raise ValueError(f"fault {name} needs {key}=...")
        params[key] = given.get(key, default)
    if name == "hidden_sync" and params["every"] != "microbatch":
        raise ValueError("hidden_sync supports every=microbatch only")
    if name == "checkpoint" and (
        params["every"] < 1
        or params["mode"] not in CHECKPOINT_MODES
        or (params["mode"] == "sleep") != (params["factor"] > 0)
        or params["slow_ms"] < 0
    ):
        raise ValueError(
            f"checkpoint needs every >= 1 and either factor > 0 (a pause) or mode in "
            f"{', '.join(CHECKPOINT_MODES[1:])} (real saves)"
        )
    if name == "unpinned_copies" and params["mb"] < 0:
        raise ValueError("unpinned_copies needs mb >= 0")
    if name == "varlen" and (params["spread"] < 0 or not 0 <= params["tail"] < 1):
        raise ValueError("varlen needs spread >= 0 and 0 <= tail < 1")
    return FaultSpec(name, params)


class Faults:
    """What the faults of this run mean for this rank."""

    def __init__(
        self,
        specs: list[FaultSpec],
        rank: int,
        stage: int,
        device: torch.device,
        dp_rank: int | None = None,
        emulated_device_ms: float = 0.0,
    ):
        self.rank, self.device = rank, device
        # (config.py) the accelerator's time per forward of a micro-batch, emulated by a wait; CPU only
        self.emulated_device_ms = emulated_device_ms if device.type == "cpu" else 0.0
        self.dp_rank = rank if dp_rank is None else dp_rank
        self.step = -1
        self.microbatch = -1  # set by the StageRunner before each forward/backward
        self.varlen: tuple[float, int, float] | None = None  # (spread, seed, tail)
        self.compute_factor = 1.0
        self.slow_input_ms = 0.0
        self.hidden_sync_every_microbatch = False
        self.blocking_p2p = False
        self.accum_sync = False
        self.unpinned_copies = False
        self.offload_numel = 0
        self._offload = None  # (pageable host buffer, device buffer)
        self.stop: tuple[str, int] | None = None  # ("hang" | "crash", step) for this rank
        self.hang_holds_gil = False
        self.extra_allreduce_numel = 0
        self.extra_allreduce_repeat = 0
        self._extra_buf = None
        self._device_slowdown = None
        self.checkpoint: tuple[int, float] | None = None  # (every, factor)
        self.checkpointer = None  # real saves (mode != sleep)
        self.checkpoint_state = None  # () -> the state to save, set by train.py
        self.slowdown_frac = 0.0
        self._paused_s = 0.0
        self._step_times_s: list[float] = []
        self.added_compute_s = 0.0  # this step's sleeps that stretch compute (debug rows)
        for f in specs:
            p = f.params
            if f.name == "straggler" and p["rank"] == rank:
                self.compute_factor *= p["factor"]
            elif f.name == "slow_stage" and p["stage"] == stage:
                self.compute_factor *= p["factor"]
            elif f.name == "slow_input":
                self.slow_input_ms += p["ms"]
            elif f.name == "slowdown":
                self.slowdown_frac += p["pct"] / 100.0
            elif f.name == "hidden_sync":
                self.hidden_sync_every_microbatch = True
            elif f.name == "blocking_p2p":
                self.blocking_p2p = True
            elif f.name == "accum_sync":
                self.accum_sync = True
            elif f.name == "unpinned_copies":
                if device.type != "cuda":
                    raise SystemExit(
                        "fault unpinned_copies needs CUDA: a CPU run has no host-device copy to leave unpinned"
                    )
                self.unpinned_copies = True
                self.offload_numel = int(p["mb"] * 2**20 / 4)
            elif f.name in ("hang", "crash") and p["rank"] == rank:
                self.stop = (f.name, p["step"])
                self.hang_holds_gil = bool(p.get("gil"))
            elif f.name == "comm_bound":
                self.extra_allreduce_numel = int(p["mb"] * 2**20 / 4)
                self.extra_allreduce_repeat = p["repeat"]
            elif f.name == "varlen":
                self.varlen = (p["spread"], p["seed"], p["tail"])
            elif f.name == "checkpoint":
                self.checkpoint = (p["every"], p["factor"])
                if p["mode"] != "sleep":
                    self.checkpointer = Checkpointer(p["mode"], rank, p["slow_ms"] if p["slow_rank"] == rank else 0.0)

    def length_factor(self, step: int, microbatch: int) -> float:
        """varlen: the micro-batch's length over the shortest, the same on every rank of
        a dp replica and on every call (forward and backward of one micro-batch agree)."""
        if self.varlen is None:
            return 1.0
        spread, seed, tail = self.varlen
        # a string seed is hashed with SHA-512: the same draw in every process and run
        draws = random.Random(f"varlen:{seed}:{step}:{microbatch}:{self.dp_rank}")
        if not tail:
            return 1.0 + spread * draws.random()
        # most sequences short, a few long: the short ones differ a little too
        return 1.0 + spread if draws.random() < tail else 1.0 + SHORT_SPREAD * draws.random()

    def compute_begins(self):
        """Call before a forward/backward's compute; hand the result to compute_ends."""
        factor = self.compute_factor * self.length_factor(self.step, self.microbatch)
        if factor <= 1.0 and not self.emulated_device_ms:
            return None
        if self.device.type == "cuda":
            if self._device_slowdown is None:
                self._device_slowdown = DeviceSlowdown(factor)
            return self._device_slowdown.begin(), factor
        return time.perf_counter(), factor

    def compute_ends(self, begun, weight: float = 1.0) -> None:
        """After the compute: the phase grows F-fold, as on a slower GPU (CUDA: a
        spin kernel on the stream, the host never waits) or a throttled host (CPU).
        With an emulated device (CPU) the phase lasts F x `weight` x emulated_device_ms
        (2 for a backward) or the host's own compute if that is longer: the host queues
        work its device runs meanwhile, so the device's time does not depend on how
        fast the shared cores ran the host's part (the 2-core box's contention, which
        changes with how the ranks' compute lines up, is not a device's)."""
        if begun is None:
            return
        begun, factor = begun
        if self._device_slowdown is not None:
            self._device_slowdown.factor = factor  # varlen: this phase's own length
            self._device_slowdown.end(begun, kind=weight)
        elif self.emulated_device_ms:
            compute_s = time.perf_counter() - begun
            self._stretch(factor * weight * self.emulated_device_ms / 1e3 - compute_s)
        else:
            compute_s = time.perf_counter() - begun
            self._stretch((factor - 1.0) * compute_s)

    def _stretch(self, sleep_s: float) -> None:
        sleep_s = max(sleep_s, 0.0)
        self.added_compute_s += sleep_s
        time.sleep(sleep_s)

    def take_added_compute_s(self) -> float:
        """The compute this step's faults added on the host (their sleeps), reset."""
        added_s, self.added_compute_s = self.added_compute_s, 0.0
        return added_s

    def offload_states(self) -> None:
        """unpinned_copies: the optimizer state round trip of a naive CPU offload, from
        pageable memory with blocking copies: each waits for the stream, and neither
        overlaps compute (copy_stall's signal, in a profiler window's Memcpy rows)."""
        if not self.offload_numel:
            return
        if self._offload is None:
            self._offload = (
                torch.empty(self.offload_numel),  # pageable: no pin_memory()
                torch.zeros(self.offload_numel, device=self.device),
            )
        host, device_copy = self._offload
        host.copy_(device_copy)  # device -> host (the gradients, to the CPU optimizer)
        device_copy.copy_(host)  # host -> device (the updated parameters)

    def after_microbatch(self, loss_or_activation: torch.Tensor, group) -> None:
        """The classic logging mistake: reduce the micro-batch loss and read it on the host,
        which synchronises every rank (and the GPU) once per micro-batch."""
        if not self.hidden_sync_every_microbatch:
            return
        value = loss_or_activation.detach().float().mean().reshape(1)
        dist.all_reduce(value, group=group)
        value.item()

    def before_collective(self) -> None:
        """Right before this rank's first gradient collective of a step (or at the step's
        start when it has none): the others are left waiting inside that collective."""
        if self.stop is None or self.stop[1] != self.step:
            return
        kind = self.stop[0]
        print(f"[reference_trainer] fault {kind}: rank {self.rank} at step {self.step}", file=sys.stderr, flush=True)
        if kind == "crash":
            os.kill(os.getpid(), signal.SIGKILL)
        if self.hang_holds_gil:
            hold_the_gil_forever()
        if self.device.type == "cuda":  # a deadlock: alive, never reaches the collective
            threading.Event().wait()
        while True:  # hang: alive but never reaches the collective
            time.sleep(3600)

    def after_step(self, step: int, step_time_s: float) -> None:
        """checkpoint: a pause F x the median step, as saving a checkpoint takes (the
        host writes; no collective runs and nothing is recorded meanwhile); slowdown:
        see slow_step."""
        self._step_times_s.append(step_time_s - self._paused_s)  # the step without slow_step's pause
        self._paused_s = 0.0
        if self.checkpoint is None or (step + 1) % self.checkpoint[0]:
            return
        if self.checkpointer is not None:
            self.checkpointer.save(self.checkpoint_state())
            return
        times = sorted(self._step_times_s)
        time.sleep(self.checkpoint[1] * times[len(times) // 2])

    def slow_step(self) -> None:
        """slowdown: P% of the median step so far, inside the step (before the
        optimizer), as a heavier code path would add; host time."""
        if not self.slowdown_frac or not self._step_times_s:
            return
        times = sorted(self._step_times_s)
        self._paused_s = self.slowdown_frac * times[len(times) // 2]
        time.sleep(self._paused_s)

    def extra_comm(self, group) -> None:
        """comm_bound: gradient traffic far larger than the compute it follows."""
        if not self.extra_allreduce_repeat:
            return
        if self._extra_buf is None:
            self._extra_buf = torch.zeros(self.extra_allreduce_numel, device=self.device)
        for _ in range(self.extra_allreduce_repeat):
            dist.all_reduce(self._extra_buf, group=group)


def hold_the_gil_forever() -> None:
    """A self-deadlock in C with the GIL held: ctypes.PyDLL keeps the GIL across
    the call, so no Python thread of this process runs again (diagnose's writer
    included); only a signal handler in C (faulthandler) can still say where it is."""
    libc = ctypes.PyDLL(None)
    mutex = ctypes.create_string_buffer(64)  # >= sizeof(pthread_mutex_t) (40 on x86-64 glibc)
    libc.pthread_mutex_init(mutex, None)
    libc.pthread_mutex_lock(mutex)
    libc.pthread_mutex_lock(mutex)  # the same non-recursive mutex again: never returns
