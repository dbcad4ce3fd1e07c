"""Acceptance tests for reference_trainer: real torchrun launches on gloo/CPU.

Launches are cached per module, and each test groups the checks its launches
allow, because every torchrun costs several seconds on a 2-core machine.
"""

import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reference_trainer.config import parse_args
from reference_trainer.faults import parse_fault
from reference_trainer.scenarios import SCENARIOS, WARMUP_STEPS

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
STEPS = 8
REL_TOL = 1e-5
# every launch below uses a global batch of 8 samples (dp * microbatches * micro_batch_size)
LAUNCHES = {
    # name: (dp, tp, pp, trainer args)
    "base": (1, 1, 1, ["--microbatches", "4", "--steps", "30"]),
    # pp alone and each other parallelism with it (tp x pp, dp x pp with ZeRO-1): a dp-only
    # or tp-only launch adds no code path (pp=1 is the base run's), at ~9 s a launch
    "pp2_afab": (1, 1, 2, ["--microbatches", "4", "--schedule", "afab"]),
    "tp2_pp2_1f1b": (1, 2, 2, ["--microbatches", "4", "--schedule", "1f1b", "--num-workers", "2"]),
    "dp2_pp2_1f1b_zero1": (2, 1, 2, ["--microbatches", "2", "--schedule", "1f1b", "--zero1"]),
    # faults that must not change the math, with an uneven split of layers over stages
    "dp2_pp2_faults": (
        2,
        1,
        2,
        [
            "--microbatches",
            "2",
            "--schedule",
            "afab",
            "--layers-per-stage",
            "3,1",
            "--fault",
            "straggler:rank=2,factor=4",
            "--fault",
            "slow_input:ms=5",
            "--fault",
            "hidden_sync:every=microbatch",
            "--fault",
            "blocking_p2p",
            "--fault",
            "comm_bound:mb=4,repeat=2",
            "--fault",
            "accum_sync",
        ],
    ),
}


def torchrun_cmd(nproc: int, args: list[str]) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(nproc),
        "-m",
        "reference_trainer",
        *args,
    ]


def descendant_pids(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def kill_tree(proc: subprocess.Popen) -> None:
    """torchrun starts each rank in a session of its own, so killing torchrun's process
    group is not enough: kill the group of every descendant too."""
    groups = set()
    for pid in [proc.pid, *descendant_pids(proc.pid)]:
        try:
            groups.add(os.getpgid(pid))
        except ProcessLookupError:
            pass
    for pgid in groups:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=30)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


class Launch:
    def __init__(self, out_dir: Path, dp: int, tp: int, pp: int, args: list[str]):
        self.log_path = out_dir / "loss.jsonl"
        self.debug_dir = out_dir / "debug"
        self.args = [
            "--dp",
            str(dp),
            "--tp",
            str(tp),
            "--pp",
            str(pp),
            "--steps",
            str(STEPS),
            "--seed",
            "7",
            "--log-jsonl",
            str(self.log_path),
            "--debug-dir",
            str(self.debug_dir),
            *args,
        ]
        self.nproc = dp * tp * pp

    def run(self, timeout_s: float = 180) -> "Launch":
        self.proc = subprocess.run(
            torchrun_cmd(self.nproc, self.args), env=ENV, cwd=REPO, capture_output=True, text=True, timeout=timeout_s
        )
        return self

    @property
    def rows(self) -> list[dict]:
        return read_jsonl(self.log_path)

    @property
    def losses(self) -> list[float]:
        return [r["loss"] for r in self.rows]

    def debug(self, rank: int) -> list[dict]:
        return read_jsonl(self.debug_dir / f"rank-{rank:05d}.jsonl")


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    cache: dict[str, Launch] = {}

    def get(name: str) -> Launch:
        if name not in cache:
            dp, tp, pp, args = LAUNCHES[name]
            launch = Launch(tmp_path_factory.mktemp(name), dp, tp, pp, args).run()
            assert launch.proc.returncode == 0, launch.proc.stderr[-4000:]
            cache[name] = launch
        return cache[name]

    return get


