"""The `--torch-profiler` contract between `diagnose run` and its ranks: the
launcher puts the window (STEPS as FIRST-LAST or N) in the environment variable
ENV, every rank's torch_profiler instrumentor reads it, and each rank writes its
Kineto trace into OUT_DIR inside its rank folder (docs/run-directory.md), where
the importer finds it after the job."""

import re

ENV = "DIAGNOSE_TORCH_PROFILER"
OUT_DIR = "torch_profiler"


def parse_window(spec: str) -> tuple[int, int]:
    """ "10-12" -> (10, 12); "10" -> (10, 10)."""
    m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", spec or "")
    if not m:
        raise ValueError(f"--torch-profiler takes STEPS as FIRST-LAST or N (e.g. 10-12), not {spec!r}")
    first = int(m.group(1))
    last = int(m.group(2)) if m.group(2) is not None else first
    if last < first:
        raise ValueError(f"--torch-profiler {spec}: the last step comes before the first")
    return first, last
