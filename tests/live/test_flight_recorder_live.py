"""Issue 22 on a real torch 2.13 gloo job under `diagnose run`: the Flight
Recorder settings reach every rank, a hang is dumped and diagnosed while the job
is still hung (and the job is left to its backend), and a checkpoint a few steps
long is not a hang."""

import json
import os
import shutil
import statistics
import time

import pytest

from diagnose.analysis.detectors import hang
from diagnose.analysis.findings.run_detectors import Context
from diagnose.run.flight_recorder_env import flight_recorder_env
from diagnose.run.watchdog import HANG_STEP_MULTIPLE
from tests.support.jobs import job_env, load_run, run_diagnose, torchrun

PG_TIMEOUT_S = 14


def _trainer(*args):
    return torchrun(2, "-m", "reference_trainer", "--dp", 2, *args)


@pytest.fixture(scope="module")
def hung_run(tmp_path_factory):
    """Rank 1 stops before its gradient all-reduce of step 5; gloo's own timeout
    (--pg-timeout-s) is what ends the job, 20 s in, not diagnose."""
    out = tmp_path_factory.mktemp("fr") / "hung"
    started = time.monotonic()
    proc = run_diagnose(
        [
            "run",
            "--out",
            out,
            "--hang-timeout",
            6,
            "--",
            *_trainer("--steps", 30, "--fault", "hang:rank=1,step=5", "--pg-timeout-s", PG_TIMEOUT_S),
        ],
        check=False,
        timeout=300,
    )
    return out, proc, time.monotonic() - started


def _finding(out):
    return json.loads((out / "analysis" / "findings.json").read_text())[0]


def test_a_hung_gloo_job_is_diagnosed_from_its_dumps_and_not_killed(hung_run, tmp_path):
    out, proc, elapsed_s = hung_run
    assert proc.returncode != 0
    manifest = json.loads((out / "manifest.json").read_text())
    report = manifest["hang"]
    assert report["killed_by_diagnose"] is False and report["timeout_s"] == 6
    # the job lived on after the diagnosis until gloo's timeout ended it
    assert manifest["end_wall_ns"] - report["wall_ns"] >= (PG_TIMEOUT_S - 6 - 5) * 1e9, manifest
    assert elapsed_s >= PG_TIMEOUT_S
    assert "hang in a process group" in proc.stdout.split("diagnose: run directory")[0]
    top = _finding(out)
    assert top["kind"] == "hang" and top["ranks"] == [1], top
    m = top["metrics"]
    assert m["source"] == "flight_recorder" and m["rank1_role"] == "missing"
    assert m["op"] == "gloo:all_reduce" and m["group_ranks"] == "0,1" and m["waiting_rank_list"] == "0"
    assert m["watchdog_dump_agrees"] == 1.0
    # the same finding as the native hang path (diagnose's own in-flight table),
    # whose sequence numbers count from 0 where Flight Recorder's count from 1
    run = load_run(out)
    (native,) = hang._from_dumps(Context(run), run.watchdog_dumps)
    assert native.ranks == [1] and native.metrics["seq"] == m["seq"] - 1
    assert f"of group {m['group']} " in native.title and "all_reduce" in native.title

    # both forms diagnose asked for, each on its own, give that finding
    folder = out / "flight_recorder"
    for form, names in (("pickle", ["rank_0", "rank_1"]), ("json", ["rank_0.json", "rank_1.json"])):
        alone = tmp_path / form
        alone.mkdir()
        for name in names:
            shutil.copy(folder / name, alone / name)
        run_diagnose(["import", "flight-recorder", alone, "--out", tmp_path / f"run-{form}"])
        again = _finding(tmp_path / f"run-{form}")
        assert (again["ranks"], again["metrics"]["seq"], again["metrics"]["op"], again["metrics"]["group"]) == (
            [1],
            m["seq"],
            m["op"],
            m["group"],
        ), (form, again)


def test_every_rank_gets_the_flight_recorder_settings(hung_run):
    out, _, _ = hung_run
    run = load_run(out)
    folder = str(out / "flight_recorder")
    for rank in (0, 1):
        env = run.rank_meta[rank]["env"]["nccl_env"]
        # torch 2.13 reads the new names (and warns about the old ones): only those are set
        assert env["TORCH_FR_BUFFER_SIZE"] == "2000", env
        assert env["TORCH_FR_DUMP_TEMP_FILE"] == folder + "/rank_"
        assert env["TORCH_FR_DEBUG_INFO_PIPE_FILE"] == folder + "/pipe_"
        assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == env["TORCH_NCCL_ENABLE_TIMING"] == "1"
        assert "TORCH_NCCL_TRACE_BUFFER_SIZE" not in env and "TORCH_NCCL_DEBUG_INFO_TEMP_FILE" not in env


def test_the_names_follow_the_torch_version(tmp_path):
    names = {v: set(flight_recorder_env(str(tmp_path), {}, torch_version=v)[0]) for v in ("2.13.0+cpu", "2.4.1", None)}
    assert {"TORCH_FR_BUFFER_SIZE", "TORCH_FR_DUMP_TEMP_FILE"} <= names["2.13.0+cpu"]
    assert not any(n.startswith("TORCH_NCCL_TRACE") for n in names["2.13.0+cpu"])
    assert {"TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"} <= names["2.4.1"]
    assert not any(n.startswith("TORCH_FR_") for n in names["2.4.1"])
    assert names[None] == names["2.13.0+cpu"] | names["2.4.1"]  # no torch found: both


