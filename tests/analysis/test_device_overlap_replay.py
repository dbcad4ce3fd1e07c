"""Issue 46: the device replay on a trace whose communication overlaps compute.
A dp4 job with DDP's bucketed gradient all-reduces (tests/support/megatron_stream_model.py,
buckets=4): each bucket's all-reduce runs on the data-parallel stream while the
rest of the last backward computes, and only the last bucket is exposed. The
replay reads only the Kineto export; the truth is the simulation's own re-run
(all-reduces made ~free for exposed_comm, the slow rank at normal speed for the
straggler).
"""

import numpy as np
import pytest

from diagnose.analysis.findings.run_detectors import detect
from diagnose.analysis.replay.whatif import WhatIf
from diagnose.importers.kineto import import_kineto
from tests.support import kineto_perturb
from tests.support import megatron_stream_model as model
from tests.support.jobs import load_run

TOLERANCE_FRAC = 0.25  # the acceptance: within 25% of the re-run truth
FIDELITY_FRAC = 0.05  # ... and every steady step replayed within 5% of its record
# a backward kernel is 750 us (fwd 3000 us x 2 / 8 kernels), a bucket every 2 of
# them (1500 us): a 1200 us transfer hides behind the next two kernels but the
# last bucket's, which only the optimizer waits for, is the step's
BUCKET_US = 1200.0
FREE_US = 1.0  # the re-run's all-reduce: transfer ~0, its rendezvous kept
_SIMS, _RUNS = {}, {}


def _sim(**settings) -> model.Sim:
    key = tuple(sorted((k, str(v)) for k, v in settings.items()))
    if key not in _SIMS:
        _SIMS[key] = model.simulate(
            pp=1, dp=4, microbatches=4, steps=6, seed=0, jitter_sigma=0.02, record_waits=True, buckets=4, **settings
        )
    return _SIMS[key]


def _analyzed(tmp_path_factory, **settings):
    """The run and detect()'s findings of a simulated job's export (once per module)."""
    key = tuple(sorted((k, str(v)) for k, v in settings.items()))
    if key not in _RUNS:
        tmp = tmp_path_factory.mktemp("job")
        paths = [kineto_perturb.write(t, tmp / f"rank{r}.json") for r, t in enumerate(_sim(**settings).traces)]
        run = load_run(import_kineto(paths, str(tmp / "run"))[0])
        _RUNS[key] = run, detect(run)
    return _RUNS[key]


def _step_ms(sim) -> np.ndarray:
    """The job's steps (ms, after step 0) on the simulation's clock: last end to last end."""
    return np.diff(np.max(np.array(sim.step_end_us), axis=0)) / 1000.0


def _truth_ms(faulty, fixed, steps) -> float:
    saved = _step_ms(faulty) - _step_ms(fixed)
    return float(np.mean([saved[s - 1] for s in steps]))


@pytest.mark.parametrize("drop", [0.0, 1.0], ids=["recorded_waits", "inferred_waits"])
def test_the_replay_gives_back_every_step_of_an_overlapped_job(tmp_path_factory, drop):
    run, _ = _analyzed(tmp_path_factory, allreduce_us=BUCKET_US, drop_waits_frac=drop)
    figures = run.step_figures
    assert figures["impact_from_replay"] and figures["replay_max_step_error_frac"] <= FIDELITY_FRAC, figures
    if drop:  # every bucket's wait on the backward, and the optimizer's on the last bucket
        assert figures["recorded_waits"] == 0 and figures["inferred_waits"] > 0, figures


def _overlap_frac(kernels) -> float:
    """Of the communication kernels' time, the share a compute kernel of their rank ran in."""
    overlapped = busy = 0
    for _, mine in kernels.groupby("rank"):
        comm, compute = mine[mine["kind"] == "communication"], mine[mine["kind"] == "compute"]
        start, end = compute["start_ns"].to_numpy(), compute["end_ns"].to_numpy()
        for c_start, c_end in zip(comm["start_ns"], comm["end_ns"]):
            # one compute stream: its kernels do not overlap each other
            overlapped += np.clip(np.minimum(end, c_end) - np.maximum(start, c_start), 0, None).sum()
            busy += c_end - c_start
    return overlapped / busy


