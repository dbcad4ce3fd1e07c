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
    rec.meta["instrumentors"] = [n for n in INSTRUMENTORS if n not in disabled
                                 and not any(e["collector"] == n for e in rec.errors)]
    rec.write_meta()


def activate(run_dir: str) -> None:
    os.environ["DIAGNOSE_ACTIVE_PID"] = str(os.getpid())
    rec = start_recorder(run_dir, meta={"run_dir": run_dir})
    after_import("torch", lambda: install_torch_instrumentors(rec))
