"""What every campaign file under bench/results/ starts with (the day, the commit,
the command that made it) and how it is written."""

import datetime
import os
import subprocess
import sys
from pathlib import Path

# a campaign's jobs: one thread per rank, findings and tables only, no tracking
QUIET_ENV = {**os.environ, "OMP_NUM_THREADS": "1", "DIAGNOSE_OUTPUTS": "off", "DIAGNOSE_TRACKING": "off"}


def stamp(repo: Path) -> tuple[str, str]:
    """(today as YYYY-MM-DD, the short commit measured)."""
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True
    ).stdout.strip()
    return datetime.date.today().isoformat(), commit


def write(repo: Path, slug: str, title: str, command: str, body: list) -> Path:
    """bench/results/<date>-<slug>.md: a title with the day and commit, the command
    (run on the 2-core VM with nothing else running), then `body`; printed too."""
    date, commit = stamp(repo)
    text = [
        f"# {title} ({date}, at {commit})",
        "",
        f"`{command}` on the 2-core VM, nothing else running (what and how: the script's docstring).",
        "",
        *body,
    ]
    path = repo / "bench" / "results" / f"{date}-{slug}.md"
    path.write_text("\n".join(text) + "\n")
    print("\n".join(text))
    print(f"wrote {path.relative_to(repo)}")
    return path


def run_trainer(repo: Path, out: Path, nproc: int, argv: list) -> None:
    """The reference trainer on `nproc` ranks under `diagnose run --out out`; a failed
    job stops the campaign with its output's tail."""
    py = sys.executable
    proc = subprocess.run(
        [
            py,
            "-m",
            "diagnose",
            "run",
            "--out",
            str(out),
            "--",
            py,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            str(nproc),
            "-m",
            "reference_trainer",
            *argv,
        ],
        cwd=repo,
        env=QUIET_ENV,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if proc.returncode != 0:
        raise SystemExit(f"{argv}: exited {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
