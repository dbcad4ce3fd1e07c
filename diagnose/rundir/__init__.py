"""The run-directory contract, read side: what `diagnose run`, the importers
and `diagnose merge` leave on disk, and how everything else finds it.

Enters: a run directory (docs/run-directory.md): manifest.json, traces/rank-NNNNN/
with each rank's event and sample parts, meta.json, progress.json and counters.
Leaves: paths and names (here), one rank's parts read defensively as Arrow
tables (rank_reader), each rank's progress (progress), one run merged from
per-node directories (node_merge). A run directory is a local path or an fsspec
URL (storage: the file operations of both). Everything that touches a run directory goes
through this package; the rank side writes it through collectors.part_writer."""

import json
import os
import re
import time

from collectors.part_writer import atomic_write_json
from diagnose.errors import NotAnalyzed, UserError
from diagnose.rundir import storage

MANIFEST = "manifest.json"
TRACES = "traces"
ANALYSIS = "analysis"
FINDINGS = os.path.join(ANALYSIS, "findings.json")
STEP_FIGURES = os.path.join(ANALYSIS, "step_figures.json")
REPORT = "report.html"
CHROME_TRACE = "trace.json.gz"
ALERTS = "alerts.jsonl"


def default_out_dir(root: str = "runs", name: str | None = None) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return os.path.join(root, f"{stamp}-{name}" if name else stamp)


def prepare_out_dir(path: str, force: bool = False) -> str:
    """Create the run dir; refuse to reuse a non-empty one unless forced (data loss)."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise UserError(f"--out {path} exists and is not a directory")
    if os.path.isdir(path) and os.listdir(path) and not force:
        raise UserError(f"--out {path} is not empty; choose another directory or pass --force")
    os.makedirs(os.path.join(path, TRACES), exist_ok=True)
    return os.path.abspath(path)


def require_run_dir(path: str) -> str:
    """The run directory's absolute path, or its URL (diagnose.rundir.storage)."""
    if not storage.exists(path):
        raise UserError(f"run directory {path} does not exist")
    if not storage.isdir(path):
        raise UserError(f"{path} is not a directory")
    if not storage.isdir(storage.join(path, TRACES)) and not storage.isfile(storage.join(path, MANIFEST)):
        raise UserError(f"{path} is not a diagnose run directory (no traces/ or manifest.json)")
    return path.rstrip("/") if storage.is_url(path) else os.path.abspath(path)


def read_json_dict(path: str) -> dict | None:
    """A JSON object from a file of the run directory; None when missing, unreadable or not an object."""
    try:
        with storage.open(path) as f:
            value = json.loads(f.read())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def read_findings(run_dir: str) -> list[dict]:
    """analysis/findings.json; NotAnalyzed when the run has none or it is unreadable."""
    path = os.path.join(run_dir, FINDINGS)
    try:
        with storage.open(path) as f:
            return json.loads(f.read())
    except OSError:
        raise NotAnalyzed(
            f"{run_dir} has not been analyzed (no readable {FINDINGS}): "
            "diagnose.analyze(run), or `diagnose analyze RUN`"
        ) from None
    except ValueError as exc:
        raise NotAnalyzed(f"{path} is not JSON ({exc}): analyze the run again") from None


def read_manifest(run_dir: str) -> dict:
    return read_json_dict(os.path.join(run_dir, MANIFEST)) or {}


def write_manifest(run_dir: str, manifest: dict) -> None:
    atomic_write_json(os.path.join(run_dir, MANIFEST), manifest)


_RANK_DIR = re.compile(r"^rank-(\d+)$")


def rank_of_dir(path: str) -> int | None:
    """The rank a rank folder is named for (rank-00003 -> 3), None for another name."""
    m = _RANK_DIR.match(os.path.basename(path))
    return int(m.group(1)) if m else None


def rank_dirs(run_dir: str) -> list[str]:
    traces = storage.join(run_dir, TRACES)
    try:
        names = sorted(storage.folders(traces))
    except OSError:
        return []
    return [storage.join(traces, n) for n in names if n.startswith("rank-")]


def rank_folders(run_dirs: list) -> tuple[list, dict]:
    """([(rank, rank_dir) to read, or a warning, in directory order], {rank: rank_dir})."""
    todo, found = [], {}
    for run_dir in run_dirs:
        for rank_dir in rank_dirs(run_dir):
            rank = rank_of_dir(rank_dir)
            if rank is None:
                continue
            if rank in found:
                todo.append(f"{rank_dir}: rank {rank} already read from {found[rank]}; ignored")
                continue
            found[rank] = rank_dir
            todo.append((rank, rank_dir))
    return todo, found
