"""Issue 48, item 1: MFU per rank. Each rank counts one step's FLOPs zero-code
(collectors/instrument/flop_count.py, meta.json `flops`); the analysis divides
them by the median steady step and the GPU's dense peak (diagnose/analysis/tables/mfu.py).
In-process: counting the reference GPT against its analytic figure, activation
checkpointing, the hooks' step, a DTensor TP share (2 gloo ranks, spawned:
tests/support/mfu_tp_rank.py); the shared DDP run (no launch of its own) for the job,
the report and the MLflow metrics; real imported GPU traces say why no figure."""

import json
import socket

import pytest
import torch
import torch.multiprocessing as mp

from collectors.instrument import flop_count
from collectors.recorder import StepState
from diagnose.analysis.tables import gpu_peaks, mfu
from reference_trainer.config import TrainConfig
from reference_trainer.model import GPTStage
from tests.support import mfu_tp_rank
from tests.support.jobs import fixture_path, load_run
from tests.support.synthetic_run import write_synthetic_run


def _gpt(cfg: TrainConfig) -> GPTStage:
    return GPTStage(
        vocab=cfg.vocab,
        seq_len=cfg.seq_len,
        d_model=cfg.d_model,
        heads=cfg.heads,
        n_layers=cfg.layers,
        layer_lo=0,
        layer_hi=cfg.layers,
        first=True,
        last=True,
        seed=0,
        tp_rank=0,
        tp=1,
        tp_group=None,
    )


def _one_step(model, cfg: TrainConfig) -> None:
    gen = torch.Generator().manual_seed(0)
    for _ in range(cfg.microbatches):
        tokens = torch.randint(0, cfg.vocab, (cfg.micro_batch_size, cfg.seq_len), generator=gen)
        model(tokens, tokens).backward()


_counted = mfu_tp_rank.count_step


def analytic_flops(cfg: TrainConfig) -> float:
    """6·N·T + attention for one step of the reference GPT (PaLM's appendix B):
    N the matmul weights (qkv, proj, fc, proj per layer, and the head; the
    embeddings are lookups), T the step's tokens, and 12·L·s·d per token for
    attention's two matmuls forward and backward (non-causal, as torch counts)."""
    d, layers = cfg.d_model, cfg.layers
    n_matmul = layers * 12 * d * d + cfg.vocab * d
    tokens = cfg.microbatches * cfg.micro_batch_size * cfg.seq_len
    return 6 * n_matmul * tokens + 12 * layers * cfg.seq_len * d * tokens


def test_the_reference_gpt_counts_its_analytic_flops_and_its_mfu(tmp_path):
    cfg = TrainConfig()
    model = _gpt(cfg)
    count = _counted(lambda: _one_step(model, cfg))
    ratio = count["model_flops"] / analytic_flops(cfg)
    # torch prices attention's backward at 5 matmuls to the analytic 4: 1.022 here
    assert 1.0 <= ratio < 1.05, ratio
    tokens = cfg.microbatches * cfg.micro_batch_size * cfg.seq_len
    attention = 14 * cfg.layers * cfg.seq_len * cfg.d_model * tokens  # 0 without the CPU formulas
    assert (
        count["model_flops"] == analytic_flops(cfg) - 12 * cfg.layers * cfg.seq_len * cfg.d_model * tokens + attention
    )
    assert count["hardware_flops"] == count["model_flops"] and count["by_phase"]["recompute"] == 0
    assert count["by_dtype"] == {"float32": count["model_flops"]} and count["device"] == "cpu"
    assert count["uncounted_ops"] == {}
    # without the CPU attention formulas attention would count 0
    assert not set(flop_count._extra_formulas(torch, torch.utils.flop_counter)) & set(
        torch.utils.flop_counter.flop_registry
    )
    # MFU on a run whose ranks carry this count: achieved / the peak given
    out = write_synthetic_run(str(tmp_path / "run"), ranks=2, steps=8)
    for rank in (0, 1):
        path = tmp_path / "run" / "traces" / f"rank-0000{rank}" / "meta.json"
        meta = json.loads(path.read_text())
        path.write_text(json.dumps({**meta, "flops": count}))
    run = load_run(out)
    summary = mfu.summarize(run, peak_tflops=0.5)
    step_s = summary["ranks"][0]["step_ms"] / 1e3
    analytic_mfu = analytic_flops(cfg) / step_s / 0.5e12
    assert summary["mfu"] == pytest.approx(analytic_mfu, rel=0.05)
    assert summary["lines"][0].startswith(f"MFU {summary['mfu']:.1%} per rank: ")
    assert "given by --peak-tflops" in summary["lines"][0] and "step 1 counted" in summary["lines"][0]
    # a CPU run without a peak: achieved TFLOP/s, no percentage
    line = mfu.summarize(run)["lines"][0]
    assert line.startswith("MFU: no percentage (a CPU run has no peak") and "%" not in line
    # the counted step is left out of the steady steps even where warm-up would keep it
    short = load_run(write_synthetic_run(str(tmp_path / "short"), ranks=1, steps=4))
    assert short.steady_steps() == [1, 2, 3]
    meta_path = tmp_path / "short" / "traces" / "rank-00000" / "meta.json"
    meta_path.write_text(json.dumps({**json.loads(meta_path.read_text()), "flops": count}))
    assert load_run(tmp_path / "short").steady_steps() == [2, 3]


