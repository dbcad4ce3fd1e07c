"""What the Kineto and Nsight importers share: GPU-activity classification,
NCCL naming, step assignment, and writing an ordinary run directory.

Imported GPU activity is stored as event rows of kind "kernel" (see
collectors/schema.py), one per kernel, memcpy, memset or GPU-side sync:

    name      kernel name as the profiler wrote it
    start_ns  end_ns  GPU execution interval
    step      the profiler step in which the CPU launched it (-1: before the first)
    group     CUDA stream id, as a string
    seq       correlation id of the launch (-1 if unknown)
    bytes     bytes moved (memcpy/memset) or sent (NCCL), else 0
    detail    class: "compute" | "communication" | "memory" | "other"

The classes are HTA's (hta.utils.utils.get_kernel_type), so that HTA's
temporal breakdown can be reproduced: communication = NCCL kernels, memory =
Memcpy/Memset/DMA, other = GPU syncs and kernels HTA leaves unclassified.

Each NCCL kernel also yields a "collective" row (start = end = kernel start,
async) and a "done" row at kernel end, keyed by process group and per-group
sequence number, so cross-rank matching (diagnose.matching) runs on GPU times:
arrival = when the rank's GPU reached the collective.
"""
import os
import re
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from collectors.part_writer import PartWriter, atomic_write_json
from collectors.schema import events_table, rank_dir_name
from diagnose import rundir
from diagnose.errors import UserError

COMPUTE, COMMUNICATION, MEMORY, OTHER = "compute", "communication", "memory", "other"
_NCCL_RE = re.compile(r"^nccl.*Kernel")
_MEMORY_RE = re.compile(r"(^Memcpy)|(^Memset)|(^dma)")
_NOT_COMPUTE_RE = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")
_NCCL_OP_RE = re.compile(r"Kernel_([A-Za-z]+)")
_CAMEL = re.compile(r"(?<!^)(?=[A-Z])")
_OP_ALIASES = {"allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter",
               "alltoall": "all_to_all", "all_to_allv": "all_to_all", "alltoallv": "all_to_all",
               "_allgather_base": "all_gather", "_reduce_scatter_base": "reduce_scatter",
               "all_gather_into_tensor": "all_gather", "reduce_scatter_tensor": "reduce_scatter",
               "sendrecv": "send_recv"}
DTYPE_BYTES = {"float": 4, "float32": 4, "half": 2, "float16": 2, "bfloat16": 2, "double": 8,
               "float64": 8, "long": 8, "int64": 8, "int": 4, "int32": 4, "short": 2, "byte": 1,
               "char": 1, "bool": 1, "uint8": 1, "int8": 1}


def kernel_class(name: str) -> str:
    """HTA's kernel type of a GPU activity name."""
    if _NCCL_RE.match(name):
        return COMMUNICATION
    if _MEMORY_RE.match(name):
        return MEMORY
    if not _NOT_COMPUTE_RE.match(name):
        return COMPUTE
    return OTHER


def as_int(value, default=-1) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def collective_op(collective_name: str | None, kernel_name: str) -> str:
    """Our op name (torch.distributed spelling) from Kineto's "Collective name"
    or, failing that, from the NCCL kernel name (ncclDevKernel_AllReduce_...)."""
    if collective_name:
        key = collective_name.strip().lower()
        return _OP_ALIASES.get(key, key)
    m = _NCCL_OP_RE.search(kernel_name)
    if not m:
        return "nccl"
    snake = _CAMEL.sub("_", m.group(1)).lower()
    return _OP_ALIASES.get(snake.replace("_", ""), snake)


def assign_steps(step_starts_ns: np.ndarray, step_numbers: np.ndarray, t_ns: np.ndarray) -> np.ndarray:
    """Step in progress at each time: the last step that started at or before it
    (a step lasts until the next one starts), -1 before the first."""
    if len(step_starts_ns) == 0:
        return np.full(len(t_ns), -1, dtype=np.int64)
    order = np.argsort(step_starts_ns)
    starts, numbers = step_starts_ns[order], step_numbers[order]
    idx = np.searchsorted(starts, t_ns, side="right") - 1
    return np.where(idx >= 0, numbers[np.clip(idx, 0, None)], -1)


