"""Issue 6: report.html renders offline in a real browser, stays small for long
runs, shows trace strings as text, and `diagnose compare` explains a change."""

import json
import os
import shutil

import pyarrow.parquet as pq
import pytest
from plotly.offline import get_plotlyjs

import diagnose
from collectors.part_writer import atomic_write_json
from collectors.schema import event_row, events_table
from dashboards.report_page import write_report
from tests.support.jobs import ARTIFACTS, job_env, run_diagnose
from tests.support.synthetic_run import write_synthetic_run

ALL_FIGURES_DRAWN = """(() => {
  const divs = Array.from(document.querySelectorAll('.plotly-graph-div'));
  return divs.length > 0 && divs.every(d => d.querySelector('.main-svg'));
})()"""
XSS = "<script>alert(1)</script>"
IMG_XSS = '<img src=x onerror="window.__xss=1">'


def open_offline(browser, path):
    page = browser.page()
    page.offline()
    page.navigate(path.as_uri() if hasattr(path, "as_uri") else f"file://{path}")
    page.wait_for(ALL_FIGURES_DRAWN, timeout=90)
    page.pump(0.5)
    return page


def figure_ids(page) -> list:
    return page.evaluate("Array.from(document.querySelectorAll('.plotly-graph-div')).map(d => d.id)")


def assert_offline_and_clean(page):
    assert page.console_errors == [], page.console_errors
    fetched = [u for u in page.requests if not u.startswith(("file://", "data:", "blob:"))]
    assert fetched == [], f"the report fetched from the network: {fetched}"
    assert page.dialogs == []


def test_report_of_a_real_run_renders_offline_in_chromium(ddp_run, browser):
    report = ddp_run / "report.html"
    assert report.exists(), "diagnose run writes report.html after the analysis"
    html = report.read_text()
    assert html.count('class="diagnose-figure"') >= 6
    plotly_js = get_plotlyjs()
    assert html.count(plotly_js) == 1, "plotly.js embedded once"
    # the text comes before plotly.js (MLflow's preview showed nothing while it loaded)
    assert html.index("Findings") < html.index(plotly_js)
    assert "cdn.plot.ly" not in html.replace(plotly_js, "")
    # a CPU/gloo run: every figure is host time, and the report says so
    assert "host clocks (the work runs on the host: CPU/gloo)" in html and "<td>GPU</td>" not in html
    page = open_offline(browser, report)
    try:
        ids = figure_ids(page)
        for expected in (
            "breakdown-ranks",
            "breakdown-steps",
            "timeline",
            "heat-busy",
            "heat-wait-suffered",
            "heat-wait-caused",
            "collectives",
            "data-wait",
            "samples",
        ):
            assert f"fig-{expected}" in ids
        # every figure drew its SVG and every finding links to a section that exists
        assert page.evaluate("""Array.from(document.querySelectorAll('a[href^="#"]'))
            .every(a => document.getElementById(a.getAttribute('href').slice(1)))""")
        assert_offline_and_clean(page)
        ARTIFACTS.mkdir(exist_ok=True)
        shot = page.screenshot(str(ARTIFACTS / "report-ddp.png"))
        assert os.path.getsize(shot) > 50_000
    finally:
        page.close()


def test_long_pipelined_run_report_is_small_and_draws_every_view(tmp_path, browser):
    """8 ranks x 1,000 steps (DP 2 x PP 4, one slow rank), as bench/report_size.py."""
    run_dir = write_synthetic_run(str(tmp_path / "long"), ranks=8, steps=1000, pp=4, slow_rank=3, slow_factor=1.3)
    run = diagnose.load(run_dir)
    findings = [
        {
            "kind": "stage_imbalance",
            "severity": "warning",
            "title": "stage 1 is heavier",
            "ranks": [2, 3],
            "stage": 1,
            "callsite": None,
            "metrics": {"x_frac": 0.3},
            "recommendation": "move a layer",
            "impact_ms_per_step": 9.0,
        }
    ]
    path = write_report(run, findings)
    size_mb = os.path.getsize(path) / 2**20
    assert size_mb < 10, f"report of 8 ranks x 1000 steps is {size_mb:.1f} MB"
    page = open_offline(browser, tmp_path / "long" / "report.html")
    try:
        ids = figure_ids(page)
        assert {"fig-pipeline", "fig-pipeline-stages", "fig-heat-busy", "fig-samples"} <= set(ids)
        # the pipeline schedule shows forward and backward blocks and the bubbles between them
        names = page.evaluate("document.getElementById('fig-pipeline').data.map(t => t.name)")
        assert {"forward", "backward", "bubble (idle)"} <= set(names)
        # the finding links to its evidence: the per-stage view
        assert (
            page.evaluate("document.querySelector('#finding-0 a.evidence').getAttribute('href')") == "#pipeline-stages"
        )
        assert_offline_and_clean(page)
        page.screenshot(str(ARTIFACTS / "report-synthetic-8x1000.png"))
    finally:
        page.close()