def test_activation_checkpointing_is_hardware_flops_not_model_flops():
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)
    block = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.GELU(), torch.nn.Linear(128, 32))
    x = torch.randn(16, 32, requires_grad=True)
    plain = _counted(lambda: block(x).sum().backward())
    for reentrant in (False, True):
        checkpointed = _counted(
            lambda reentrant=reentrant: checkpoint(block, x, use_reentrant=reentrant).sum().backward()
        )
        assert checkpointed["model_flops"] == plain["model_flops"], reentrant
        assert checkpointed["by_phase"]["recompute"] > 0
        assert checkpointed["hardware_flops"] == plain["model_flops"] + checkpointed["by_phase"]["recompute"]
    summary = {
        "ranks": {0: mfu.rank_figures({**checkpointed, "device": "cuda", "device_name": "NVIDIA H100 PCIe"}, 100.0)}
    }
    figures = summary["ranks"][0]
    assert (figures["peak_tflops"], figures["peak_source"]) == (51.0, "H100 PCIe, FP32 dense")
    assert figures["hfu"] > figures["mfu"]
    summary["ranks"][0].update(mfu=0.30, hfu=0.40)
    assert mfu.lines(
        {
            **summary,
            "mfu": 0.30,
            "hfu": 0.40,
            "achieved_tflops_per_rank": 15.3,
            "peak_tflops": 51.0,
            "peak_source": figures["peak_source"],
            "counted_step": 1,
        }
    )[0] == (
        "MFU 30.0% per rank: 15.3 TFLOP/s of model FLOPs against a peak of 51 TFLOP/s (H100 PCIe, FP32 dense); "
        "step 1 counted; with activation recomputation (hardware FLOPs) 40.0%"
    )


class _Recorder:
    """What flop_count.install uses of the recorder."""

    def __init__(self):
        self.state, self.meta, self.close_hooks, self.rows, self.errors = StepState(), {}, [], [], []

    def add(self, row):
        self.rows.append(row)

    def record_error(self, name, exc):
        self.errors.append((name, exc))

    def write_meta(self):
        pass


def test_the_hooks_count_step_1_and_nothing_else(monkeypatch):
    monkeypatch.delenv(flop_count.ENV, raising=False)
    monkeypatch.setenv("DIAGNOSE_TORCH_PROFILER", "0-1")
    assert flop_count.counted_step() == 2  # not inside the profiler window
    monkeypatch.setenv(flop_count.ENV, "0")
    assert flop_count.counted_step() is None
    monkeypatch.delenv(flop_count.ENV)
    monkeypatch.delenv("DIAGNOSE_TORCH_PROFILER")
    rec = _Recorder()
    handles = flop_count.install(rec)
    try:
        model = torch.nn.Linear(8, 8)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(4):
            model(torch.randn(4, 8)).sum().backward()
            rec.state.step = step + 1  # (steps.py's post-hook, which runs before ours, does this)
            optimizer.step()
    finally:
        for handle in handles.values():
            handle.remove()
    # one step of a 4x8 @ 8x8 linear, forward and weight gradient (its input needs none)
    assert rec.meta["flops"]["step"] == 1 and rec.meta["flops"]["model_flops"] == 2 * (2 * 4 * 8 * 8)
    assert [row[1] for row in rec.rows] == ["flop_count"] and rec.errors == []
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    assert _get_current_dispatch_mode() is None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_dtensor_tp_rank_counts_its_share(tmp_path):
    """Under DTensor every rank would count the global figure; its local shards give its share."""
    block, x = mfu_tp_rank.tp_block(), torch.randn(16, 32)
    whole = _counted(lambda: block(x).sum().backward())
    mp.spawn(mfu_tp_rank.tp_rank, args=(_free_port(), str(tmp_path)), nprocs=2, join=True)
    for rank in (0, 1):
        count = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert count["model_flops"] == whole["model_flops"] // 2, (rank, count, whole)
        assert "dtensor_ops_estimated" not in count


