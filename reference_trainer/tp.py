"""Megatron-style tensor parallelism: the f/g conjugate autograd functions and
the column-/row-parallel linears built on them.

A column-parallel linear followed by a row-parallel one needs exactly one
all-reduce forward (g, after the row-parallel matmul) and one backward (f, on
the gradient of the replicated input), whatever the activation in between.
"""

import hashlib

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


class _CopyToTP(torch.autograd.Function):
    """f: identity forward; all-reduce of the input gradient backward, because each tp
    rank only saw the part of the gradient that flows through its own shard."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromTP(torch.autograd.Function):
    """g: all-reduce forward (sum the partial products of the row shards); identity backward."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.contiguous().clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def copy_to_tp(x: torch.Tensor, group, tp: int) -> torch.Tensor:
    return x if tp == 1 else _CopyToTP.apply(x, group)


def reduce_from_tp(x: torch.Tensor, group, tp: int) -> torch.Tensor:
    return x if tp == 1 else _ReduceFromTP.apply(x, group)


def seeded_normal(shape: tuple[int, ...], std: float, seed: int, name: str) -> torch.Tensor:
    """The full (unsharded) tensor for parameter `name`, identical on every rank and in
    every layout, so that runs with different dp/tp/pp start from the same weights."""
    digest = hashlib.sha256(f"{seed}/{name}".encode()).digest()
    gen = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & (2**63 - 1))
    return torch.randn(shape, generator=gen) * std


class ColumnParallelLinear(nn.Module):
    """Output features split over tp; the input is replicated."""

    def __init__(self, weight_shard: torch.Tensor, group, tp: int):
        super().__init__()
        self.group, self.tp = group, tp
        self.weight = nn.Parameter(weight_shard.contiguous())
        self.bias = nn.Parameter(torch.zeros(weight_shard.shape[0]))

    def forward(self, x):
        return F.linear(copy_to_tp(x, self.group, self.tp), self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """Input features split over tp; the output is summed over tp, then the (replicated)
    bias is added once."""

    def __init__(self, weight_shard: torch.Tensor, group, tp: int):
        super().__init__()
        self.group, self.tp = group, tp
        self.weight = nn.Parameter(weight_shard.contiguous())
        self.bias = nn.Parameter(torch.zeros(weight_shard.shape[0]))

    def forward(self, x):
        return reduce_from_tp(F.linear(x, self.weight), self.group, self.tp) + self.bias
