"""Issue 45 item 1 on device traces: an imported Kineto trace of a Megatron job
(tests/support/megatron_stream_model.py) has no phases, no forward/backward rows of our
hooks, and its batched p2p is one fused SendRecv kernel per exchange whose
peers are only in the CPU nccl:send / nccl:recv ops (or nowhere). The importer
reads the exchanges and the passes from what the trace holds
(diagnose/importers/kineto_structure.py), so the detectors that read phases
find a slow stage, a bubble and unequal micro-batches on the device's clock,
and say which phases they read; uniform jittered runs give nothing from them.
"""

import numpy as np
import pytest

from diagnose.analysis.findings.run_detectors import detect
from diagnose.importers import kineto_scan
from diagnose.importers.kineto import import_kineto
from tests.support import kineto_perturb
from tests.support import megatron_stream_model as model
from tests.support.jobs import load_run
from tests.support.kineto_scan_paths import scan_path_tables

FWD_MS = 3.0  # a micro-batch's forward on the device (model default); backward twice that
DEVICE_PASSES = "device passes inferred from the trace"
PHASE_READERS = {"stage_imbalance", "pipeline_bubble", "workload_imbalance"}
CONTROL_SEEDS = range(20)


def _run(tmp_path, traces, expected_warnings=()):
    paths = [kineto_perturb.write(t, tmp_path / f"rank{r}.json") for r, t in enumerate(traces)]
    return load_run(import_kineto(paths, str(tmp_path / "run"))[0], expected_warnings=expected_warnings)


def _by_kind(found):
    return {f["kind"]: f for f in found}


@pytest.mark.parametrize("peer_args", [True, False], ids=["peers-in-cpu-ops", "no-peer-args"])
def test_a_slow_stage_is_named_from_fused_exchanges(tmp_path, peer_args):
    # pp4 x dp2, 8 micro-batches, stage 2 computes 1.5x: ranks 4 and 5 (pipelines [0,2,4,6], [1,3,5,7])
    run = _run(tmp_path, model.traces(4, 2, 8, steps=6, stage_factor={2: 1.5}, peer_args=peer_args))
    assert run.stage_source == "inferred: 4 stages x 2 pipelines"
    events = run.events()
    p2p = events[events["kind"] == "p2p"]
    assert (p2p["peer"] >= 0).all() and set(p2p["detail"].astype(str)) == {"gpu"}
    # one row per message of each fused exchange: rank 2 (stage 1) sends 8 activations down, 8 gradients up
    rank2 = p2p[(p2p["rank"] == 2) & (p2p["name"] == "send") & (p2p["step"] == 3)]
    assert rank2.groupby("peer").size().to_dict() == {0: 8, 4: 8}
    passes = events[events["kind"].isin(["forward", "backward"]) & (events["step"] == 3)]
    assert set(passes["detail"].astype(str)) == {"gpu:inferred"}
    assert (
        passes.groupby(["rank", "kind"], observed=True)["microbatch"]
        .apply(sorted)
        .apply(lambda mbs: mbs == list(range(8)))
        .all()
    )

    found = _by_kind(detect(run))
    f = found["stage_imbalance"]
    assert f["stage"] == 2 and f["ranks"] == [4, 5] and f["severity"] in ("warning", "critical")
    # per micro-batch compute is the device's: 3 + 6 ms, 1.5x on stage 2 (host launches take ~0.1 ms)
    for stage in range(4):
        expected_ms = 3 * FWD_MS * (1.5 if stage == 2 else 1.0)
        assert f["metrics"][f"stage{stage}_microbatch_ms"] == pytest.approx(expected_ms, rel=0.02)
    assert f["metrics"]["imbalance_max_over_mean_x"] == pytest.approx(1.5 / 1.125, rel=0.02)
    # the pipeline runs at stage 2's pace: (m + p - 1) x (max - mean) per step, capped by the step
    assert 0 < f["impact_ms_per_step"] <= (8 + 3) * (13.5 - 10.125) * 1.02
    assert DEVICE_PASSES in f["metrics"]["phases_from"]


def test_two_micro_batches_leave_a_bubble(tmp_path):
    run = _run(tmp_path, model.traces(4, 2, 2, steps=6))
    found = _by_kind(detect(run))
    f = found["pipeline_bubble"]
    assert f["ranks"] == list(range(8)) and f["metrics"]["device_time"] == 1.0
    assert f["metrics"]["stages"] == 4 and f["metrics"]["microbatches"] == 2
    assert f["metrics"]["theoretical_bubble_frac"] == pytest.approx(3 / 5)
    # idle on the device: no compute kernel running, measured where theory says
    assert f["metrics"]["bubble_frac"] == pytest.approx(3 / 5, abs=0.05)
    assert f["impact_ms_per_step"] > 0 and f["severity"] in ("warning", "critical")
    assert DEVICE_PASSES in f["metrics"]["phases_from"]
    assert "stage_imbalance" not in found
    # the SendRecv kernels spin while the neighbour computes: the bubble's time, not
    # communication (it was a critical exposed_comm of 28.6 ms/step, ranked first)
    serious = [g["kind"] for g in detect(run) if g["severity"] != "info"]
    assert serious[0] == "pipeline_bubble" and "exposed_comm" not in serious, serious


def _lengths(rng, rank, step, mb):
    """10% of micro-batches 3x, the rest 1x +-5%."""
    return 3.0 if rng.random() < 0.1 else rng.uniform(0.95, 1.05)


