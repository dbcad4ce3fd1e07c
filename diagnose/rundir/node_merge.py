"""Merge per-node run directories (rank folders named by global rank) into one."""

import os
import shutil

from diagnose import rundir
from diagnose.errors import UserError


def merge_runs(run_dirs: list, out: str) -> str:
    sources = [rundir.require_run_dir(d) for d in run_dirs]
    target = rundir.prepare_out_dir(out)
    manifests = [rundir.read_manifest(d) for d in sources]
    seen = {}
    for source in sources:
        for rank_dir in rundir.rank_dirs(source):
            name = os.path.basename(rank_dir)
            if name in seen:
                raise UserError(f"{name} is in both {seen[name]} and {source}")
            seen[name] = source
            shutil.copytree(rank_dir, os.path.join(target, rundir.TRACES, name))
    merged = dict(manifests[0]) if manifests else {}
    merged.update(
        merged_from=sources,
        world_size=len(seen),
        nodes=[
            {"dir": d, "launcher_host": m.get("launcher_host"), "exit_status": m.get("exit_status")}
            for d, m in zip(sources, manifests)
        ],
    )
    statuses = [m.get("exit_status") for m in manifests if m.get("exit_status") is not None]
    merged["exit_status"] = max(statuses, default=None)
    rundir.write_manifest(target, merged)
    return target
