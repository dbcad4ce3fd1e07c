"""Issue 25 (progress): `diagnose analyze` on a run with more than a few dozen ranks
shows a bar over the ranks as it reads them, on a terminal; the loader reports
each rank read, in order of completion, to whoever asks (on_rank).

Issue 48: `diagnose run`'s progress line waits for the ranks that have not
reported yet, and names the rank the others wait for (the live monitor's
arrival lags, via live.json), not the lowest index among ranks tied on steps."""

import io
import json
import os
import pty
import select
import subprocess
import time

import diagnose
from diagnose.live.rank_gauges import LIVE_STATE
from diagnose.run.progress_line import ProgressLine, rank_spans
from tests.support.jobs import DIAGNOSE, REPO, job_env
from tests.support.synthetic_run import write_synthetic_run

RANKS = 64


def test_the_loader_reports_every_rank_read(tmp_path):
    run_dir = write_synthetic_run(str(tmp_path / "run"), ranks=RANKS, steps=4)
    seen, warnings = [], []
    run = diagnose.load(run_dir, warn=warnings.append, on_rank=lambda done, total: seen.append((done, total)))
    assert seen == [(i, RANKS) for i in range(1, RANKS + 1)] and len(run.ranks) == RANKS
    assert warnings == []


def test_analyze_on_a_terminal_shows_a_bar_over_the_ranks(tmp_path):
    run_dir = write_synthetic_run(str(tmp_path / "run"), ranks=RANKS, steps=4)
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [*DIAGNOSE, "analyze", run_dir, "--quiet", "--no-outputs"],
        cwd=REPO,
        env=job_env(COLUMNS="120"),
        stdout=subprocess.DEVNULL,
        stderr=slave,
    )
    os.close(slave)
    seen = b""
    while True:
        ready, _, _ = select.select([master], [], [], 120)
        if not ready:
            break
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the terminal closed: the process is done
            break
        if not chunk:
            break
        seen += chunk
    os.close(master)
    assert proc.wait(timeout=60) == 0, seen[-2000:]
    assert b"reading ranks" in seen and f"/{RANKS}".encode() in seen, seen[-2000:]


def _line(tmp_path, progress: dict, started=(0, 1, 2, 3)) -> str:
    for rank in started:
        (tmp_path / "traces" / f"rank-{rank:05d}").mkdir(parents=True, exist_ok=True)
    stream = io.StringIO()
    line = ProgressLine(stream, run_dir=str(tmp_path))
    line.tick(progress)
    return stream.getvalue().strip()


def test_the_progress_line_waits_for_the_ranks_that_have_not_reported(tmp_path):
    """It said "1 ranks, step 0-0" while ranks 1-3 still started."""
    assert _line(tmp_path, {0: {"steps_done": 0}}) == "diagnose: 1 of 4 ranks reporting, waiting for ranks 1-3"
    assert _line(tmp_path, {}) == "diagnose: 0 of 4 ranks reporting, waiting for ranks 0-3"
    assert _line(tmp_path, {r: {"steps_done": 2} for r in (0, 1, 3)}).endswith("waiting for rank 2")
    assert rank_spans([0, 2, 3, 4, 7]) == "0,2-4,7"


def test_the_progress_line_names_the_rank_the_others_wait_for(tmp_path):
    """Ranks tied on step count name nobody (it said "slowest rank 0" throughout a run
    whose rank 2 was the straggler); the live monitor's arrival lag names rank 2."""
    tied = {r: {"steps_done": 40, "last_step_ms": 650.0} for r in range(4)}
    assert _line(tmp_path, tied) == "diagnose: 4 ranks, step 40, last step 650 ms"
    (tmp_path / LIVE_STATE).write_text(
        json.dumps({"wall_ns": time.time_ns(), "waited_for": {"rank": 2, "lag_ms": 301.4}})
    )
    assert _line(tmp_path, tied) == (
        "diagnose: 4 ranks, step 40, the others wait for rank 2 (+301 ms/step at collectives), last step 650 ms"
    )
    (tmp_path / LIVE_STATE).write_text(
        json.dumps({"wall_ns": time.time_ns() - 60 * 10**9, "waited_for": {"rank": 2, "lag_ms": 301.4}})
    )
    spread = {0: {"steps_done": 40}, 1: {"steps_done": 39}, 2: {"steps_done": 37}, 3: {"steps_done": 40}}
    assert _line(tmp_path, spread) == "diagnose: 4 ranks, step 37-40, behind: rank 2"  # a stale live.json
