"""Issue 49, "one registry of causes": every kind of finding is one entry of
diagnose/analysis/detectors/finding_kinds.py, and the CLI, the report, compare and MLflow
read it. What an entry must provide, and a kind added here (a detector of this
module and a registry entry, nothing else) reaching all four."""

import ast
import importlib
import re
import shutil
import sys
import types

import pytest
from mlflow.tracking import MlflowClient

from diagnose.analysis.detectors import finding_kinds
from diagnose.analysis.detectors.finding_record import Finding
from diagnose.analysis.tables.breakdown import PARTS
from tests.support.jobs import REPO, fixture_path


def _anchors(markdown: str) -> set:
    """The anchors GitHub gives a Markdown file's headings."""
    return {
        re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        for line in markdown.splitlines()
        if line.startswith("#")
    }


def _dashboard_anchors() -> set:
    """The report's section anchors: the string literals the views name sections with."""
    found = set()
    for path in (REPO / "dashboards").glob("fig_*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", None) == "Section"
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                found.add(node.args[0].value)
    return found


@pytest.mark.parametrize("kind", finding_kinds.KINDS, ids=lambda k: k.name)
def test_every_kind_provides_a_detector_a_label_docs_and_its_evidence(kind):
    module = importlib.import_module(kind.module)
    assert callable(getattr(module, "detect", None)), f"{kind.module} has no detect(ctx)"
    doc = module.__doc__ or ""
    assert doc.startswith(f"{kind.name}:"), f"{kind.module}'s docstring opens with what {kind.name} is"
    assert "Signal" in doc and re.search("threshold|severity", doc, re.I), (
        f"{kind.module}'s docstring states its signal and threshold"
    )
    assert kind.label and kind.label != kind.name and "\n" not in kind.label
    path, _, anchor = kind.docs.partition("#")
    assert anchor in _anchors((REPO / path).read_text(encoding="utf-8")), kind.docs
    assert set(kind.evidence) <= _dashboard_anchors(), kind.evidence
    assert kind.parts and set(kind.parts) <= set(PARTS)
    # a kind the device graph replays has a what-if; one priced by estimate says why
    assert not kind.device_whatif or kind.whatif
    assert kind.whatif or kind.estimate_why or not kind.device_whatif


def test_the_registry_is_every_detector_once():
    names = finding_kinds.names()
    assert len(set(names)) == len(names)
    modules = {p.stem for p in (REPO / "diagnose" / "analysis" / "detectors").glob("*.py")} - {
        "__init__",
        "run_structure",
        "straggler_waits",
        "straggler_causes",
        "significance",
        "finding_kinds",
        "finding_record",
    }  # helpers, the registry, its record
    assert modules == {k.module.rpartition(".")[2] for k in finding_kinds.KINDS}


def test_the_readmes_table_of_kinds_is_the_registry():
    """The README names every kind the registry has, and no other (its table is
    prose, written by hand: this keeps it whole)."""
    rows = re.findall(r"^\| `([a-z_0-9]+)` \|", (REPO / "README.md").read_text(encoding="utf-8"), re.M)
    assert sorted(rows) == sorted(finding_kinds.names())


# -- a kind added here ---------------------------------------------------------
TEST_KIND = finding_kinds.FindingKind(
    "test_cause", "Test cause", "docs/analysis.md#detectors", detector="test_cause_detector"
)


def _detect(ctx):
    """test_cause: rank 1 loses a fifth of every step (the test's own cause).

    Signal: none, it is always there. Threshold: none."""
    return [
        Finding(
            kind="test_cause",
            title="rank 1 loses a fifth of the step to the test",
            recommendation="stop the test",
            impact_ms_per_step=0.2 * ctx.step_ms,
            ranks=[1],
        )
    ]


def _register(monkeypatch):
    module = types.ModuleType(TEST_KIND.detector, _detect.__doc__)
    module.detect = _detect
    monkeypatch.setitem(sys.modules, TEST_KIND.detector, module)
    monkeypatch.setattr(finding_kinds, "KINDS", finding_kinds.KINDS + (TEST_KIND,))


def _cli(capsys, *args) -> str:
    from diagnose.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(list(map(str, args)))
    out = capsys.readouterr()
    assert exit_.value.code == 0, out.out + out.err
    return out.out


def test_a_kind_added_in_a_test_shows_in_the_cli_report_compare_and_mlflow(tmp_path, monkeypatch, capsys):
    runs = tmp_path / "runs"
    for name in ("before", "after"):
        shutil.copytree(fixture_path("runs", "clean"), runs / name, ignore=shutil.ignore_patterns("SOURCE.txt"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("DIAGNOSE_OUTPUTS", "on")
    monkeypatch.setenv("DIAGNOSE_TRACKING", "off")
    _cli(capsys, "analyze", runs / "before", "--quiet", "--no-outputs")  # the baseline: without the kind
    _register(monkeypatch)
    monkeypatch.setenv("DIAGNOSE_TRACKING", "on")
    printed = _cli(capsys, "analyze", runs / "after", "--quiet")
    # the CLI's findings table: the kind, its label, its finding
    assert "test_cause" in printed and "Test cause" in printed and "rank 1 loses a fifth" in printed
    # the report (built by the analysis, offline): the findings table names it
    report = (runs / "after" / "report.html").read_text()
    assert '<div class="kind">test_cause</div>' in report and "Test cause" in report
    assert "rank 1 loses a fifth of the step to the test" in report
    # compare: gained from before to after, in the terminal and the HTML page
    monkeypatch.setenv("DIAGNOSE_TRACKING", "off")
    compared = _cli(capsys, "compare", runs / "before", runs / "after", "--html", tmp_path / "compare.html")
    gained = [line for line in compared.splitlines() if "gained" in line]
    assert gained and "test_cause" in gained[0] and "critical" in gained[0], compared
    assert '<div class="kind">test_cause</div>' in (tmp_path / "compare.html").read_text()
    # MLflow: the kind's impact metric and its tags, in the runs' own store
    run_id = (runs / "after" / "mlflow_run_id").read_text().strip()
    logged = MlflowClient(tracking_uri=f"sqlite:///{runs / 'mlflow.db'}").get_run(run_id).data
    impact = logged.metrics["finding/test_cause_impact_ms_per_step"]
    assert impact > 0 and logged.metrics["finding/straggler_impact_ms_per_step"] == 0.0
    assert logged.tags["finding.test_cause"] == "critical" and logged.tags["finding.test_cause.ranks"] == "1"
