"""Data wait = time the training loop spends inside a DataLoader iterator's
__next__ (single- and multi-process loaders share _BaseDataLoaderIter.__next__).
The loader's num_workers goes in `detail`, so advice can name the knob."""
import functools

from collectors import nvtx_ranges
from collectors.clock import now_ns


def install(rec):
    from torch.utils.data.dataloader import _BaseDataLoaderIter
    st = rec.state
    orig = _BaseDataLoaderIter.__next__
    labels: dict = {}  # num_workers -> "workers=N", so the hot path allocates no string

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
        label = labels.get(workers) or labels.setdefault(workers, f"workers={workers}")
        rec.add(("data", "data_wait", t0, t1, st.step, st.microbatch, st.stage, "", "", -1,
                 -1, 0, False, "", label, -1))
        return batch

    _BaseDataLoaderIter.__next__ = __next__
