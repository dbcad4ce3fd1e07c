"""Bootstrap that `diagnose run` puts on PYTHONPATH.

It first runs any other sitecustomize the environment has (we must not shadow
it), then activates the collectors only in a torchrun worker (RANK and
LOCAL_RANK set) of a diagnose run, and only in the process itself, not in
processes it spawns (DataLoader workers inherit the environment).
"""
import os
import sys


def _chain_other_sitecustomize():
    import importlib.machinery
    import importlib.util
    here = os.path.dirname(os.path.abspath(__file__))
    others = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", others)
    if spec is not None and spec.loader is not None and spec.origin != os.path.abspath(__file__):
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


def _activate():
    env = os.environ
    run_dir = env.get("DIAGNOSE_RUN_DIR")
    if not run_dir or "RANK" not in env or "LOCAL_RANK" not in env:
        return
    if env.get("DIAGNOSE_ACTIVE_PID") not in (None, "", str(os.getpid())):
        return
    try:
        import collectors  # noqa: F401
    except ImportError:
        sys.path.append(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    try:
        from collectors.activate import activate
        activate(run_dir)
    except Exception as exc:  # never break the user's job
        sys.stderr.write(f"diagnose: collectors not active in rank {env.get('RANK')}: {exc}\n")


try:
    _chain_other_sitecustomize()
except Exception as exc:
    sys.stderr.write(f"diagnose: the environment's own sitecustomize failed: {exc}\n")
_activate()
