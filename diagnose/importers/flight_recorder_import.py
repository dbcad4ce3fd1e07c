"""`diagnose import flight-recorder PATH... --out RUN`: a run directory made of
Flight Recorder dumps alone (from a job diagnose did not launch).

Every file is read first (diagnose.rundir.flight_recorder_reader: size cap,
no globals, JSON ranks), so nothing unreadable is imported; the dumps used are
then copied byte for byte into RUN/flight_recorder/ as rank_<N> (pickle) or
rank_<N>.json, where the analysis reads them like a hung run's own.
"""

import os
import shutil
import time

from diagnose import rundir
from diagnose.rundir.flight_recorder_reader import FOLDER, dump_files, read_dumps


def _world_size(dumps: dict) -> int:
    default = [
        g["ranks"] for d in dumps.values() for g in d["groups"].values() if g["desc"] == "default_pg" and g["ranks"]
    ]
    return max([len(r) for r in default] + [max(dumps) + 1])


def import_flight_recorder(paths: list[str], out_dir: str, force: bool = False) -> tuple[str, dict]:
    dumps = read_dumps(paths)  # DumpError (a UserError): one line, nothing written
    sources = {os.path.basename(p): p for p in dump_files(paths)}
    run_dir = rundir.prepare_out_dir(out_dir, force=force)
    folder = os.path.join(run_dir, FOLDER)
    os.makedirs(folder, exist_ok=True)
    for rank, dump in sorted(dumps.items()):
        suffix = ".json" if dump["format"] == "json" else ""
        shutil.copyfile(sources[dump["file"]], os.path.join(folder, f"rank_{rank}{suffix}"))
    versions = sorted({d["version"] for d in dumps.values()})
    rundir.write_manifest(
        run_dir,
        {
            "name": os.path.basename(run_dir),
            "source": "flight_recorder",
            "imported_from": list(paths),
            "start_wall_ns": time.time_ns(),
            "world_size": _world_size(dumps),
            "ranks_seen": sorted(dumps),
            "flight_recorder": {
                "versions": versions,
                "comm_lib_versions": sorted({d["comm_lib_version"] for d in dumps.values()}),
            },
            # a dump set is read as what it is: the state of a job that stopped
            "hang": {"source": "flight_recorder"},
        },
    )
    return run_dir, {"ranks": sorted(dumps), "versions": versions}
