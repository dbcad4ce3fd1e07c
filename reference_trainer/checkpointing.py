"""Real checkpoint saves for the `checkpoint` fault (mode=torch|dcp|dcp_async):
what the recorder's checkpoint spans and the checkpoint_stall detector are
tried on (issue 47, item 4). Each rank saves its own stage's model state into a
scratch directory of its own, removed at exit; `slow_ms` makes one rank's disk
slow (a pause in each write of the file: a slow or busy volume), inside the
save, as a real slow disk would be.

    torch       torch.save of the state to one file (no fsync: the page cache)
    dcp         torch.distributed.checkpoint.save, every rank together (DCP
                synchronises its ranks inside save: a slow rank shows in all)
    dcp_async   DCP's async_save: the call returns once the state is staged to
                CPU; the previous upload is waited before the next save
"""

import atexit
import io
import os
import shutil
import tempfile
import time

MODES = ("sleep", "torch", "dcp", "dcp_async")


class SlowFile(io.FileIO):
    """A file whose every write waits `slow_s` first (a slow disk)."""

    def __init__(self, path, slow_s: float):
        super().__init__(path, "w")
        self.slow_s = slow_s

    def write(self, data):
        time.sleep(self.slow_s)
        return super().write(data)


class Checkpointer:
    def __init__(self, mode: str, rank: int, slow_ms: float = 0.0):
        self.mode, self.rank, self.slow_s = mode, rank, slow_ms / 1e3
        self.dir = tempfile.mkdtemp(prefix=f"ckpt-rank{rank}-")
        atexit.register(shutil.rmtree, self.dir, True)
        self.pending = None  # dcp_async: the previous upload
        self.saves = 0

    def save(self, state: dict) -> None:
        import torch

        self.saves += 1
        if self.mode == "torch":
            path = os.path.join(self.dir, "model.pt")
            if self.slow_s:
                with SlowFile(path, self.slow_s) as f:
                    torch.save(state, f)
            else:
                torch.save(state, path)
            return
        import torch.distributed.checkpoint as dcp

        # stages have parameters of the same names: keyed by rank, each is its own
        keyed = {f"rank{self.rank}": state}
        where = os.path.join(self.dir, f"step{self.saves}")
        if self.slow_s:
            time.sleep(self.slow_s)  # DCP opens its own files: the slow disk as one pause
        if self.mode == "dcp":
            dcp.save(keyed, checkpoint_id=where)
        else:
            if self.pending is not None:
                self.pending.result()  # the next save waits for the previous upload
            self.pending = dcp.async_save(keyed, checkpoint_id=where)

    def close(self) -> None:
        if self.pending is not None:
            self.pending.result()
