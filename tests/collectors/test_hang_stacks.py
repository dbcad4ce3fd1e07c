"""Issue 47, items 1-3: every thread's stack on a hang, even while a thread holds
the GIL (faulthandler on a real-time signal: collectors/instrument/fault_stacks.py),
sent only to marked rank processes (diagnose/run/stack_signal.py), read to the
line (diagnose/rundir/fault_stacks_reader.py, diagnose/analysis/tables/stuck_frames.py).

Real processes in real states, no torch: each child registers as a rank does,
writes its marker in a rank folder, then gets stuck; the launcher's code signals it."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from diagnose.analysis.tables.stuck_frames import describe, sentence
from diagnose.run.stack_signal import markers, signal_marked_ranks
from diagnose.rundir.fault_stacks_reader import read_rank_stacks
from tests.support.jobs import REPO

PRELUDE = """
import ctypes, os, signal, sys, threading, time
sys.path.insert(0, {repo!r})
from collectors.instrument.fault_stacks import StackSignal
stacks = StackSignal({rank_dir!r})
assert stacks.register()
ready = threading.Event()
def waiter():
    ready.wait()
threading.Thread(target=waiter, name="loader-thread", daemon=True).start()
stacks.write_marker()
print("registered", stacks.sig, flush=True)
"""
# a self-deadlock in C: ctypes.PyDLL keeps the GIL across the call, ctypes.CDLL releases it
DEADLOCK = """
libc = ctypes.{lib}(None)
mutex = ctypes.create_string_buffer(64)
libc.pthread_mutex_init(mutex, None)
libc.pthread_mutex_lock(mutex)
libc.pthread_mutex_lock(mutex)
"""
STATES = {
    "gil": DEADLOCK.format(lib="PyDLL"),
    "c_no_gil": DEADLOCK.format(lib="CDLL"),
    "event": """
stop = threading.Event()
stop.wait()
""",
}


def _stuck(tmp_path, state, extra=""):
    run_dir = tmp_path / "run"
    rank_dir = run_dir / "traces" / "rank-00001"
    rank_dir.mkdir(parents=True)
    code = textwrap.dedent(PRELUDE.format(repo=str(REPO), rank_dir=str(rank_dir))) + extra + STATES[state]
    script = tmp_path / f"{state}_job.py"
    script.write_text(code)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().startswith("registered")
    _wait_until_blocked(proc.pid)
    return run_dir, rank_dir, proc, script


def _wait_until_blocked(pid: int, timeout_s: float = 30.0) -> None:
    """Until the job's main thread sleeps in a futex: in every state here that is
    its stuck call (the second mutex lock, or the event's wait; its other thread
    already waits in its own). A fixed sleep here once signalled a job of a loaded
    box still on its way, and its stack said "in library code only"."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/wchan") as wchan:
            if "futex" in wchan.read():
                return
        time.sleep(0.01)  # poll period
    raise AssertionError(f"the job never blocked in its stuck call within {timeout_s} s")


def _signalled(run_dir, rank_dir, proc):
    assert signal_marked_ranks(str(run_dir)) == [proc.pid]
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not read_rank_stacks(str(rank_dir)):
        time.sleep(0.05)
    stacks = read_rank_stacks(str(rank_dir))
    assert proc.poll() is None, "our signal must not end the rank"
    proc.kill()
    proc.wait()
    return stacks


def test_a_rank_holding_the_gil_in_c_is_named_to_the_line_with_the_gil_inferred(tmp_path):
    run_dir, rank_dir, proc, script = _stuck(tmp_path, "gil")
    stacks = _signalled(run_dir, rank_dir, proc)
    names = {t["name"] for t in stacks["threads"]}
    assert {"MainThread", "loader-thread"} <= names  # idents mapped through the marker
    where = describe(stacks, watchdog_dumped=False)
    assert where["thread"] == "MainThread" and where["frame"] == f"{script}:{script.read_text().count(chr(10))}"
    assert where["code"] == "libc.pthread_mutex_lock(mutex)" and where["what"] == "in a C call"
    assert where["gil"] == "held (inferred)"
    text = sentence(where, os.path.basename)
    assert text.startswith(f"in a C call at {script.name}:") and "holding the GIL (inferred" in text


def test_a_rank_in_a_c_call_without_the_gil_is_not_said_to_hold_it(tmp_path):
    run_dir, rank_dir, proc, _ = _stuck(tmp_path, "c_no_gil")
    where = describe(_signalled(run_dir, rank_dir, proc), watchdog_dumped=True)
    assert where["what"] == "in a C call" and where["gil"] is None
    assert "GIL" not in sentence(where, os.path.basename)


def test_a_rank_waiting_on_an_event_is_in_wait(tmp_path):
    run_dir, rank_dir, proc, script = _stuck(tmp_path, "event")
    where = describe(_signalled(run_dir, rank_dir, proc), watchdog_dumped=False)
    # every thread waits in a call that releases the GIL: no holder is claimed
    assert where["thread"] == "MainThread" and where["what"] == "in `wait` (threading.py)"
    assert where["code"] == "stop.wait()" and where["gil"] is None


