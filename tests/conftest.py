"""Shared helpers: real processes, real torchrun (gloo), real files."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
PYTHON = sys.executable
DIAGNOSE = [PYTHON, "-m", "diagnose"]


def job_env(**extra) -> dict:
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.pop("DIAGNOSE_RUN_DIR", None)
    env.pop("MLFLOW_TRACKING_URI", None)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def torchrun(nproc: int, *program, rdzv_standalone=True) -> list:
    launcher = [PYTHON, "-m", "torch.distributed.run"]
    if rdzv_standalone:
        launcher.append("--standalone")
    return [*launcher, "--nproc-per-node", str(nproc), *map(str, program)]


def run_diagnose(args, timeout=300, env=None, check=True) -> subprocess.CompletedProcess:
    proc = subprocess.run([*DIAGNOSE, *map(str, args)], cwd=REPO, env=env or job_env(),
                          capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"diagnose {args} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture(scope="session")
def ddp_run(tmp_path_factory) -> Path:
    """samples/ddp_mlp.py, 2 ranks, under `diagnose run` (shared by many tests)."""
    out = tmp_path_factory.mktemp("ddp") / "run"
    result = out.parent / "result.json"
    run_diagnose(["run", "--out", out, "--", *torchrun(2, "samples/ddp_mlp.py", "--steps", 12,
                                                       "--result-json", result)])
    return out
