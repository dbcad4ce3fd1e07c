"""Issue 45, item 5: traces without step markers, and one rank of many.

The real 2 x H100 Nsight pair (tests/data/nsys/nsysai_2gpu_h100, both devices
in one file each, no step markers) and the TraceLens rank-0 traces of an
8-GPU B200 vLLM job and an 8-rank MI300 DDP job. A trace with no steps is
analysed as one window per rank (first kernel to last), and `diagnose
compare` of two such windows gives the figures the pair's authors state in
SOURCE.txt: GPU kernel time summed 535.20 -> 488.84 ms, exposed communication
25.4 -> 33.7 ms, SendRecv +8.34 ms, flash_fwd -31.56 ms.
"""

import gzip
import io
import shutil

import pandas as pd
import pytest
from rich.console import Console

from diagnose.analysis.tables.step_tables import steady_state_steps, steps_table
from diagnose.importers.kineto import import_kineto
from diagnose.importers.nsys import import_nsys
from tests.support.jobs import fixture_path, load_run

PAIR = fixture_path("nsys", "nsysai_2gpu_h100")
WINDOW_NOTE = "the trace marks no steps; analysed as one window per rank"
# SOURCE.txt: (GPU kernel time summed, exposed communication), ms
AUTHORS = {"before": (535.20, 25.4), "after": (488.84, 33.7)}


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """Both exports decompressed and imported once: {"before": run dir, "after": run dir}."""
    tmp = tmp_path_factory.mktemp("nsys_pair")
    out = {}
    for name in AUTHORS:
        sqlite = tmp / f"mfu_2gpu_{name}.sqlite"
        with gzip.open(PAIR / f"mfu_2gpu_{name}.sqlite.gz", "rb") as src, open(sqlite, "wb") as dst:
            shutil.copyfileobj(src, dst)
        out[name] = import_nsys([str(sqlite)], str(tmp / name))[0]
    return out


def test_nsys_pair_send_recv_kernels_match_across_both_devices_without_a_differ_warning(pair):
    """Each ncclDevKernel_SendRecv is one all_to_all of both ranks (PyTorch's
    nccl:all_to_all range around NCCL's ncclGroupEnd, a send and a recv to each
    rank): every one is matched with both members, and the loader warns of
    nothing (load_run fails on any warning: "32 of 33 collectives differ (op
    or size)" before)."""
    for name, kernels_per_device in (("before", 33), ("after", 31)):
        run = load_run(pair[name])
        arrivals = run.arrivals()
        assert len(arrivals) == 2 * kernels_per_device
        assert (arrivals["members"] == 2).all() and (arrivals["expected_members"] == 2).all()
        assert set(arrivals["name"].astype(str)) <= {"all_to_all", "send_recv"}
        assert (arrivals["name"].astype(str) == "all_to_all").sum() >= 2 * (kernels_per_device - 1)
        # one window per device, marked as one, spanning its kernels
        steps = run.steps()
        assert steps["rank"].tolist() == [0, 1] and steps["trace_window"].all()
        spans = run.kernels().groupby("rank").agg(first=("start_ns", "min"), last=("end_ns", "max"))
        assert (steps.set_index("rank")["start_ns"] == spans["first"]).all()
        assert (steps.set_index("rank")["end_ns"] == spans["last"]).all()
        assert run.steady_steps() == [0]
        # each kernel keeps how long it waited after its launch (the host-bound straggler reads it)
        queued = run.kernels()["queued_ns"]
        assert (queued >= 0).mean() > 0.95 and queued.median() > 0


