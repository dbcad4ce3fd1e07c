"""Every recorded range is also an NVTX range in domain "diagnose", one category
per event kind, so `nsys profile` shows our phases beside the CUDA kernels.

Domain and per-(name, kind) event attributes are created once and cached: NVTX
registration is the costly part, push/pop with a cached attribute is cheap (and
a no-op when no tool is attached).
"""
try:
    import nvtx as _nvtx
    _DOMAIN = _nvtx.get_domain("diagnose")
except Exception:  # nvtx missing or broken: ranges are simply not mirrored
    _DOMAIN = None

_ATTRIBUTES: dict = {}


def _attributes(name: str, kind: str):
    key = (name, kind)
    attrs = _ATTRIBUTES.get(key)
    if attrs is None:
        attrs = _DOMAIN.get_event_attributes(message=name, category=_DOMAIN.get_category_id(kind))
        _ATTRIBUTES[key] = attrs
    return attrs


def push(name: str, kind: str) -> None:
    if _DOMAIN is not None:
        _DOMAIN.push_range(_attributes(name, kind))


def pop() -> None:
    if _DOMAIN is not None:
        _DOMAIN.pop_range()
