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
import re

from collectors.schema import COMMUNICATION, COMPUTE, MEMORY, OTHER

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
