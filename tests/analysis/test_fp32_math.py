"""Issue 27: fp32 matrix math in a run that uses 16-bit formats elsewhere
(detectors/fp32_math.py), from real GPU kernel traces in tests/data/kineto
(HTA's test data, MIT): the kernel-name table on names taken from those traces,
the finding on a TorchRec-style job whose embeddings run in fp16 while its dense
GEMMs run TF32/fp32 (trace_filter), none on a job that is fp32 throughout
(ns_resolution_trace), and none once the same job's GEMMs are renamed to bf16
kernels (a copy of trace_filter built here by renaming kernel names only)."""

import gzip
import json

import pytest

from diagnose.analysis.tables.kernel_precision import classify
from tests.support.jobs import DATA, imported_findings

TRACE_FILTER = [DATA / "kineto" / "hta" / "trace_filter" / f"sampled_rank-{r}.json.gz" for r in (0, 1)]
FP32_ONLY = DATA / "kineto" / "hta" / "ns_resolution_trace" / "rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"


@pytest.mark.parametrize(
    "name, expected",
    [
        # names as they appear in the traces under tests/data/kineto/hta
        ("ampere_sgemm_32x32_sliced1x4_tn", ("gemm", "fp32")),
        ("volta_sgemm_128x32_nt", ("gemm", "fp32")),
        ("cudnn_ampere_scudnn_128x64_relu_xregs_large_nn_v1", ("conv", "fp32")),
        (
            "sm80_xmma_fprop_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x128x16",
            ("conv", "tf32"),
        ),
        (
            "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_256x64_16x4_nn_align4>(cutlass_80_tensorop_s1688gemm_"
            "256x64_16x4_nn_align4::Params)",
            ("gemm", "tf32"),
        ),
        (
            "void cudnn::detail::dgrad_engine<float, 512, 6, 5, 3, 3, 3, false>(int, int, int, float const*)",
            ("conv", "fp32"),
        ),
        (
            "void split_embedding_codegen_forward_unweighted_kernel<c10::Half, c10::Half, float, false, long, 2ul, 32ul>"
            "(fbgemm_gpu::FixedDivisor)",
            (None, "fp16"),
        ),
        ("void cudnn::bn_bw_1C11_kernel_new<float, float, float2, 128, true, 1>(float, float, float)", (None, "fp32")),
        ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", (None, None)),
        ("Memcpy HtoD (Pinned -> Device)", (None, None)),
        # cuBLAS/cuBLASLt names of 16-bit GEMMs (vendor spellings)
        ("ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_tn", ("gemm", "bf16")),
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", ("gemm", "bf16")),
        ("ampere_fp16_s16816gemm_fp16_256x128_ldg8_f2f_stages_32x3_nn", ("gemm", "fp16")),
        ("volta_h884gemm_64x64_ldg8_nn", ("gemm", "fp16")),
        # cuBLAS's nvjet family, as in TraceLens' B200 trace (bf16 aten::linear launches them)
        ("nvjet_tst_64x64_64x16_2x1_2cta_v_bz_bias_TNT", ("gemm", "bf16")),
        ("nvjet_tst_144x128_64x6_2x1_v_bz_bias_TNN", ("gemm", "bf16")),
    ],
)
def test_kernel_names_say_their_math_and_precision(name, expected):
    assert classify(name) == expected


def test_fp32_gemms_beside_fp16_embeddings_are_found(tmp_path):
    found = [f for f in imported_findings(tmp_path / "torchrec", TRACE_FILTER) if f["kind"] == "fp32_math"]
    assert len(found) == 1, found
    m = found[0]["metrics"]
    assert found[0]["ranks"] == [0, 1] and m["fp32_gemm_share_frac"] == 1.0
    assert 0.75 < m["gemm_tf32_share_frac"] < 0.85 and m["device_time"] == 1.0  # cutlass s1688 (TF32) most
    assert 30 < m["fp32_gemm_ms_per_step"] < 40 and found[0]["impact_ms_per_step"] == pytest.approx(
        m["fp32_gemm_ms_per_step"] / 2, rel=1e-3
    )
    assert "s1688gemm" in found[0]["recommendation"] and "autocast" in found[0]["recommendation"]


def test_a_job_in_fp32_throughout_is_not_flagged(tmp_path):
    assert not any(f["kind"] == "fp32_math" for f in imported_findings(tmp_path / "fp32", [FP32_ONLY]))


def test_the_same_job_with_bf16_gemms_is_not_flagged(tmp_path):
    renamed = []
    for i, path in enumerate(TRACE_FILTER):
        trace = json.load(gzip.open(path))
        for event in trace["traceEvents"]:
            name = event.get("name", "")
            if event.get("cat") == "kernel" and ("s1688gemm" in name or "sgemm" in name):
                event["name"] = "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_tn"
        copy = tmp_path / f"rank-{i}.json.gz"
        with gzip.open(copy, "wt") as f:
            json.dump(trace, f)
        renamed.append(copy)
    assert not any(f["kind"] == "fp32_math" for f in imported_findings(tmp_path / "bf16", renamed))
