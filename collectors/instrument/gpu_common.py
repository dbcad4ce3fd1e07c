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
            sys.stderr.write(f"diagnose: info: no usable GPU here ({reason}); NVML sampling, "
                             "CUDA-event timing and sync-debug events are off\n")


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