def test_cli_and_fault_parsing():
    cfg = parse_args(
        [
            "--dp",
            "2",
            "--pp",
            "2",
            "--layers",
            "5",
            "--layers-per-stage",
            "4,1",
            "--fault",
            "straggler:rank=3,factor=1.5",
            "--fault",
            "blocking_p2p",
        ]
    )
    assert cfg.world_size == 4 and cfg.stage_layer_ranges() == [(0, 4), (4, 5)]
    assert cfg.faults[0].params == {"rank": 3, "factor": 1.5}
    assert parse_fault("comm_bound").params == {"mb": 32.0, "repeat": 1}
    assert parse_fault("hang:rank=1,step=4").params == {"rank": 1, "step": 4, "gil": 0}
    for bad in ("nosuch", "hang:rank=1", "straggler:rank=1,speed=2", "hidden_sync:every=step"):
        with pytest.raises(ValueError):
            parse_fault(bad)
    with pytest.raises(ValueError):
        parse_args(["--pp", "2", "--layers", "4", "--layers-per-stage", "3,2"])
    assert parse_args(["--pp", "3", "--layers", "4"]).stage_layer_ranges() == [(0, 2), (2, 3), (3, 4)]


def test_scenarios_cover_design_and_parse():
    # every demo scenario, plus `showcase` (what `make demo` runs)
    assert set(SCENARIOS) == {
        "clean",
        "straggler",
        "slow_stage",
        "slow_input",
        "hidden_sync",
        "blocking_p2p",
        "hang",
        "crash",
        "comm_bound",
        "bubble",
        "varlen",
        "showcase",
        "pipeline_straggler",
        "accum_sync",
    }
    kinds = {
        None,
        "straggler",
        "stage_imbalance",
        "pipeline_bubble",
        "input_stall",
        "hidden_sync",
        "blocking_async",
        "exposed_comm",
        "hang",
        "rank_failure",
        "memory_imbalance",
        "workload_imbalance",
        "accumulation_sync",
    }
    for s in SCENARIOS.values():
        cfg = parse_args(s.argv)
        assert cfg.world_size == s.nproc, s.name
        assert s.expected_kind in kinds, s.name
        assert all(0 <= r < s.nproc for r in s.expected_ranks), s.name
        assert s.expected_stage is None or s.expected_stage < cfg.pp, s.name
        assert cfg.steps >= WARMUP_STEPS + 8, s.name
        for f in cfg.faults:
            if f.name in ("hang", "crash"):
                assert WARMUP_STEPS < f.params["step"] < cfg.steps, s.name


def test_losses_match_across_layouts_schedules_and_zero1(launched):
    base = launched("base").losses[:STEPS]
    assert len(base) == STEPS
    names = ["pp2_afab", "tp2_pp2_1f1b", "dp2_pp2_1f1b_zero1"]
    for name in names:
        losses = launched(name).losses
        assert len(losses) == STEPS, name
        for step, (a, b) in enumerate(zip(base, losses)):
            assert abs(a - b) <= REL_TOL * abs(a), f"{name} step {step}: {b} vs {a}"
    # every layout, both schedules, ZeRO-1 on and off are represented
    layouts = {LAUNCHES[n][:3] for n in ["base", *names]}
    assert layouts == {(1, 1, 1), (1, 1, 2), (1, 2, 2), (2, 1, 2)}
    flags = [set(LAUNCHES[n][3]) for n in names if LAUNCHES[n][2] > 1]
    assert any("afab" in f for f in flags) and any("1f1b" in f for f in flags)
    assert any("--zero1" in f for f in flags) and any("--zero1" not in f for f in flags)


def test_loss_goes_down_and_log_schema(launched):
    rows = launched("base").rows
    assert [r["step"] for r in rows] == list(range(30))
    assert set(rows[0]) == {"step", "loss", "step_time_s", "tokens_per_s", "end_unix_s"}
    first, last = sum(r["loss"] for r in rows[:3]) / 3, sum(r["loss"] for r in rows[-3:]) / 3
    assert first > 5.0 and last < first - 0.5, (first, last)
    assert all(r["step_time_s"] > 0 and r["tokens_per_s"] > 0 for r in rows)


def test_1f1b_bounds_inflight_activations_afab_holds_all(launched):
    # pp=2, 4 micro-batches: stage 0 (rank 0) holds pp=2 under 1F1B, m=4 under AFAB
    assert {r["max_inflight_activations"] for r in launched("tp2_pp2_1f1b").debug(0)} == {2}
    assert {r["max_inflight_activations"] for r in launched("pp2_afab").debug(0)} == {4}
    # the last stage of 1F1B never holds more than one
    assert {r["max_inflight_activations"] for r in launched("tp2_pp2_1f1b").debug(3)} == {1}


