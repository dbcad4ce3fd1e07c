"""Pipeline point-to-point communication, posted one of three ways (--p2p-mode).

A stage's schedule is a sequence of computes, and between two of them the stage
makes one exchange with its neighbours: it sends what the compute before
produced (a forward's activation on to the next stage, a backward's gradient
back to the previous one) and receives what the compute after needs (a
forward's activation from the previous stage, a backward's gradient from the
next). The modes post the same tensors to the same peers in the same order per
direction, so every mode trains the same model; they differ in how the
operations are grouped and when a receive is posted, as real jobs do:

    separate    (default) the send, in a batch of its own left in flight, then
                the receive, waited at once; a send and a receive with the same
                neighbour share one batch (Megatron's send_forward_recv_backward
                in 1F1B's steady state)
    batched     every exchange is ONE `batch_isend_irecv`, with both neighbours
                where the stage has traffic with both (warm-up: activation on,
                next activation in; cool-down: gradient back, next gradient in),
                in Megatron's order: send prev, recv prev, send next, recv next
                (`_batched_p2p_ops`, as its interleaved schedule posts them)
    preposted   every operation on its own (a batch of one, as Megatron's
                `_p2p_ops` calls isend/irecv), and each receive posted one
                exchange early, before the compute that precedes its use, and
                waited where the data is needed (`overlap_p2p_comm`). gloo only:
                on NCCL a pair's sends and receives share one stream, and a
                gradient receive posted ahead of the activation send it waits
                for deadlocks 1F1B (Megatron allows overlap_p2p_comm only with
                its interleaved schedule)

A batch with a receive is waited at once (the data is needed next); sends alone
are left in flight and waited at the end of the schedule, so the stage computes
its next micro-batch while the neighbour picks the activation up. A batch of one
rather than a bare `dist.irecv`: the collectors record `batch_isend_irecv`, not
isend/irecv (collectors/instrument/collectives.py), and on gloo the two post the
same operation.

With the blocking_p2p fault (separate mode only) every operation is its own
batch and is waited immediately, like a naive `send(); recv()` pair: a send then
lasts until the neighbour is ready to receive (gloo and NCCL are both
rendezvous). Even stages send first and odd stages receive first, the order
Megatron's unbatched path uses so that two neighbours never both wait in send.
"""

import torch
import torch.distributed as dist

from reference_trainer.optional_collectors import phase

FORWARD, BACKWARD = "forward", "backward"
P2P_MODES = ("separate", "batched", "preposted")


class PipelineP2P:
    def __init__(
        self,
        *,
        stage: int,
        prev_rank: int | None,
        next_rank: int | None,
        group,
        activation_shape: tuple[int, ...],
        dtype: torch.dtype,
        device: torch.device,
        blocking: bool,
        mode: str = "separate",
    ):
        self.stage, self.prev, self.next, self.group = stage, prev_rank, next_rank, group
        self.shape, self.dtype, self.device = activation_shape, dtype, device
        self.blocking, self.mode = blocking, mode
        self._unwaited_sends: list = []
        self._preposted: dict = {}  # (kind, microbatch) -> (works, buffer) of a receive posted ahead

    def exchange(self, sent: tuple | None, needed: tuple | None, ahead: tuple | None) -> torch.Tensor | None:
        """sent: (kind, microbatch, tensor) the compute before produced; needed: (kind,
        microbatch) of the compute after; ahead: that of the compute after it. Returns the
        tensor the needed compute takes in (None: it has no neighbour to take it from)."""
        send = self._send_op(sent)
        if self.mode == "preposted":
            return self._preposted_exchange(send, sent, needed, ahead)
        recv = None if needed is None else self._recv_op(needed)
        mb = sent[1] if sent is not None else (needed[1] if needed is not None else -1)
        if self.mode == "batched":
            ops = sorted(filter(None, [send, recv]), key=self._megatron_order)
            if ops:
                self._post(_phase_name(ops), mb, ops, wait=recv is not None)
        elif send is not None and recv is not None and send.peer == recv.peer:
            self._post("p2p", mb, [send, recv], wait=True)
        else:
            if send is not None:
                self._post("send", mb, [send], wait=False)
            if recv is not None:
                self._post("recv", needed[1], [recv], wait=True)
        return None if recv is None else _received(needed, recv.tensor)

    def _preposted_exchange(self, send, sent, needed, ahead) -> torch.Tensor | None:
        if send is not None:
            self._post("send", sent[1], [send], wait=False)
        # receives from a peer are matched in the order they are posted: the schedule's
        # first receive (no exchange came before it) goes before the one after it
        if needed is not None and needed not in self._preposted:
            self._prepost(needed)
        # and that one before this wait, so that it is in flight during the wait too
        if ahead is not None:
            self._prepost(ahead)
        if needed is None:
            return None
        works, buffer = self._preposted.pop(needed, (None, None))
        if buffer is None:
            return None
        with phase("recv", microbatch=needed[1], stage=self.stage):
            for work in works:
                work.wait()
        return _received(needed, buffer)

    def _prepost(self, needed: tuple) -> None:
        recv = self._recv_op(needed)
        if recv is not None:
            self._preposted[needed] = (dist.batch_isend_irecv([recv]), recv.tensor)

    def _send_op(self, sent):
        if sent is None:
            return None
        kind, _, tensor = sent
        peer = self.next if kind == FORWARD else self.prev
        if peer is None or tensor is None:
            return None
        return dist.P2POp(dist.isend, tensor.detach().contiguous(), peer, self.group)

    def _recv_op(self, needed):
        peer = self.prev if needed[0] == FORWARD else self.next
        if peer is None:
            return None
        buffer = torch.empty(self.shape, dtype=self.dtype, device=self.device)
        return dist.P2POp(dist.irecv, buffer, peer, self.group)

    def _megatron_order(self, op) -> int:
        """send prev, recv prev, send next, recv next."""
        return (0 if op.peer == self.prev else 2) + (0 if op.op is dist.isend else 1)

    def _post(self, name: str, microbatch: int, ops: list, wait: bool) -> None:
        with phase(name, microbatch=microbatch, stage=self.stage):
            if self.blocking:
                sends_first = self.stage % 2 == 0
                for op in sorted(ops, key=lambda o: (o.op is dist.isend) != sends_first):
                    for work in dist.batch_isend_irecv([op]):
                        work.wait()
                return
            works = dist.batch_isend_irecv(ops)
            if wait:
                for work in works:
                    work.wait()
            else:
                # keep the tensors alive until the send has completed
                self._unwaited_sends.append((works, [op.tensor for op in ops]))

    def wait_sends(self) -> None:
        """End of the schedule: every send must have landed before buffers are reused."""
        assert not self._preposted, f"receives posted and never used: {sorted(self._preposted)}"
        if not self._unwaited_sends:
            return
        with phase("send", stage=self.stage):
            for works, _ in self._unwaited_sends:
                for work in works:
                    work.wait()
        self._unwaited_sends.clear()


def _phase_name(ops: list) -> str:
    sends = {op.op is dist.isend for op in ops}
    return "p2p" if len(sends) == 2 else ("send" if True in sends else "recv")


def _received(needed: tuple, buffer: torch.Tensor) -> torch.Tensor:
    # a received activation is the leaf whose grad the backward sends back
    return buffer.requires_grad_() if needed[0] == FORWARD else buffer
