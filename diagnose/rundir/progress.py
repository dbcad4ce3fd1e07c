"""Each rank's progress as the run directory holds it while the job runs: its
progress.json (rewritten by the rank's writer every 0.25 s and at each flush) and
its steps-done counter (a mapped file stored at every step end, exact even after
a SIGKILL). Read by the launcher's progress line, the live monitor and the loader."""

import json

from collectors.part_writer import read_counter
from collectors.schema import STEPS_DONE_FILE
from diagnose import rundir
from diagnose.rundir import storage


def read_progress(run_dir: str) -> dict[int, dict]:
    progress = {}
    for rank_dir in rundir.rank_dirs(run_dir):
        rank = rundir.rank_of_dir(rank_dir)
        if rank is None:
            continue
        # the recorder rewrites the file in place (PartWriter.overwrite_json): a
        # read in the middle of a write does not parse, and the next one does
        for _ in range(3):
            try:
                with storage.open(storage.join(rank_dir, "progress.json")) as f:
                    progress[rank] = json.loads(f.read())
                break
            except OSError:
                break  # not written yet, or gone
            except ValueError:
                continue
        # progress.json trails by up to a quarter second; the mapped counter does not
        steps_done = read_counter(storage.join(rank_dir, STEPS_DONE_FILE), opener=storage.open)
        entry = progress.get(rank, {}) if steps_done else None
        if isinstance(entry, dict):
            if not isinstance(entry.get("steps_done"), int) or entry["steps_done"] < steps_done:
                entry["steps_done"] = steps_done
            progress[rank] = entry
    return progress
