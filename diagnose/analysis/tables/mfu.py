"""Model FLOPs utilisation per rank (issue 48; docs/analysis.md#mfu).

    achieved TFLOP/s = FLOPs of one step / the rank's median steady step
    MFU = achieved (model FLOPs) / the GPU's dense peak for the step's precision
    HFU = the same with hardware FLOPs (activation recomputation included)

Each rank counted one step's FLOPs itself (collectors/instrument/flop_count.py,
meta.json `flops`): its own share under tensor and pipeline parallelism, so
the figures are per rank and the job's MFU is their mean. The count is of one
step and the time is the median steady step: a job whose steps differ in work
(variable-length batches) gets the counted step's work at the median step's
time. The counted step ran several times slower and is left out of the steady
steps (without_counted_step).

The peak: `--peak-tflops` (DIAGNOSE_PEAK_TFLOPS) when given, else the table in
gpu_peaks.py for the GPU's name and the precision most of the FLOPs ran in. A
CPU run has no peak: achieved TFLOP/s only, no percentage unless one is given.

What the count cannot see: ops with no FLOP formula that are compute by name
(flash-attn's custom ops, grouped GEMMs) are listed; kernels launched outside
torch's dispatcher (Transformer Engine, raw Triton) are invisible to it, so
where kernels are recorded (an imported trace, `--torch-profiler`) the share
of compute-kernel time in such kernels (UNCOUNTED_KERNELS, by name) is given:
MFU leaves their work out. An imported trace has no model to count: it says
so instead of a number.
"""

import re

from collectors.instrument.flop_count import ENV as FLOPS_ENV
from collectors.instrument.flop_count import META_KEY
from diagnose.analysis.tables import gpu_peaks

# compute kernels no torch FLOP formula sees, by name: the flash-attn package's
# (torch's own flash attention is pytorch_flash::, counted: TORCH_OWN), FlashInfer's
# and TensorRT-LLM's attention and MoE kernels, Transformer Engine's, grouped GEMMs.
# A GEMM Transformer Engine runs through cuBLAS has cuBLAS's name: not told apart.
UNCOUNTED_KERNELS = re.compile(
    r"flash_(?:fwd|bwd)|flash::|flashinfer|fmhaSm|tensorrt_llm|moe::|fused_moe|transformer_engine|nvte|"
    r"grouped_?gemm|grouped_?mm|bmm_\w*MxE",
    re.IGNORECASE,
)
TORCH_OWN = re.compile(r"pytorch_flash|pytorch_fmha")


def counted_steps(rank_meta: dict) -> set:
    """The steps a rank counted FLOPs in (count_ms: the count ran, slowing it)."""
    out = set()
    for meta in rank_meta.values():
        count = meta.get(META_KEY) if isinstance(meta, dict) else None
        if isinstance(count, dict) and "count_ms" in count and isinstance(count.get("step"), int):
            out.add(count["step"])
    return out


def without_counted_step(steady: list, rank_meta: dict) -> list:
    """The steady steps less the counted one, unless that leaves none."""
    counted = counted_steps(rank_meta)
    rest = [s for s in steady if s not in counted]
    return rest or steady


def summarize(run, peak_tflops: float | None = None) -> dict:
    """{"ranks": {rank: figures}, "mfu", "hfu", "achieved_tflops_per_rank",
    "peak_tflops", "peak_source", "why" (no figure), "uncounted_ops",
    "uncounted_kernel_share", "lines"}: what the CLI, the report and MLflow show.
    Never raises: what cannot be read is a "why" (meta.json is data a rank wrote)."""
    try:
        out = _summarize(run, peak_tflops or gpu_peaks.peak_override())
    except Exception as exc:
        out = {"ranks": {}, "why": f"the FLOP counts could not be read ({type(exc).__name__}: {exc})"}
    out["lines"] = lines(out)
    return out


