"""Pipeline schedules, written as the papers' pseudo-code: the order in which a
stage runs its micro-batches' forwards and backwards, run by one loop over a
StageRunner (one micro-batch forward or backward on this stage) and PipelineP2P
(one exchange with the neighbours between two computes, in the --p2p-mode's way).

AFAB (GPipe): all m forwards, then all m backwards; stage 0 keeps the
activations of all m micro-batches alive. 1F1B (PipeDream-Flush): stage s runs
pp-s-1 warm-up forwards, then alternates one forward with one backward, so at
most pp micro-batches are alive on stage 0 and the bubble is the same.
Both run backwards in micro-batch order, so gradients accumulate in the same
order and the two schedules give bitwise-equal updates.
"""

import contextlib
import time

import torch

from reference_trainer.optional_collectors import phase
from reference_trainer.p2p import BACKWARD, FORWARD, PipelineP2P


class StageRunner:
    """Forward and backward of one micro-batch on this stage, with its phases and faults."""

    def __init__(
        self,
        model,
        *,
        stage: int,
        first: bool,
        last: bool,
        microbatches: int,
        buckets,
        faults,
        dp_group,
        autocast_dtype: torch.dtype | None,
        device: torch.device,
    ):
        self.model, self.stage, self.first, self.last = model, stage, first, last
        self.microbatches = microbatches
        self.buckets, self.faults, self.dp_group = buckets, faults, dp_group
        self.autocast_dtype, self.device = autocast_dtype, device
        self.batches: list = []
        self.loss_sum = torch.zeros((), device=device)
        self.max_inflight = 0
        self.compute_s = 0.0  # forward + backward host time this step (on CUDA: to queue it)
        # A compute fault slows the model's own forward (hooks run inside its call),
        # as a slow part would: a trace of module calls alone, without phases, shows it.
        self._begun = None
        model.register_forward_pre_hook(self._compute_begins)
        model.register_forward_hook(self._compute_ends)

    def _compute_begins(self, module, args):
        self._begun = self.faults.compute_begins()

    def _compute_ends(self, module, args, output):
        self.faults.compute_ends(self._begun)
        self._begun = None

    def start_step(self, batches: list) -> None:
        self.batches = batches
        self.loss_sum = torch.zeros((), device=self.device)
        self.max_inflight = 0
        self.compute_s = 0.0

    def note_inflight(self, n_alive: int) -> None:
        self.max_inflight = max(self.max_inflight, n_alive)

    def _autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def forward(self, x: torch.Tensor | None, mb: int) -> torch.Tensor:
        self.faults.microbatch = mb  # varlen: a micro-batch's length sets its compute
        with phase("forward", microbatch=mb, stage=self.stage):
            t0 = time.perf_counter()
            tokens, targets = self.batches[mb] if self.batches else (None, None)
            with self._autocast():
                y = self.model(tokens if self.first else x, targets if self.last else None)
            if self.last:
                self.loss_sum += y.detach()
                # grads accumulate over micro-batches: scale so they sum to the batch mean
                y = y / self.microbatches
            self.compute_s += time.perf_counter() - t0
            self.faults.after_microbatch(y, self.dp_group)
        return y

    def backward(
        self, x: torch.Tensor | None, y: torch.Tensor, dy: torch.Tensor | None, mb: int
    ) -> torch.Tensor | None:
        # the data-parallel all-reduce is launched from grad hooks during the last backward
        # (accum_sync: during every one, waited at its end, as DDP does without no_sync();
        # the buckets hold the accumulated gradient, and a mean of equal values is that value,
        # so the last round still gives the batch mean)
        last = mb == self.microbatches - 1
        self.buckets.sync_enabled = last or self.faults.accum_sync
        self.faults.microbatch = mb
        with phase("backward", microbatch=mb, stage=self.stage):
            t0, begun = time.perf_counter(), self.faults.compute_begins()
            if begun is not None:
                # the slowdown ends the backward from inside it (the engine's final
                # callback), so that a trace of the backward call alone shows it
                y.register_hook(
                    lambda grad: torch.autograd.Variable._execution_engine.queue_callback(
                        lambda: self.faults.compute_ends(begun, weight=2.0)
                    )
                )
            torch.autograd.backward(y, grad_tensors=None if self.last else dy)
            self.compute_s += time.perf_counter() - t0
            if self.faults.accum_sync and not last:
                self.buckets.wait()
        return None if x is None else x.grad


def afab(m: int, pp: int, stage: int) -> list:
    return [(FORWARD, i) for i in range(m)] + [(BACKWARD, i) for i in range(m)]


def one_f_one_b(m: int, pp: int, stage: int) -> list:
    warmup = min(pp - stage - 1, m)
    order = [(FORWARD, i) for i in range(warmup)]
    for i in range(m - warmup):
        order += [(FORWARD, warmup + i), (BACKWARD, i)]
    return order + [(BACKWARD, i) for i in range(m - warmup, m)]


SCHEDULES = {"afab": afab, "1f1b": one_f_one_b}


def run_schedule(name: str, run: StageRunner, p2p: PipelineP2P, m: int, pp: int, stage: int) -> None:
    """Each compute takes what the exchange before it received and hands its result
    to the exchange after it, which also receives the next compute's input."""
    order = SCHEDULES[name](m, pp, stage)

    def after(k: int):
        return order[k] if k < len(order) else None

    inputs, outputs = {}, {}
    received = p2p.exchange(None, after(0), after(1))
    for k, (kind, mb) in enumerate(order):
        if kind == FORWARD:
            y = run.forward(received, mb)
            inputs[mb], outputs[mb] = received, y
            run.note_inflight(len(outputs))
            result = y
        else:
            result = run.backward(inputs.pop(mb), outputs.pop(mb), received, mb)
        received = p2p.exchange((kind, mb, result), after(k + 1), after(k + 2))
    p2p.wait_sends()
