"""Peak dense TFLOP/s of common NVIDIA GPUs, per math precision, for MFU
(diagnose/analysis/tables/mfu.py).

Dense, never the "with sparsity" figures: NVIDIA's datasheets print the tensor
core rates with 2:4 structured sparsity (marked *), twice the dense rate that
training runs at; every tensor core figure below is that printed figure / 2.
"fp32" is the CUDA-core rate (IEEE fp32 matmuls), "tf32" fp32 matmuls on tensor
cores (torch.set_float32_matmul_precision("high") or allow_tf32), "bf16" and
"fp16" with fp32 accumulation, "fp8" the Hopper/Ada/Blackwell FP8 rate. A
precision a GPU lacks is absent (no percentage is made up).

The model is told apart by its NVML name (torch.cuda.get_device_name gives the
same string): SXM, PCIe and NVL boards of one chip differ in clocks and power,
so in peak (H100 SXM 989.4 BF16, PCIe 756, NVL 835.5). Patterns are tried in
order, the most specific first; an unknown name has no peak (`--peak-tflops`
or DIAGNOSE_PEAK_TFLOPS gives one).

Sources (NVIDIA datasheets; figures per GPU):
  A100: NVIDIA A100 Tensor Core GPU datasheet (nvidia-a100-datasheet-us-nvidia-
    1758950-r4-web.pdf): FP32 19.5, TF32 156 (312*), BF16/FP16 312 (624*); the
    40 GB, 80 GB, SXM4 and PCIe boards have the same rates.
  H100: NVIDIA H100 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h100):
    SXM FP32 67, TF32 989*, BF16/FP16 1,979*, FP8 3,958*; PCIe FP32 51, TF32 756*,
    BF16/FP16 1,513*, FP8 3,026*; NVL FP32 60, TF32 835*, BF16/FP16 1,671*,
    FP8 3,341*. The whitepaper's dense SXM rates: 494.7, 989.4, 1,978.9.
  H200: NVIDIA H200 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h200):
    SXM as H100 SXM; NVL as H100 NVL. GH200: NVIDIA GH200 datasheet, its GPU as
    H100 SXM.
  B200: NVIDIA HGX B200 (nvidia.com/en-us/data-center/hgx), 8 GPUs: FP32 600 TF,
    TF32 18 PF*, BF16/FP16 36 PF*, FP8 72 PF*, so per GPU FP32 75, TF32 1,125,
    BF16/FP16 2,250, FP8 4,500 dense.
  L40S: NVIDIA L40S datasheet: FP32 91.6, TF32 366*, BF16/FP16 733*, FP8 1,466*.
  L40: NVIDIA L40 datasheet: FP32 90.5, TF32 181*, BF16/FP16 362.1*, FP8 724*.
  L4: NVIDIA L4 datasheet: FP32 30.3, TF32 120*, BF16/FP16 242*, FP8 485*.
  A10: NVIDIA A10 datasheet: FP32 31.2, TF32 125*, BF16/FP16 250*.
  V100: NVIDIA V100 datasheet: SXM2 FP32 15.7, tensor (FP16) 125; PCIe 14, 112;
    V100S PCIe 16.4, 130 (no sparsity, no BF16 or TF32 tensor cores).
"""

import os
import re

PEAK_ENV = "DIAGNOSE_PEAK_TFLOPS"


def _hopper(fp32, tf32, bf16, fp8):
    return {"fp32": fp32, "tf32": tf32, "bf16": bf16, "fp16": bf16, "fp8": fp8}


H100_SXM = _hopper(66.9, 494.7, 989.4, 1978.9)
H100_PCIE = _hopper(51.0, 378.0, 756.5, 1513.0)
H100_NVL = _hopper(60.0, 417.5, 835.5, 1670.5)
A100 = {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0}

# (pattern on the NVML name, the model as said in the report, dense TFLOP/s per precision)
PEAKS = (
    (r"GH200", "GH200 (H100 SXM class)", H100_SXM),
    (r"H200.*NVL", "H200 NVL", H100_NVL),
    (r"H200", "H200 SXM", H100_SXM),
    (r"H100.*NVL", "H100 NVL", H100_NVL),
    (r"H100.*PCIe", "H100 PCIe", H100_PCIE),
    (r"H100", "H100 SXM", H100_SXM),
    (r"B200", "B200 (HGX)", _hopper(75.0, 1125.0, 2250.0, 4500.0)),
    (r"A100", "A100", A100),
    (r"L40S", "L40S", _hopper(91.6, 183.0, 366.5, 733.0)),
    (r"L40\b", "L40", _hopper(90.5, 90.5, 181.05, 362.0)),
    (r"\bL4\b", "L4", _hopper(30.3, 60.0, 121.0, 242.5)),
    (r"\bA10\b(?!G)", "A10", {"fp32": 31.2, "tf32": 62.5, "bf16": 125.0, "fp16": 125.0}),
    (r"V100S", "V100S PCIe", {"fp32": 16.4, "fp16": 130.0}),
    (r"V100.*PCIE", "V100 PCIe", {"fp32": 14.0, "fp16": 112.0}),
    (r"V100", "V100 SXM2", {"fp32": 15.7, "fp16": 125.0}),
)

# torch dtype name (flops.by_dtype) -> the precision whose peak applies
PRECISIONS = {
    "bfloat16": "bf16",
    "float16": "fp16",
    "float32": "fp32",
    "float8_e4m3fn": "fp8",
    "float8_e5m2": "fp8",
    "float8_e4m3fnuz": "fp8",
    "float8_e5m2fnuz": "fp8",
}


def precision_of(dtype: str, fp32_matmul: str | None = None) -> str | None:
    """The peak's precision for FLOPs of `dtype`; fp32 on tensor cores is tf32."""
    precision = PRECISIONS.get(dtype)
    return "tf32" if precision == "fp32" and fp32_matmul == "tf32" else precision


def lookup(device_name: str | None) -> tuple[str, dict] | None:
    """(model, {precision: dense TFLOP/s}) for an NVML device name, or None."""
    for pattern, model, peaks in PEAKS:
        if device_name and re.search(pattern, device_name, re.IGNORECASE):
            return model, peaks
    return None


def peak_override(environ=os.environ) -> float | None:
    """The peak the user gave (`--peak-tflops`, DIAGNOSE_PEAK_TFLOPS), or None."""
    text = environ.get(PEAK_ENV, "").strip()
    try:
        value = float(text) if text else None
    except ValueError:
        return None
    return value if value is not None and 0 < value < float("inf") else None