def test_the_buckets_overlap_the_backward_in_the_trace(tmp_path_factory):
    run, _ = _analyzed(tmp_path_factory, allreduce_us=BUCKET_US)
    kernels = run.kernels()
    comm = kernels[kernels["kind"] == "communication"]
    assert set(comm["stream"]) == {21} and len(comm) == 4 * 4 * 6  # 4 buckets, 4 ranks, 6 steps
    # 3 buckets of 4 hidden whole, the last exposed: 0.75 here
    assert 0.6 <= _overlap_frac(kernels) <= 0.8


def test_exposed_comm_saves_the_last_bucket_not_every_transfer(tmp_path_factory):
    """Making every all-reduce instant saves the exposed last bucket, ~1.2 ms a
    step, not the ~5 ms of transfer on the data-parallel stream each step: a lane
    model serialising communication with compute would claim all of it."""
    run, found = _analyzed(tmp_path_factory, allreduce_us=BUCKET_US)
    steady = run.steady_steps()
    truth = _truth_ms(_sim(allreduce_us=BUCKET_US), _sim(allreduce_us=FREE_US), steady)
    kernels = run.kernels()
    comm = kernels[(kernels["kind"] == "communication") & kernels["step"].isin(steady)]
    transfer_ms_per_step = float((comm["end_ns"] - comm["start_ns"]).sum()) / 1e6 / len(steady) / 4
    assert truth <= 0.3 * transfer_ms_per_step, (truth, transfer_ms_per_step)
    saving, _ = WhatIf(run, steady, run.rank_stages(), device=True).exposed_comm()
    assert abs(saving - truth) <= TOLERANCE_FRAC * truth, (saving, truth)
    named = [f for f in found if f["kind"] == "exposed_comm"]
    for finding in named:  # below the detector's threshold here (3% of the step)
        assert finding["impact_source"] == "replay"
        assert abs(finding["impact_ms_per_step"] - truth) <= TOLERANCE_FRAC * truth, (finding, truth)


def test_exposed_comm_named_on_slow_buckets_saves_its_rerun(tmp_path_factory):
    """2500 us buckets queue on the data-parallel stream past the backward's end:
    half the step's transfer is exposed, and the detector names it."""
    run, found = _analyzed(tmp_path_factory, allreduce_us=2500.0)
    assert run.step_figures["replay_max_step_error_frac"] <= FIDELITY_FRAC
    (finding,) = [f for f in found if f["kind"] == "exposed_comm"]
    assert finding["impact_source"] == "replay"
    truth = _truth_ms(_sim(allreduce_us=2500.0), _sim(allreduce_us=FREE_US), run.steady_steps())
    assert abs(finding["impact_ms_per_step"] - truth) <= TOLERANCE_FRAC * truth, (finding["impact_ms_per_step"], truth)


def test_a_slow_rank_with_overlapped_buckets_saves_its_rerun(tmp_path_factory):
    """Rank 1's compute 1.5x: the others' buckets wait for its at every rendezvous."""
    run, found = _analyzed(tmp_path_factory, allreduce_us=BUCKET_US, rank_factor={1: 1.5})
    assert run.step_figures["replay_max_step_error_frac"] <= FIDELITY_FRAC
    (finding,) = [f for f in found if f["kind"] == "straggler"]
    assert finding["ranks"] == [1] and finding["impact_source"] == "replay"
    truth = _truth_ms(
        _sim(allreduce_us=BUCKET_US, rank_factor={1: 1.5}), _sim(allreduce_us=BUCKET_US), run.steady_steps()
    )
    assert abs(finding["impact_ms_per_step"] - truth) <= TOLERANCE_FRAC * truth, (finding["impact_ms_per_step"], truth)
