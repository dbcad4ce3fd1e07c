"""The jobs bench/overhead.py measures (reference trainer, samples/ddp_mlp.py,
samples/titan_style.py: 2 ranks under torchrun, local rank i on core i where
pinned), the readers of their step logs, and how one run is started in a mode
(plain, `diagnose run`, the collectors alone, torch.profiler), each in a
session of its own, and stopped with its ranks. bench/live_cost.py runs them too.
"""

import json
import os
import signal
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = sys.executable


def torchrun(pin: bool) -> list:
    """2 local ranks; with `pin`, local rank i runs on core i (modulo the cores)."""
    launcher = [PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    if not pin:
        return launcher
    return launcher + ["--no-python", "bash", "-c", f'exec taskset -c $((LOCAL_RANK % {os.cpu_count()})) "$0" "$@"', PY]


def jobs(steps: int, pin: bool) -> dict:
    """job -> (command for a log path, reader of that log: [(step_s, end_unix_s)])."""
    run = torchrun(pin)
    return {
        "reference": (
            lambda log: (
                run
                + [
                    "-m",
                    "reference_trainer",
                    "--dp",
                    "2",
                    "--microbatches",
                    "2",
                    "--steps",
                    str(steps),
                    "--log-jsonl",
                    log,
                ]
            ),
            _jsonl_steps,
        ),
        "ddp_mlp": (
            lambda log: (
                run
                + [
                    "samples/ddp_mlp.py",
                    "--steps",
                    str(steps),
                    "--dim",
                    "256",
                    "--hidden",
                    "768",
                    "--batch-size",
                    "40",
                    "--log-step-times",
                    log,
                ]
            ),
            _line_steps,
        ),
        # DTensor TP over both ranks: every block's all-reduce is a functional collective
        "titan_style": (
            lambda log: (
                run
                + [
                    "samples/titan_style.py",
                    "--tp",
                    "2",
                    "--steps",
                    str(steps),
                    "--dim",
                    "256",
                    "--layers",
                    "4",
                    "--seq",
                    "64",
                    "--log-step-times",
                    log,
                ]
            ),
            _line_steps,
        ),
    }


def _jsonl_steps(path):
    with open(path, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [(row["step_time_s"], row["end_unix_s"]) for row in rows]


def _line_steps(path):
    with open(path, encoding="utf-8") as f:
        return [tuple(map(float, line.split())) for line in f if line.strip()]


def start(command: list, mode: str, work: str) -> tuple:
    """Start one job in one mode, in a session of its own; (process, run dir or None)."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    run_dir = None
    if mode == "diagnose":
        run_dir = tempfile.mkdtemp(prefix="run-", dir=work)
        command = [PY, "-m", "diagnose", "run", "--out", run_dir, "--force", "--no-analyze", "--", *command]
    elif mode == "collectors":  # the ranks' side alone: what `diagnose run` puts in the job, no launcher
        run_dir = tempfile.mkdtemp(prefix="run-", dir=work)
        env.update(
            DIAGNOSE_RUN_DIR=run_dir,
            PYTHONPATH=os.pathsep.join(
                [os.path.join(ROOT, "collectors", "bootstrap"), env.get("PYTHONPATH", "")]
            ).rstrip(os.pathsep),
        )
    elif mode == "profiler":
        site = os.path.join(ROOT, "bench", "profiler_site")
        env["PYTHONPATH"] = os.pathsep.join([site, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    proc = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    return proc, run_dir


def stop(procs) -> None:
    """SIGTERM first: torchrun passes it on to its ranks, which run in sessions
    of their own, so a SIGKILL to the launcher's group alone would leave them
    running (they did, when this bench was interrupted)."""
    running = [p for p in procs if p.poll() is None]
    for proc in running:
        os.killpg(proc.pid, signal.SIGTERM)
    for proc in running:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
