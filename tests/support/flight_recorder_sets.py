"""Reading the real Flight Recorder dump sets (tests/data/flight_recorder): the
attribution nvidia-resiliency-ext gave them, `diagnose import flight-recorder`
of a set, and a dump read as plain data (tests/interop/test_flight_recorder*.py)."""

import json
import pickle

from tests.support.jobs import run_diagnose


def nvrx_reference(folder):
    """What nvidia-resiliency-ext names for the set (its last row): group, op, size, missing ranks."""
    row = (folder / "nvrx_reference.txt").read_text().strip().splitlines()[-1]
    pgid, desc, op, size, dtype, missing = [c.strip() for c in row.split("|")]
    return {"desc": desc.split(",")[0], "op": op, "size": size, "missing": [int(r) for r in missing.split(",")]}


def import_dumps(folder, out):
    """`diagnose import flight-recorder` of the set: (the process, its findings)."""
    proc = run_diagnose(["import", "flight-recorder", folder, "--out", out])
    findings = json.loads((out / "analysis" / "findings.json").read_text())
    return proc, findings


def plain_load(path):
    """The fixtures hold plain data only (SOURCE.txt): a data-only unpickler reads them."""

    class DataOnly(pickle.Unpickler):
        def find_class(self, module, name):
            raise AssertionError(f"fixture names a global {module}.{name}")

    with open(path, "rb") as f:
        return DataOnly(f).load()
