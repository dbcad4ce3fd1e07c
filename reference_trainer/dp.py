"""Data-parallel gradient synchronisation: flat gradient buckets whose
all-reduce starts while backward is still running.

Each parameter's `.grad` is a view into its bucket's flat buffer, so autograd
accumulates micro-batch gradients straight into the buffer and the all-reduce
needs no copy. Buckets are filled in reverse registration order because
backward produces the last layers' gradients first. On the last micro-batch a
post-accumulate-grad hook counts the bucket's finished gradients and launches
its asynchronous all-reduce (or, for ZeRO-1, reduce-scatter) when the bucket is
complete; buckets launch strictly in order so that every dp rank issues the same
sequence of collectives. `wait()` is the only blocking point, before the optimizer.
"""

import warnings

import torch
import torch.distributed as dist

# torch >= 2.10 renamed these; the old names are kept because they are what tools patch
warnings.filterwarnings("ignore", message=r".*reduce_scatter_tensor.* is deprecated")
warnings.filterwarnings("ignore", message=r".*all_gather_into_tensor.* is deprecated")


class Bucket:
    def __init__(self, params: list, dp: int, device: torch.device):
        self.params = params
        numel = sum(p.numel() for p in params)
        self.padded_numel = -(-numel // dp) * dp  # a multiple of dp, so it splits into equal shards
        self.shard_numel = self.padded_numel // dp
        self.grad = torch.zeros(self.padded_numel, device=device)
        self.grad_shard = None  # reduce-scatter output, ZeRO-1 only
        self.slots: list[tuple[int, int]] = []
        offset = 0
        for p in params:
            self.slots.append((offset, p.numel()))
            p.grad = self.grad[offset : offset + p.numel()].view_as(p)
            offset += p.numel()
        self.n_ready = 0
        self.work = None


class GradBuckets:
    def __init__(
        self,
        params,
        *,
        group,
        dp: int,
        device: torch.device,
        bucket_cap_mb: float,
        reduce_scatter: bool = False,
        before_first_launch=None,
    ):
        self.group, self.dp, self.reduce_scatter = group, dp, reduce_scatter
        self.before_first_launch = before_first_launch
        self.sync_enabled = False
        params = [p for p in params if p.requires_grad]
        cap_numel = max(1, int(bucket_cap_mb * 2**20 / 4))
        groups, current, size = [], [], 0
        for p in reversed(params):
            current.append(p)
            size += p.numel()
            if size >= cap_numel:
                groups.append(current)
                current, size = [], 0
        if current:
            groups.append(current)
        self.buckets = [Bucket(ps, dp, device) for ps in groups]
        self.bucket_of = {}
        for i, b in enumerate(self.buckets):
            if reduce_scatter:
                b.grad_shard = torch.zeros(b.shard_numel, device=device)
            for p in b.params:
                self.bucket_of[p] = i
                p.register_post_accumulate_grad_hook(self._on_grad_ready)
        self.next_to_launch = 0

    def zero_grad(self) -> None:
        for b in self.buckets:
            b.grad.zero_()

    def _on_grad_ready(self, p: torch.Tensor) -> None:
        if not self.sync_enabled:
            return
        self.buckets[self.bucket_of[p]].n_ready += 1
        while self.next_to_launch < len(self.buckets):
            b = self.buckets[self.next_to_launch]
            if b.n_ready < len(b.params):
                break
            self._launch(b)
            self.next_to_launch += 1

    def _launch(self, b: Bucket) -> None:
        if self.next_to_launch == 0 and self.before_first_launch is not None:
            self.before_first_launch()
        if self.dp == 1:
            return
        b.grad.div_(self.dp)  # gloo has no AVG; pre-dividing keeps fp32 sums small
        if self.reduce_scatter:
            b.work = dist.reduce_scatter_tensor(b.grad_shard, b.grad, group=self.group, async_op=True)
        else:
            b.work = dist.all_reduce(b.grad, group=self.group, async_op=True)

    def wait(self) -> None:
        """Block until every bucket's collective has finished; reset for the next step."""
        if self.next_to_launch != len(self.buckets):
            raise RuntimeError(
                f"only {self.next_to_launch}/{len(self.buckets)} gradient buckets were "
                "launched: a parameter got no gradient on the last micro-batch"
            )
        for b in self.buckets:
            if b.work is not None:
                b.work.wait()
                b.work = None
            if self.reduce_scatter and self.dp == 1:
                b.grad_shard.copy_(b.grad)
            b.n_ready = 0
        self.next_to_launch = 0
        self.sync_enabled = False
