"""Issue 49, "Run loads; analyze(run) analyzes": `diagnose.load` reads a run,
`diagnose.analyze(run)` runs the detectors, and `Run.findings` only reads
(analyze's findings, else analysis/findings.json, else NotAnalyzed)."""

import json
import shutil

import pytest

import diagnose
from diagnose.analysis.findings import run_detectors
from diagnose.errors import NotAnalyzed, UserError
from tests.support.jobs import fixture_path, load_run


@pytest.fixture
def straggler_copy(tmp_path):
    """The recorded straggler scenario, never analyzed: no analysis/ folder."""
    out = tmp_path / "straggler"
    shutil.copytree(fixture_path("runs", "straggler"), out, ignore=shutil.ignore_patterns("SOURCE.txt"))
    assert not (out / "analysis").exists()
    return out


def _no_detectors(monkeypatch):
    def refuse(run):
        raise AssertionError("the detectors ran")

    monkeypatch.setattr(run_detectors, "detect", refuse)


def test_findings_only_read_and_analyze_is_the_step_that_runs_the_detectors(straggler_copy, monkeypatch):
    run = load_run(straggler_copy)
    with monkeypatch.context() as m:
        _no_detectors(m)
        with pytest.raises(NotAnalyzed, match="diagnose.analyze") as raised:
            _ = run.findings
    assert isinstance(raised.value, UserError)  # the CLI prints it as one line, exit 2
    findings = diagnose.analyze(run)
    assert [f["ranks"] for f in findings if f["kind"] == "straggler"] == [[2]]  # the scenario slows rank 2
    assert run.findings is findings
    assert not (straggler_copy / "analysis").exists(), "analyze writes nothing"


def test_a_written_analysis_is_read_back_without_running_the_detectors(straggler_copy, monkeypatch):
    written = run_detectors.write_analysis(load_run(straggler_copy))
    _no_detectors(monkeypatch)
    run = load_run(straggler_copy)
    assert run.findings == json.loads((straggler_copy / "analysis" / "findings.json").read_text()) == written
    assert run_detectors.read_or_analyze(run) == written


def test_report_and_compare_analyze_a_run_that_never_was(straggler_copy):
    """read_or_analyze, the step `diagnose report` and `diagnose compare` take:
    findings.json where there is one, else the analysis, written nowhere."""
    run = load_run(straggler_copy)
    findings = run_detectors.read_or_analyze(run)
    assert "straggler" in {f["kind"] for f in findings} and run.findings is findings
    assert not (straggler_copy / "analysis").exists()


def test_an_unreadable_findings_file_is_one_line_not_a_silent_analysis(straggler_copy, monkeypatch):
    (straggler_copy / "analysis").mkdir()
    (straggler_copy / "analysis" / "findings.json").write_text("{not json")
    _no_detectors(monkeypatch)
    with pytest.raises(NotAnalyzed, match="is not JSON"):
        _ = load_run(straggler_copy).findings
