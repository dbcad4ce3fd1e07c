"""Issue 46's test bench checked on its own (not the replay): each case's truth
is what the issue says, the fixed job is the faulty one with only the fault
removed, the exported cross-stream waits are the simulation's dependencies
(all of them unless some are dropped, then fewer), host syncs hold the host
until the device drains, and the exports import.
"""

import json

import numpy as np
import pytest

from diagnose.analysis.detectors import finding_kinds
from diagnose.importers.kineto import import_kineto
from tests.support import kineto_perturb
from tests.support import megatron_stream_model as model
from tests.support import stream_sim_faults as faults
from tests.support import stream_sim_queues as queues
from tests.support import whatif_sim_cases as cases

CASES = cases.CASES
_SIMS = {}


def _sim(name, which="faulty", seed=0, drop=0.0) -> model.Sim:
    """Simulated once per module (the tests only read them)."""
    key = (name, which, seed, drop)
    if key not in _SIMS:
        _SIMS[key] = getattr(CASES[name], which).simulate(seed, drop)
    return _SIMS[key]


def _mean_ms(name, which):
    return float(np.mean(getattr(CASES[name], which).step_ms(0)))


def _kernels(trace, cat="kernel"):
    return [e for e in trace["traceEvents"] if e["cat"] == cat]


def _unexplained_starts(trace) -> int:
    """Kernels that start later than their launch, the kernel before them on
    their stream and the producers of the recorded waits on their stream
    (issued before their launch) explain: the dependencies the export lacks.
    A wait's producer is the last kernel launched on `wait_on_stream` before
    its cudaEventRecord (how HTA reads them)."""
    events = trace["traceEvents"]
    runtime = {e["args"]["correlation"]: e for e in events if e["cat"] == "cuda_runtime" and "correlation" in e["args"]}
    launched = sorted(((runtime[k["args"]["correlation"]]["ts"], k) for k in _kernels(trace)), key=lambda p: p[0])
    waits = []  # (stream, call ts, producer end)
    for w in (e for e in events if e["name"] == faults.STREAM_WAIT):
        record, call = runtime[w["args"]["wait_on_cuda_event_record_corr_id"]], runtime[w["args"]["correlation"]]
        assert record["name"] == "cudaEventRecord" and call["name"] == "cudaStreamWaitEvent"
        assert call["ts"] <= w["ts"] <= call["ts"] + call["dur"] and w["tid"] == w["args"]["stream"]
        producer = [k for ts, k in launched if ts < record["ts"] and k["tid"] == w["args"]["wait_on_stream"]][-1]
        waits.append((w["tid"], call["ts"], producer["ts"] + producer["dur"]))
    unexplained, prev_end = 0, {}
    for ts, k in launched:
        ready = max([ts, prev_end.get(k["tid"], ts), *(end for s, t, end in waits if s == k["tid"] and t < ts)])
        unexplained += k["ts"] > ready + 1e-6
        assert k["ts"] >= ready - 1e-6, "a kernel starts before a recorded dependency ends"
        prev_end[k["tid"]] = k["ts"] + k["dur"]
    return unexplained


def test_the_cases_are_the_issues():
    assert list(CASES) == [
        "replica_slow_stage0",
        "last_stage_slow",
        "microbatch_tail",
        "host_sync",
        "blocking_p2p",
        "ring3",
    ]
    for case in CASES.values():
        assert case.finding in finding_kinds.names()
        assert (case.ranks != []) == (case.finding == "straggler") and (case.stage is not None) == (
            case.finding == "stage_imbalance"
        )
    assert len(_sim("replica_slow_stage0").traces) == 16 and len(_sim("ring3").traces) == 3


def test_a_slow_replica_at_stage_0_costs_about_half_the_step():
    # pp4 x dp4: the slow rank's pipeline runs at its pace, the other replicas
    # wait for it at the gradient all-reduce (issue 46: 22.9 of 46.3 s)
    truth = CASES["replica_slow_stage0"].truth_ms_per_step(0)
    assert 0.4 < truth / _mean_ms("replica_slow_stage0", "faulty") < 0.6
    # where: stage 0's healthy replicas (ranks 1-3) wait that long in the all-reduce
    for trace in _sim("replica_slow_stage0").traces[1:4]:
        reduces = [k["dur"] for k in _kernels(trace) if k["name"] == queues.ALL_REDUCE_KERNEL]
        assert min(reduces[1:]) > 0.8 * 1000 * truth


