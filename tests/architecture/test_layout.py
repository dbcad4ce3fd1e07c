"""The layout is the architecture: data flows one way, collectors -> run dir ->
analysis -> findings -> dashboards / exporters / tracking (README, "How it works").

Read statically from every import statement, function-level ones included (a lazy
import is still a dependency), so a violation fails here however rarely the
importing code runs. diagnose/analysis/ is in rooms that name the flow
(docs/architecture.md), each importing only the rooms below it (ROOMS)."""

import ast
import collections
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("collectors", "diagnose", "dashboards", "reference_trainer")


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in sorted((REPO / pkg).rglob("*.py"))}


def _imports(name: str, path: Path) -> set[str]:
    """Every module `name` imports (absolute names; relative imports resolved)."""
    found = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            found.add(base)
            # `from diagnose.analysis import loader` imports diagnose.analysis.load.loader
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


MODULES = _modules()
IMPORTS = {name: _imports(name, path) for name, path in MODULES.items()}


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def _violations(importer_prefix: str, allowed=None, forbidden=()) -> list[str]:
    out = []
    for name, imported in IMPORTS.items():
        if not _under(name, importer_prefix):
            continue
        for target in sorted(imported):
            if target in PACKAGES or not any(_under(target, p) for p in PACKAGES):
                continue  # a package's root (`from diagnose import rundir`), the stdlib, third parties
            if any(_under(target, f) for f in forbidden) or (
                allowed is not None and not any(_under(target, a) for a in allowed)
            ):
                out.append(f"{name} imports {target}")
    return out


def test_collectors_import_nothing_of_the_analysis_side():
    assert _violations("collectors", forbidden=("diagnose", "dashboards", "reference_trainer")) == []


def test_the_analysis_imports_nothing_downstream():
    assert (
        _violations(
            "diagnose.analysis",
            forbidden=(
                "dashboards",
                "diagnose.run",
                "diagnose.live",
                "diagnose.cli",
                "diagnose.exporters",
                "diagnose.importers",
                "reference_trainer",
            ),
        )
        == []
    )


ANALYSIS = "diagnose.analysis"
# the rooms of diagnose/analysis/, bottom first, and the rooms each may import (only
# rooms earlier in this list: one way; docs/architecture.md draws them)
ROOMS = {
    "tables": (),  # derived tables: pure functions of frames
    "load": ("tables",),  # a run directory -> Run
    "replay": ("tables",),  # the dependency model, the what-if
    "detectors": ("tables",),  # one module per kind of finding
    "findings": ("tables", "load", "replay", "detectors"),  # the analysis step
    "compare": ("tables", "load", "replay", "detectors", "findings"),  # across runs
}
RUN_DIRECTORY_READERS = ("load", "findings")  # the others get frames, or a loaded run


def _room(module: str) -> str | None:
    """The room of a module of diagnose.analysis ("" for the package itself), else None."""
    if not _under(module, ANALYSIS):
        return None
    return module[len(ANALYSIS) + 1 :].partition(".")[0]


def _room_violations() -> list[str]:
    out = []
    for name, imported in IMPORTS.items():
        room = _room(name)
        if room is None:
            continue
        allowed = {room, *ROOMS.get(room, ())}
        out += [f"{name} imports {target}" for target in sorted(imported) if _room(target) not in (None, "", *allowed)]
    return out


def test_the_analysis_is_in_rooms_that_import_only_rooms_below():
    analysis = REPO / "diagnose" / "analysis"
    assert sorted(p.name for p in analysis.glob("*.py")) == ["__init__.py"]
    assert sorted(p.name for p in analysis.iterdir() if p.is_dir() and p.name != "__pycache__") == sorted(ROOMS)
    rooms = list(ROOMS)
    for room, below in ROOMS.items():
        assert all(rooms.index(b) < rooms.index(room) for b in below), room  # one way: no two rooms import each other
    assert IMPORTS[ANALYSIS] == set(), "`import diagnose.analysis` stays free (no pandas)"
    assert _room_violations() == []


