"""The FLOPs of one training step, counted zero-code for MFU (issue 48; what the
analysis makes of them: diagnose/analysis/tables/mfu.py, docs/analysis.md#mfu).

Which step. Step COUNTED_STEP (1), or the first step after the `--torch-profiler`
window when that window holds it: a counted step runs every op of the step
through a Python dispatch mode, several times slower (the reference trainer's
default step on CPU: 0.08 CPU-s against 0.02), and a profiled step must show
the job's own work. Step 1 is warm-up for the analysis of a run of 6 steps and more
(the first 2 steps are); in a shorter run the loader leaves the counted step
out of the steady steps (meta.json `flops.step` names it). From the optimizer
post-hook that ends step 0 to the first optimizer pre-hook of step 1: the
forwards and backwards of every micro-batch,
not the optimizer (its elementwise updates have no FLOP formula anyway). The
same step on every rank, so the ranks are slow together.

How. torch.utils.flop_counter.FlopCounterMode (torch's own formulas: matmuls,
convolutions, attention), with these changes:

* attention on CPU (`_scaled_dot_product_flash_attention_for_cpu` and its
  backward) is not in torch's registry and would count 0: _extra_formulas
  prices it with torch's own attention formulas;
* under DTensor the mode sees the global shapes, so every rank would count the
  whole model: each formula is given the rank's local shards instead, which is
  the rank's share whatever the placement (a replicated matmul is counted in
  full on every rank, as every rank computes it); manual tensor and pipeline
  parallelism count their share as they are;
* no module tracker: FlopCounterMode's per-module table installs global module
  hooks (every module call of the step through Module's slow path) and grad
  hooks on every module's inputs and outputs; we keep the total only;
* the mode ignores compile internals: under a mode that does not, torch.compile
  skips every frame (compiled code runs eagerly, and a fullgraph=True function
  raises in the job: tests/scripts/compile_counts.py did). Compiled code then
  runs as compiled and the count sees the aten ops it calls (aot_eager: all of
  them; Inductor: the matmuls and attention it leaves to aten, not the kernels
  it generates, pointwise ones without FLOPs anyway; `compiled_graphs` says the
  job compiled);
* its handler is not wrapped for dynamo while torch._dynamo is not imported
  (_mode_class: the wrapper's import cost 1-3 s of the counted step here).

Each FLOP is tallied by phase and dtype: "forward" (outside the autograd
engine), "backward" (inside it, grad mode off) and "recompute" (inside it, grad
mode on: activation checkpointing's recomputed forwards, reentrant or not).
Model FLOPs = forward + backward; hardware FLOPs add the recomputation. (A
double backward, create_graph=True, would land in "recompute" too.) Ops that
have no formula and look like compute (a matmul, attention or convolution by
name: custom kernels such as the flash-attn package's) are listed, uncounted.
Kernels launched outside the dispatcher (Transformer Engine's GEMMs, raw
Triton launches) are invisible here; the analysis reports their device-time
share where kernels are recorded.

Never the job's failure: a formula that raises stops the tally (the figure is
then absent and meta.json says why), never the op. DIAGNOSE_FLOPS=0 turns it off.
The result goes into meta.json `flops` (docs/run-directory.md).
"""

import os
import re
import sys
from collections import defaultdict

from collectors.clock import now_ns
from collectors.profiler_window import ENV as PROFILER_ENV
from collectors.profiler_window import parse_window

ENV = "DIAGNOSE_FLOPS"
META_KEY = "flops"
COUNTED_STEP = 1
# an op without a formula that is compute by its name: counted as "uncounted"
COMPUTE_NAME = re.compile(r"mm(?:_|$)|matmul|gemm|linear|attention|attn|conv", re.IGNORECASE)
MAX_UNCOUNTED_OPS = 20  # distinct names kept in meta.json


def counted_step(environ=os.environ) -> int | None:
    """The step to count, None when counting is off."""
    if environ.get(ENV, "1").strip() == "0":
        return None
    step = COUNTED_STEP
    try:
        first, last = parse_window(environ.get(PROFILER_ENV) or "")
    except ValueError:  # no window (or one `diagnose run` already refused)
        return step
    return last + 1 if first <= step <= last else step


def _extra_formulas(torch, fc) -> dict:
    """Formulas torch's registry lacks (those it has are left as they are)."""
    aten = torch.ops.aten

    def sdpa(query, key, value, *args, out_shape=None, **kwargs):
        return fc.sdpa_flop_count(query, key, value)

    def sdpa_backward(grad_out, query, key, value, *args, out_shape=None, **kwargs):
        return fc.sdpa_backward_flop_count(grad_out, query, key, value)

    wanted = {
        "_scaled_dot_product_flash_attention_for_cpu": sdpa,
        "_scaled_dot_product_flash_attention_for_cpu_backward": sdpa_backward,
        "_scaled_dot_product_fused_attention_overrideable": sdpa,
        "_scaled_dot_product_fused_attention_overrideable_backward": sdpa_backward,
    }
    out = {}
    for name, formula in wanted.items():
        if hasattr(aten, name) and getattr(aten, name) not in fc.flop_registry:
            out[getattr(aten, name)] = formula
    return out


