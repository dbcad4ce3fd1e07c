"""Pipeline point-to-point communication over `dist.batch_isend_irecv`.

Every exchange is between a stage and one neighbour. A batch that receives is
waited at once (the data is needed next); a batch that only sends is left in
flight and waited at the end of the schedule, so the stage computes its next
micro-batch while the neighbour picks the activation up.

With the blocking_p2p fault every operation is its own batch and is waited
immediately, like a naive `send(); recv()` pair: a send then lasts until the
neighbour is ready to receive (gloo and NCCL are both rendezvous). Even stages
send first and odd stages receive first, the order Megatron's unbatched path
uses so that two neighbours never both wait in send.
"""
import torch
import torch.distributed as dist

from reference_trainer.optional_collectors import phase


class PipelineP2P:
    def __init__(self, *, stage: int, prev_rank: int | None, next_rank: int | None, group,
                 activation_shape: tuple[int, ...], dtype: torch.dtype, device: torch.device,
                 blocking: bool):
        self.stage, self.prev, self.next, self.group = stage, prev_rank, next_rank, group
        self.shape, self.dtype, self.device = activation_shape, dtype, device
        self.blocking = blocking
        self._unwaited_sends: list = []

    def _buffer(self) -> torch.Tensor:
        return torch.empty(self.shape, dtype=self.dtype, device=self.device)

    def _exchange(self, name: str, microbatch: int, sends: list, recvs: list) -> None:
        """sends/recvs: (tensor, peer) pairs."""
        send_ops = [dist.P2POp(dist.isend, t.contiguous(), peer, self.group) for t, peer in sends]
        recv_ops = [dist.P2POp(dist.irecv, t, peer, self.group) for t, peer in recvs]
        with phase(name, microbatch=microbatch, stage=self.stage):
            if self.blocking:
                ordered = send_ops + recv_ops if self.stage % 2 == 0 else recv_ops + send_ops
                for op in ordered:
                    for work in dist.batch_isend_irecv([op]):
                        work.wait()
                return
            works = dist.batch_isend_irecv(send_ops + recv_ops)
            if recv_ops:
                for work in works:
                    work.wait()
            else:
                # keep the tensors alive until the send has completed
                self._unwaited_sends.append((works, [op.tensor for op in send_ops]))

    def recv_forward(self, microbatch: int) -> torch.Tensor | None:
        if self.prev is None:
            return None
        x = self._buffer()
        self._exchange("recv", microbatch, [], [(x, self.prev)])
        return x.requires_grad_()

    def send_forward(self, y: torch.Tensor, microbatch: int) -> None:
        if self.next is not None:
            self._exchange("send", microbatch, [(y.detach(), self.next)], [])

    def recv_backward(self, microbatch: int) -> torch.Tensor | None:
        if self.next is None:
            return None
        g = self._buffer()
        self._exchange("recv", microbatch, [], [(g, self.next)])
        return g

    def send_backward(self, dx: torch.Tensor | None, microbatch: int) -> None:
        if self.prev is not None:
            self._exchange("send", microbatch, [(dx, self.prev)], [])

    def send_forward_recv_backward(self, y: torch.Tensor, microbatch: int) -> torch.Tensor | None:
        if self.next is None:
            return None
        g = self._buffer()
        self._exchange("p2p", microbatch, [(y.detach(), self.next)], [(g, self.next)])
        return g

    def send_backward_recv_forward(self, dx: torch.Tensor | None, microbatch: int) -> torch.Tensor | None:
        if self.prev is None:
            return None
        x = self._buffer()
        self._exchange("p2p", microbatch, [(dx, self.prev)], [(x, self.prev)])
        return x.requires_grad_()

    def wait_sends(self) -> None:
        """End of the schedule: every send must have landed before buffers are reused."""
        if not self._unwaited_sends:
            return
        with phase("send", stage=self.stage):
            for works, _ in self._unwaited_sends:
                for work in works:
                    work.wait()
        self._unwaited_sends.clear()