def _summarize(run, peak_tflops: float | None) -> dict:
    out = {"ranks": {}, "uncounted_kernel_share": uncounted_kernel_share(run)}
    counts = {r: (m or {}).get(META_KEY) for r, m in run.rank_meta.items()}
    measured = {
        r: c
        for r, c in counts.items()
        if isinstance(c, dict) and isinstance(c.get("model_flops"), int) and isinstance(c.get("step"), int)
    }
    if any((m or {}).get("imported") for m in run.rank_meta.values()):
        out["why"] = "an imported trace has no model to count FLOPs on (a `diagnose run` of the job counts them)"
    elif not measured:
        out["why"] = _why_none(counts)
    else:
        step_ms = _median_step_ms(run)
        for rank, count in sorted(measured.items()):
            if step_ms.get(rank):
                out["ranks"][rank] = rank_figures(count, step_ms[rank], peak_tflops, _env_gpu(run.rank_meta.get(rank)))
        if not out["ranks"]:
            out["why"] = "no steady step to time the counted FLOPs against"
    figures = list(out["ranks"].values())
    if figures:
        out["achieved_tflops_per_rank"] = _mean(f["achieved_tflops"] for f in figures)
        out["hardware_tflops_per_rank"] = _mean(f["hardware_tflops"] for f in figures)
        with_peak = [f for f in figures if f["mfu"] is not None]
        out["mfu"] = _mean(f["mfu"] for f in with_peak) if with_peak else None
        out["hfu"] = _mean(f["hfu"] for f in with_peak) if with_peak else None
        out["peak_tflops"] = with_peak[0]["peak_tflops"] if with_peak else None
        out["peak_source"] = (with_peak or figures)[0]["peak_source"]
        out["counted_step"] = min(c["step"] for c in measured.values())
        ops: dict = {}
        for count in measured.values():
            for name, calls in (count.get("uncounted_ops") or {}).items():
                ops[name] = ops.get(name, 0) + calls
        out["uncounted_ops"] = ops
        out["compiled"] = any(c.get("compiled_graphs") for c in measured.values())
        missing = sorted(set(run.rank_meta) - set(out["ranks"]))
        if missing:
            out["ranks_without_figure"] = missing
    return out


def rank_figures(count: dict, step_ms: float, peak_tflops: float | None = None, env_gpu: str | None = None) -> dict:
    """One rank's figures from its meta.json `flops` and its median steady step."""
    seconds = step_ms / 1e3
    achieved = count["model_flops"] / seconds / 1e12
    hardware = count.get("hardware_flops", count["model_flops"]) / seconds / 1e12
    peak, source = peak_for(count, peak_tflops, env_gpu)
    return {
        "model_flops_per_step": int(count["model_flops"]),
        "hardware_flops_per_step": int(count.get("hardware_flops", count["model_flops"])),
        "step_ms": float(step_ms),
        "achieved_tflops": achieved,
        "hardware_tflops": hardware,
        "peak_tflops": peak,
        "peak_source": source,
        "mfu": achieved / peak if peak else None,
        "hfu": hardware / peak if peak else None,
    }


def peak_for(count: dict, given: float | None, env_gpu: str | None = None) -> tuple[float | None, str]:
    """(peak TFLOP/s or None, where it comes from or why there is none)."""
    if given:
        return float(given), "given by --peak-tflops"
    if count.get("device", "cpu") == "cpu":
        return None, "a CPU run has no peak; --peak-tflops gives one"
    name = count.get("device_name") or env_gpu
    found = gpu_peaks.lookup(name)
    if found is None:
        return None, f"no peak known for {name or 'this device'!r}; --peak-tflops gives one"
    model, peaks = found
    by_dtype = count.get("by_dtype") or {}
    dtype = max(by_dtype, key=by_dtype.get) if by_dtype else "float32"
    precision = gpu_peaks.precision_of(dtype, count.get("fp32_matmul"))
    if precision not in peaks:
        return None, f"{model} has no {dtype} peak in the table; --peak-tflops gives one"
    return peaks[precision], f"{model}, {precision.upper()} dense"


def uncounted_kernel_share(run) -> float | None:
    """Of the compute-kernel time recorded, the share in UNCOUNTED_KERNELS; None without kernels."""
    kernels = run.kernels()
    if kernels.empty:
        return None
    compute = kernels[kernels["kind"].astype(str) == "compute"]
    total = float(compute["dur_ms"].sum())
    if not total > 0:
        return None
    names = compute["name"].astype(str)
    hit = names.str.contains(UNCOUNTED_KERNELS) & ~names.str.contains(TORCH_OWN)
    return float(compute.loc[hit, "dur_ms"].sum()) / total


