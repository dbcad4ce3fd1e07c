"""Where a stuck rank is, to the line, from its faulthandler stacks
(diagnose/rundir/fault_stacks_reader.py): the thread that matters, its
innermost user frame with the code line, what it is in, and whether it holds
the GIL.

What it is in: the library frame the user's line called (innermost first:
"in `wait` (threading.py) at train.py:120"); a user frame with no Python frame
inside it is "in a C call at data.py:41" (faulthandler shows Python frames
only: the C function, or the line's own work).

Who holds the GIL, inferred (no native frames here; `py-spy dump --native`
shows them, and the finding says so): the rank's own writer thread could not
write its watchdog dump, so some thread held the GIL the whole time; the holder
is the one job thread that is not in a wait that releases it (a threading or
queue wait, a sleep, a selector, socket or pipe read, a join, a collective or
a device sync in torch, whose C++ releases the GIL). Exactly one such thread,
or no claim. With the watchdog dump present the GIL was free: a culprit in a C
call then runs without it.
"""

import linecache
import os
import re

# library frames a thread waits in with the GIL released
_WAIT_FUNCS = {
    "wait",
    "_wait_for_tstate_lock",
    "join",
    "acquire",
    "get",
    "select",
    "poll",
    "recv",
    "recv_into",
    "recvfrom",
    "accept",
    "read",
    "readline",
    "sleep",
    "result",
    "wait_for",
    "_recv",
    "_recv_bytes",
    "_poll",
    "synchronize",
}
# the code of a user line that waits in C with the GIL released
_WAIT_CALL = re.compile(
    r"\b(sleep|wait|join|acquire|recv|select|barrier|all_reduce|all_gather|reduce_scatter|"
    r"broadcast|all_to_all|send|irecv|isend|synchronize|result)\s*\("
)
_STDLIB = re.compile(r"/lib/python\d+\.\d+/(?!.*-packages/)")
_OURS = tuple(
    os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), d) + os.sep
    for d in ("collectors", "diagnose")
)
OUR_THREAD_PREFIX = "diagnose-"


def is_library(path: str) -> bool:
    # not collectors.callsite.is_internal: that one knows this interpreter's stdlib
    # directory; a dump may come from another machine's, so its path shape is read
    return (
        path.startswith("<") or bool(_STDLIB.search(path)) or f"{os.sep}torch{os.sep}" in path or path.startswith(_OURS)
    )


def code_line(path: str, line: int) -> str:
    """The line's code, its trailing comment left out (read from the file, as data)."""
    text = linecache.getline(path, line) if path and not path.startswith("<") else ""
    return re.sub(r"\s+#[^'\"]*$", "", text.strip())


def _user_frame(frames: list) -> tuple[int, dict] | tuple[None, None]:
    for i, frame in enumerate(frames):
        if not is_library(frame["file"]):
            return i, frame
    return None, None


def _waits(thread: dict) -> bool:
    frames = thread["frames"]
    if not frames:
        return True  # in C only, no Python frame: not running Python code
    if is_library(frames[0]["file"]) and frames[0]["func"] in _WAIT_FUNCS:
        return True
    i, user = _user_frame(frames)
    return i == 0 and bool(_WAIT_CALL.search(code_line(user["file"], user["line"])))


def describe(stacks: dict, watchdog_dumped: bool) -> dict | None:
    """{thread, frame (file:line), code, what, gil} of the thread that matters, or None."""
    threads = [t for t in stacks.get("threads", []) if not (t.get("name") or "").startswith(OUR_THREAD_PREFIX)]
    if not threads:
        return None
    holder = None
    if not watchdog_dumped:
        running = [t for t in threads if not _waits(t)]
        holder = running[0] if len(running) == 1 else None
    main = next((t for t in threads if t.get("name") == "MainThread"), None)
    thread = holder or main or next((t for t in threads if _user_frame(t["frames"])[1]), threads[0])
    i, user = _user_frame(thread["frames"])
    if user is None:
        return {
            "thread": thread.get("name") or thread["ident"],
            "frame": None,
            "code": "",
            "what": "in library code only",
            "gil": "held (inferred)" if holder else None,
        }
    inside = thread["frames"][i - 1] if i > 0 else None
    what = f"in `{inside['func']}` ({os.path.basename(inside['file'])})" if inside else "in a C call"
    return {
        "thread": thread.get("name") or thread["ident"],
        "frame": f"{user['file']}:{user['line']}",
        "code": code_line(user["file"], user["line"]),
        "what": what,
        "gil": "held (inferred)" if holder is thread else None,
    }


def sentence(where: dict, relpath) -> str:
    """ "in a C call at data.py:41 (`lock(m)`), holding the GIL (inferred: ...)"."""
    if where["frame"] is None:
        return f"its {where['thread']} thread is {where['what']}"
    text = f"{where['what']} at {relpath(where['frame'])}" + (f" (`{where['code']}`)" if where["code"] else "")
    if where["gil"]:
        text += (
            ", holding the GIL (inferred: its writer thread could not run and every other thread "
            "waits in a call that releases it; `py-spy dump --native --pid PID` shows the C frames)"
        )
    return text
