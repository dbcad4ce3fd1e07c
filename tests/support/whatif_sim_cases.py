"""Issue 46's test bench for the what-if replay: jobs simulated with a fault and
again with only the fault removed (tests/support/megatron_stream_model.py, an event
simulation of hosts, CUDA stream queues, NCCL rendezvous and fused p2p
batches). A case's truth is the simulation's own: the faulty job's mean step
minus the fixed job's, both from the simulated times, never from reading the
exported traces back. The replay under test reads only the export.

    case.faulty(seed)  /  case.fixed(seed)   -> Kineto traces (one dict per rank),
        with the cross-stream waits recorded; drop_waits_frac=0.5 leaves half of
        each rank's waits out of the export (seeded), the simulation unchanged
    case.truth_ms_per_step(seed)             -> ms/step the fix saves

A job's step time is the bench's and the replay's (step_replay.job_step_ms):
from the previous step's last end on any rank to this step's last end; step 0
has no previous end and is skipped. Same seed, same draws: the fixed job's
kernels are the faulty job's but for the fault (jitter included).

Run as a script, it prints each case's faulty and fixed step and truth.
"""

import statistics
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from tests.support import megatron_stream_model as model

STEPS = 6
JITTER = 0.02  # lognormal sigma per kernel: steps are not all the same


class _Job:
    """A simulated job's settings; called with a seed, its traces."""

    def __init__(self, **settings):
        self.settings = settings

    def simulate(self, seed: int, drop_waits_frac: float = 0.0) -> model.Sim:
        settings = dict(self.settings)
        length = settings.pop("length", None)
        return model.simulate(
            steps=STEPS,
            seed=seed,
            jitter_sigma=JITTER,
            record_waits=True,
            drop_waits_frac=drop_waits_frac,
            length=length(seed) if length else None,
            **settings,
        )

    def __call__(self, seed: int, drop_waits_frac: float = 0.0) -> list:
        return self.simulate(seed, drop_waits_frac).traces

    def step_ms(self, seed: int = 0) -> list:
        """The job's step times (ms) after step 0, on the simulation's clock."""
        last_end_us = np.max(np.array(self.simulate(seed).step_end_us), axis=0)
        return (np.diff(last_end_us) / 1000.0).tolist()


@dataclass
class Case:
    name: str
    finding: str  # the finding kind whose fix this emulates
    ranks: list[int]  # the culprit ranks (straggler), [] otherwise
    stage: int | None  # the culprit stage (stage_imbalance), else None
    # (both _Job: also .simulate(seed, drop_waits_frac) -> model.Sim, .step_ms(seed), .settings)
    faulty: Callable[[int], list[dict]]  # seed -> Kineto traces, fault in
    fixed: Callable[[int], list[dict]]  # seed -> same job, fault removed (the emulated fix)

    def truth_ms_per_step(self, seed: int = 0) -> float:
        """Mean over steady steps of the faulty job's step minus the fixed job's (ms)."""
        return statistics.mean(self.faulty.step_ms(seed)) - statistics.mean(self.fixed.step_ms(seed))


def _tail_lengths(fixed: bool, dp: int, microbatches: int):
    """seed -> length(rng, rank, step, mb): each data-parallel replica's
    micro-batches drawn per step, 15% of them 2.5-3.5x, the rest 0.9-1.1x (a
    micro-batch is as long on every stage of its pipeline); fixed: every
    micro-batch of the step the mean, the same total work. Drawn from their own
    generator, so the simulation's draws are the same either way."""

    def for_seed(seed):
        cache = {}

        def length(rng, rank, step, mb):
            if step not in cache:
                draw = np.random.default_rng([seed, step, 4646])
                long = draw.random((dp, microbatches)) < 0.15
                cache[step] = np.where(long, draw.uniform(2.5, 3.5, long.shape), draw.uniform(0.9, 1.1, long.shape))
            lengths = cache[step]
            return float(lengths.mean()) if fixed else float(lengths[rank % dp, mb])

        return length

    return for_seed


def _case(name, finding, ranks, stage, shape, fault: dict, fix: dict | None = None, **common) -> Case:
    pp, dp, m = shape
    job = dict(pp=pp, dp=dp, microbatches=m, **common)
    return Case(name, finding, ranks, stage, _Job(**job, **fault), _Job(**job, **(fix or {})))


# one data-parallel replica's stage-0 rank (rank 0 of pipeline [0, 4, 8, 12]) 2.8x:
# its pipeline runs at its pace and every other replica waits for it at the
# gradient all-reduce, so the fix saves about half the step (issue 46's 3D job)
CASES = {
    c.name: c
    for c in [
        _case("replica_slow_stage0", "straggler", [0], None, (4, 4, 8), {"rank_factor": {0: 2.8}}),
        _case("last_stage_slow", "stage_imbalance", [], 3, (4, 2, 8), {"stage_factor": {3: 1.5}}),
        _case(
            "microbatch_tail",
            "workload_imbalance",
            [],
            None,
            (2, 2, 8),
            {"length": _tail_lengths(False, 2, 8)},
            {"length": _tail_lengths(True, 2, 8)},
        ),
        # host work between micro-batches, hidden while the host runs ahead, is in
        # the step once a loss.item() after each backward drains the device first
        _case(
            "host_sync",
            "hidden_sync",
            [],
            None,
            (1, 2, 4),
            {"host_sync_every_mb": 1},
            host_gap_us=2000.0,
            launch_us=100.0,
        ),
        # the same with each exchange waited at once: the host cannot run ahead
        _case(
            "blocking_p2p",
            "blocking_async",
            [],
            None,
            (4, 1, 8),
            {"blocking_p2p": True},
            host_gap_us=1000.0,
            launch_us=50.0,
        ),
        _case("ring3", "straggler", [1], None, (1, 3, 4), {"rank_factor": {1: 1.5}}, ring=True),
    ]
}


if __name__ == "__main__":
    for case in CASES.values():
        faulty, fixed = statistics.mean(case.faulty.step_ms(0)), statistics.mean(case.fixed.step_ms(0))
        print(
            f"{case.name:22s} faulty {faulty:8.2f} ms  fixed {fixed:8.2f} ms  truth {case.truth_ms_per_step(0):7.2f} ms/step"
        )
