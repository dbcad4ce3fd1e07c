"""Helpers shared by the collective instrumentors (collectives.py, coalescing.py,
functional_collectives.py): a call's arguments and bytes, and the device-timing
hooks (collective_events.py) behind one guard."""

import inspect


def tensor_bytes(obj) -> int:
    if hasattr(obj, "element_size") and hasattr(obj, "numel"):
        return obj.element_size() * obj.numel()
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(x) for x in obj if hasattr(x, "numel"))
    return 0


def _param_index(fn, name):
    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return None
    return params.index(name) if name in params else None


def _arg(args, kwargs, index, name):
    if name in kwargs:
        return kwargs[name]
    if index is not None and index < len(args):
        return args[index]
    return None


def _device(tracker, method: str, *args):
    """tracker.device.<method>(*args) (collective_events.py) when CUDA timing is
    on; a failure turns it off for the rest of the run, never in the job's way."""
    device = tracker.device
    if device is None:
        return None
    try:
        return getattr(device, method)(*args)
    except Exception as exc:
        tracker.rec.record_error("collective_events", exc)
        tracker.device = None
        return None


def _device_mark(tracker, tensor, group=None, is_gloo=None):
    """The call's arrival event on the device, or None (CUDA timing off, or
    a gloo group: its work is the host's)."""
    if tracker.device is None:
        return None
    if is_gloo is None:
        try:
            is_gloo = tracker.group_info(group, tensor)[3]
        except Exception:
            return None  # unknown backend: not timed
    return _device(tracker, "mark", tensor, is_gloo)