def test_only_load_and_findings_read_the_run_directory():
    for room in set(ROOMS) - set(RUN_DIRECTORY_READERS):
        assert _violations(f"{ANALYSIS}.{room}", forbidden=("diagnose.rundir",)) == []


def test_the_run_directory_reader_imports_only_the_contract():
    assert _violations("diagnose.rundir", allowed=("diagnose.rundir", "diagnose.errors", "collectors")) == []


def test_dashboards_import_only_analysis_and_rundir():
    assert _violations("dashboards", allowed=("dashboards", "diagnose.analysis", "diagnose.rundir")) == []


def test_importers_and_exporters_stay_on_their_side():
    assert (
        _violations(
            "diagnose.importers",
            forbidden=(
                "dashboards",
                "diagnose.analysis",
                "diagnose.run",
                "diagnose.live",
                "diagnose.cli",
                "diagnose.exporters",
            ),
        )
        == []
    )
    assert (
        _violations(
            "diagnose.exporters",
            forbidden=("dashboards", "diagnose.run", "diagnose.live", "diagnose.cli", "diagnose.importers"),
        )
        == []
    )


def test_no_import_cycles():
    graph = {
        name: {t for t in imported if t in MODULES and t != name and not _under(name, t)}
        for name, imported in IMPORTS.items()
    }
    state, cycles = {}, []

    def visit(node, stack):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                cycles.append(" -> ".join(stack[stack.index(nxt) :] + [nxt]))
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    assert cycles == []


def test_one_stage_per_folder_and_no_two_modules_share_a_name():
    loose = sorted(p.name for p in (REPO / "diagnose").glob("*.py"))
    assert loose == ["__init__.py", "__main__.py", "errors.py"]
    by_name = collections.defaultdict(list)
    for name, path in MODULES.items():
        if path.name not in ("__init__.py", "__main__.py"):
            by_name[path.stem.lstrip("_")].append(name)
    assert {n: m for n, m in by_name.items() if len(m) > 1} == {}
    for package in [p for p in (REPO / "diagnose").iterdir() if p.is_dir() and p.name != "__pycache__"]:
        doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text(encoding="utf-8")))
        assert doc and "Enters" in doc and "Leaves" in doc, f"{package.name}/__init__.py"


TEST_FOLDERS = ("analysis", "architecture", "cli", "collectors", "interop", "live", "trainer")
NOT_PYTHON_PACKAGES = ("data", "scripts", "__pycache__")  # fixtures; jobs the tests launch by path


def test_tests_sit_in_package_folders_and_helpers_in_support():
    """docs/testing.md, "Layout": no test or helper beside the folders, every test
    module in a package folder under a name of its own, helpers only in support/
    (a folder's conftest.py aside)."""
    tests = REPO / "tests"
    assert sorted(p.name for p in tests.glob("*.py")) == ["__init__.py", "conftest.py"]
    folders = sorted(p.name for p in tests.iterdir() if p.is_dir() and p.name not in NOT_PYTHON_PACKAGES)
    assert folders == sorted((*TEST_FOLDERS, "support"))
    by_name = collections.defaultdict(list)
    for folder in folders:
        modules = sorted(p.name for p in (tests / folder).glob("*.py"))
        assert "__init__.py" in modules, folder
        # a folder's conftest.py shares its fixtures (pytest finds them by name)
        for module in set(modules) - {"__init__.py", "conftest.py"}:
            assert module.startswith("test_") == (folder != "support"), f"tests/{folder}/{module}"
            by_name[module].append(folder)
    assert {n: f for n, f in by_name.items() if len(f) > 1} == {}
    # what tests share lives in support/: no test module is imported by another
    importing = [
        f"{p.relative_to(REPO)} imports {module}"
        for p in sorted(tests.rglob("*.py"))
        for module in _imports(_module_name(p), p)
        if any(_under(module, f"tests.{folder}") for folder in TEST_FOLDERS)
    ]
    assert importing == []


