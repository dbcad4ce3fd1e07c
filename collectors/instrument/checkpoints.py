"""Checkpoint saves as spans (issue 47, item 4): `torch.save`,
`torch.distributed.checkpoint.save` / `async_save` (DCP) and, when the job
imports it, `safetensors.torch.save_file`.

One "checkpoint" row per call on the calling thread: name the API, from its
call to its return (what it blocks the caller), bytes the tensors it was
given hold (a walk of the state dict's containers, at save time only: never a
cost per step), the user's line, and the thread (detail `thread=<name>`). DCP
synchronises its ranks inside `save`, so a slow rank shows in every rank's span;
`async_save` returns once its stager has copied the state to CPU (that copy
blocks the caller: the span), then uploads on a thread or process, whose end a
"done" row marks when the returned future completes (detail `upload_ns`: the
upload's length, done - return). The wrappers call the original first and record after; a
failure to record is the recorder's error, never the job's. A save inside a
save (DCP's writers call torch.save per item) is not a span of its own, nor is
a torch.save no line of the job made (an async upload's writes on DCP's threads,
after async_save returned: the done row says when they ended).
"""

import functools
import threading

from collectors.after_import import after_import
from collectors.callsite import user_callsite
from collectors.clock import now_ns

MAX_WALK = 100_000  # containers and tensors looked at per save: a bound, not a guess of sizes


def state_bytes(obj) -> int:
    """Bytes of the tensors in a (nested) state dict, list or tuple."""
    total, todo, seen = 0, [obj], 0
    while todo and seen < MAX_WALK:
        item = todo.pop()
        seen += 1
        if isinstance(item, dict):
            todo.extend(item.values())
        elif isinstance(item, (list, tuple)):
            todo.extend(item)
        else:
            nbytes = getattr(item, "nbytes", None)
            if isinstance(nbytes, int):
                total += nbytes
            elif hasattr(item, "element_size") and hasattr(item, "numel"):
                total += int(item.element_size()) * int(item.numel())
    return total


_INSIDE = [0]  # saves in progress: DCP's writers call torch.save per item, one span is the save


def _wrap(rec, name: str, orig, on_result=None):
    st = rec.state

    @functools.wraps(orig)
    def save(obj, *args, **kwargs):
        if _INSIDE[0]:
            return orig(obj, *args, **kwargs)
        t0 = now_ns()
        _INSIDE[0] += 1
        try:
            result = orig(obj, *args, **kwargs)
        finally:
            _INSIDE[0] -= 1
        t1 = now_ns()
        try:
            callsite = user_callsite(2)
            if not callsite and name == "torch.save":
                return result  # a library's own write (DCP's upload threads): part of its save
            thread = threading.current_thread().name
            rec.add(
                (
                    "checkpoint",
                    name,
                    t0,
                    t1,
                    st.step,
                    -1,
                    -1,
                    "",
                    "",
                    -1,
                    -1,
                    state_bytes(obj),
                    False,
                    callsite,
                    f"thread={thread}",
                    -1,
                )
            )
            if on_result is not None:
                on_result(result, t1)
        except Exception as exc:
            rec.record_error("checkpoints", exc)
        return result

    save._diagnose_wrapped = True
    return save


def _patch(rec, module, attr: str, name: str, on_result=None) -> None:
    orig = getattr(module, attr, None)
    if orig is None or getattr(orig, "_diagnose_wrapped", False):
        return
    setattr(module, attr, _wrap(rec, name, orig, on_result))


def install(rec):
    import torch
    import torch.serialization

    wrapped = _wrap(rec, "torch.save", torch.save)
    torch.save = torch.serialization.save = wrapped
    after_import("torch.distributed.checkpoint", lambda: _install_dcp(rec))
    after_import("safetensors.torch", lambda: _install_safetensors(rec))


def _install_dcp(rec) -> None:
    try:
        import torch.distributed.checkpoint as dcp

        st = rec.state

        def upload_done(future, returned_ns):
            def done(_):
                t = now_ns()
                rec.add(
                    (
                        "done",
                        "dcp.async_save",
                        t,
                        t,
                        st.step,
                        -1,
                        -1,
                        "",
                        "",
                        -1,
                        -1,
                        0,
                        False,
                        "",
                        f"upload_ns={t - returned_ns}",
                        -1,
                    )
                )

            if hasattr(future, "add_done_callback"):
                future.add_done_callback(done)

        _patch(rec, dcp, "save", "dcp.save")
        _patch(rec, dcp, "async_save", "dcp.async_save", upload_done)
    except Exception as exc:
        rec.record_error("checkpoints", exc)


def _install_safetensors(rec) -> None:
    try:
        import safetensors.torch as st_torch

        _patch(rec, st_torch, "save_file", "safetensors.save_file")
    except Exception as exc:
        rec.record_error("checkpoints", exc)
