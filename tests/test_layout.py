"""The layout is the architecture: data flows one way, collectors -> run dir ->
analysis -> findings -> dashboards / exporters / tracking (README, "How it works").

Read statically from every import statement, function-level ones included (a lazy
import is still a dependency), so a violation fails here however rarely the
importing code runs."""
import ast
import collections
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
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
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + ([base] if base else []))
            found.add(base)
            # `from diagnose.analysis import loader` imports diagnose.analysis.loader
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
                    allowed is not None and not any(_under(target, a) for a in allowed)):
                out.append(f"{name} imports {target}")
    return out


def test_collectors_import_nothing_of_the_analysis_side():
    assert _violations("collectors", forbidden=("diagnose", "dashboards", "reference_trainer")) == []


def test_the_analysis_imports_nothing_downstream():
    assert _violations("diagnose.analysis", forbidden=(
        "dashboards", "diagnose.run", "diagnose.live", "diagnose.cli", "diagnose.exporters",
        "diagnose.importers", "reference_trainer")) == []


def test_the_run_directory_reader_imports_only_the_contract():
    assert _violations("diagnose.rundir", allowed=("diagnose.rundir", "diagnose.errors", "collectors")) == []


def test_dashboards_import_only_analysis_and_rundir():
    assert _violations("dashboards", allowed=("dashboards", "diagnose.analysis", "diagnose.rundir")) == []


def test_importers_and_exporters_stay_on_their_side():
    assert _violations("diagnose.importers", forbidden=(
        "dashboards", "diagnose.analysis", "diagnose.run", "diagnose.live", "diagnose.cli",
        "diagnose.exporters")) == []
    assert _violations("diagnose.exporters", forbidden=(
        "dashboards", "diagnose.run", "diagnose.live", "diagnose.cli", "diagnose.importers")) == []


def test_no_import_cycles():
    graph = {name: {t for t in imported if t in MODULES and t != name and not _under(name, t)}
             for name, imported in IMPORTS.items()}
    state, cycles = {}, []

    def visit(node, stack):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                cycles.append(" -> ".join(stack[stack.index(nxt):] + [nxt]))
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


@pytest.mark.parametrize("violating,expected", [
    ("from dashboards.view_parts import esc\n", "diagnose.analysis.breakdown imports dashboards.view_parts"),
    ("def f():\n    from diagnose.cli import app\n", "diagnose.analysis.breakdown imports diagnose.cli"),
])
def test_the_checks_catch_a_violation(monkeypatch, tmp_path, violating, expected):
    """The rules above fail on an upward import, lazy or not (so they can fail)."""
    path = tmp_path / "breakdown.py"
    path.write_text(MODULES["diagnose.analysis.breakdown"].read_text(encoding="utf-8") + violating)
    monkeypatch.setitem(IMPORTS, "diagnose.analysis.breakdown", _imports("diagnose.analysis.breakdown", path))
    assert expected in _violations("diagnose.analysis", forbidden=("dashboards", "diagnose.cli"))
