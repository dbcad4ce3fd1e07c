"""The suite's shared fixtures (session-wide runs, a browser) and its xdist grouping.
The helpers they are built on are in tests/support/jobs.py."""

import contextlib
import io
import shutil
import subprocess
import types
from pathlib import Path

import pytest

pytest.register_assert_rewrite("tests.support")  # the helpers' asserts explain themselves, as a test's do
from tests.support.jobs import DIAGNOSE, REPO, STRAGGLER_STEPS, fixture_path, job_env, run_diagnose, torchrun  # noqa: E402


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


@pytest.fixture(scope="session")
def ddp_run(tmp_path_factory) -> Path:
    """samples/ddp_mlp.py, 2 ranks, under `diagnose run` (shared by many tests)."""
    out = tmp_path_factory.mktemp("ddp") / "run"
    result = out.parent / "result.json"
    run_diagnose(
        ["run", "--out", out, "--", *torchrun(2, "samples/ddp_mlp.py", "--steps", 12, "--result-json", result)],
        env=job_env(outputs=True),
    )
    return out


@pytest.fixture(scope="session")
def browser():
    """Headless Debian chromium over the DevTools protocol (tests/support/cdp.py)."""
    from tests.support.cdp import Browser, chromium_available

    if not chromium_available():
        pytest.fail("chromium is missing: `make setup` installs it (apt-get install chromium)")
    with Browser(["--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1"]) as b:
        yield b


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
    proc = subprocess.Popen(
        [
            *DIAGNOSE,
            "run",
            "--out",
            str(out),
            "--",
            *torchrun(
                2,
                "samples/ddp_mlp.py",
                "--steps",
                STRAGGLER_STEPS,
                "--slow-rank",
                1,
                "--slow-ms",
                300,
                "--slow-from-step",
                10,
            ),
        ],
        cwd=REPO,
        env=job_env(outputs=True),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
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


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    """Under pytest-xdist (`--dist loadgroup`) a fixture is made once per worker that
    uses it: every test that reads the shared DDP runs goes to one worker, and the
    other tests go with their module (whose module-scoped launches are then made
    once). Serially this is a no-op. First among the hooks: xdist's worker reads
    the marks in its own hook (it suffixes each test id with its group), and a mark
    added after it groups nothing (tests/test_suite_grouping.py)."""
    for item in items:
        shared = {"ddp_run", "straggler_run"} & set(getattr(item, "fixturenames", ()))
        item.add_marker(pytest.mark.xdist_group("ddp_runs" if shared else item.module.__name__))
    # Groups go to the workers in collection order, each to the first free one: the
    # longest first, so the last ones handed out are short (tests/trainer/test_trainer.py,
    # 111 s, was collected near the end: one worker ran it while the other had run out)
    first = {name: i for i, name in enumerate(LONGEST_GROUPS)}
    group = {id(item): item.get_closest_marker("xdist_group").args[0] for item in items}
    items.sort(key=lambda item: first.get(group[id(item)], len(first)))


# By their test time on 2026-12-06 (`--durations=0`, summed per group), longest first;
# the other groups follow in collection order
LONGEST_GROUPS = (
    "ddp_runs",
    "tests.trainer.test_trainer",
    "tests.cli.test_user_script",
    "tests.interop.test_titan_style",
    "tests.cli.test_failures",
    "tests.analysis.test_analysis_engines",
    "tests.interop.test_modern_stacks",
    "tests.live.test_flight_recorder_live",
    "tests.collectors.test_recording",
    "tests.cli.test_launchers",
    "tests.trainer.test_scenarios",
    "tests.collectors.test_job_safety",
    "tests.trainer.test_trainer_real_trace_mode",
    "tests.analysis.test_scaling",
)
