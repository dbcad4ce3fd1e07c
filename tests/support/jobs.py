"""How the suite launches jobs and reads what they leave: real processes, real
torchrun (gloo), real files. The fixtures built on these are in tests/conftest.py."""

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data"  # fixtures, each with its SOURCE.txt (tests/data/README.md)
PYTHON = sys.executable
DIAGNOSE = [PYTHON, "-m", "diagnose"]
ARTIFACTS = REPO / "test-artifacts"  # screenshots kept for a person to look at (gitignored)


def fixture_path(*parts) -> Path:
    """A fixture under tests/data; a missing one fails the test module, it does not skip it."""
    path = DATA.joinpath(*parts)
    assert path.exists(), f"fixture {path.relative_to(REPO)} is missing (tests/data/README.md)"
    return path


def load_run(*run_dirs, expected_warnings=(), **options):
    """diagnose.load, failing on a loader warning the test did not expect (one could
    be a part or a detector's input gone missing) and on an expected one that did not
    come. `expected_warnings`: substrings, each matching at least one warning;
    options: load()'s own (engine, max_events)."""
    import diagnose

    warnings = []
    run = diagnose.load(*map(str, run_dirs), warn=warnings.append, **options)
    assert [w for w in warnings if not any(e in w for e in expected_warnings)] == [], warnings
    assert [e for e in expected_warnings if not any(e in w for w in warnings)] == [], warnings
    return run


def job_env(outputs=False, **extra) -> dict:
    """The environment of a job the suite launches. Without `outputs` its analysis
    writes findings.json and the tables only (DIAGNOSE_OUTPUTS=off) and nothing is
    tracked (DIAGNOSE_TRACKING=off): the merged trace, report and MLflow store cost
    ~5 s a job and only the tests of those outputs read them (they pass outputs=True)."""
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.pop("DIAGNOSE_RUN_DIR", None)
    env.pop("MLFLOW_TRACKING_URI", None)
    state = "on" if outputs else "off"
    env.update(DIAGNOSE_OUTPUTS=state, DIAGNOSE_TRACKING=state)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def torchrun(nproc: int, *program, rdzv_standalone=True) -> list:
    launcher = [PYTHON, "-m", "torch.distributed.run"]
    if rdzv_standalone:
        launcher.append("--standalone")
    return [*launcher, "--nproc-per-node", str(nproc), *map(str, program)]


def run_diagnose(args, timeout=300, env=None, check=True) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [*DIAGNOSE, *map(str, args)], cwd=REPO, env=env or job_env(), capture_output=True, text=True, timeout=timeout
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"diagnose {args} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def imported_findings(out, traces) -> list:
    """Kineto traces imported into `out` (a run directory), analyzed: its findings."""
    run_diagnose(["import", "kineto", *traces, "--out", out])
    run_diagnose(["analyze", out, "--quiet"])
    return json.loads((Path(out) / "analysis" / "findings.json").read_text())


# 30 slowed steps (~10 s): the live child runs at idle priority, and with 22 steps (12
# slowed) its alert once came 0.7 s after the job ended on a box busy with other jobs
STRAGGLER_STEPS = 40
