"""nanoGPT-like decoder, cut into pipeline stages and sharded over tp.

Every weight is drawn full-size from a seed keyed by its layout-independent name
(see tp.seeded_normal) and then sliced, so a (dp, tp, pp) run starts from the
weights a single-process run starts from. The embedding and the head are
replicated over tp and not tied: tying them across the first and last pipeline
stage would need one more all-reduce per step for a 2-layer toy model.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from reference_trainer.tp import ColumnParallelLinear, RowParallelLinear, seeded_normal

INIT_STD = 0.02


class Attention(nn.Module):
    def __init__(self, layer: int, d_model: int, heads: int, n_layers: int, seed: int, tp_rank: int, tp: int, group):
        super().__init__()
        head_dim, local_heads = d_model // heads, heads // tp
        self.local_heads, self.head_dim = local_heads, head_dim
        heads_here = slice(tp_rank * local_heads, (tp_rank + 1) * local_heads)
        # (q|k|v, head, head_dim, d_model): a tp rank takes whole heads of each of q, k, v
        qkv = seeded_normal((3, heads, head_dim, d_model), INIT_STD, seed, f"h.{layer}.attn.qkv")
        self.qkv = ColumnParallelLinear(qkv[:, heads_here].reshape(-1, d_model), group, tp)
        proj_std = INIT_STD / math.sqrt(2 * n_layers)  # nanoGPT: residual projections scaled by depth
        proj = seeded_normal((d_model, heads, head_dim), proj_std, seed, f"h.{layer}.attn.proj")
        self.proj = RowParallelLinear(proj[:, heads_here].reshape(d_model, -1), group, tp)

    def forward(self, x):
        batch, seq, _ = x.shape
        q, k, v = self.qkv(x).view(batch, seq, 3, self.local_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(batch, seq, self.local_heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, layer: int, d_model: int, n_layers: int, seed: int, tp_rank: int, tp: int, group):
        super().__init__()
        hidden = 4 * d_model
        local = slice(tp_rank * hidden // tp, (tp_rank + 1) * hidden // tp)
        fc = seeded_normal((hidden, d_model), INIT_STD, seed, f"h.{layer}.mlp.fc")
        proj = seeded_normal((d_model, hidden), INIT_STD / math.sqrt(2 * n_layers), seed, f"h.{layer}.mlp.proj")
        self.fc = ColumnParallelLinear(fc[local], group, tp)
        self.proj = RowParallelLinear(proj[:, local], group, tp)

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, layer: int, d_model: int, heads: int, n_layers: int, seed: int, tp_rank: int, tp: int, group):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = Attention(layer, d_model, heads, n_layers, seed, tp_rank, tp, group)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = MLP(layer, d_model, n_layers, seed, tp_rank, tp, group)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPTStage(nn.Module):
    """Blocks [layer_lo, layer_hi) of the model; the first stage also embeds tokens, the
    last also applies the final LayerNorm, the head and the loss."""

    def __init__(
        self,
        *,
        vocab: int,
        seq_len: int,
        d_model: int,
        heads: int,
        n_layers: int,
        layer_lo: int,
        layer_hi: int,
        first: bool,
        last: bool,
        seed: int,
        tp_rank: int,
        tp: int,
        tp_group,
    ):
        super().__init__()
        self.first, self.last, self.vocab = first, last, vocab
        if first:
            self.wte = nn.Embedding(vocab, d_model)
            self.wpe = nn.Embedding(seq_len, d_model)
            with torch.no_grad():
                self.wte.weight.copy_(seeded_normal((vocab, d_model), INIT_STD, seed, "wte"))
                self.wpe.weight.copy_(seeded_normal((seq_len, d_model), INIT_STD, seed, "wpe"))
        self.blocks = nn.ModuleList(
            Block(i, d_model, heads, n_layers, seed, tp_rank, tp, tp_group) for i in range(layer_lo, layer_hi)
        )
        if last:
            self.ln_f = nn.LayerNorm(d_model)
            self.lm_head = nn.Linear(d_model, vocab, bias=False)
            with torch.no_grad():
                self.lm_head.weight.copy_(seeded_normal((vocab, d_model), INIT_STD, seed, "lm_head"))

    def forward(self, x: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """x: token ids (first stage) or the previous stage's activations. Returns the
        activations, or on the last stage the mean cross-entropy over the micro-batch."""
        if self.first:
            pos = torch.arange(x.shape[1], device=x.device)
            x = self.wte(x) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        if not self.last:
            return x
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.float().view(-1, self.vocab), targets.view(-1))
