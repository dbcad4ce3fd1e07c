"""A rank's faulthandler stacks (collectors/instrument/fault_stacks.py), read as data.

faulthandler writes, per thread, most recent call first:

    Thread 0x00007efd3d5ad6c0 (most recent call first):
      File "/path/x.py", line 327 in wait
      ...

    Current thread 0x00007efd3e422b80 (most recent call first):
      File "/path/train.py", line 13 in hold_gil

("Current thread" is the one that ran the signal handler, not the GIL holder;
"  ..." marks a stack cut at 100 frames; "  <no Python frame>" a thread in C
only). Idents become names through the marker the rank wrote beside the dump.
A dump that is empty (the rank was never signalled), truncated or foreign
gives what it could parse, never an error: it is evidence, not input the
analysis depends on.
"""

import json
import os
import re

from diagnose.rundir import storage

_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+) \(most recent call first\):\s*$")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*?)\s*$')
MAX_BYTES = 4 << 20  # 100 threads x 100 frames is ~1.5 MB at most


def parse_stacks(text: str, names: dict | None = None) -> list[dict]:
    """[{ident, name, current, frames: [{file, line, func}] innermost first}] in dump order;
    a thread dumped twice keeps its last stack."""
    names = names or {}
    threads, current = {}, None
    for line in text.splitlines():
        head = _THREAD.match(line)
        if head:
            ident = head.group(2).lower()
            current = {
                "ident": ident,
                "name": names.get(ident),
                "current": head.group(1) == "Current thread",
                "frames": [],
            }
            threads.pop(ident, None)
            threads[ident] = current
            continue
        frame = _FRAME.match(line)
        if frame and current is not None:
            current["frames"].append({"file": frame.group(1), "line": int(frame.group(2)), "func": frame.group(3)})
    return list(threads.values())


def read_rank_stacks(rank_dir: str) -> dict | None:
    """{pid, signal, threads} of the rank's last signalled process, or None when
    none left a non-empty dump."""
    best = None
    for marker_path in sorted(storage.glob(rank_dir, "stacks-*.json")):
        try:
            with storage.open(marker_path) as f:
                marker = json.loads(f.read())
            dump_path = storage.join(rank_dir, os.path.basename(str(marker.get("dump", ""))))
            if not storage.exists(dump_path):
                continue
            with storage.open(dump_path, "rb") as f:
                text = f.read(MAX_BYTES).decode("utf-8", "replace")
        except (OSError, ValueError, AttributeError):
            continue
        names = marker.get("threads") if isinstance(marker.get("threads"), dict) else {}
        threads = parse_stacks(text, {str(k).lower(): str(v) for k, v in names.items()})
        if threads:
            best = {"pid": marker.get("pid"), "signal": marker.get("signal"), "threads": threads}
    return best
