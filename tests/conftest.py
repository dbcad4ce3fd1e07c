"""Shared helpers: real processes, real torchrun (gloo), real files."""
import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data"   # fixtures, each with its SOURCE.txt (tests/data/README.md)
PYTHON = sys.executable
DIAGNOSE = [PYTHON, "-m", "diagnose"]


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
    proc = subprocess.run([*DIAGNOSE, *map(str, args)], cwd=REPO, env=env or job_env(),
                          capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"diagnose {args} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture(scope="session")
def recorded_scenario(tmp_path_factory):
    """name -> (run dir, result) of a recorded scenario run, tests/data/runs/<name>
    (scripts/record_test_runs.py): copied and analyzed in this process as `diagnose
    analyze --no-outputs` would, once per session. result.stdout is what the command
    prints (findings, step figures), result.warnings the loader's warnings."""
    runs = {}

    def analyze(name: str):
        if name not in runs:
            from diagnose.cli.after_run import analyze_run
            from diagnose.cli.console import print_findings, print_step_figures
            out = tmp_path_factory.mktemp("recorded") / name
            shutil.copytree(fixture_path("runs", name), out, ignore=shutil.ignore_patterns("SOURCE.txt"))
            warnings, printed = [], io.StringIO()
            with contextlib.redirect_stdout(printed):
                run, findings = analyze_run([str(out)], outputs=False, warn=warnings.append)
                print_findings(findings)
                print_step_figures(run.step_figures)
            runs[name] = (out, types.SimpleNamespace(stdout=printed.getvalue(), warnings=warnings))
        return runs[name]
    return analyze


def imported_findings(out, traces) -> list:
    """Kineto traces imported into `out` (a run directory), analyzed: its findings."""
    run_diagnose(["import", "kineto", *traces, "--out", out])
    run_diagnose(["analyze", out, "--quiet"])
    return json.loads((Path(out) / "analysis" / "findings.json").read_text())


@pytest.fixture(scope="session")
def ddp_run(tmp_path_factory) -> Path:
    """samples/ddp_mlp.py, 2 ranks, under `diagnose run` (shared by many tests)."""
    out = tmp_path_factory.mktemp("ddp") / "run"
    result = out.parent / "result.json"
    run_diagnose(["run", "--out", out, "--", *torchrun(2, "samples/ddp_mlp.py", "--steps", 12,
                                                       "--result-json", result)], env=job_env(outputs=True))
    return out


# -- reports, tracking, live (issue 6) -----------------------------------------
ARTIFACTS = REPO / "test-artifacts"  # screenshots kept for a person to look at (gitignored)


@pytest.fixture(scope="session")
def browser():
    """Headless Debian chromium over the DevTools protocol (tests/cdp.py)."""
    from cdp import Browser, chromium_available
    if not chromium_available():
        pytest.fail("chromium is missing: `make setup` installs it (apt-get install chromium)")
    with Browser(["--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1"]) as b:
        yield b


# 30 slowed steps (~10 s): the live child runs at idle priority, and with 22 steps (12
# slowed) its alert once came 0.7 s after the job ended on a box busy with other jobs
STRAGGLER_STEPS = 40


@pytest.fixture(scope="session")
def straggler_run(ddp_run) -> dict:
    """samples/ddp_mlp.py with rank 1 slowed down from step 10 of STRAGGLER_STEPS, under `diagnose run`,
    in the same runs root as ddp_run (an existing MLflow store, as a user has),
    while this process polls the store. Returns the run dir, the output, and
    the live step metrics seen in the store while the job ran."""
    import time

    from mlflow.tracking import MlflowClient  # imported before the job starts: polls begin at once
    out = ddp_run.parent / "straggler"
    db = out.parent / "mlflow.db"
    proc = subprocess.Popen([*DIAGNOSE, "run", "--out", str(out), "--",
                             *torchrun(2, "samples/ddp_mlp.py", "--steps", STRAGGLER_STEPS, "--slow-rank", 1,
                                       "--slow-ms", 300, "--slow-from-step", 10)],
                            cwd=REPO, env=job_env(outputs=True), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    polls, client, run_id = [], None, None
    deadline = time.monotonic() + 300
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)  # poll period
        manifest = out / "manifest.json"
        if "end_wall_ns" in (manifest.read_text() if manifest.exists() else ""):
            break  # the job ended; the launcher now analyses
        id_file = out / "mlflow_run_id"
        if run_id is None and id_file.exists() and db.exists():
            run_id = id_file.read_text().strip()
            client = MlflowClient(tracking_uri=f"sqlite:///{db}")
        if client is not None:
            try:
                history = client.get_metric_history(run_id, "live/step_time_p50_ms")
            except Exception:
                continue  # the store is being written
            polls.append({"wall_ns": time.time_ns(), "steps": sorted(m.step for m in history)})
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, f"{stdout}\n{stderr}"
    return {"dir": out, "stdout": stdout, "stderr": stderr, "polls": polls, "run_id": run_id}


def pytest_collection_modifyitems(items):
    """Under pytest-xdist (`--dist loadgroup`) a fixture is made once per worker that
    uses it: every test that reads the shared DDP runs goes to one worker, and the
    other tests go with their module (whose module-scoped launches are then made
    once). Serially this is a no-op."""
    for item in items:
        shared = {"ddp_run", "straggler_run"} & set(getattr(item, "fixturenames", ()))
        item.add_marker(pytest.mark.xdist_group("ddp_runs" if shared else item.module.__name__))