def ranks_string(ranks) -> str:
    """ "[0, 1, 2]" or a list -> "0,1,2"; anything unparsable -> "". """
    if isinstance(ranks, (list, tuple)):
        items = ranks
    elif isinstance(ranks, str):
        items = re.findall(r"-?\d+", ranks)
    else:
        return ""
    try:
        return ",".join(str(int(r)) for r in items)
    except (TypeError, ValueError):
        return ""


def clock_meta(wall_anchor_ns: int = 0, mono_anchor_ns: int = 0) -> dict:
    """Imported times are absolute (wall clock or the profiler's session base);
    ranks are put on one clock through these anchors (diagnose.align)."""
    return {"mono_anchor_ns": int(mono_anchor_ns), "wall_anchor_ns": int(wall_anchor_ns),
            "offset_to_rank0_ns": None, "offset_error_ns": None, "offset_method": "import"}


class RunDirWriter:
    """Creates the run directory (refusing a non-empty one) and writes ranks."""

    def __init__(self, out_dir: str, fmt: str, sources: list):
        if os.path.isdir(out_dir) and os.listdir(out_dir):
            raise UserError(f"--out {out_dir} is not empty; choose a new directory")
        self.run_dir = rundir.prepare_out_dir(out_dir)
        self.fmt = fmt
        self.sources = [os.path.abspath(s) for s in sources]
        self.ranks: dict = {}
        self.events_total = 0

    def write_rank(self, rank: int, rows, meta: dict) -> None:
        """rows: event tuples, or an Arrow table in collectors.schema's EVENT_SCHEMA."""
        writer = PartWriter(os.path.join(self.run_dir, rundir.TRACES, rank_dir_name(rank)))
        if isinstance(rows, list):
            writer.write_events(rows)
        else:
            writer.write_events_table(rows)
        self._add_meta(writer, rank, meta, len(rows))

    def adopt_rank(self, rank: int, events_file: str, events: int, meta: dict) -> None:
        """The rank's events as a Parquet file already written (by a worker process), moved in."""
        writer = PartWriter(os.path.join(self.run_dir, rundir.TRACES, rank_dir_name(rank)))
        writer.adopt_events_file(events_file)
        self._add_meta(writer, rank, meta, events)

    def _add_meta(self, writer: PartWriter, rank: int, meta: dict, events: int) -> None:
        writer.write_meta({"rank": rank, "imported": self.fmt, **meta})
        self.ranks[rank] = events
        self.events_total += events

    def finish(self, extra: dict | None = None) -> str:
        now = time.time_ns()
        rundir.write_manifest(self.run_dir, {
            "name": os.path.basename(self.run_dir), "command": f"diagnose import {self.fmt}",
            "argv": ["diagnose", "import", self.fmt, *self.sources], "imported_from": self.sources,
            "format": self.fmt, "world_size": len(self.ranks), "ranks_seen": sorted(self.ranks),
            "start_wall_ns": now, "end_wall_ns": now, "exit_status": 0, **(extra or {})})
        return self.run_dir


def append_rank_events(rank_dir: str, rows, tag: str) -> str | None:
    """Add rows (event tuples, or an Arrow table in collectors.schema's
    EVENT_SCHEMA) to an existing rank folder as `events-<tag>-NNNNNN.parquet`,
    beside the recorder's own parts (names that can never collide with them)."""
    if not len(rows):
        return None
    index = 1 + sum(1 for n in os.listdir(rank_dir) if n.startswith(f"events-{tag}-"))
    path = os.path.join(rank_dir, f"events-{tag}-{index:06d}.parquet")
    tmp = f"{path}.tmp-{os.getpid()}"
    pq.write_table(rows if isinstance(rows, pa.Table) else events_table(rows), tmp, compression="zstd")
    os.replace(tmp, path)
    return path


def write_json(path: str, obj) -> None:
    atomic_write_json(path, obj)