def test_peaks_are_dense_and_told_apart_by_name(monkeypatch):
    bf16 = {
        name: gpu_peaks.lookup(name)[1]["bf16"]
        for name in (
            "NVIDIA H100 80GB HBM3",
            "NVIDIA H100 PCIe",
            "NVIDIA H100 NVL",
            "NVIDIA H200",
            "NVIDIA H200 NVL",
            "NVIDIA A100-SXM4-80GB",
            "NVIDIA A100 80GB PCIe",
            "NVIDIA A10",
            "NVIDIA L4",
            "NVIDIA L40S",
        )
    }
    assert bf16 == {
        "NVIDIA H100 80GB HBM3": 989.4,
        "NVIDIA H100 PCIe": 756.5,
        "NVIDIA H100 NVL": 835.5,
        "NVIDIA H200": 989.4,
        "NVIDIA H200 NVL": 835.5,
        "NVIDIA A100-SXM4-80GB": 312.0,
        "NVIDIA A100 80GB PCIe": 312.0,
        "NVIDIA A10": 125.0,
        "NVIDIA L4": 121.0,
        "NVIDIA L40S": 366.5,
    }
    assert gpu_peaks.lookup("NVIDIA A10G") is None and gpu_peaks.lookup("Intel Gaudi") is None
    count = {
        "model_flops": 10**12,
        "device": "cuda",
        "device_name": "NVIDIA H100 80GB HBM3",
        "by_dtype": {"bfloat16": 9 * 10**11, "float32": 10**11},
    }
    assert mfu.peak_for(count, None) == (989.4, "H100 SXM, BF16 dense")
    assert mfu.peak_for({**count, "by_dtype": {"float32": 1}, "fp32_matmul": "tf32"}, None)[0] == 494.7
    assert (
        mfu.peak_for({**count, "device_name": "NVIDIA A100-PCIE-40GB", "by_dtype": {"float8_e4m3fn": 1}}, None)[0]
        is None
    )  # an A100 has no FP8
    monkeypatch.setenv(gpu_peaks.PEAK_ENV, "400")
    assert gpu_peaks.peak_override() == 400.0
    assert mfu.rank_figures(count, 1000.0, gpu_peaks.peak_override())["mfu"] == pytest.approx(1 / 400)


def test_an_imported_gpu_trace_says_there_is_no_model_to_count(tmp_path):
    from diagnose.importers.kineto import import_kineto

    trace = fixture_path("kineto", "tb_plugin_resnet50", "resnet50_num_workers_0")
    files = sorted(str(p) for p in trace.iterdir() if ".json" in p.name)
    run = load_run(import_kineto(files, str(tmp_path / "run"))[0])
    summary = mfu.summarize(run)
    assert summary["lines"][0] == (
        "MFU: not measured: an imported trace has no model to count FLOPs on (a `diagnose run` of the job counts them)"
    )
    assert summary.get("mfu") is None and len(summary["lines"]) == 1
    assert mfu.metrics(summary) == {"mfu/uncounted_kernel_share": 0.0}  # kernels, none of them uncounted
    from dashboards.report_page import render

    assert "MFU: not measured: an imported trace" in render(run, [])
    # a vLLM B200 trace: its MoE GEMMs and attention are TensorRT-LLM's and FlashInfer's kernels
    vllm = load_run(
        import_kineto(
            [str(fixture_path("kineto", "tracelens", "b200_vllm_tp8_rank0.json.gz"))], str(tmp_path / "vllm")
        )[0]
    )
    summary = mfu.summarize(vllm)
    assert summary["uncounted_kernel_share"] == pytest.approx(0.60, abs=0.01)
    assert summary["lines"][1].startswith("60.1% of compute-kernel time is in kernels torch's FLOP formulas")
    assert mfu.metrics(summary) == {"mfu/uncounted_kernel_share": summary["uncounted_kernel_share"]}


def test_the_ddp_job_counts_its_step_and_reports_it(ddp_run):
    """samples/ddp_mlp.py (the shared 2-rank run, 64 x 2 samples a step): the exact count
    of its MLP, in the report's header and in MLflow."""
    dim, hidden, samples = 256, 1024, 64 * 2
    weights = dim * hidden + hidden * hidden + hidden
    # 2 FLOPs per multiply-add: forward, the weight gradients, and the input gradients of the
    # two layers after the first (its input needs none)
    expected = 2 * samples * (3 * weights - dim * hidden)
    for rank in (0, 1):
        count = json.loads((ddp_run / "traces" / f"rank-0000{rank}" / "meta.json").read_text())["flops"]
        assert count["step"] == 1 and count["model_flops"] == expected, count
    run = load_run(ddp_run)
    assert 1 not in run.steady_steps()
    summary = mfu.summarize(run)
    line = summary["lines"][0]
    assert line.startswith("MFU: no percentage (a CPU run has no peak") and "TFLOP/s of model FLOPs" in line
    assert "MFU: no percentage" in (ddp_run / "report.html").read_text()
    from diagnose.exporters import mlflow_metrics  # what log_run logs, without importing MLflow here

    tracked = mlflow_metrics.summary_metrics(run, [])
    assert tracked["mfu/achieved_tflops_per_rank"] == pytest.approx(summary["achieved_tflops_per_rank"])
    assert "mfu/mfu" not in tracked  # no peak, no percentage
