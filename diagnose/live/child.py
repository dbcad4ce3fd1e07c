"""The live monitor's process. `LiveProcess` is the launcher's handle; `main`
is the child (`python -m diagnose.live.child RUN_DIR [--metrics-port N]`), which
ticks a diagnose.live.monitor.LiveMonitor with the ranks' progress.json every
TICK_S until the launcher sends the job's exit status, and with a port serves
the monitor's state as Prometheus metrics (diagnose.live.prometheus_metrics)."""

import os
import sys

from diagnose import rundir

TICK_S = 0.25
CLOSE_TIMEOUT_S = 90.0  # creating a new sqlite store can take ~10 s on a busy machine


class LiveProcess:
    """The launcher's handle: the monitor runs in a child process (`python -m
    diagnose.live.child RUN_DIR`, at lower CPU priority) that reads progress.json
    itself every TICK_S, so MLflow imports, store writes and event parsing
    never hold the launcher's GIL or delay its loop (exit-order tracking and the
    hang watchdog depend on that loop). The child writes alerts to the
    launcher's stderr; close() sends the job's exit status and waits for it. The child
    starts at the launcher's first tick, while the ranks import and rendezvous: its
    own imports and the MLflow store (seconds of CPU, at a rank's weight until the
    run exists) are then done before the job's first step. Started once a rank had
    recorded a step, they slowed a 40-step job's loop by 39% (bench/overhead.py
    --whole-job). A job that fails before its first step gets an MLflow run too,
    marked FAILED."""

    def __init__(self, run_dir: str, metrics_port: int | None = None):
        self.run_dir, self.metrics_port = run_dir, metrics_port
        self.proc = None
        self.reported = False

    def _spawn(self) -> None:
        import subprocess

        # its own session: see yield_to_the_job
        port = [] if self.metrics_port is None else ["--metrics-port", str(self.metrics_port)]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "diagnose.live.child", self.run_dir, *port],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )

    def tick(self, progress) -> None:
        if self.proc is None:
            try:
                self._spawn()
            except Exception as exc:
                self.reported = True
                self.proc = False
                sys.stderr.write(f"diagnose: warning: live monitor off: {type(exc).__name__}: {exc}\n")
            return
        if not self.proc:
            return
        if not self.reported and self.proc.poll() not in (None, 0):
            self.reported = True
            sys.stderr.write(
                f"diagnose: warning: live monitor exited with status "
                f"{self.proc.returncode}; no more live alerts or metrics\n"
            )

    def close(self, exit_status=None, timeout: float = CLOSE_TIMEOUT_S) -> None:
        import subprocess

        if not self.proc:
            return  # the job ended before the first tick, or the child could not start
        try:
            self.proc.stdin.write(f"{'' if exit_status is None else exit_status}\n")
            self.proc.stdin.close()
        except (OSError, ValueError):
            pass
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            sys.stderr.write(f"diagnose: warning: live monitor did not finish within {timeout:.0f} s; stopped\n")


def start(run_dir: str, manifest: dict | None = None, metrics_port: int | None = None) -> "LiveProcess | NullMonitor":
    """For the launcher: the live monitor's process, or a do-nothing stand-in if
    even starting it fails. `manifest` is already on disk; the child reads it.
    metrics_port: serve Prometheus metrics there (0: any free port)."""
    try:
        return LiveProcess(run_dir, metrics_port)
    except Exception as exc:
        sys.stderr.write(f"diagnose: warning: live monitor off: {type(exc).__name__}: {exc}\n")
        return NullMonitor()


class NullMonitor:
    def tick(self, progress) -> None:
        pass

    def close(self, exit_status=None) -> None:
        pass


def yield_to_the_job() -> None:
    """Run on the CPU time the job leaves idle. SCHED_IDLE (Linux; inherited by
    threads started later, as the MLflow one): a rank that wakes takes the core at once.
    At nice 10 this process still cost the reference trainer ~4% of its step
    time on a saturated 2-core box (bench/overhead.py: +4.6% against +0.7% for
    the collectors alone), though it used only 3.5% of one core: in a
    synchronous job, a rank that loses its core for a few ms holds up the others.

    SCHED_IDLE yields only to the threads of its own scheduling group, and on a
    kernel with autogroups (the default on most distributions, where no cpu
    cgroup is set up) every session is a group: torchrun starts each rank in a
    session of its own, so a child in the launcher's session weighed as much
    as a rank. The child therefore runs in its own session (LiveProcess), and
    lower_group_weight() takes that group down to nice 19 once the job's
    MLflow run exists.

    On a machine with no idle CPU at all, live alerts and metrics lag; the
    launcher's hang watchdog and the analysis do not depend on this process."""
    try:
        # every thread: Arrow's, started at import, too
        for thread_id in [int(t) for t in os.listdir("/proc/self/task")]:
            os.sched_setscheduler(thread_id, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):  # not Linux
        try:
            os.nice(19)
        except OSError:
            pass


def lower_group_weight() -> None:
    """This process's autogroup to nice 19: weight 15 against each rank's 1024
    (yield_to_the_job says why). Only once the MLflow run exists: creating a
    store costs seconds of CPU, and at weight 15 on a saturated box it ended
    after a short job did, leaving no live metrics at all."""
    if os.getsid(0) != os.getpid():  # never lower a group that holds more than this process
        return
    try:
        with open("/proc/self/autogroup", "w") as f:
            f.write("19")
    except OSError:
        pass  # no autogroups (a cpu cgroup, or not Linux): SCHED_IDLE is enough


def main(argv=None) -> int:
    """The child: tick a LiveMonitor until the launcher sends the exit status
    (or goes away: stdin closes)."""
    import select
    import signal

    argv = sys.argv[1:] if argv is None else argv
    run_dir = argv[0]
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the launcher's to handle
    yield_to_the_job()
    from diagnose.live.monitor import LiveMonitor
    from diagnose.rundir.progress import read_progress

    monitor = LiveMonitor(run_dir, rundir.read_manifest(run_dir))
    if "--metrics-port" in argv[1:-1]:
        from diagnose.live.prometheus_metrics import serve

        # its thread is SCHED_IDLE too (inherited): a scrape never takes a rank's core
        serve(run_dir, argv[argv.index("--metrics-port") + 1], monitor.gauges, monitor._say)
    exit_status = None
    lowered = False
    while True:
        ready, _, _ = select.select([sys.stdin], [], [], TICK_S)
        if ready:
            line = sys.stdin.readline()
            text = line.strip()
            exit_status = int(text) if text.lstrip("-").isdigit() else None
            break
        monitor.tick(read_progress(run_dir))
        streamer = monitor.streamer
        if not lowered and (streamer is None or streamer.run_id is not None or streamer.failed):
            lower_group_weight()
            lowered = True
    monitor.close(exit_status)
    return 0


if __name__ == "__main__":
    sys.exit(main())
