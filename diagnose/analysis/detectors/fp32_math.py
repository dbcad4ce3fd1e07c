"""fp32_math: matrix math in fp32 in a run that uses 16-bit formats elsewhere.

Signal (device traces: kernels recorded; judged on the steady steps they cover):
the GEMM and convolution kernels, classified by name
(diagnose/analysis/tables/kernel_precision.py): their time per step by precision. A
run whose GEMM/conv time is mostly fp32 or TF32 (>= FP32_SHARE) while other
kernels work in fp16/bf16/fp8 (embeddings, activations, a half of the model:
autocast or 16-bit parameters are in use) runs its heaviest math at a fraction
of the tensor cores' 16-bit rate: a layer left out of autocast, a matmul on fp32
weights, an fp32 loss head, or a model that was meant to be bf16 and is not.
A job that is fp32 throughout is not flagged: that is its choice, not a slip.

Threshold: fp32/TF32 GEMM/conv time >= MIN_STEP_FRAC of the step (median rank).
Impact: half that time (bf16 tensor cores run dense math at twice TF32's peak on
A100 and H100, 8-16x SIMT fp32's: half is the conservative end). Evidence: the
share of GEMM/conv time per precision, the heaviest fp32 kernels, the 16-bit
kernels that show mixed precision is in use.
"""

from diagnose.analysis.detectors.finding_record import Finding
from diagnose.analysis.tables.kernel_precision import REDUCED, classify_names

FP32_SHARE = 0.5
MIN_STEP_FRAC = 0.01
SPEEDUP = 2.0
TOP_KERNELS = 3


def detect(ctx):
    steps = ctx.kernel_covered
    if not steps:
        return []
    kernels = ctx.run.kernels()
    kernels = kernels[kernels["step"].isin(steps)]
    if kernels.empty:
        return []
    kernels = kernels.join(classify_names(kernels["name"]))
    reduced = kernels[kernels["precision"].isin(REDUCED)]
    math = kernels[kernels["math"].notna()]
    if reduced.empty or math.empty:
        return []
    wide = math["precision"].isin(("fp32", "tf32"))
    by_precision = math.groupby(math["precision"].fillna("unknown"))["dur_ms"].sum()
    share = float(math.loc[wide, "dur_ms"].sum() / math["dur_ms"].sum())
    if share < FP32_SHARE:
        return []
    n_steps = len(steps)
    per_rank_ms = math[wide].groupby("rank")["dur_ms"].sum() / n_steps
    fp32_ms = float(per_rank_ms.median())
    if not ctx.step_ms or fp32_ms < MIN_STEP_FRAC * ctx.step_ms:
        return []
    top = math[wide].groupby("name", observed=True)["dur_ms"].sum().sort_values(ascending=False).head(TOP_KERNELS)
    top_text = "; ".join(
        f"{str(name)[:80]} ({ms / n_steps / max(len(per_rank_ms), 1):.1f} ms/step)" for name, ms in top.items()
    )
    reduced_kinds = sorted(set(reduced["precision"]))
    example = str(reduced.groupby("name", observed=True)["dur_ms"].sum().idxmax())[:80]
    total = float(by_precision.sum())
    return [
        Finding(
            kind="fp32_math",
            title=(
                f"{share:.0%} of the GEMM/convolution time runs in fp32/TF32 ({fp32_ms:.1f} ms/step) while "
                f"{'/'.join(reduced_kinds)} kernels run elsewhere: the heaviest math forgoes the tensor cores' "
                "16-bit rate (on the GPUs' clocks)"
            ),
            ranks=sorted(int(r) for r in per_rank_ms.index),
            impact_ms_per_step=fp32_ms * (1 - 1 / SPEEDUP),
            recommendation=(
                f"Run these matmuls in bf16: {top_text}. Put the layers that launch them under "
                '`torch.autocast("cuda", dtype=torch.bfloat16)` (or cast their weights), check '
                "for modules excluded from autocast or called outside it (a loss head, a custom "
                "layer), and keep fp32 only where accuracy needs it (e.g. a final softmax). "
                f"16-bit kernels seen: {example}."
            ),
            metrics={
                "fp32_gemm_share_frac": share,
                "fp32_gemm_ms_per_step": fp32_ms,
                **{f"gemm_{p}_share_frac": float(ms / total) for p, ms in by_precision.items()},
                "device_time": 1.0,
            },
        )
    ]