def test_trace_strings_show_as_text_never_markup(ddp_run, tmp_path, browser):
    copy = tmp_path / "hostile"
    shutil.copytree(ddp_run, copy, ignore=shutil.ignore_patterns("mlflow_run_id", "report.html"))
    run = diagnose.load(copy)
    steady = run.steady_steps()
    step = steady[len(steady) // 2]
    rank0 = run.steps()[(run.steps()["rank"] == 0) & (run.steps()["step"] == step)].iloc[0]
    # back to rank 0's own clock: the loader shifted by t0 (and rank 0's offset is 0)
    start = int(rank0["start_ns"]) + run.t0_ns + (run.offsets_ns.get(0, 0))
    rank_dir = copy / "traces" / "rank-00000"
    pq.write_table(
        events_table(
            [
                event_row("phase", XSS, start, start + 30_000_000, step=step),
                event_row("mark", IMG_XSS, start + 1_000_000, start + 1_000_000, step=step, detail=XSS),
            ]
        ),
        rank_dir / "events-999999.parquet",
    )
    meta = json.loads((rank_dir / "meta.json").read_text())
    meta["host"] = IMG_XSS
    atomic_write_json(str(rank_dir / "meta.json"), meta)
    atomic_write_json(
        str(copy / "analysis" / "findings.json"),
        [
            {
                "kind": "hidden_sync",
                "severity": "critical",
                "title": f"sync at {XSS}",
                "ranks": [0],
                "stage": None,
                "callsite": f"{IMG_XSS}.py:1",
                "metrics": {XSS: 1.0, "whatif_step_ms": 10.0, "whatif_saving_ms_per_step": 5.0},
                "recommendation": IMG_XSS,
                "impact_ms_per_step": 5.0,
            }
        ],
    )
    run_diagnose(["report", copy, "--steps", f"{step}-{step}"])
    page = open_offline(browser, copy / "report.html")
    try:
        # no injected script ran, no injected element exists
        assert page.dialogs == [] and page.evaluate("window.__xss === undefined")
        n_figures = len(figure_ids(page))
        # the only scripts: each figure's JSON (data), plotly.js and the loader that draws them
        assert page.evaluate("""Array.from(document.scripts).map(s => s.type)""") == (
            ["application/json"] * n_figures + ["text/javascript"] * 2
        )
        assert page.evaluate("document.querySelectorAll('img').length") == 0
        # ... and the strings are there, as text
        text = page.evaluate("document.body.innerText")
        assert f"sync at {XSS}" in text and IMG_XSS in text
        # in the plotly timeline: the range's label and its hover text are text nodes too
        assert page.evaluate(f"""Array.from(document.querySelectorAll('#fig-timeline text'))
            .some(t => t.textContent === {json.dumps(XSS)})""")
        hover = page.evaluate("""(() => {
            const gd = document.getElementById('fig-timeline');
            for (let c = 0; c < gd.data.length; c++) {
              const texts = gd.data[c].hovertext || [];
              for (let p = 0; p < texts.length; p++) if (String(texts[p]).includes('script'))
                { Plotly.Fx.hover(gd, [{curveNumber: c, pointNumber: p}]); break; }
            }
            const layer = gd.querySelector('.hoverlayer');
            return {text: layer.textContent, scripts: layer.querySelectorAll('script').length};
        })()""")
        assert XSS in hover["text"] and hover["scripts"] == 0
        # the what-if view's bar for the finding is labelled with its callsite, as text
        assert page.evaluate(f"""Array.from(document.querySelectorAll('#fig-whatif text'))
            .some(t => t.textContent.includes({json.dumps(IMG_XSS)}))""")
        assert page.evaluate("window.__xss === undefined") and page.dialogs == []
        assert page.console_errors == []
        page.screenshot(str(ARTIFACTS / "report-hostile-strings.png"), full_page=False)
    finally:
        page.close()


def test_whatif_view_shows_each_findings_step_beside_the_measured_one(straggler_run, browser):
    """Issue 23: per finding, the step time with its cause removed, beside the
    measured, replayed and ideal step, on one axis (the figures of the analysis)."""
    run_dir = straggler_run["dir"]
    figures = json.loads((run_dir / "analysis" / "step_figures.json").read_text())
    findings = json.loads((run_dir / "analysis" / "findings.json").read_text())
    (straggler,) = [f for f in findings if f["kind"] == "straggler"]
    page = open_offline(browser, run_dir / "report.html")
    try:
        bars = page.evaluate("""(() => { const t = document.getElementById('fig-whatif').data[0];
            return Object.fromEntries(t.y.map((label, i) => [label, t.x[i]])); })()""")
        assert bars["measured"] == pytest.approx(figures["measured_step_ms"])
        assert bars["replayed"] == pytest.approx(figures["replay_step_ms"])
        assert bars["ideal"] == pytest.approx(figures["ideal_step_ms"])
        assert bars["without straggler (rank 1)"] == pytest.approx(straggler["metrics"]["whatif_step_ms"])
        assert bars["without straggler (rank 1)"] < bars["replayed"]
        # issue 48: where the step goes, in % adding up to the step: the straggler's share, the rest
        steps = page.evaluate("""(() => { const t = document.getElementById('fig-waterfall').data[0];
            return Object.fromEntries(t.x.map((label, i) => [label, t.y[i]])); })()""")
        waterfall = figures["waterfall"]
        assert steps["straggler (rank 1)"] == pytest.approx(100 * waterfall["shares"][0]["share_frac"])
        assert sum(v for label, v in steps.items() if label != "step") == pytest.approx(100.0)
        assert steps["not explained by any finding"] == pytest.approx(100 * waterfall["rest_frac"])
        assert_offline_and_clean(page)
    finally:
        page.close()


def test_report_command_rejects_steps_not_recorded(ddp_run):
    proc = run_diagnose(["report", ddp_run, "--steps", "500-510"], check=False)
    assert proc.returncode == 2
    assert "no such step" in proc.stderr


def test_compare_shows_straggler_gained_and_step_time_change(ddp_run, straggler_run, tmp_path, browser):
    html = tmp_path / "compare.html"
    proc = run_diagnose(["compare", ddp_run, straggler_run["dir"], "--html", html], env=job_env(outputs=True))
    out = proc.stdout
    assert ("gained" in out or "changed" in out) and "straggler" in out, out
    # logged to the later run (the straggler run): its baseline named, the comparison as artifacts
    from mlflow.tracking import MlflowClient

    from diagnose.exporters.mlflow_store import tracking_uri

    client = MlflowClient(tracking_uri=tracking_uri(str(straggler_run["dir"])))
    later = client.get_run((straggler_run["dir"] / "mlflow_run_id").read_text().strip())
    assert later.data.tags["diagnose.compare.baseline"] == str(ddp_run), later.data.tags
    assert later.data.tags["diagnose.compare.baseline_run_id"] == (ddp_run / "mlflow_run_id").read_text().strip()
    assert later.data.metrics["compare/step_time_ratio"] > 1.5
    logged = {f.path for f in client.list_artifacts(later.info.run_id, "compare")}
    assert logged == {f"compare/vs-{ddp_run.name}.json", f"compare/vs-{ddp_run.name}.html"}, logged
    result = json.loads(run_diagnose(["compare", ddp_run, straggler_run["dir"], "--json"]).stdout)
    findings = result["findings"]
    # the fault's straggler is new, or (a busy 2-core box gave the clean run a rank-1
    # straggler of its own once) kept and at least twice as dear
    worse = [p["b"] for p in findings["changed"] if p["b"]["impact_ms_per_step"] >= 2 * p["a"]["impact_ms_per_step"]]
    assert any(f["kind"] == "straggler" and f["ranks"] == [1] for f in findings["gained"] + worse), findings
    # a straggler the clean run lost: only one its cores made (its neighbours' jobs kept
    # a rank off a core: "cpu contention", as the suite's clean-run test allows)
    lost = [f for f in findings["lost"] if f["kind"] == "straggler"]
    assert all(f["metrics"].get("cause") == "cpu contention" for f in lost), lost
    assert result["step_time"]["ratio"] > 1.5, result["step_time"]
    # the slow rank's extra time is its own (uninstrumented sleep: "other"), the other waits
    parts = {p["part"]: p for p in result["parts"]}
    assert parts["other"]["delta_ms"] + parts["exposed_comm"]["delta_ms"] > 100
    page = open_offline(browser, html)
    try:
        assert {"fig-compare-steps", "fig-compare-parts"} <= set(figure_ids(page))
        assert "straggler" in page.evaluate("document.querySelector('table.findings').innerText")
        assert_offline_and_clean(page)
    finally:
        page.close()


def test_compare_calls_a_kept_finding_changed_on_severity_or_a_2x_impact():
    from diagnose.analysis.compare.run_compare import compare

    def summary(findings):
        return {
            "root": "r",
            "name": "r",
            "world_size": 2,
            "step_ms": 50.0,
            "mean_step_ms": 50.0,
            "slowest_step_ms": 50.0,
            "parts": {},
            "per_step": [],
            "findings": findings,
        }

    def finding(kind, severity, impact):
        return {"kind": kind, "ranks": [1], "severity": severity, "impact_ms_per_step": impact, "title": kind}

    a = summary(
        [
            finding("straggler", "critical", 14.0),
            finding("bubble", "warning", 5.0),
            finding("data_stall", "warning", 0.2),
            finding("host_sync", "warning", 8.0),
        ]
    )
    b = summary(
        [
            finding("straggler", "critical", 600.0),
            finding("bubble", "warning", 9.0),
            finding("data_stall", "warning", 0.9),
            finding("host_sync", "critical", 8.0),
        ]
    )
    changed = {p["b"]["kind"]: p["change"] for p in compare(a, b)["findings"]["changed"]}
    assert changed == {
        "straggler": "critical -> critical, impact 14.0 -> 600.0 ms/step",
        "host_sync": "warning -> critical",
    }  # 1.8x, and +0.7 ms, are the same


@pytest.mark.parametrize(
    "window,findings,expected",
    [
        (None, [], "steady steps 6-8"),
        ((3, 4), [], "steps 3-4"),
        (
            None,
            [{"kind": "hang", "severity": "critical", "title": "rank 2 never arrived"}],
            "the end of the run (steps 10-11 and after)",
        ),
    ],
)
def test_timeline_window_default_chosen_and_at_a_hang(tmp_path, window, findings, expected):
    run_dir = write_synthetic_run(str(tmp_path / "small"), ranks=4, steps=12, pp=2)
    run = diagnose.load(run_dir)
    from dashboards.report_page import render

    assert expected in render(run, findings, window_steps=window)


def test_waiting_is_charged_to_the_last_arriver():
    import pandas as pd

    from diagnose.analysis.tables.step_tables import arrival_skew, waits_caused, waits_suffered

    ms = 1_000_000
    arrivals = pd.DataFrame(
        {  # 3 ranks, 2 all-reduces; rank 2 is 10 ms late at the first
            "group": ["0"] * 6,
            "seq": [0, 0, 0, 1, 1, 1],
            "name": ["all_reduce"] * 6,
            "rank": [0, 1, 2, 0, 1, 2],
            "step": [5] * 6,
            "members": [3] * 6,
            "arrival_ns": [0, 2 * ms, 10 * ms, 20 * ms, 21 * ms, 20 * ms],
        }
    )
    last = arrivals.groupby("seq")["arrival_ns"].transform("max")
    arrivals["last_rank"] = [2, 2, 2, 1, 1, 1]
    arrivals["wait_ms"] = (last - arrivals["arrival_ns"]) / ms
    caused = waits_caused(arrivals).set_index("rank")["wait_ms"].to_dict()
    assert caused == {2: 18.0, 1: 2.0}
    suffered = waits_suffered(arrivals).set_index("rank")["wait_ms"].to_dict()
    assert suffered == {0: 11.0, 1: 8.0, 2: 1.0}
    skew = arrival_skew(arrivals).set_index("seq")["skew_ms"].to_dict()
    assert skew == {0: 10.0, 1: 1.0}


def test_bubble_frac_has_one_definition_in_the_report_metrics_and_summary(tmp_path):
    """Idle over schedule window, whether per step (MLflow metric), per stage (the
    report's pipeline view) or over the steady steps (summary/bubble_frac)."""
    from dashboards.fig_pipeline import per_stage
    from diagnose.analysis.tables.step_tables import bubbles, pipeline_blocks, steady, step_summary
    from diagnose.exporters.mlflow_metrics import summary_metrics

    run = diagnose.load(write_synthetic_run(str(tmp_path / "pp"), ranks=4, steps=12, pp=2))
    blocks = pipeline_blocks(run.events())
    table = bubbles(blocks)
    per_step = step_summary(run.breakdown(), run.steps(), table).set_index("step")["bubble_frac"]
    for step, rows in table.groupby("step"):
        assert per_step[step] == pytest.approx(rows["bubble_ms"].sum() / rows["window_ms"].sum())
    steady_table = bubbles(steady(blocks, run.steady_steps()))
    assert (
        0
        < summary_metrics(run, [])["summary/bubble_frac"]
        == pytest.approx(steady_table["bubble_ms"].sum() / steady_table["window_ms"].sum())
    )
    _, stage_bubble = per_stage(blocks, run.steady_steps())
    for stage, rows in steady_table.groupby("stage"):
        assert stage_bubble.loc[stage, "bubble_frac"] == pytest.approx(
            rows["bubble_ms"].sum() / rows["window_ms"].sum()
        )
