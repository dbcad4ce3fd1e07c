"""ZeRO stage 1: optimizer state sharded over the data-parallel group.

Parameters are moved into flat buffers laid out exactly like the gradient
buckets. Each dp rank owns one contiguous shard of every bucket: gradients are
reduce-scattered into that shard (dp.GradBuckets with reduce_scatter=True), AdamW
keeps moments for the shard only (1/dp of the state) and updates it in place,
and an all-gather then hands every rank the other shards' new values.
"""

import torch
import torch.distributed as dist
import torch.nn as nn

from reference_trainer.dp import GradBuckets


class ZeroAdamW:
    def __init__(self, buckets: GradBuckets, *, group, dp_rank: int, lr: float, weight_decay: float, betas=(0.9, 0.95)):
        self.buckets, self.group = buckets, group
        self.shards: list[nn.Parameter] = []
        for b in buckets.buckets:
            b.param_flat = torch.zeros_like(b.grad)
            for p, (offset, numel) in zip(b.params, b.slots):
                view = b.param_flat[offset : offset + numel]
                view.copy_(p.detach().reshape(-1))
                p.data = view.view_as(p)
            lo = dp_rank * b.shard_numel
            shard = nn.Parameter(b.param_flat[lo : lo + b.shard_numel])  # shares storage
            shard.grad = b.grad_shard
            self.shards.append(shard)
        self.optimizer = torch.optim.AdamW(self.shards, lr=lr, betas=betas, weight_decay=weight_decay)
        # inside optimizer.step(), so whoever times "the optimizer" sees the all-gather too
        self.optimizer.register_step_post_hook(lambda *_: self._all_gather_params())

    def step(self) -> None:
        self.optimizer.step()

    def _all_gather_params(self) -> None:
        if self.buckets.dp == 1:
            return
        works = [
            dist.all_gather_into_tensor(b.param_flat, shard.detach().clone(), group=self.group, async_op=True)
            for b, shard in zip(self.buckets.buckets, self.shards)
        ]
        for work in works:
            work.wait()

    def state_numel(self) -> int:
        return sum(
            t.numel() for s in self.optimizer.state.values() for t in s.values() if torch.is_tensor(t) and t.dim() > 0
        )
