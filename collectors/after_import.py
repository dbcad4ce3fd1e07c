"""Run a callback the moment a module finishes importing (a meta-path hook),
or at once if it already has. So that diagnose never imports a module before
the job does: torch before the user's script (which may set CUDA_VISIBLE_DEVICES
or thread counts first), or a torch.distributed submodule the job never uses
(FSDP2's costs 0.6 s to import here, the functional collectives' 15 ms).
"""

import importlib.abc
import importlib.util
import sys


class _AfterImport(importlib.abc.MetaPathFinder):
    def __init__(self, name, callback):
        self.name, self.callback = name, callback

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module
        callback = self.callback

        def exec_then_call(module):
            exec_module(module)
            callback()

        spec.loader.exec_module = exec_then_call
        return spec


def after_import(name: str, callback) -> None:
    """callback() once `name` is imported (now, if it is); callback handles its own errors."""
    if name in sys.modules:
        callback()
    else:
        sys.meta_path.insert(0, _AfterImport(name, callback))