def test_compare_of_the_nsys_pair_gives_the_authors_kernel_time_and_exposed_communication(pair):
    from diagnose.cli.compare_command import compare_runs, print_comparison

    result = compare_runs([pair["before"], pair["after"]])
    assert result["unit"] == "window"
    figures = {row["figure"]: row for row in result["device"]["figures"]}
    for side, name in (("a_ms", "before"), ("b_ms", "after")):
        kernel_ms, exposed_ms = AUTHORS[name]
        assert figures["kernel_ms"][side] == pytest.approx(kernel_ms, rel=0.01)
        assert figures["exposed_comm_ms"][side] == pytest.approx(exposed_ms, rel=0.10)
    kernels = {row["family"]: row["delta_ms"] for row in result["device"]["kernels"]}
    assert kernels["flash_fwd_kernel"] == pytest.approx(-31.56, abs=0.05)
    assert kernels["ncclDevKernel_SendRecv"] == pytest.approx(8.34, abs=0.05)
    assert list(kernels)[0] == "flash_fwd_kernel"  # the largest change first
    # the window is the capture's span per device: SOURCE's "step time" is the two devices' sum
    assert 2 * result["step_time"]["mean_a_ms"] == pytest.approx(598.52, rel=0.01)
    text = io.StringIO()
    print_comparison(result, Console(file=text, width=200))
    text = text.getvalue()
    assert "per window, not per training step" in text
    assert f"A, every rank: {WINDOW_NOTE}" in text and f"B, every rank: {WINDOW_NOTE}" in text
    assert "GPU kernel time" in text and "535.2" in text and "488.8" in text


def test_the_nsys_pairs_windows_are_replayed_on_the_gpus(pair):
    """One window per device, no step before it: the what-if replay measures it from
    its recorded start and gives it back within the 5% gate. Before: "what-if replay
    failed" (a launch that ran two kernels on one stream broke the stream-wait
    index), and with that fixed, no replay ("deadlocked": a step was measured only
    from the step before it)."""
    from diagnose.analysis.findings.run_detectors import detect
    from diagnose.cli.console import print_step_figures

    for name in AUTHORS:
        run = load_run(pair[name])
        kernels = run.kernels()
        assert kernels.duplicated(["rank", "stream", "correlation"]).any()  # what broke the index
        warnings = []
        run.warn = warnings.append
        detect(run)
        figures = run.step_figures
        assert warnings == [] and figures["impact_from_replay"], (warnings, figures)
        assert figures["replay_max_step_error_frac"] <= 0.05 and figures["replay_lanes"] == "device"
        # the GPUs' window: the later device's span, first kernel to last
        spans = kernels.groupby("rank").agg(first=("start_ns", "min"), last=("end_ns", "max"))
        assert figures["recorded_step_ms"] == pytest.approx((spans["last"].max() - spans["first"].min()) / 1e6)
        text = io.StringIO()
        print_step_figures(figures, Console(file=text, width=400))
        assert f"as recorded {figures['recorded_step_ms']:.1f} ms on the GPUs" in text.getvalue()


def _shares(findings: list) -> dict:
    return {
        f"{f['kind']}.{k}": v
        for f in findings
        for k, v in f["metrics"].items()
        if k.endswith("_frac") and isinstance(v, (int, float))
    }


@pytest.mark.parametrize("trace, windowed", [("b200_vllm_tp8_rank0", True), ("mi300_ddp_resnet_rank0", False)])
def test_tracelens_rank_zero_traces_get_steps_or_a_window_and_no_share_above_the_step(tmp_path, trace, windowed):
    """B200: no ProfilerStep, 930 GPU activities and one all-gather carrying NCCL's
    own metadata (process group "3", ranks 0-7) was "no completed steps
    recorded, findings: none". MI300: profiler steps, kept as steps."""
    from diagnose.cli.after_run import analyze_run

    out = import_kineto([str(fixture_path("kineto", "tracelens", f"{trace}.json.gz"))], str(tmp_path / "run"))[0]
    warnings = []
    run, findings = analyze_run([out], outputs=False, warn=warnings.append)
    steps = run.steps()
    assert len(steps) and bool(steps["trace_window"].any()) == windowed
    assert [w for w in warnings if "differ" in w] == []
    assert run.world_size == 8 and run.ranks == [0]
    calls = run.collectives()
    assert len(calls) and (calls["group_ranks"].astype(str) == "0,1,2,3,4,5,6,7").all()
    if windowed:
        assert set(calls["group"].astype(str)) == {"3"} and set(calls["name"].astype(str)) == {"all_gather"}
        assert (run.kernels()["step"] == 0).all()
    breakdown = run.breakdown()
    assert (
        len(breakdown)
        and (breakdown.filter(like="_ms").drop(columns="step_ms").sum(axis=1) <= breakdown["step_ms"] + 1e-6).all()
    )
    exposed = run.device_exposed_comm()
    assert (exposed["exposed_comm_ms"] <= exposed["comm_ms"] + 1e-9).all()
    assert all(0 <= v <= 1 for v in _shares(findings).values()), _shares(findings)
    for f in findings:  # from 1 of 8 ranks, nothing critical built on collective-kernel time
        if f["kind"] == "exposed_comm":
            assert f["severity"] == "info" and "from 1 of 8 ranks" in f["title"]
            assert "group [0,1,2,3,4,5,6,7] (default_pg)" in f["title"]  # its role, from pg_config
    # the groups the trace's pg_config holds, read into the rank's meta
    groups = run.rank_meta[0]["process_groups"]
    assert len(groups) == (15 if windowed else 1) and groups["0"]["desc"] == "default_pg"
    if windowed:
        assert groups["3"]["ranks"] == list(range(8)) and groups["3"]["backend"] == "cuda:nccl"


