"""What `diagnose run --nsys` and `--torch-profiler STEPS` do around the job.

before_job: with --nsys and `nsys` on PATH, rewrite the command so each rank
runs under `nsys profile` (diagnose.run.nsys_wrap); without nsys say so in one line
and run the job as it is. With --torch-profiler, check STEPS and pass them to
every rank (DIAGNOSE_TORCH_PROFILER, read by collectors/instrument/torch_profiler).

after_job: import the ranks' profiler traces (their GPU kernels) into the run,
and say where the Nsight reports are and how to import them.
"""

import os
import shutil
import sys

from collectors.profiler_window import ENV as TORCH_PROFILER_ENV
from collectors.profiler_window import parse_window
from diagnose.errors import UserError


def say(message: str) -> None:
    print(f"diagnose: {message}", file=sys.stderr)


def before_job(opts, run_dir: str, manifest: dict) -> tuple[list, dict]:
    """(command to launch, extra environment)."""
    command, env = list(opts.command), dict(opts.extra_env)
    if getattr(opts, "torch_profiler", None):
        try:
            first, last = parse_window(opts.torch_profiler)
        except ValueError as exc:
            raise UserError(str(exc)) from None
        env[TORCH_PROFILER_ENV] = f"{first}-{last}"
        manifest["torch_profiler"] = {"steps": [first, last]}
    if getattr(opts, "nsys", False):
        nsys = shutil.which("nsys")
        if nsys is None:
            say("--nsys: nsys (Nsight Systems) is not on PATH; running without it")
            manifest["nsys"] = {"used": False, "reason": "nsys not on PATH"}
        else:
            from diagnose.run.nsys_wrap import NSYS_DIR, nsys_command, torchrun_python

            os.makedirs(os.path.join(run_dir, NSYS_DIR), exist_ok=True)
            command = nsys_command(command, run_dir, python=torchrun_python(command[0]), nsys=nsys)
            manifest["nsys"] = {"used": True, "command": command}
            say(f"--nsys: each rank runs under nsys; reports go to {os.path.join(run_dir, NSYS_DIR)}")
    return command, env


def after_job(opts, run_dir: str, manifest: dict) -> None:
    if getattr(opts, "torch_profiler", None):
        from diagnose.importers.kineto import import_profiler_windows

        try:
            done = import_profiler_windows(run_dir, warn=lambda m: print(m, file=sys.stderr))
        except Exception as exc:  # the job's own results must survive a bad trace
            say(f"--torch-profiler: traces not imported: {type(exc).__name__}: {exc}")
            done = {}
        manifest.setdefault("torch_profiler", {})["imported_kernels"] = {str(r): n for r, n in done.items()}
        if done:
            say(f"--torch-profiler: imported {sum(done.values())} GPU activities from {len(done)} rank trace(s)")
        else:
            say("--torch-profiler: no profiler trace was written (did the job reach the window?)")
    if (manifest.get("nsys") or {}).get("used"):
        reports = os.path.join(run_dir, "nsys")
        say(
            f"--nsys: to analyse the reports: nsys export --type sqlite {reports}/rankN.nsys-rep, "
            f"then diagnose import nsys {reports}/rank*.sqlite --out <new run>"
        )
