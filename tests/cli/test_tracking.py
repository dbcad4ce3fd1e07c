"""Issue 6: one MLflow run per diagnose run, in the embedded sqlite store next to
the runs, and the MLflow UI (`diagnose ui`) that shows it, checked in a browser."""

import json
import math
import os
import signal
import socket
import subprocess
import time
import urllib.parse
import urllib.request

import pytest
from mlflow.tracking import MlflowClient

import diagnose
from diagnose.analysis.detectors import finding_kinds
from diagnose.exporters import mlflow_run as tracking
from diagnose.exporters import mlflow_store
from tests.support.jobs import ARTIFACTS, DIAGNOSE, REPO, job_env


def client_of(run_dir) -> MlflowClient:
    return MlflowClient(tracking_uri=f"sqlite:///{run_dir.parent / 'mlflow.db'}")


def test_wrapped_job_has_one_mlflow_run_with_params_metrics_tags_artifacts(ddp_run):
    client = client_of(ddp_run)
    experiment = client.get_experiment_by_name("diagnose")
    assert experiment is not None
    runs = client.search_runs([experiment.experiment_id])
    run_id = (ddp_run / "mlflow_run_id").read_text().strip()
    assert [r.info.run_id for r in runs if r.data.tags.get("diagnose.run_dir") == str(ddp_run)] == [run_id]
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags["diagnose.live"] == "done"  # a short job closes the live stream before it says "running"
    assert run.info.run_name == "run"
    params = run.data.params
    assert params["world_size"] == "2"
    assert "samples/ddp_mlp.py --steps 12" in params["command"]
    assert "layout" in params
    # per-step metrics from the analysis, and the live ones streamed while it ran
    for key in ("step_time_p50_ms", "step_time_max_ms", "data_wait_frac", "exposed_comm_frac"):
        history = client.get_metric_history(run_id, key)
        assert sorted(m.step for m in history) == list(range(12)), key
    p50 = {m.step: m.value for m in client.get_metric_history(run_id, "step_time_p50_ms")}
    assert all(v > 0 for v in p50.values())
    assert len(client.get_metric_history(run_id, "live/step_time_p50_ms")) >= 10
    assert run.data.metrics["summary/step_time_median_ms"] > 0
    # findings as tags
    findings = json.loads((ddp_run / "analysis" / "findings.json").read_text())
    tags = run.data.tags
    assert tags["findings.count"] == str(len(findings))
    for f in findings:
        assert f"finding.{f['kind']}" in tags
    # metrics to chart across runs: each phase's ms per step, each kind's impact (0 when absent)
    metrics = run.data.metrics
    assert metrics["summary/forward_ms_per_step"] > 0 and metrics["summary/backward_ms_per_step"] > 0
    assert "summary/exposed_comm_ms_per_step" in metrics and "summary/data_wait_ms_per_step" in metrics
    for kind in finding_kinds.names():
        worst = max([f["impact_ms_per_step"] for f in findings if f["kind"] == kind], default=0.0)
        assert metrics[f"finding/{kind}_impact_ms_per_step"] == pytest.approx(worst), kind
    # where the step goes (issue 48): the findings' shares and the rest add up to the step
    waterfall = json.loads((ddp_run / "analysis" / "step_figures.json").read_text())["waterfall"]
    shares = {k: v for k, v in metrics.items() if k.startswith("waterfall/")}
    assert shares["waterfall/rest_frac"] == pytest.approx(waterfall["rest_frac"])
    kinds = [share["kind"] for share in waterfall["shares"]]
    assert len(kinds) == len(set(kinds)) and {f"waterfall/{k}_frac" for k in kinds} <= set(shares)
    assert sum(shares.values()) == pytest.approx(1.0)
    # the run's Description: layout, world size, step time, the top findings
    note = tags["mlflow.note.content"]
    assert note.startswith("**diagnose**: 2 ranks, layout") and "ms (median rank" in note, note
    # the three artifacts, byte for byte
    artifacts = {a.path for a in client.list_artifacts(run_id)}
    assert {"report.html", "findings.json", "trace.json.gz"} <= artifacts
    local = client.download_artifacts(run_id, "findings.json", str(ddp_run.parent / "dl"))
    assert json.loads(open(local).read()) == findings