def lines(summary: dict) -> list[str]:
    """The summary in words, first line first (the CLI prints them, the report shows them)."""
    out = []
    if summary.get("why"):
        out.append(f"MFU: not measured: {summary['why']}")
    elif summary.get("mfu") is not None:
        ranks = [f["mfu"] for f in summary["ranks"].values() if f["mfu"] is not None]
        spread = f", ranks {min(ranks):.1%}-{max(ranks):.1%}" if max(ranks) - min(ranks) >= 0.005 else ""
        line = (
            f"MFU {summary['mfu']:.1%} per rank{spread}: {summary['achieved_tflops_per_rank']:.4g} TFLOP/s "
            f"of model FLOPs against a peak of {summary['peak_tflops']:g} TFLOP/s ({summary['peak_source']}); "
            f"step {summary['counted_step']} counted"
        )
        if abs(summary["hfu"] - summary["mfu"]) >= 0.0005:
            line += f"; with activation recomputation (hardware FLOPs) {summary['hfu']:.1%}"
        out.append(line)
    else:
        figures = list(summary["ranks"].values())
        flops = _mean(f["model_flops_per_step"] for f in figures)
        out.append(
            f"MFU: no percentage ({summary['peak_source']}): {summary['achieved_tflops_per_rank']:.4g} "
            f"TFLOP/s of model FLOPs per rank, {flops / 1e9:.4g} GFLOP per step "
            f"(step {summary['counted_step']} counted)"
        )
    if summary.get("ranks_without_figure"):
        out.append(
            "No MFU figure for rank(s) "
            + ",".join(map(str, summary["ranks_without_figure"][:16]))
            + " (no count in their meta.json, or no steady step)"
        )
    if summary.get("compiled"):
        out.append(
            "The job runs torch.compile'd code: its matmuls and attention are counted where they run "
            "as aten ops (extern kernels), not in kernels Inductor generates (max-autotune templates)"
        )
    if summary.get("uncounted_ops"):
        names = ", ".join(sorted(summary["uncounted_ops"])[:5])
        out.append(f"MFU leaves out ops without a FLOP formula: {names}")
    share = summary.get("uncounted_kernel_share")
    if share:
        out.append(
            f"{share:.1%} of compute-kernel time is in kernels torch's FLOP formulas do not cover "
            "(flash-attn, FlashInfer, TensorRT-LLM, Transformer Engine, grouped GEMM): their FLOPs "
            "are not in MFU"
        )
    return out


def metrics(summary: dict) -> dict:
    """MLflow metrics (mfu/*); none when nothing was measured."""
    out = {}
    for key, name in (
        ("mfu", "mfu/mfu"),
        ("hfu", "mfu/hfu"),
        ("achieved_tflops_per_rank", "mfu/achieved_tflops_per_rank"),
        ("peak_tflops", "mfu/peak_tflops"),
        ("uncounted_kernel_share", "mfu/uncounted_kernel_share"),
    ):
        if isinstance(summary.get(key), (int, float)):
            out[name] = float(summary[key])
    if summary.get("ranks"):
        out["mfu/model_gflop_per_step"] = sum(f["model_flops_per_step"] for f in summary["ranks"].values()) / 1e9
    return out


def _why_none(counts: dict) -> str:
    for rank, count in sorted(counts.items()):
        if isinstance(count, dict) and count.get("off"):
            return f"FLOP counting was off ({FLOPS_ENV}=0)"
        if isinstance(count, dict) and count.get("error"):
            return f"rank {rank}: {count['error']}"
    return "no rank counted FLOPs (recorded before FLOP counting, or the flop_count instrumentor was disabled)"


def _median_step_ms(run) -> dict:
    breakdown = run.breakdown()
    steady = run.steady_steps()
    if breakdown.empty or not steady:
        return {}
    rows = breakdown[breakdown["step"].isin(steady)]
    return {int(r): float(ms) for r, ms in rows.groupby("rank")["step_ms"].median().items() if ms > 0}


def _env_gpu(meta: dict | None) -> str | None:
    gpu = ((meta or {}).get("env") or {}).get("gpu") or {}
    return gpu.get("model") if isinstance(gpu, dict) else None


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values)
