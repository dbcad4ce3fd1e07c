"""GPU activity in imported traces: its class, NCCL op names and element sizes,
shared by the Kineto and Nsight importers.

Imported GPU activity is stored as event rows of kind "kernel" (the fields are
described in docs/run-directory.md), one per kernel, memcpy, memset or GPU-side
sync, with its class in `detail`: "compute" | "communication" | "memory" |
"other" (collectors.schema.KERNEL_CLASSES). The classes are HTA's
(hta.utils.utils.get_kernel_type), so that HTA's temporal breakdown can be
reproduced: communication = NCCL kernels, memory = Memcpy/Memset/DMA, other =
GPU syncs and kernels HTA leaves unclassified.
"""

import bisect
import re

from collectors.schema import COMMUNICATION, COMPUTE, MEMORY, OTHER

_NCCL_RE = re.compile(r"^nccl.*Kernel")
_MEMORY_RE = re.compile(r"(^Memcpy)|(^Memset)|(^dma)")
_NOT_COMPUTE_RE = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")
_NCCL_OP_RE = re.compile(r"Kernel_([A-Za-z]+)")
_CAMEL = re.compile(r"(?<!^)(?=[A-Z])")
_OP_ALIASES = {
    "allreduce": "all_reduce",
    "allgather": "all_gather",
    "reducescatter": "reduce_scatter",
    "alltoall": "all_to_all",
    "all_to_allv": "all_to_all",
    "alltoallv": "all_to_all",
    "_allgather_base": "all_gather",
    "_reduce_scatter_base": "reduce_scatter",
    "all_gather_into_tensor": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter",
    "_all_gather_base": "all_gather",
    "sendrecv": "send_recv",
}
DTYPE_BYTES = {
    "float": 4,
    "float32": 4,
    "half": 2,
    "float16": 2,
    "bfloat16": 2,
    "double": 8,
    "float64": 8,
    "long": 8,
    "int64": 8,
    "int": 4,
    "int32": 4,
    "short": 2,
    "byte": 1,
    "char": 1,
    "bool": 1,
    "uint8": 1,
    "int8": 1,
    # the profiler's "Input type" spellings (C++ type names)
    "c10::half": 2,
    "c10::bfloat16": 2,
    "long int": 8,
    "short int": 2,
    "signed char": 1,
    "unsigned char": 1,
    "c10::float8_e4m3fn": 1,
    "c10::float8_e5m2": 1,
    "c10::complex<float>": 8,
    "c10::complex<double>": 16,
}


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


# kernel names that say nothing of the op: one kernel runs any collective (RCCL's
# ncclDevKernel_Generic on MI300; NCCL's SendRecv kernel also runs all_to_all)
_ANY_OP_KERNELS = {"Generic"}


def collective_op(collective_name: str | None, kernel_name: str) -> str:
    """Our op name (torch.distributed spelling) from Kineto's "Collective name"
    or, failing that, from the NCCL kernel name (ncclDevKernel_AllReduce_...).
    Callers try the launching CPU op or NVTX range first: a kernel name is the
    last resort, and "nccl" (op unknown) where it names no op."""
    if collective_name:
        key = collective_name.strip().lower()
        return _OP_ALIASES.get(key, key)
    m = _NCCL_OP_RE.search(kernel_name)
    if not m or m.group(1) in _ANY_OP_KERNELS:
        return "nccl"
    snake = _CAMEL.sub("_", m.group(1)).lower()
    return _OP_ALIASES.get(snake.replace("_", ""), snake)


_NCCL_CALLS = {
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "broadcast",
    "reduce",
    "send",
    "recv",
    "all_to_all",
    "gather",
    "scatter",
}


def nccl_call_op(text: str) -> str | None:
    """The op of a CPU range around an NCCL call: PyTorch's "nccl:all_reduce"
    or NCCL's own NVTX range "ncclAllReduce"; "nccl" for ncclGroupEnd (which
    launches a group's kernel: its ops are the group's, not said here); None
    for a range that launches nothing (ncclGroupStart, ncclCommInitRank...)."""
    if text.startswith("nccl:"):
        return collective_op(text[5:], "")
    if not text.startswith("nccl"):
        return None
    if text == "ncclGroupEnd":
        return "nccl"
    op = collective_op(_CAMEL.sub("_", text[4:]), "")
    op = _OP_ALIASES.get(op.replace("_", ""), op)  # (ncclAlltoAll)
    return op if op in _NCCL_CALLS else None


def p2p_pair(op: str, rank: int, peer: int) -> tuple[str, str]:
    """(group, group_ranks) of a send or recv between rank and peer, as a
    native run names them (collectors/instrument/collectives.py): "SRC->DST",
    "SRC,DST", so that the n-th message of a pair meets its partner."""
    src, dst = (rank, peer) if op == "send" else (peer, rank)
    return f"{src}->{dst}", f"{src},{dst}"


def tensor_bytes(dims, types) -> int:
    """The bytes of a call's tensors from a profiler op's "Input Dims" and
    "Input type" ([[19618307]], ["float"]); 0 where they say nothing usable.
    Scalars and non-tensor arguments ([] dims, "Scalar" or "" types) count 0."""
    if not isinstance(dims, list) or not isinstance(types, list):
        return 0
    total = 0
    for shape, dtype in zip(dims, types):
        size = DTYPE_BYTES.get(dtype.lower(), 0) if isinstance(dtype, str) else 0
        if not size or not isinstance(shape, list) or not shape:
            continue
        n = 1
        for d in shape:
            if not isinstance(d, int) or isinstance(d, bool) or d < 0:
                n = 0
                break
            n *= d
        total += n * size
    return total


_NESTING = 8  # how many earlier ranges on a thread may hold a launch (nested calls are few)


def launching_ranges(launches: list, ranges: list) -> list:
    """For each kernel launch, (ts, thread) or None, the index in `ranges`
    ((start, end, thread) of the CPU ranges around NCCL calls) of the innermost
    one that encloses it on the launching thread, or -1: the call that launched
    the kernel (launch correlation)."""
    by_thread = {}
    for index, (start, end, thread) in enumerate(ranges):
        by_thread.setdefault(thread, []).append((start, end, index))
    starts = {}
    for thread, spans in by_thread.items():
        spans.sort()
        starts[thread] = [s for s, _, _ in spans]
    found = []
    for launch in launches:
        index = -1
        spans = by_thread.get(launch[1]) if launch is not None else None
        if spans:
            at = bisect.bisect_right(starts[launch[1]], launch[0])
            for _, end, candidate in reversed(spans[max(at - _NESTING, 0) : at]):  # innermost first
                if end >= launch[0]:
                    index = candidate
                    break
        found.append(index)
    return found


def ranks_string(ranks) -> str:
    """ "[0, 1, 2]" or a list -> "0,1,2"; anything unparsable -> ""."""
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
