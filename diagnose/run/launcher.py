"""`diagnose run -- CMD...`: run an unmodified job with the collectors bootstrapped
into every rank, watch it, pass its exit status through, then analyze.

The job runs in its own process group, so that Ctrl-C (forwarded), a hang
(ended by the watchdog) and the job's own children can be signalled as one.
"""

import importlib.metadata
import os
import platform
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import collectors
from collectors.instrument.flight_recorder_dump import enabled as fr_enabled
from collectors.part_writer import merge_row_parts
from diagnose import rundir
from diagnose.errors import UserError
from diagnose.live.child import start as start_live
from diagnose.run.flight_recorder_env import collect_user_dumps, flight_recorder_env
from diagnose.run.profiling_tools import after_job, before_job
from diagnose.run.progress_line import ProgressLine
from diagnose.run.rank_liveness import RankLiveness
from diagnose.run.watchdog import HANG_FLOOR_S, HangWatchdog, kill_rank_processes
from diagnose.rundir.progress import read_progress

BOOTSTRAP_DIR = os.path.join(os.path.dirname(os.path.abspath(collectors.__file__)), "bootstrap")
INTERRUPT_GRACE_S = 15.0


@dataclass
class RunOptions:
    command: list
    out_dir: str | None = None
    name: str | None = None
    force: bool = False
    hang_timeout_s: float | None = None  # None: derived from the median step (diagnose.run.watchdog)
    hang_floor_s: float = HANG_FLOOR_S
    kill_on_hang: bool = False
    on_hang: Callable[[str], None] | None = None  # run_dir -> None: the analysis while it hangs
    extra_env: dict = field(default_factory=dict)
    nsys: bool = False  # --nsys: each rank under `nsys profile` (diagnose.run.profiling_tools)
    torch_profiler: str | None = None  # --torch-profiler STEPS, e.g. "10-12"
    metrics_port: int | None = None  # --metrics-port: Prometheus metrics from the live child (0: any port)


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _layout_from_argv(argv: list) -> dict:
    layout = {}
    for flag in ("--dp", "--tp", "--pp"):
        if flag in argv[:-1]:
            try:
                layout[flag[2:]] = int(argv[argv.index(flag) + 1])
            except ValueError:
                pass
    return layout


def job_env(run_dir: str, extra: dict) -> dict:
    env = dict(os.environ)
    env.pop("DIAGNOSE_ACTIVE_PID", None)
    env["DIAGNOSE_RUN_DIR"] = run_dir
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [BOOTSTRAP_DIR, env.get("PYTHONPATH", "")]))
    env.update(extra)
    return env


def _signal_group(proc, sig) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def launch(opts: RunOptions) -> tuple[str, int]:
    """Run the job to its end. Returns (run_dir, exit status as a shell reports it)."""
    if not opts.command:
        raise UserError("no command given: use `diagnose run -- torchrun ... train.py`")
    run_dir = rundir.prepare_out_dir(opts.out_dir or rundir.default_out_dir(name=opts.name), force=opts.force)
    manifest = {
        "name": opts.name or os.path.basename(run_dir),
        "command": shlex.join(opts.command),
        "argv": list(opts.command),
        "cwd": os.getcwd(),
        "start_wall_ns": time.time_ns(),
        "launcher_host": socket.gethostname(),
        "layout": _layout_from_argv(list(opts.command)),
        "versions": {"python": platform.python_version(), "torch": _version("torch"), "diagnose": _version("diagnose")},
    }
    environ = {**os.environ, **opts.extra_env}
    fr_env, manifest["flight_recorder"] = flight_recorder_env(
        run_dir, environ, torch_version=manifest["versions"]["torch"]
    )
    rundir.write_manifest(run_dir, manifest)
    group_kwargs = {"process_group": 0} if sys.version_info >= (3, 11) else {"preexec_fn": os.setpgrp}
    try:
        command, extra_env = before_job(opts, run_dir, manifest)
        proc = subprocess.Popen(command, env=job_env(run_dir, {**fr_env, **extra_env}), **group_kwargs)
    except (FileNotFoundError, PermissionError) as exc:
        raise UserError(f"cannot start {opts.command[0]!r}: {exc.strerror}") from None

    interrupted_at = []

    def on_sigint(signum, frame):
        interrupted_at.append(time.monotonic())
        _signal_group(proc, signal.SIGINT)

    previous = signal.signal(signal.SIGINT, on_sigint)
    progress = ProgressLine(run_dir=run_dir)  # reads the rank dirs and the live child's live.json

    def on_hang(report):  # analyze while the job is still hung: the user sees who, now
        manifest["hang"] = report
        rundir.write_manifest(run_dir, manifest)
        if opts.on_hang is not None:
            opts.on_hang(run_dir)

    watchdog = HangWatchdog(
        run_dir,
        proc,
        opts.hang_timeout_s,
        floor_s=opts.hang_floor_s,
        kill_on_hang=opts.kill_on_hang,
        on_hang=on_hang,
        flight_recorder=fr_enabled({**environ, **fr_env}),
    )
    liveness = RankLiveness(run_dir)
    # alerts, MLflow and Prometheus metrics while the job runs; never raises
    live = start_live(run_dir, manifest, metrics_port=opts.metrics_port)
    try:
        while proc.poll() is None:
            time.sleep(0.25)
            snapshot = read_progress(run_dir)
            progress.tick(snapshot)
            watchdog.tick(snapshot)
            live.tick(snapshot)
            if interrupted_at and time.monotonic() - interrupted_at[0] > INTERRUPT_GRACE_S:
                _signal_group(proc, signal.SIGKILL)
                kill_rank_processes(run_dir)
    finally:
        signal.signal(signal.SIGINT, previous)
        progress.close()
        live.close(proc.returncode)
    status = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
    for rank_dir in rundir.rank_dirs(run_dir):
        merge_row_parts(rank_dir)  # what a killed rank left as JSON rows becomes Parquet
    collect_user_dumps(run_dir, manifest["flight_recorder"], manifest["start_wall_ns"])
    stalled = watchdog.report is not None and "resumed_after_s" in watchdog.report
    manifest.update(
        end_wall_ns=time.time_ns(),
        exit_status=status,
        interrupted=bool(interrupted_at),
        hang=None if stalled else watchdog.report,
        stall=watchdog.report if stalled else None,
        hang_watch=watchdog.summary(),
        rank_exits=liveness.close(),
    )
    after_job(opts, run_dir, manifest)
    metas = read_progress(run_dir)
    manifest["world_size"] = len(rundir.rank_dirs(run_dir)) or None
    manifest["ranks_seen"] = sorted(metas)
    rundir.write_manifest(run_dir, manifest)
    return run_dir, status