class _NoModules:
    """Stands in for FlopCounterMode's module tracker (module docstring: why)."""

    parents = frozenset({"Global"})

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


def make_counter():
    """A FlopCounterMode that tallies by phase and dtype on local shards."""
    import torch
    from torch.utils import flop_counter as fc
    from torch.utils._pytree import tree_flatten, tree_map

    def local(x):
        shard = getattr(x, "_local_tensor", None)  # a DTensor: this rank's shard
        return shard if isinstance(shard, torch.Tensor) else x

    class StepFlops(fc.FlopCounterMode):
        def __init__(self):
            super().__init__(display=False, custom_mapping=_extra_formulas(torch, fc))
            self.mod_tracker = _NoModules()
            self.by_phase: dict = defaultdict(int)
            self.by_dtype: dict = defaultdict(int)
            self.uncounted: dict = defaultdict(int)
            self.device = None
            self.failure = None
            self.estimated = 0  # DTensor ops counted from the global figure

        def __enter__(self):
            self.flop_counts.clear()
            self.mode = _mode_class(torch, fc)(self)
            self.mode.__enter__()
            return self

        def _count_flops(self, func_packet, out, args, kwargs):
            if self.failure is None:
                try:
                    self._tally(func_packet, out, args, kwargs)
                except Exception as exc:  # no figure, never a failed op
                    self.failure = f"{func_packet}: {type(exc).__name__}: {exc}"[:300]
            return out

        def _tally(self, func_packet, out, args, kwargs):
            formula = self.flop_registry.get(func_packet)
            if formula is None:
                name = str(func_packet)
                if COMPUTE_NAME.search(name.rsplit(".", 1)[-1]) and (
                    name in self.uncounted or len(self.uncounted) < MAX_UNCOUNTED_OPS
                ):
                    self.uncounted[name] += 1
                return
            shards = tree_map(local, (args, kwargs, out))
            try:
                flops = int(formula(*shards[0], **shards[1], out_val=shards[2]))
            except Exception:
                # shards a formula cannot pair (DTensor redistributes them before the
                # local op): the global figure over the mesh, as if all were sharded
                mesh = next((t.device_mesh for t in tree_flatten(args)[0] if hasattr(t, "_local_tensor")), None)
                if mesh is None:
                    raise
                flops = int(formula(*args, **kwargs, out_val=out)) // max(mesh.size(), 1)
                self.estimated += 1
            args = shards[0]
            first = next((t for t in tree_flatten(args)[0] if isinstance(t, torch.Tensor)), None)
            dtype = str(first.dtype).removeprefix("torch.") if first is not None else "unknown"
            if self.device is None and first is not None:
                self.device = first.device
            in_backward = torch._C._current_graph_task_id() != -1
            phase = "forward" if not in_backward else "recompute" if torch.is_grad_enabled() else "backward"
            self.by_phase[phase] += flops
            self.by_dtype[dtype] += flops

    return StepFlops()


_MODE_CLASS: list = []


def _mode_class(torch, fc):
    """torch's _FlopCounterMode with its handler unwrapped while torch._dynamo is
    not imported. torch wraps every dispatch mode's handler so that dynamo never
    compiles it, and that wrapper imports torch._dynamo at its first call: 1-3 s
    of a counted step here, in a job that never compiles. Nothing can compile
    before torch._dynamo is imported, and the moment it is (now, or during the
    count) the handler is wrapped as torch wraps it."""
    if _MODE_CLASS:
        return _MODE_CLASS[0]
    from collectors.after_import import after_import

    parent = fc._FlopCounterMode
    raw = getattr(parent.__dict__["__torch_dispatch__"], "__wrapped__", parent.__dict__["__torch_dispatch__"])

    class LeanMode(parent):
        @classmethod
        def _should_skip_dynamo(cls):
            return False  # (wrapped below, once torch._dynamo is imported)

        @classmethod
        def ignore_compile_internals(cls):
            # a mode that does not say so makes torch.compile skip every frame while it
            # is on: compiled code runs eagerly, and fullgraph=True raises in the job
            return True

    LeanMode.__torch_dispatch__ = raw

    def wrap():
        LeanMode.__torch_dispatch__ = torch._disable_dynamo(raw, recursive=True)

    after_import("torch._dynamo", wrap)
    _MODE_CLASS.append(LeanMode)
    return LeanMode