def test_analysing_again_updates_the_same_mlflow_run(ddp_run, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("DIAGNOSE_TRACKING", raising=False)
    client = client_of(ddp_run)
    run_id = (ddp_run / "mlflow_run_id").read_text().strip()
    before = len(client.get_metric_history(run_id, "step_time_p50_ms"))
    run = diagnose.load(ddp_run)
    assert tracking.log_run(run, run.findings) == run_id
    assert len(client.get_metric_history(run_id, "step_time_p50_ms")) == before
    runs = client.search_runs([client.get_experiment_by_name("diagnose").experiment_id])
    assert [r.info.run_id for r in runs if r.data.tags.get("diagnose.run_dir") == str(ddp_run)] == [run_id]


def test_tracking_uri_honours_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert mlflow_store.tracking_uri(str(tmp_path / "runs" / "r1")) == f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:1")
    assert mlflow_store.tracking_uri(str(tmp_path / "runs" / "r1")) == "http://127.0.0.1:1"
    monkeypatch.setenv("DIAGNOSE_TRACKING", "off")
    assert tracking.log_run(object(), []) is None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_http(url: str, timeout: float, proc) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"diagnose ui exited {proc.returncode}: {proc.stdout.read()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)  # poll period
    raise AssertionError(f"{url} did not come up in {timeout} s")


@pytest.fixture(scope="module")
def mlflow_ui(ddp_run):
    # the port is free when picked and may be taken before the server binds it
    # (bind-then-close): a server that exits with the port in use starts again on another
    for attempt in range(3):
        port = _free_port()
        proc = subprocess.Popen(
            [*DIAGNOSE, "ui", "--port", str(port), "--runs-root", str(ddp_run.parent)],
            cwd=REPO,
            env=job_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        # the link diagnose ui prints (before MLflow's own output)
        printed = [proc.stdout.readline(), proc.stdout.readline()]
        try:
            _wait_http(f"http://127.0.0.1:{port}/health", 120, proc)
            break
        except AssertionError as exc:
            if "in use" not in str(exc) or attempt == 2:
                _stop(proc)
                raise
    try:
        link = next((line[line.index("http") :].strip() for line in printed if "model-training view" in line), None)
        yield {"url": f"http://127.0.0.1:{port}", "link": link, "printed": printed}
    finally:
        _stop(proc)


def _stop(proc) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


@pytest.fixture
def fresh_browser():
    """Issue 26's browser tests each start from a fresh profile: no view chosen,
    nothing in the browser's storage."""
    from tests.support.cdp import Browser

    with Browser(["--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1"]) as b:
        yield b


def test_the_printed_link_opens_the_training_view_and_the_runs_overview(ddp_run, mlflow_ui, fresh_browser):
    ui = mlflow_ui["url"]
    run_id = (ddp_run / "mlflow_run_id").read_text().strip()
    experiment_id = client_of(ddp_run).get_experiment_by_name("diagnose").experiment_id
    assert mlflow_ui["link"] == f"{ui}/#/experiments/{experiment_id}?workflowType=machine_learning", mlflow_ui[
        "printed"
    ]
    page = fresh_browser.page()
    try:
        page.navigate(mlflow_ui["link"])
        page.wait_for("document.body.innerText.includes('run')", timeout=90)
        page.pump(2)
        text = page.evaluate("document.body.innerText")
        # the training view lists runs and models; the GenAI view offers judges and evaluation runs
        assert "Models" in text and "Evaluation runs" not in text and "Judges" not in text, text[:800]
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(str(ARTIFACTS / "mlflow-experiment.png"), full_page=False)
        page.navigate(f"{ui}/#/experiments/{experiment_id}/runs/{run_id}?workflowType=machine_learning")
        page.wait_for("document.body.innerText.includes('world_size')", timeout=90)
        text = page.evaluate("document.body.innerText")
        assert "run" in text and "step_time_p50_ms" in text and "findings.count" in text
        assert "diagnose: 2 ranks, layout" in text, text[:2000]  # the Description
        page.screenshot(str(ARTIFACTS / "mlflow-run.png"), full_page=False)
    finally:
        page.close()


def test_the_report_renders_with_its_figures_in_the_artifact_preview(ddp_run, mlflow_ui, fresh_browser):
    ui = mlflow_ui["url"]
    run_id = (ddp_run / "mlflow_run_id").read_text().strip()
    experiment_id = client_of(ddp_run).get_experiment_by_name("diagnose").experiment_id
    page = fresh_browser.page()
    try:
        # the run's artifacts, as the UI lists them
        page.navigate(f"{ui}/#/experiments/{experiment_id}/runs/{run_id}?workflowType=machine_learning")
        listed = page.evaluate(f"""fetch('{ui}/ajax-api/2.0/mlflow/artifacts/list?run_id={run_id}')
            .then(r => r.json()).then(j => j.files.map(f => f.path))""")
        assert {"report.html", "findings.json", "trace.json.gz"} <= set(listed)
        # the preview: a sandboxed iframe in a process of its own, attached to read what it shows
        page.attach_frames()
        page.navigate(f"{ui}/#/experiments/{experiment_id}/runs/{run_id}/artifacts/report.html")
        shown = _preview(page, "diagnose report: run", timeout=90)
        assert shown["figures"] >= 6 and shown["drawn"] == shown["figures"], shown
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(str(ARTIFACTS / "mlflow-artifact-report.png"), full_page=False)
    finally:
        page.close()


def test_the_compare_view_lists_each_findings_impact_for_two_runs(ddp_run, straggler_run, mlflow_ui, fresh_browser):
    client = client_of(ddp_run)
    experiment_id = client.get_experiment_by_name("diagnose").experiment_id
    ids = [(d / "mlflow_run_id").read_text().strip() for d in (ddp_run, straggler_run["dir"])]
    straggler = client.get_run(ids[1]).data.metrics["finding/straggler_impact_ms_per_step"]
    assert straggler > 0
    page = fresh_browser.page()
    try:
        runs, experiments = (urllib.parse.quote(json.dumps(x)) for x in (ids, [experiment_id]))
        page.navigate(f"{mlflow_ui['url']}/#/compare-runs?runs={runs}&experiments={experiments}")
        page.wait_for("document.body.innerText.includes('finding/')", timeout=90)
        page.pump(2)
        text = _all_rows_text(page)
        for kind in finding_kinds.names():
            assert f"finding/{kind}_impact_ms_per_step" in text, kind
        # the values follow the names: the straggler run's impact among them, as the UI rounds it
        assert _as_mlflow_shows(straggler) in text, (straggler, text[-1500:])
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(str(ARTIFACTS / "mlflow-compare.png"), full_page=True)
    finally:
        page.close()


def _as_mlflow_shows(value: float) -> str:
    """A metric value as the UI prints it (its Utils.formatMetric): 340.966 shows as "341"."""
    if value == 0:
        return "0"
    if abs(value) < 1e-3:
        mantissa, exponent = f"{value:.3e}".split("e")
        return f"{mantissa}e{int(exponent):+d}"
    scale = 1000 if abs(value) < 10 else 100 if abs(value) < 100 else 10
    shown = math.floor(value * scale + 0.5) / scale  # JavaScript's Math.round: halves go up
    return str(int(shown)) if shown == int(shown) else str(shown)


def _all_rows_text(page) -> str:
    """The page's text with every scrolling table scrolled through: the compare view
    draws only the rows in view, and other tests' compare/* metrics push finding/*
    rows down."""
    return page.evaluate("""(async () => {
        const seen = [document.body.innerText];
        const boxes = Array.from(document.querySelectorAll('*')).filter(e =>
            e.scrollHeight > e.clientHeight + 20 && ['auto', 'scroll'].includes(getComputedStyle(e).overflowY));
        for (const box of boxes) {
            for (let y = 0; y <= box.scrollHeight; y += Math.max(box.clientHeight / 2, 50)) {
                box.scrollTop = y;
                await new Promise(r => setTimeout(r, 60));
                seen.push(document.body.innerText);
            }
        }
        return seen.join('\\n');
    })()""")


def _preview(page, title: str, timeout: float) -> dict:
    """What the artifact preview's iframe shows once its text has the title and its
    loader has drawn every figure: {"figures": divs, "drawn": divs with an SVG}."""
    probe = """(() => ({text: document.body ? document.body.innerText.slice(0, 400) : '',
        done: document.body && document.body.getAttribute('data-figures-drawn') === 'all',
        figures: document.querySelectorAll('.plotly-graph-div').length,
        drawn: Array.from(document.querySelectorAll('.plotly-graph-div')).filter(d => d.querySelector('.main-svg')).length}))()"""
    deadline = time.monotonic() + timeout
    seen = None
    while time.monotonic() < deadline:
        page.pump(0.25)
        for session, info in list(page.frames.items()):
            if info.get("type") != "iframe":
                continue
            try:
                seen = page.frame_evaluate(session, probe, timeout=10)
            except (RuntimeError, TimeoutError):
                continue  # the frame is still loading, or went away
            if seen and title in seen["text"] and seen["done"]:
                return seen
    raise AssertionError(f"the preview did not show the report with its figures in {timeout} s: {seen}")