def test_the_other_truths():
    # a pipeline runs at its slowest stage's pace: 8 micro-batches x 0.5 x (3 + 6 ms)
    assert CASES["last_stage_slow"].truth_ms_per_step(0) == pytest.approx(8 * 0.5 * 9, rel=0.1)
    # the ring couples every rank to the slow one each exchange: 4 x 0.5 x 9 ms
    assert CASES["ring3"].truth_ms_per_step(0) == pytest.approx(4 * 0.5 * 9, rel=0.1)
    # a sync after each of 4 backwards exposes the 2 ms of host work before the next 3 forwards
    assert 3 * 2.0 < CASES["host_sync"].truth_ms_per_step(0) < 4 * (2.0 + 12 * 0.1)
    assert 0.05 < CASES["blocking_p2p"].truth_ms_per_step(0) / _mean_ms("blocking_p2p", "faulty") < 0.3
    for seed in (0, 1, 2):  # long micro-batches cost in each seed's draw
        assert CASES["microbatch_tail"].truth_ms_per_step(seed) > 5.0


@pytest.mark.parametrize("name", ["replica_slow_stage0", "last_stage_slow", "ring3", "host_sync", "blocking_p2p"])
def test_the_fixed_job_is_the_faulty_one_without_the_fault(name):
    settings = CASES[name].faulty.settings
    rank_factor, stage_factor = settings.get("rank_factor", {}), settings.get("stage_factor", {})
    for r, (a, b) in enumerate(zip(_sim(name).traces, _sim(name, "fixed").traces)):
        ka, kb = _kernels(a), _kernels(b)
        assert [(k["name"], k["tid"]) for k in ka] == [(k["name"], k["tid"]) for k in kb]
        for p, q in zip(ka, kb):  # same draws: compute kernels differ by the fault's factor only
            if p["tid"] == faults.COMPUTE_STREAM:
                x = rank_factor.get(r, 1.0) * (
                    stage_factor.get(r // settings["dp"], 1.0) if p["name"] == queues.GEMM else 1.0
                )
                assert p["dur"] == pytest.approx(x * q["dur"], abs=0.5)  # (times are 0.25 us apart at 1.7e15)
        syncs = [[e for e in t["traceEvents"] if e["name"] == "cudaStreamSynchronize"] for t in (a, b)]
        expected = {
            "host_sync": cases.STEPS * settings["microbatches"],
            "blocking_p2p": len([k for k in ka if k["tid"] == faults.P2P_STREAM]),
        }
        assert [len(s) for s in syncs] == [expected.get(name, 0), 0]


def test_equal_micro_batches_keep_each_steps_work():
    lengths = [cases._tail_lengths(fixed, 2, 8)(0) for fixed in (False, True)]
    for step in range(cases.STEPS):
        faulty, fixed = ([f(None, r, step, mb) for r in range(2) for mb in range(8)] for f in lengths)
        assert max(faulty) > 2 * min(faulty) and len(set(fixed)) == 1
        assert sum(faulty) == pytest.approx(sum(fixed), rel=1e-12)
    a, b = _sim("microbatch_tail").traces, _sim("microbatch_tail", "fixed").traces
    for ta, tb in zip(a, b):
        assert len(_kernels(ta)) == len(_kernels(tb))


@pytest.mark.parametrize("name", list(CASES))
def test_recorded_waits_are_the_simulations_dependencies(name):
    """All recorded, they explain every kernel's start; half dropped, some
    starts are unexplained, and nothing else in the export or the run changes."""
    full, dropped = _sim(name), _sim(name, drop=0.5)
    assert dropped.step_end_us == full.step_end_us
    assert sum(_unexplained_starts(t) for t in full.traces) == 0
    assert sum(_unexplained_starts(t) for t in dropped.traces) > 0
    for a, b in zip(full.traces, dropped.traces):
        waits = [e for e in a["traceEvents"] if e["name"] == faults.STREAM_WAIT]
        left = [e for e in b["traceEvents"] if e["name"] == faults.STREAM_WAIT]
        assert len(waits) > 0 and len(left) == len(waits) - round(len(waits) / 2)
        gone = {e["args"]["correlation"] for e in waits} - {e["args"]["correlation"] for e in left}
        kept = [
            e
            for e in a["traceEvents"]
            if not (e["args"].get("correlation") in gone and e["name"] in (faults.STREAM_WAIT, "cudaStreamWaitEvent"))
        ]
        assert json.dumps(kept) == json.dumps(b["traceEvents"])


@pytest.mark.parametrize("name, stream", [("host_sync", faults.COMPUTE_STREAM), ("blocking_p2p", faults.P2P_STREAM)])
def test_a_host_sync_holds_the_host_until_its_stream_drains(name, stream):
    for trace in _sim(name).traces:
        events = trace["traceEvents"]
        runtime = {
            e["args"]["correlation"]: e for e in events if e["cat"] == "cuda_runtime" and "correlation" in e["args"]
        }
        launched = sorted(
            ((runtime[k["args"]["correlation"]]["ts"], k) for k in _kernels(trace) if k["tid"] == stream),
            key=lambda p: p[0],
        )
        launches = sorted(e["ts"] for e in events if e["name"] == "cudaLaunchKernel")
        syncs = [e for e in events if e["name"] == faults.STREAM_SYNC]
        assert syncs and all(s["tid"] == s["args"]["stream"] == stream for s in syncs)
        for s in syncs:
            call = runtime[s["args"]["correlation"]]
            assert call["name"] == "cudaStreamSynchronize" and call["ts"] < s["ts"] <= call["ts"] + call["dur"]
            last = [k for ts, k in launched if ts < call["ts"]][-1]
            end = call["ts"] + call["dur"]
            assert end >= last["ts"] + last["dur"]  # it waited for the stream's last op
            assert not [t for t in launches if call["ts"] < t < end]  # and launched nothing meanwhile


def test_a_host_bound_rank_starves_its_device():
    """Rank 1's host takes 1 ms a launch, longer than a forward kernel (0.75
    ms): its kernels start as launched, and rank 0 waits for it at the all-reduce."""
    slow = model.simulate(1, 2, 4, steps=3, launch_us={1: 1000.0})
    plain = model.simulate(1, 2, 4, steps=3)
    trace = slow.traces[1]
    launch_ts = {e["args"]["correlation"]: e["ts"] for e in trace["traceEvents"] if e["name"] == "cudaLaunchKernel"}
    forwards = [k for k in _kernels(trace) if k["name"] == queues.GEMM and k["dur"] == 750.0]
    assert forwards and all(k["ts"] == launch_ts[k["args"]["correlation"]] for k in forwards)
    reduces = [k["dur"] for k in _kernels(slow.traces[0]) if k["name"] == queues.ALL_REDUCE_KERNEL]
    assert min(reduces) > 10 * 1000.0
    assert np.diff(np.max(slow.step_end_us, axis=0)).mean() > np.diff(np.max(plain.step_end_us, axis=0)).mean()


def test_off_by_default():
    """Without the new arguments nothing new is in the traces (the existing tests' traces)."""
    plain = model.traces(2, 2, 4, steps=2)
    names = {e["name"] for t in plain for e in t["traceEvents"]}
    assert not names & {
        faults.STREAM_WAIT,
        faults.STREAM_SYNC,
        "cudaEventRecord",
        "cudaStreamWaitEvent",
        "cudaStreamSynchronize",
        "host_work",
        "aten::item",
    }


@pytest.mark.parametrize("name", list(CASES))
def test_the_exports_import(tmp_path, name):
    traces = _sim(name, drop=0.5).traces
    paths = [kineto_perturb.write(t, tmp_path / f"rank{r}.json") for r, t in enumerate(traces)]
    _, counts = import_kineto(paths, str(tmp_path / "run"))
    assert sorted(counts["ranks"]) == list(range(len(traces))) and min(counts["ranks"].values()) > 0


def test_ddp_buckets_overlap_the_last_backward():
    """buckets=4: an all-reduce after every 2nd of the last backward's 8 kernels,
    each after the compute launched before it, the backward running on meanwhile;
    the n-th bucket of a step is one instance on every rank (it ends together)
    and the optimizer waits for the last. The recorded waits explain every start."""
    sim = model.simulate(1, 4, 4, steps=3, jitter_sigma=0.02, record_waits=True, buckets=4, allreduce_us=1200.0)
    bucket_ends = []
    for trace in sim.traces:
        assert _unexplained_starts(trace) == 0
        launched = sorted(_kernels(trace), key=lambda k: k["args"]["correlation"])
        steps = np.split(launched, [i + 1 for i, k in enumerate(launched) if k["name"] == queues.ADAM][:-1])
        ends = []
        for step in steps:
            names = [k["name"] for k in step]
            at = [i for i, n in enumerate(names) if n == queues.ALL_REDUCE_KERNEL]
            first = len(step) - 1 - 8 - 4  # the last backward's 8 kernels, 4 buckets, then the optimizer
            assert at == [first + 2, first + 5, first + 8, first + 11]
            for i in at:
                before, bucket = step[i - 1], step[i]
                assert bucket["ts"] >= before["ts"] + before["dur"] - 1e-6
            # the backward does not wait for its buckets: the first three overlap it
            for i in at[:-1]:
                after = step[i + 1]
                assert after["ts"] < step[i]["ts"] + step[i]["dur"]
            optimizer, last = step[-1], step[at[-1]]
            assert optimizer["ts"] >= last["ts"] + last["dur"] - 1e-6
            ends.append([step[i]["ts"] + step[i]["dur"] for i in at])
        bucket_ends.append(ends)
    assert np.ptp(np.array(bucket_ends), axis=0).max() < 1e-6  # every rank's n-th bucket ends together
    plain = model.simulate(1, 4, 4, steps=3, jitter_sigma=0.02, record_waits=True)
    assert [[k["name"] for k in _kernels(t)].count(queues.ALL_REDUCE_KERNEL) for t in plain.traces] == [3] * 4
