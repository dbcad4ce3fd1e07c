"""Turn a worker process into an instrumented one: start the recorder now, and
install the torch instrumentors the moment `import torch` finishes
(collectors/after_import.py), so that we never import torch before the user's
script does: scripts that set CUDA_VISIBLE_DEVICES or thread counts before
`import torch` keep working.
"""

import importlib
import os

from collectors.after_import import after_import
from collectors.instrument import INSTRUMENTORS
from collectors.recorder import start_recorder


def install_torch_instrumentors(rec) -> None:
    # DIAGNOSE_DISABLE=ddp,host_sync: leave those instrumentors out (bench/overhead.py
    # uses it to cost each one; a user can drop one that misbehaves in their job)
    disabled = set(filter(None, os.environ.get("DIAGNOSE_DISABLE", "").replace(" ", "").split(",")))
    for name in INSTRUMENTORS:
        if name in disabled:
            continue
        try:
            module = importlib.import_module(f"collectors.instrument.{name}")
            module.install(rec)
        except Exception as exc:
            rec.record_error(name, exc)
    rec.meta["instrumentors"] = [
        n for n in INSTRUMENTORS if n not in disabled and not any(e["collector"] == n for e in rec.errors)
    ]
    rec.write_meta()


def activate(run_dir: str, when: str = "now") -> None:
    """when: "now" (a launcher's worker, its rank known: record from the start),
    "torch" (no launcher: record from `import torch`, under a provisional name),
    "process_group" (started by a recorded process, its process group just created:
    record from here, provisionally too; "solo" is "torch" once torch is imported).
    collectors/bootstrap/sitecustomize.py decides."""
    if when == "torch":
        # a helper that never imports torch leaves nothing (and starts no recorded ancestor)
        after_import("torch", lambda: activate(run_dir, "solo"))
        return
    os.environ["DIAGNOSE_ACTIVE_PID"] = str(os.getpid())
    rec = start_recorder(run_dir, meta={"run_dir": run_dir}, provisional=when != "now")
    after_import("torch", lambda: install_torch_instrumentors(rec))
