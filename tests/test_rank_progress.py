"""Issue 25 (progress): `diagnose analyze` on a run with more than a few dozen ranks
shows a bar over the ranks as it reads them, on a terminal; the loader reports
each rank read, in order of completion, to whoever asks (on_rank)."""
import os
import pty
import select
import subprocess

import diagnose
from conftest import DIAGNOSE, REPO, job_env
from synthetic_run import write_synthetic_run

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
    proc = subprocess.Popen([*DIAGNOSE, "analyze", run_dir, "--quiet", "--no-outputs"], cwd=REPO,
                            env=job_env(COLUMNS="120"), stdout=subprocess.DEVNULL, stderr=slave)
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
