"""The `diagnose demo` scenarios: a launch of the reference trainer per problem,
with the finding the analyzer is expected to report.

Layouts use 4 ranks, hidden_sync 2 (a 2-core CPU machine runs them in seconds); each run is long
enough that the first WARMUP_STEPS steps can be dropped. `argv` is the trainer's
own command line (after `torchrun ... -m reference_trainer`).
"""

from dataclasses import dataclass

WARMUP_STEPS = 2
_MODEL = ["--d-model", "64", "--heads", "4", "--seq-len", "64", "--micro-batch-size", "2"]


@dataclass(frozen=True)
class Scenario:
    name: str
    nproc: int
    argv: list[str]
    expected_kind: str | None  # a findings.json kind; None: nothing above "info"
    expected_ranks: tuple[int, ...] = ()
    expected_stage: int | None = None
    description: str = ""


def _run(layout: list[str], steps: int = 16, faults: tuple[str, ...] = (), layers: int = 8) -> list[str]:
    argv = layout + ["--steps", str(steps), "--seed", "0", "--layers", str(layers)] + _MODEL
    for fault in faults:
        argv += ["--fault", fault]
    return argv


_DP2_PP2 = ["--dp", "2", "--pp", "2", "--schedule", "1f1b", "--microbatches", "8"]
_DP4 = ["--dp", "4", "--microbatches", "2"]
_PP4 = ["--pp", "4", "--schedule", "1f1b", "--microbatches", "8"]

SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in [
        Scenario(
            "clean",
            4,
            _run(_DP2_PP2),
            None,
            description="dp2 x pp2, 1F1B with 8 micro-batches: no problem worth a warning",
        ),
        Scenario(
            "straggler",
            4,
            _run(_DP4, faults=("straggler:rank=2,factor=3",)),
            "straggler",
            (2,),
            description="rank 2 computes 3x slower; ranks 0, 1, 3 wait in the DP all-reduce",
        ),
        # 8 ranks on 2 cores (the slowdown is a sleep, so it holds): rank 5 is stage 1 of
        # pipeline 1; its delay reaches stages 0, 2, 3 through sends and receives
        Scenario(
            "pipeline_straggler",
            8,
            _run(
                ["--dp", "2", "--pp", "4", "--schedule", "1f1b", "--microbatches", "8"],
                faults=("straggler:rank=5,factor=3",),
            ),
            "straggler",
            (5,),
            description="dp2 x pp4: rank 5 (stage 1) computes 3x slower; its pipeline waits "
            "in receives, its DP peer in the gradient all-reduce",
        ),
        Scenario(
            "slow_stage",
            4,
            _run(_PP4, faults=("slow_stage:stage=2,factor=3",)),
            "stage_imbalance",
            (2,),
            2,
            description="pipeline stage 2 computes 3x slower than the others",
        ),
        Scenario(
            "slow_input",
            4,
            _run(_DP4, faults=("slow_input:ms=15",)),
            "input_stall",
            (0, 1, 2, 3),
            description="every sample takes 15 ms to load with num_workers=0",
        ),
        # one rank per core of a 2-core box: a sync per micro-batch runs the ranks in
        # lockstep, and 4 of them on 2 cores made the scheduler's preemptions an
        # intermittent straggler of their own (rank 0, 1.67x on the steps it was last)
        Scenario(
            "hidden_sync",
            2,
            _run(["--dp", "2", "--microbatches", "4"], faults=("hidden_sync:every=microbatch",)),
            "hidden_sync",
            (0, 1),
            description="loss all_reduce + .item() inside the micro-batch loop",
        ),
        # 16 micro-batches: the schedule's bubble (3/19) stays under the bubble detector's
        # gate, so the waited sends are the one cause (with 8 the bubble, 3/11, costs more).
        # One layer fewer on the last stage: its LM head and loss cost about a layer, and with
        # 2 layers everywhere it computed 1.2-1.36x the others, a real stage imbalance that a
        # slower box's what-if put over the warning gate
        Scenario(
            "blocking_p2p",
            4,
            _run(
                ["--pp", "4", "--schedule", "1f1b", "--microbatches", "16", "--layers-per-stage", "2,2,2,1"],
                faults=("blocking_p2p",),
                layers=7,
            ),
            "blocking_async",
            (0, 1, 2, 3),
            description="pipeline sends waited at once instead of overlapped with compute",
        ),
        Scenario(
            "hang",
            4,
            _run(_DP2_PP2, faults=("hang:rank=1,step=6,gil=1",)),
            "hang",
            (1,),
            1,
            description="rank 1 (stage 1) stops before its gradient all-reduce at step 6",
        ),
        Scenario(
            "crash",
            4,
            _run(_DP2_PP2, faults=("crash:rank=3,step=6",)),
            "rank_failure",
            (3,),
            1,
            description="rank 3 (stage 1) is SIGKILLed at step 6",
        ),
        Scenario(
            "comm_bound",
            4,
            _run(_DP4, faults=("comm_bound:mb=32",)),
            "exposed_comm",
            (0, 1, 2, 3),
            description="an extra 32 MB all-reduce per step: communication dominates the step",
        ),
        # seed 5: in the 14 steady steps the draws make ranks 0-2 slowest 4 times each and
        # rank 3 twice (seed 0 happens to give rank 2 eight: "most steps", a straggler's mark)
        Scenario(
            "varlen",
            4,
            _run(["--dp", "4", "--microbatches", "4"], faults=("varlen:spread=6,seed=5",)),
            "workload_imbalance",
            (0, 1, 2, 3),
            description="sequence lengths vary per micro-batch (1-7x): a different rank is slowest "
            "at every step and the others wait for it in the gradient all-reduce",
        ),
        Scenario(
            "accum_sync",
            4,
            _run(["--dp", "4", "--microbatches", "4"], faults=("accum_sync",)),
            "accumulation_sync",
            (0, 1, 2, 3),
            description="gradients all-reduced after each of the 4 micro-batches' backwards, "
            "not only the last (DDP without no_sync())",
        ),
        Scenario(
            "bubble",
            4,
            _run(["--pp", "4", "--schedule", "afab", "--microbatches", "2"]),
            "pipeline_bubble",
            (0, 1, 2, 3),
            description="pp4 with only 2 micro-batches: stages idle most of the step",
        ),
        Scenario(
            "showcase",
            4,
            _run(
                ["--dp", "2", "--pp", "2", "--schedule", "1f1b", "--microbatches", "4"],
                faults=("straggler:rank=2,factor=2.5", "slow_input:ms=4"),
            ),
            "straggler",
            (2,),
            description="`make demo`: a straggler, a slow input pipeline and "
            "too few micro-batches for the pipeline, at once",
        ),
    ]
}