def test_the_users_own_settings_are_left_alone(tmp_path):
    extra, record = flight_recorder_env(
        str(tmp_path),
        {
            "TORCH_NCCL_TRACE_BUFFER_SIZE": "50",
            "TORCH_NCCL_ENABLE_TIMING": "0",
            "TORCH_FR_DUMP_TEMP_FILE": "/elsewhere/fr_",
        },
    )
    # either generation of a name counts as the user's; neither is then overridden
    assert not {
        "TORCH_FR_BUFFER_SIZE",
        "TORCH_NCCL_TRACE_BUFFER_SIZE",
        "TORCH_NCCL_ENABLE_TIMING",
        "TORCH_FR_DUMP_TEMP_FILE",
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE",
    } & set(extra), extra
    assert extra["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert extra["TORCH_FR_DEBUG_INFO_PIPE_FILE"] == str(tmp_path / "flight_recorder" / "pipe_")
    assert record["user_dump_prefix"] == "/elsewhere/fr_"
    assert record["set_by_user"] == {
        "TORCH_NCCL_TRACE_BUFFER_SIZE": "50",
        "TORCH_NCCL_ENABLE_TIMING": "0",
        "TORCH_FR_DUMP_TEMP_FILE": "/elsewhere/fr_",
    }


def test_a_checkpoint_three_steps_long_is_not_a_hang(tmp_path):
    """Every 5 steps a pause 3x the median step. The steps are an emulated device's
    (30 ms a sample: ~0.72 s, the host's share far below it), so their length is not
    the box's: on a faster box or beside other jobs the pause stays ~2.2 s. A
    floor-only timeout (0.5 s) would call it a hang: the pause outlasts the floor plus
    the 0.8 s the last events may take to be flushed. The derived one (10x the median
    step, ~7 s) does not: it leaves ~4.8 s for the flushes around the pause and a
    step slowed by contention. The user's own buffer size is kept."""
    out = tmp_path / "ckpt"
    run_diagnose(
        [
            "run",
            "--out",
            out,
            "--hang-floor",
            0.5,
            "--",
            *_trainer("--steps", 12, "--emulated-device-ms-per-sample", 30, "--fault", "checkpoint:every=5,factor=3"),
        ],
        env=job_env(TORCH_FR_BUFFER_SIZE=500),
        timeout=300,
    )
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["hang"] is None and manifest["stall"] is None and manifest["exit_status"] == 0
    watch = manifest["hang_watch"]
    run = load_run(out)
    steps = run.steps()
    ends = steps[steps["rank"] == 0].sort_values("step")["end_ns"].to_numpy() / 1e9
    gaps = [b - a for a, b in zip(ends[:-1], ends[1:])]
    median_s = statistics.median(gaps)
    # the pause happened, and outlasted the floor plus a flush interval
    assert max(gaps) >= 3.5 * median_s and max(gaps) > 0.5 + 0.8 + median_s, gaps
    assert watch["timeout_s"] == pytest.approx(HANG_STEP_MULTIPLE * watch["median_step_s"], rel=1e-3)
    assert watch["timeout_s"] > max(gaps), (watch, gaps)
    assert run.rank_meta[0]["env"]["nccl_env"]["TORCH_FR_BUFFER_SIZE"] == "500"


def test_the_debug_info_pipes_are_asked_without_blocking(tmp_path):
    """NCCL's watchdog makes <prefix><rank>.pipe and dumps when a byte arrives; a
    pipe whose rank is gone (no reader) must not block the launcher."""

    from diagnose.run.flight_recorder_env import ask_backend_for_dumps

    folder = tmp_path / "flight_recorder"
    folder.mkdir()
    served, gone = folder / "pipe_0.pipe", folder / "pipe_1.pipe"
    os.mkfifo(served)
    os.mkfifo(gone)
    reader = os.open(served, os.O_RDONLY | os.O_NONBLOCK)  # as NCCL's watchdog opens it
    try:
        started = time.monotonic()
        assert ask_backend_for_dumps(str(tmp_path)) == 1
        assert time.monotonic() - started < 1.0
        assert os.read(reader, 8) == b"1"
    finally:
        os.close(reader)


def test_dumps_under_the_users_own_prefix_are_brought_in(tmp_path):
    from diagnose.run.flight_recorder_env import collect_user_dumps

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for name in ("fr_0", "fr_1.json", "fr_notes.txt"):
        (elsewhere / name).write_bytes(b"{}")
    run = tmp_path / "run"
    (run / "flight_recorder").mkdir(parents=True)
    record = {"user_dump_prefix": str(elsewhere / "fr_")}
    copied = collect_user_dumps(str(run), record, since_wall_ns=0)
    assert sorted(os.path.basename(p) for p in copied) == ["rank_0", "rank_1.json"]
    # older than the job: not this job's
    assert collect_user_dumps(str(run), record, since_wall_ns=time.time_ns() + 10**12) == []
