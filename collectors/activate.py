"""Turn a worker process into an instrumented one: start the recorder now, and
install the torch instrumentors the moment `import torch` finishes (a post-import
hook), so that we never import torch before the user's script does: scripts that
set CUDA_VISIBLE_DEVICES or thread counts before `import torch` keep working.
"""
import importlib
import importlib.abc
import importlib.util
import os
import sys

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


class _AfterTorchImport(importlib.abc.MetaPathFinder):
    def __init__(self, callback):
        self.callback = callback

    def find_spec(self, fullname, path, target=None):
        if fullname != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module
        callback = self.callback

        def exec_then_instrument(module):
            exec_module(module)
            callback()

        spec.loader.exec_module = exec_then_instrument
        return spec


def activate(run_dir: str) -> None:
    os.environ["DIAGNOSE_ACTIVE_PID"] = str(os.getpid())
    rec = start_recorder(run_dir, meta={"run_dir": run_dir})
    if "torch" in sys.modules:
        install_torch_instrumentors(rec)
    else:
        sys.meta_path.insert(0, _AfterTorchImport(lambda: install_torch_instrumentors(rec)))