def test_only_ranks_with_kernels_and_no_steps_get_a_window():
    """Rank 0 has steps: kept. Rank 1 has kernels only: one window over them.
    Rank 2 has host rows only (a live rank that never completed a step, a
    hang): no window, as before."""
    rows = [
        (0, "step", 0, 100, 5),
        (0, "step", 100, 200, 6),
        (0, "kernel", 10, 50, 5),
        (1, "kernel", 30, 40, -1),
        (1, "phase", 0, 500, -1),
        (1, "kernel", 70, 90, -1),
        (2, "forward", 0, 80, -1),
    ]
    events = pd.DataFrame(rows, columns=["rank", "kind", "start_ns", "end_ns", "step"])
    steps = steps_table(events)
    assert steps[["rank", "step", "start_ns", "end_ns", "trace_window"]].values.tolist() == [
        [0, 5, 0, 100, False],
        [0, 6, 100, 200, False],
        [1, 0, 30, 90, True],
    ]
    assert steady_state_steps(steps[steps["rank"] == 1]) == [0]


def test_kernel_family_drops_return_type_namespaces_templates_and_parameters():
    from diagnose.analysis.compare.device_figures import kernel_family

    assert (
        kernel_family("void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<(int)128>, (bool)0>(Flash_fwd_params)")
        == "flash_fwd_kernel"
    )
    assert (
        kernel_family("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<(unsigned long)4096>)")
        == "ncclDevKernel_SendRecv"
    )
    assert (
        kernel_family("void at::native::<unnamed>::vectorized_layer_norm_kernel<float, float>(int, T2)")
        == "vectorized_layer_norm_kernel"
    )
    assert (
        kernel_family("nvjet_tst_192x192_64x4_2x1_v_bz_coopB_bias_TNN")
        == "nvjet_tst_192x192_64x4_2x1_v_bz_coopB_bias_TNN"
    )


def test_the_terminal_breakdown_of_a_windowed_trace_says_window_not_step(tmp_path):
    from diagnose.cli.console import print_breakdown

    out = import_kineto(
        [str(fixture_path("kineto", "tracelens", "b200_vllm_tp8_rank0.json.gz"))], str(tmp_path / "run")
    )[0]
    text = io.StringIO()
    print_breakdown(load_run(out), Console(file=text, width=300))
    printed = text.getvalue()
    assert "Breakdown per window" in printed and "ms/step" not in printed
    assert "rank 0: the trace marks no steps; analysed as one window" in printed


def test_a_profilers_stop_step_is_not_a_steady_step(tmp_path):
    """HTA's MI250 trace (tests/data/kineto/hta/amd_trace): ProfilerStep#1 holds every
    kernel (9.3 ms), ProfilerStep#2 is the profiler's exit, 0.05 ms with none; it was
    the only steady step, and the analysis read nothing. A live run's profiler window
    (kernels in a few steps of many) keeps every step."""
    from diagnose.analysis.tables.step_tables import without_profiler_stop_step

    out = import_kineto(
        [str(fixture_path("kineto", "hta", "amd_trace", "mi250_minitoy_train_ROCm6_2_kineto.json.gz"))],
        str(tmp_path / "run"),
    )[0]
    run = load_run(out)
    assert sorted(run.steps()["step"]) == [1, 2] and run.steady_steps() == [1]
    assert run.breakdown().set_index("step").loc[1, "step_ms"] > 9
    steps = pd.DataFrame({"rank": 0, "step": range(40), "start_ns": range(40), "end_ns": range(1, 41)})
    window = pd.DataFrame({"step": [10, 11, 12]})
    assert len(without_profiler_stop_step(steps, window)) == 40
