"""What the GPU collectors share (not an instrumentor itself).

On a machine without a GPU or driver every GPU collector switches itself off;
the first one to notice prints one info line on rank 0's stderr, and each rank
notes in meta.json which collectors are off and why. Nothing else changes.
"""

import os
import sys

from collectors import identity

# The device-memory metric nvml_sampler writes and memory_imbalance reads: one
# constant for writer and reader, so that a rename cannot leave the reader asking
# for a name nobody writes (it did: it fell back to host RSS without saying so).
# Here, not in nvml_sampler, so that the analysis imports no instrumentor.
GPU_MEM_USED_MB = "mem_used_mb"

_said = []


def gpu_unavailable(rec, collector: str, reason: str) -> None:
    gpu = rec.meta.setdefault("gpu", {"available": False, "reason": reason, "off": []})
    gpu["available"] = False
    if collector not in gpu["off"]:
        gpu["off"].append(collector)
    if not _said:
        _said.append(reason)
        if identity.rank() == 0:
            sys.stderr.write(
                f"diagnose: info: no usable GPU here ({reason}); NVML sampling, "
                "CUDA-event timing and sync-debug events are off\n"
            )


def cuda_ready(torch) -> tuple[bool, str]:
    """(usable, reason). Call at first use, not at install: asking CUDA at
    `import torch` time would freeze the device list before the script has set
    CUDA_VISIBLE_DEVICES or its device."""
    if not torch.backends.cuda.is_built():
        return False, "CPU-only torch build"
    try:
        if torch.cuda.is_available():
            return True, ""
    except Exception as exc:  # a broken driver raises instead of returning False
        return False, f"CUDA unavailable: {exc}"
    return False, "no CUDA device visible"


# The GPU this rank's training thread uses, as NVML names it: set on that thread
# once CUDA is in use (cuda_events), read by the NVML sampler's thread, which until
# then samples local_device_index()'s guess.
RANK_GPU: dict = {"uuid": None, "index": None}


def note_rank_device(torch) -> None:
    """On the training thread, once CUDA is in use: its current device's UUID.
    The environment cannot say which GPU that is: CUDA_DEVICE_ORDER (CUDA's
    default, fastest first, is not NVML's PCI order), a set_device other than the
    local rank, or a MIG instance. The UUID is the same in CUDA and NVML."""
    index = torch.cuda.current_device()
    uuid = str(torch.cuda.get_device_properties(index).uuid)
    RANK_GPU["index"] = index
    RANK_GPU["uuid"] = uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"


def local_device_index() -> str | None:
    """This rank's physical GPU as NVML names it: CUDA_VISIBLE_DEVICES[local rank]
    (an index or a UUID), else the local rank (collectors/identity.py); None when the rank may see no GPU."""
    local = identity.local_rank()
    if "CUDA_VISIBLE_DEVICES" not in os.environ:
        return str(local)
    visible = [v.strip() for v in os.environ["CUDA_VISIBLE_DEVICES"].split(",") if v.strip()]
    if not visible or visible[0].startswith("-"):
        return None
    return visible[local] if local < len(visible) else visible[-1]