def test_bench_runs_as_modules_and_patches_no_path():
    """bench/ is a package run as `python -m bench.<name>` from the root: it imports
    bench.* and tests.support.* as they are, with no sys.path of its own."""
    bench = REPO / "bench"
    assert (bench / "__init__.py").exists()
    patched = [
        f"{p.relative_to(REPO)}:{n}"
        for p in sorted(bench.rglob("*.py"))
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if "sys.path" in line
    ]
    assert patched == []


MAX_MODULE_LINES = 400  # one concern per file, readable in one sitting (docs/architecture.md)


def test_every_python_module_reads_in_one_sitting():
    """Every tracked Python file, formatted (`ruff format`), is under 400 lines."""
    tracked = subprocess.run(
        ["git", "ls-files", "*.py"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    assert len(tracked) > 100  # the tree, not an empty listing
    long = {
        f: n for f in tracked if (n := len((REPO / f).read_text(encoding="utf-8").splitlines())) >= MAX_MODULE_LINES
    }
    assert long == {}


BREAKDOWN = "diagnose.analysis.tables.breakdown"


def _with_import(monkeypatch, tmp_path, module: str, violating: str) -> None:
    """`module` as if `violating` were appended to its source."""
    path = tmp_path / MODULES[module].name
    path.write_text(MODULES[module].read_text(encoding="utf-8") + violating)
    monkeypatch.setitem(IMPORTS, module, _imports(module, path))


@pytest.mark.parametrize(
    "violating,expected",
    [
        ("from dashboards.view_parts import esc\n", f"{BREAKDOWN} imports dashboards.view_parts"),
        ("def f():\n    from diagnose.cli import app\n", f"{BREAKDOWN} imports diagnose.cli"),
    ],
)
def test_the_checks_catch_a_violation(monkeypatch, tmp_path, violating, expected):
    """The rules above fail on an upward import, lazy or not (so they can fail)."""
    _with_import(monkeypatch, tmp_path, BREAKDOWN, violating)
    assert expected in _violations("diagnose.analysis", forbidden=("dashboards", "diagnose.cli"))


@pytest.mark.parametrize(
    "module,violating,expected",
    [
        (BREAKDOWN, "from diagnose.analysis.replay.whatif import WhatIf\n", "diagnose.analysis.replay.whatif"),
        (BREAKDOWN, "from diagnose.analysis.load import rank_pass\n", "diagnose.analysis.load.rank_pass"),
        (
            "diagnose.analysis.load.loader",
            "def f():\n    from diagnose.analysis.detectors.run_structure import layers_per_stage\n",
            "diagnose.analysis.detectors.run_structure",
        ),
        (
            "diagnose.analysis.replay.whatif",
            "import diagnose.analysis.detectors.straggler\n",
            "diagnose.analysis.detectors.straggler",
        ),
        (
            "diagnose.analysis.detectors.straggler",
            "from diagnose.analysis.findings import run_detectors\n",
            "diagnose.analysis.findings.run_detectors",
        ),
    ],
)
def test_the_room_check_catches_an_import_of_a_room_above(monkeypatch, tmp_path, module, violating, expected):
    _with_import(monkeypatch, tmp_path, module, violating)
    assert f"{module} imports {expected}" in _room_violations()


def test_the_run_directory_check_catches_a_reader_outside_load_and_findings(monkeypatch, tmp_path):
    _with_import(
        monkeypatch, tmp_path, "diagnose.analysis.replay.whatif", "def f():\n    from diagnose import rundir\n"
    )
    assert _violations("diagnose.analysis.replay", forbidden=("diagnose.rundir",)) == [
        "diagnose.analysis.replay.whatif imports diagnose.rundir"
    ]