def describe(counter, step: int, elapsed_ns: int) -> dict:
    """meta.json's `flops` for a finished count (docs/run-directory.md)."""
    import torch

    if counter.failure is not None:
        return {"step": step, "error": counter.failure, "count_ms": round(elapsed_ns / 1e6, 1)}
    phases = {p: int(counter.by_phase.get(p, 0)) for p in ("forward", "backward", "recompute")}
    out = {
        "step": step,
        "model_flops": phases["forward"] + phases["backward"],
        "hardware_flops": sum(phases.values()),
        "by_phase": phases,
        "by_dtype": dict(counter.by_dtype),
        "uncounted_ops": dict(counter.uncounted),
        "count_ms": round(elapsed_ns / 1e6, 1),
        "device": "cpu",
    }
    if counter.estimated:
        out["dtensor_ops_estimated"] = counter.estimated
    dynamo = sys.modules.get("torch._dynamo.utils")
    if dynamo is not None and dynamo.counters["stats"].get("unique_graphs"):
        out["compiled_graphs"] = int(dynamo.counters["stats"]["unique_graphs"])
    device = counter.device
    if device is not None and device.type != "cpu":
        out["device"] = device.type
        try:
            out["device_name"] = torch.cuda.get_device_name(device) if device.type == "cuda" else None
            # fp32 matmuls on tensor cores (TF32): its peak, not the FP32 one
            out["fp32_matmul"] = "tf32" if torch.get_float32_matmul_precision() != "highest" else "fp32"
        except Exception as exc:
            out["device_error"] = f"{type(exc).__name__}: {exc}"[:200]
    return out


class StepCount:
    """One count on the thread that calls begin() and end(): between the two,
    every op of this thread (and of the autograd engine's threads for its
    backward) goes through the counting mode."""

    def __init__(self, step: int):
        self.step = step
        self.counter = None
        self.t0_ns = 0

    def begin(self) -> None:
        self.t0_ns = now_ns()
        counter = make_counter()
        counter.__enter__()
        self.counter = counter  # (only once its mode is on: end() pops it)

    def on_top(self) -> bool:
        """Our mode is the innermost dispatch mode (a mode the job entered after
        ours and has not left yet must not be popped in its place)."""
        from torch.utils._python_dispatch import _get_current_dispatch_mode

        return self.counter is not None and _get_current_dispatch_mode() is self.counter.mode

    def end(self) -> dict:
        counter, self.counter = self.counter, None
        counter.__exit__(None, None, None)
        return describe(counter, self.step, now_ns() - self.t0_ns)

    def leave_in_child(self) -> None:
        """After a fork during the count (a DataLoader's workers, started in the
        counted step): the child's thread has our mode on its stack, which would
        slow every op of the worker for its whole life; it leaves it."""
        try:
            if self.on_top():
                counter, self.counter = self.counter, None
                counter.__exit__(None, None, None)
        except Exception:  # (a worker never fails for us)
            pass


def install(rec):
    """Returns the hook handles (a test removes them; the job never does)."""
    step = counted_step()
    if step is None:
        rec.meta[META_KEY] = {"off": f"{ENV}=0"}
        return
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    st = rec.state
    count = StepCount(step)
    done, late = [], []
    handles: dict = {}

    def post(optimizer, args, kwargs):
        # (after steps.py's post-hook, installed first: st.step is the step starting now)
        if done:
            if "pre" in handles:  # removed here: pre-hooks are not being iterated now
                handles.pop("pre").remove()
            return
        try:
            if count.counter is None and st.step == step:
                count.begin()
        except Exception as exc:
            done.append(True)
            rec.meta[META_KEY] = {"step": step, "error": f"{type(exc).__name__}: {exc}"[:300]}
            rec.record_error("flop_count", exc)

    def pre(optimizer, args, kwargs):
        if count.counter is None or done:
            return
        try:
            if not count.on_top():  # the job's own mode is still open: end at a later pre-hook
                late.append(True)
                return
            t0 = count.t0_ns
            result = count.end()
            if late:  # the tally ran past the step: no figure
                result = {
                    "step": step,
                    "count_ms": result["count_ms"],
                    "error": "the job's own dispatch mode was open at the step's end",
                }
            done.append(True)
            rec.meta[META_KEY] = result
            rec.add(
                (
                    "mark",
                    "flop_count",
                    t0,
                    now_ns(),
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
                    _summary(result),
                    -1,
                )
            )
            rec.write_meta()  # in the counted step, already excluded from the step statistics
        except Exception as exc:
            done.append(True)
            rec.meta[META_KEY] = {"step": step, "error": f"{type(exc).__name__}: {exc}"[:300]}
            rec.record_error("flop_count", exc)

    def at_close():
        if not done:
            why = (
                f"the job ended inside step {step}, the step counted"
                if count.counter is not None
                else f"no step {step} began (the job's optimizer stepped fewer times, or its steps were not recorded)"
            )
            rec.meta.setdefault(META_KEY, {"step": step, "error": why})

    handles["post"] = register_optimizer_step_post_hook(post)
    handles["pre"] = register_optimizer_step_pre_hook(pre)
    os.register_at_fork(after_in_child=lambda: count.counter is not None and count.leave_in_child())
    rec.close_hooks.append(at_close)
    return handles


def _summary(result: dict) -> str:
    if "error" in result:
        return f"FLOP count failed: {result['error']}"
    return (
        f"step {result['step']}: {result['model_flops'] / 1e9:.3f} GFLOP model, "
        f"{result['hardware_flops'] / 1e9:.3f} GFLOP hardware"
    )