def test_long_micro_batches_are_workload_imbalance(tmp_path):
    # plain data parallel (dp4), 4 micro-batches of gradient accumulation per step
    run = _run(tmp_path, model.traces(1, 4, 4, steps=10, length=_lengths, seed=1))
    assert run.stage_source is None
    found = _by_kind(detect(run))
    f = found["workload_imbalance"]
    assert f["ranks"] == [0, 1, 2, 3] and f["stage"] is None and f["metrics"]["device_time"] == 1.0
    assert f["impact_ms_per_step"] > 0 and f["severity"] in ("warning", "critical")
    assert f["metrics"]["phase_rank_corr"] > 0.5 and f["metrics"]["ranks_taking_turns"] >= 2
    assert DEVICE_PASSES in f["metrics"]["phases_from"]
    assert "straggler" not in found  # the rank that drew the long batches is not slow


@pytest.mark.parametrize("shape", [(1, 4, 4, 8), (2, 2, 8, 6)], ids=["dp4x4mb", "pp2xdp2x8mb"])
def test_uniform_jittered_runs_give_no_finding_above_info(tmp_path, shape):
    """20 seeds of uniform runs with jitter (lognormal sigma 0.05 per kernel, 1
    kernel in 200 20 ms longer): dp4 x 4 micro-batches, and a pp2 x dp2
    pipeline of 8 micro-batches (theory 1/9: no bubble to report): nothing
    above info, from any detector."""
    pp, dp, m, steps = shape
    above, phase_findings = [], []
    for seed in CONTROL_SEEDS:
        traces = model.traces(pp, dp, m, steps=steps, seed=seed, jitter_sigma=0.05, delay_every=200)
        (tmp_path / str(seed)).mkdir()
        for f in detect(_run(tmp_path / str(seed), traces)):
            if f["kind"] in PHASE_READERS:
                phase_findings.append((seed, f["kind"], f["severity"]))
            elif f["severity"] != "info":
                above.append((seed, f["kind"], f["severity"]))
    assert phase_findings == []
    # straggler named some rank of dp4 (seeds 6, 19) and of pp2 x dp2 (8 of 20 seeds)
    # before it asked whether the rank's kernels themselves run slower
    # (straggler_causes.kernels_slower): a few 20 ms late kernels are not a slow GPU
    assert above == []


def test_peers_that_nothing_names_are_refused_with_a_reason(tmp_path):
    """No peer args, no pg_config, no ranks on the kernels: the exchanges stay
    collectives, no stage is guessed, and the rank's meta says why."""
    traces = model.traces(4, 1, 4, steps=5, peer_args=False)
    for trace in traces:
        del trace["distributedInfo"]["pg_config"]
        for e in trace["traceEvents"]:
            if "SendRecv" in e["name"] or e["name"] in ("nccl:send", "nccl:recv"):
                e["args"].pop("Process Group Ranks", None)
    run = _run(tmp_path, traces, expected_warnings=("differ",))
    assert run.stage_source is None
    assert not (run.events()["kind"] == "p2p").any()
    notes = {r: meta.get("device_structure", "") for r, meta in run.rank_meta.items()}
    assert all(n.startswith("p2p peers not resolved: no pipeline group") for n in notes.values()), notes
    assert not PHASE_READERS & {f["kind"] for f in detect(run)}


@pytest.mark.parametrize(
    "peer_args, why",
    [(True, "ring (an interleaved schedule"), (False, "batched p2p (nccl:coalesced) names no peer")],
    ids=["peers-in-cpu-ops", "no-peer-args"],
)
def test_an_interleaved_schedule_is_refused_not_mis_staged(tmp_path, peer_args, why):
    """Two model chunks per rank: the last stage feeds the first. With peers the
    links form a ring; without, the first and last stages' traffic is a ring's,
    which no plain pipeline has: either way one line says why, and no stage is
    named, not even the slow one's."""
    traces = model.traces(4, 1, 4, steps=5, chunks=2, stage_factor={2: 1.5}, peer_args=peer_args)
    run = _run(tmp_path, traces, expected_warnings=(why, *(() if peer_args else ("differ",))))
    assert run.stage_source is None
    (line,) = [w for w in run.warnings if "pipeline stages not inferred" in w]
    assert why in line and "\n" not in line
    found = detect(run)
    assert not PHASE_READERS & {f["kind"] for f in found}
    assert all(f["stage"] is None for f in found)
    if not peer_args:  # the end stages' meta says what the import could not read
        assert "only a ring carries" in run.rank_meta[0]["device_structure"]


def test_every_scan_path_reads_the_fused_exchanges_alike():
    """dict, msgspec and C scans give one table for a Megatron rank: the peers
    of nccl:send / nccl:recv ops reach the exchange's p2p rows on each."""
    tables = scan_path_tables(model.traces(4, 1, 3, steps=2)[1])
    assert len(tables) == 3 or kineto_scan._kineto_c is None
    assert all(t.equals(tables[0]) for t in tables[1:])
    rows = tables[0].to_pylist()
    sends = [(r["peer"], r["group"]) for r in rows if r["kind"] == "p2p" and r["name"] == "send"]
    assert sorted(set(sends)) == [(0, "1->0"), (2, "1->2")] and len(sends) == 2 * 2 * 3
    kinds = np.unique([r["kind"] for r in rows if r["kind"] in ("forward", "backward")], return_counts=True)
    assert dict(zip(*kinds)) == {"backward": 6, "forward": 6}
