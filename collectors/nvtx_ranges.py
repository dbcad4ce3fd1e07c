"""Every recorded range is also an NVTX range in domain "diagnose", one category
per event kind, so `nsys profile` shows our phases beside the CUDA kernels.

Only when an NVTX tool is attached: tools attach through NVTX_INJECTION64_PATH
(nsys, ncu and `diagnose run --nsys` set it for the job), read by the NVTX
library at its first call, so without it every NVTX call is a no-op that still
cost the rank's main thread three Python-level calls per range (~70 per step
of the reference trainer). Callers test MIRRORING before they call push/pop,
so that without a tool a range costs an attribute read, not a call. Domain and per-(name, kind) event attributes are
created once and cached: registration is the costly part of NVTX.
"""

import os

_DOMAIN = None
if os.environ.get("NVTX_INJECTION64_PATH") or os.environ.get("NVTX_INJECTION32_PATH"):
    try:
        import nvtx as _nvtx

        _DOMAIN = _nvtx.get_domain("diagnose")
    except Exception:  # nvtx missing or broken: ranges are simply not mirrored
        _DOMAIN = None

MIRRORING = _DOMAIN is not None
_ATTRIBUTES: dict = {}


def push(name: str, kind: str) -> None:
    if _DOMAIN is not None:
        attrs = _ATTRIBUTES.get((name, kind))
        if attrs is None:
            attrs = _ATTRIBUTES[(name, kind)] = _DOMAIN.get_event_attributes(
                message=name, category=_DOMAIN.get_category_id(kind)
            )
        _DOMAIN.push_range(attrs)


def pop() -> None:
    if _DOMAIN is not None:
        _DOMAIN.pop_range()
