"""Data wait = time the training loop spends inside a DataLoader iterator's
__next__ (single- and multi-process loaders share _BaseDataLoaderIter.__next__).
The loader's num_workers goes in `detail`, so advice can name the knob, and the
batch's size, so that throughput can be compared across runs (`diagnose
compare`'s scaling table): `workers=N tokens=T` when the batch's first tensor
holds integers in two or more dimensions (token ids: T is their count), else
`workers=N samples=S` (its first dimension)."""

import functools

from collectors import nvtx_ranges
from collectors.clock import now_ns

MAX_LABELS = 4096


def install(rec):
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    st = rec.state
    orig = _BaseDataLoaderIter.__next__
    labels: dict = {}  # (num_workers, unit, n) -> its label, so the hot path builds no string

    @functools.wraps(orig)
    def __next__(self):
        t0 = now_ns()
        if st.step_start_ns is None:
            st.step_start_ns = t0
        if nvtx_ranges.MIRRORING:
            nvtx_ranges.push("data_wait", "data")
        try:
            batch = orig(self)
        finally:
            if nvtx_ranges.MIRRORING:
                nvtx_ranges.pop()
        t1 = now_ns()
        st.data_wait_ns += t1 - t0
        workers = getattr(self, "_num_workers", -1)
        key = (workers, *_batch_size(batch))
        label = labels.get(key)
        if label is None:
            label = f"workers={workers}" + (f" {key[1]}={key[2]}" if key[1] else "")
            if len(labels) < MAX_LABELS:  # batches of ever-new sizes (dynamic shapes) are not cached
                labels[key] = label
        rec.add(
            ("data", "data_wait", t0, t1, st.step, st.microbatch, st.stage, "", "", -1, -1, 0, False, "", label, -1)
        )
        return batch

    _BaseDataLoaderIter.__next__ = __next__


def _batch_size(batch) -> tuple:
    """("tokens", count) or ("samples", count) of the batch's first tensor, or ("", 0)."""
    first = batch
    for _ in range(3):  # a tuple/list/dict of tensors (maybe nested once or twice)
        if isinstance(first, (tuple, list)) and first:
            first = first[0]
        elif isinstance(first, dict) and first:
            first = next(iter(first.values()))
        else:
            break
    shape = getattr(first, "shape", None)
    if not shape:
        return "", 0
    if len(shape) >= 2 and not first.is_floating_point() and not first.is_complex():
        return "tokens", int(first.numel())
    return "samples", int(shape[0])
