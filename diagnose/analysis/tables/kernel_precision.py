"""The math and number format of a GPU kernel, from its name: one table for the
kernel names of cuBLAS, cuDNN, CUTLASS, cuBLASLt's xmma and PyTorch's own
kernels, as they appear in Kineto and Nsight traces (tests/analysis/test_fp32_math.py
checks it on the real traces in tests/data/kineto).

    math       "gemm" (matrix multiply), "conv" (convolution), or None
    precision  "fp32" (SIMT single precision), "tf32" (fp32 data on tensor cores),
               "fp16", "bf16", "fp8", "int8", or None when the name does not say

Names carry precision in vendor spellings: `sgemm`/`scudnn` (s: single),
`hgemm`/`h884gemm`/`h1688gemm`/`hcudnn` (h: half), cutlass `s1688gemm` (TF32
tensor ops, fp32 accumulate on Ampere), `s16816gemm_bf16`/`..._f16` (16-bit
inputs), xmma `tf32f32`/`bf16f32`/`f16f32`, and template arguments
(`c10::Half`, `c10::BFloat16`, `__nv_bfloat16`). The first rule that matches
wins; order matters (a `bf16` in a name beats the `s` of `s16816gemm`).
"""

import re

import pandas as pd

# (pattern, math) in order: what a kernel computes
MATH_RULES = (
    (re.compile(r"conv|fprop|dgrad|wgrad|scudnn|hcudnn|implicit_gemm|winograd|fft2d_[rc]2[rc]", re.I), "conv"),
    # (fbgemm_gpu, Meta's embedding/quantization library, names kernels that multiply nothing)
    (re.compile(r"(?<!fb)gemm|gemv|matmul|cublas|cutlass.*tensorop|xmma|^nvjet_", re.I), "gemm"),
)
# (pattern, precision) in order: its number format. cuBLAS's nvjet kernels
# (Hopper, Blackwell) name their types by letters after "nvjet_": `t` is bf16
# (nvjet_tst_* beside bf16 aten::linear in TraceLens' B200 trace), `h` half as in
# hgemm; other letters are left unknown until a trace shows them.
PRECISION_RULES = (
    (re.compile(r"^nvjet_t"), "bf16"),
    (re.compile(r"^nvjet_h"), "fp16"),
    (re.compile(r"bf16|bfloat16|BFloat16|__nv_bfloat16"), "bf16"),
    (re.compile(r"e4m3|e5m2|fp8|float8", re.I), "fp8"),
    (re.compile(r"(^|[^a-z])(h\d{3,5}gemm|hgemm|hcudnn)|f16f16|f16f32|_f16|fp16|c10::Half|__half|\bhalf\b"), "fp16"),
    (re.compile(r"i8i8|int8|imma|_i8"), "int8"),
    (re.compile(r"tf32|s1688gemm|s16816gemm", re.I), "tf32"),
    (re.compile(r"sgemm|sgemv|scudnn|gcgemm|(^|[^a-z])s\d{3,5}gemm|<float|\bfloat\b"), "fp32"),
)
REDUCED = ("fp16", "bf16", "fp8")


def classify(name: str) -> tuple:
    """(math, precision) of one kernel name."""
    math = next((m for pattern, m in MATH_RULES if pattern.search(name)), None)
    precision = next((p for pattern, p in PRECISION_RULES if pattern.search(name)), None)
    return math, precision


def classify_names(names: pd.Series) -> pd.DataFrame:
    """classify() over a (categorical) column of names, once per distinct name:
    columns math and precision, aligned with `names`."""
    codes, uniques = pd.factorize(names.astype(str))
    table = [classify(n) for n in uniques]
    math = pd.Series([t[0] for t in table], dtype=object)
    precision = pd.Series([t[1] for t in table], dtype=object)
    return pd.DataFrame(
        {"math": math.reindex(codes).to_numpy(), "precision": precision.reindex(codes).to_numpy()}, index=names.index
    )