def test_zero1_shards_optimizer_state(launched):
    # same stage-0 parameters in both runs; with ZeRO-1 over dp=2 each rank keeps half the state
    full = launched("pp2_afab").debug(0)[-1]
    sharded = [launched("dp2_pp2_1f1b_zero1").debug(r)[-1] for r in (0, 2)]
    assert full["optimizer_state_numel"] == 2 * full["param_numel"]  # Adam: two moments
    for row in sharded:
        assert row["param_numel"] == full["param_numel"]
        # buckets are padded to a multiple of dp: at most one extra element per bucket
        half = full["optimizer_state_numel"] // 2
        assert half <= row["optimizer_state_numel"] <= half + 64, (row, full)


def test_debug_rows_carry_each_steps_end(launched):
    # bench/whatif_accuracy.py --plain times a job without diagnose from these: a step
    # starts after the one before it ended, so two ends are at least the later step's time apart
    rows = launched("pp2_afab").debug(0)
    assert len(rows) > 2
    for before, row in zip(rows, rows[1:]):
        assert row["end_unix_s"] - before["end_unix_s"] >= row["step_time_s"] - 1e-5, (before, row)


def test_soft_faults_keep_the_math_and_hit_the_right_rank(launched):
    faulted = launched("dp2_pp2_faults")
    reference = launched("dp2_pp2_1f1b_zero1").losses
    for step, (a, b) in enumerate(zip(reference, faulted.losses)):
        assert abs(a - b) <= REL_TOL * abs(a), f"step {step}: {b} vs {a}"
    steady = slice(2, None)
    # rank 2 (dp 1, stage 0) is the straggler: its backwards, and only its, are stretched
    # by (factor - 1) x their own time in every step (the fault's sleeps, recorded apart:
    # wall-clock compute ratios between ranks move with how 4 ranks share 2 cores)
    added = {r: [x["fault_compute_s"] for x in faulted.debug(r)] for r in range(4)}
    assert all(s > 0 for s in added[2]), added[2]
    assert all(s == 0 for r in (0, 1, 3) for s in added[r]), added
    # and it is the slowest of its stage: 3x its backward added (medians: single steps are noisy)
    compute = {r: statistics.median(x["compute_s"] for x in faulted.debug(r)[steady]) for r in range(4)}
    assert compute[2] > compute[0], compute
    # slow_input: 4 samples per step per loading rank at >= 5 ms each
    data_s = [x["data_s"] for x in faulted.debug(0)[steady]]
    assert min(data_s) >= 0.018, data_s


def test_crash_fault_sigkills_the_rank(tmp_path):
    launch = Launch(
        tmp_path, 2, 1, 1, ["--microbatches", "2", "--precision", "bf16", "--fault", "crash:rank=1,step=3"]
    ).run()
    assert launch.proc.returncode != 0
    err = launch.proc.stderr
    assert "fault crash: rank 1 at step 3" in err
    assert "exitcode  : -9" in err and "SIGKILL" in err, err[-3000:]
    # steps before the crash completed and were logged (bf16 autocast on CPU, close to fp32)
    assert [r["step"] for r in launch.rows] == [0, 1, 2]
    assert all(5.0 < loss < 5.7 for loss in launch.losses), launch.losses


def test_hang_fault_blocks_the_job(tmp_path):
    launch = Launch(tmp_path, 2, 1, 1, ["--microbatches", "2", "--fault", "hang:rank=1,step=3"])
    err_path = tmp_path / "stderr.txt"
    with open(err_path, "w") as err:
        proc = subprocess.Popen(
            torchrun_cmd(launch.nproc, launch.args),
            env=ENV,
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 90
        while "fault hang: rank 1 at step 3" not in err_path.read_text():
            assert proc.poll() is None, err_path.read_text()[-3000:]
            assert time.monotonic() < deadline, "the hang fault never fired"
            time.sleep(0.1)  # poll period
        # the scenario: 10x the slowest step logged before the hang (the hang watchdog's own
        # multiple), so any step in flight would have ended; far from gloo's 30 min timeout
        time.sleep(max(1.0, 10 * max(r["step_time_s"] for r in launch.rows)))  # the scenario (above)
        assert proc.poll() is None, "the job ended on its own despite the hang"
        assert [r["step"] for r in launch.rows] == [0, 1, 2]
        ranks = descendant_pids(proc.pid)
        assert len([p for p in ranks if alive(p)]) >= 2
    finally:
        kill_tree(proc)
    deadline = time.monotonic() + 30
    while [p for p in ranks if alive(p)] and time.monotonic() < deadline:
        time.sleep(0.05)  # poll period
    assert not [p for p in ranks if alive(p)], "ranks survived the kill"
