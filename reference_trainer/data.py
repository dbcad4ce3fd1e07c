"""Token data: a nanoGPT-style uint16 token file, memory-mapped, read through a
real DataLoader.

The global batch of step k is a set of random windows drawn from a generator
seeded with (seed, k) only; dp rank r reads samples [r*n, (r+1)*n) of it in
micro-batch order. The batch therefore does not depend on the layout, which is
what makes losses comparable across (dp, tp, pp).
"""

import os
import tempfile
import time

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

DATA_SEED = 1234  # the generated corpus is shared by all runs, whatever their --seed


def make_token_file(path: str, vocab: int, n_tokens: int = 1 << 20, seed: int = DATA_SEED) -> None:
    """A corpus with learnable structure: a Zipf-distributed stream of 512 fixed random
    "words" of 2-8 tokens, so the next token inside a word is predictable and the loss
    falls well below ln(vocab) within tens of steps."""
    rng = np.random.default_rng(seed)
    n_words = 512
    words = [rng.integers(0, vocab, n) for n in rng.integers(2, 9, n_words)]
    probs = 1.0 / np.arange(1, n_words + 1)
    ids = rng.choice(n_words, size=n_tokens // 2, p=probs / probs.sum())
    tokens = np.concatenate([words[i] for i in ids])[:n_tokens].astype(np.uint16)
    # ranks generate concurrently: write privately, publish atomically
    tmp = f"{path}.{os.getpid()}.tmp"
    tokens.tofile(tmp)
    os.replace(tmp, path)


def default_token_file(vocab: int) -> str:
    path = os.path.join(tempfile.gettempdir(), "reference_trainer", f"tokens-v{vocab}-s{DATA_SEED}.bin")
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        make_token_file(path, vocab)
    return path


class TokenWindows(Dataset):
    """Index step*G + i is sample i of step k's global batch of G windows."""

    def __init__(self, path: str, seq_len: int, global_batch: int, seed: int, load_delay_ms: float):
        self.path, self.seq_len, self.global_batch, self.seed = path, seq_len, global_batch, seed
        self.load_delay_s = load_delay_ms / 1000
        self.n_tokens = os.path.getsize(path) // 2
        if self.n_tokens <= seq_len + 1:
            raise ValueError(f"{path}: {self.n_tokens} tokens, need more than seq_len+1")
        self._tokens = None
        self._offsets_step, self._offsets = -1, None

    def __len__(self) -> int:
        return 2**62  # indices come from the sampler; the corpus is sampled, not iterated

    def _window_offsets(self, step: int) -> np.ndarray:
        if step != self._offsets_step:
            rng = np.random.default_rng((self.seed, step))
            self._offsets = rng.integers(0, self.n_tokens - self.seq_len - 1, self.global_batch)
            self._offsets_step = step
        return self._offsets

    def __getitem__(self, index: int):
        if self._tokens is None:  # opened lazily: each DataLoader worker maps the file itself
            self._tokens = np.memmap(self.path, dtype=np.uint16, mode="r")
        if self.load_delay_s:
            time.sleep(self.load_delay_s)  # slow_input fault: a slow decode / remote read
        step, i = divmod(index, self.global_batch)
        start = int(self._window_offsets(step)[i])
        window = torch.from_numpy(self._tokens[start : start + self.seq_len + 1].astype(np.int64))
        return window[:-1], window[1:]


class DataParallelSlice(Sampler):
    """This dp rank's samples of every step's global batch, in micro-batch order."""

    def __init__(self, global_batch: int, dp: int, dp_rank: int, steps: int):
        self.global_batch, self.dp_rank, self.steps = global_batch, dp_rank, steps
        self.per_rank = global_batch // dp

    def __len__(self) -> int:
        return self.steps * self.per_rank

    def __iter__(self):
        for step in range(self.steps):
            first = step * self.global_batch + self.dp_rank * self.per_rank
            yield from range(first, first + self.per_rank)


def make_loader(
    *,
    path: str | None,
    vocab: int,
    seq_len: int,
    micro_batch_size: int,
    microbatches: int,
    dp: int,
    dp_rank: int,
    steps: int,
    seed: int,
    num_workers: int,
    load_delay_ms: float,
    pin_memory: bool,
) -> DataLoader:
    global_batch = dp * microbatches * micro_batch_size
    dataset = TokenWindows(path or default_token_file(vocab), seq_len, global_batch, seed, load_delay_ms)
    return DataLoader(
        dataset,
        batch_size=micro_batch_size,
        sampler=DataParallelSlice(global_batch, dp, dp_rank, steps),
        num_workers=num_workers,
        pin_memory=pin_memory,
        persistent_workers=num_workers > 0,
    )