def test_the_jobs_own_handlers_are_kept_and_only_marked_live_ranks_get_the_signal(tmp_path):
    calls = tmp_path / "calls"
    own = f"""
def mine(signum, frame):
    open({str(calls)!r}, "a").write(str(signum) + "\\n")
for s in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGRTMIN + 1):
    signal.signal(s, mine)
"""
    # the job installs its handlers before diagnose registers (as at startup, before import torch)
    state_first = PRELUDE.replace("stacks = StackSignal", own + "\nstacks = StackSignal")
    run_dir = tmp_path / "run"
    rank_dir = run_dir / "traces" / "rank-00000"
    rank_dir.mkdir(parents=True)
    script = tmp_path / "own_handlers.py"
    script.write_text(textwrap.dedent(state_first.format(repo=str(REPO), rank_dir=str(rank_dir))) + STATES["event"])
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    sig = int(proc.stdout.readline().split()[1])
    assert sig == signal.SIGRTMIN + 2  # SIGRTMIN+1 is the job's; SIGUSR1/2 are never candidates
    # a bystander: same host, not marked, its real-time signals at their default (which kills)
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    # a stale marker whose pid is now another process (the bystander): never signalled
    (run_dir / "traces" / "rank-00009").mkdir()
    stale = dict(markers(str(run_dir))[0], pid=bystander.pid)
    (run_dir / "traces" / "rank-00009" / f"stacks-{bystander.pid}.json").write_text(__import__("json").dumps(stale))
    try:
        assert signal_marked_ranks(str(run_dir)) == [proc.pid]
        # the rank's dump is written once its handler ran (a fixed 0.5 s here once
        # read no file on a loaded box); a signalled bystander would be dead by then
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not read_rank_stacks(str(rank_dir)):
            time.sleep(0.05)  # poll period
        assert bystander.poll() is None and proc.poll() is None
        assert not calls.exists()  # none of the job's handlers ran
        assert read_rank_stacks(str(rank_dir))["signal"] == sig
    finally:
        for p in (proc, bystander):
            p.kill()
            p.wait()


def test_a_handler_the_job_puts_on_our_signal_later_withdraws_the_marker(tmp_path):
    later = """
stacks.refresh()
signal.signal(stacks.sig, lambda *a: None)
stacks.refresh()
print("withdrawn", stacks.withdrawn, flush=True)
"""
    run_dir, rank_dir, proc, _ = _stuck(tmp_path, "event", extra=later)
    assert proc.stdout.readline().split() == ["withdrawn", "True"]
    assert markers(str(run_dir))[0]["withdrawn"] is True
    assert signal_marked_ranks(str(run_dir)) == []
    proc.kill()
    proc.wait()


@pytest.mark.parametrize(
    "text, names, expected",
    [
        ("Thread 0x00007f01 (most recent call first):\n  <no Python frame>\n", {}, [("0x00007f01", None, 0)]),
        (
            'garbage\nCurrent thread 0x0A (most recent call first):\n  File "a.py", line 3 in f\n  ...\n',
            {"0x0a": "MainThread"},
            [("0x0a", "MainThread", 1)],
        ),
        ("", {}, []),
    ],
)
def test_the_parser_reads_what_faulthandler_writes_and_skips_the_rest(text, names, expected):
    from diagnose.rundir.fault_stacks_reader import parse_stacks

    assert [(t["ident"], t["name"], len(t["frames"])) for t in parse_stacks(text, names)] == expected


def test_under_diagnose_run_a_jobs_own_handlers_stay_its_and_only_ranks_get_the_signal(tmp_path):
    """A job with its own SIGUSR1/SIGUSR2/SIGRTMIN+1 handlers hangs under `diagnose run`:
    at the verdict each rank's stacks are taken on a signal the job does not use, none of
    the job's handlers runs, and a process of the same host that no rank is stays alive."""
    import json

    from tests.support.jobs import job_env, run_diagnose, torchrun

    handled = tmp_path / "handled.log"
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        proc = run_diagnose(
            [
                "run",
                "--out",
                tmp_path / "run",
                "--hang-timeout",
                3,
                "--kill-on-hang",
                "--no-outputs",
                "--",
                *torchrun(2, "tests/scripts/own_handlers_job.py"),
            ],
            env=job_env(HANDLED_LOG=str(handled)),
            check=False,
            timeout=240,
        )
        assert proc.returncode != 0  # killed on the hang, as asked
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()
    assert not handled.exists(), handled.read_text()
    marks = markers(str(tmp_path / "run"))
    assert len(marks) == 2 and {m["signal"] for m in marks} == {int(signal.SIGRTMIN) + 2}
    for rank in (0, 1):
        stacks = read_rank_stacks(str(tmp_path / "run" / "traces" / f"rank-{rank:05d}"))
        assert stacks is not None and any(t["name"] == "MainThread" for t in stacks["threads"])
    findings = json.loads((tmp_path / "run" / "analysis" / "findings.json").read_text())
    (hang,) = [f for f in findings if f["kind"] == "hang"]
    assert hang["ranks"] == [1] and "own_handlers_job.py:" in hang["title"] and "time.sleep(600)" in hang["title"]
