"""What each rank left on a hang: the watchdog dump its writer thread wrote
(in-flight collectives, every thread's stack: collectors/recorder.py) and the
stacks its faulthandler wrote on the launcher's signal, which need no GIL
(diagnose/rundir/fault_stacks_reader.py). A rank with stacks but no watchdog
dump (its writer thread could not run: some thread held the GIL) gets a dump
holding the stacks only, `watchdog_dumped` False."""

import json

from diagnose.rundir import storage
from diagnose.rundir.fault_stacks_reader import read_rank_stacks


def read_hang_dumps(rank_dirs: dict, warn) -> dict[int, dict]:
    """rank -> its dump: the watchdog's, with `fault_stacks` (or None) and `watchdog_dumped`."""
    dumps = {}
    for rank, rank_dir in rank_dirs.items():
        dump = None
        for path in sorted(storage.glob(rank_dir, "watchdog-*.json")):
            try:
                with storage.open(path) as f:
                    loaded = json.loads(f.read())
                if isinstance(loaded, dict):
                    dump = loaded
            except (OSError, ValueError, UnicodeDecodeError):
                warn(f"{path}: unreadable watchdog dump; skipped")
        stacks = read_rank_stacks(rank_dir)
        if dump is None and stacks is None:
            continue
        dumps[rank] = {**(dump or {}), "watchdog_dumped": dump is not None, "fault_stacks": stacks}
    return dumps
