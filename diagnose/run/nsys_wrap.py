"""`diagnose run --nsys`: put `nsys profile` in front of each rank's program.

For a torchrun launch (`torchrun ...` or `python -m torch.distributed.run ...`)
the torchrun options are kept and the worker program becomes

    torchrun <opts> --no-python nsys profile -t cuda,nvtx,osrt -o <run>/nsys/rank%q{RANK} \
        <python> [-m] script.py args...

so each worker gets its own report, named by the RANK torchrun gives it
(`%q{RANK}` is expanded by nsys). Any other command is profiled as a whole:
`nsys profile ... -o <run>/nsys/job <command>` (one report for every process).
`nsys_command` is a pure function; `torchrun_python` finds the interpreter
torchrun would have used (its shebang).
"""

import os
import shutil

NSYS_TRACE = "cuda,nvtx,osrt"
NSYS_DIR = "nsys"
# torchrun options that take no value (torch.distributed.run.get_args_parser,
# checked against it by the tests); every other option takes one.
TORCHRUN_FLAGS = {
    "-h",
    "--help",
    "--standalone",
    "-m",
    "--module",
    "--no-python",
    "--no_python",
    "--run-path",
    "--run_path",
    "--virtual-local-rank",
    "--virtual_local_rank",
}
_MODULE = {"-m", "--module"}
_NO_PYTHON = {"--no-python", "--no_python"}
_RUN_PATH = {"--run-path", "--run_path"}
TORCHRUN_MODULES = ("torch.distributed.run", "torch.distributed.launch")


def split_torchrun(argv: list) -> tuple[list, list, list] | None:
    """(launcher prefix, torchrun options, [script, args...]) or None if argv is
    not a torchrun launch."""
    if not argv:
        return None
    head = os.path.basename(argv[0])
    if head == "torchrun":
        prefix, rest = argv[:1], argv[1:]
    elif head.startswith("python") and len(argv) >= 3 and argv[1] == "-m" and argv[2] in TORCHRUN_MODULES:
        prefix, rest = argv[:3], argv[3:]
    else:
        return None
    i = 0
    while i < len(rest):
        token = rest[i]
        if token == "--":
            return prefix, rest[:i], rest[i + 1 :]
        if not token.startswith("-") or token == "-":
            break
        if token in TORCHRUN_FLAGS or "=" in token:
            i += 1
        else:
            i += 2  # an option and its value
    return prefix, rest[:i], rest[i:]


def nsys_command(argv: list, run_dir: str, python: str = "python", nsys: str = "nsys") -> list:
    """The command line to launch instead of argv."""
    out_dir = os.path.join(run_dir, NSYS_DIR)
    parts = split_torchrun(argv)
    if parts is None or not parts[2]:
        return [nsys, "profile", "-t", NSYS_TRACE, "-o", os.path.join(out_dir, "job"), *argv]
    prefix, opts, program = parts
    if prefix[0] != "torchrun" and os.path.basename(prefix[0]).startswith("python"):
        python = prefix[0]
    no_python = any(o in _NO_PYTHON for o in opts)
    module = any(o in _MODULE for o in opts)
    kept = [o for o in opts if o not in _MODULE and o not in _NO_PYTHON and o not in _RUN_PATH]
    if no_python:
        worker = list(program)
    elif module:
        worker = [python, "-m", *program]
    else:
        worker = [python, *program]
    return [
        *prefix,
        *kept,
        "--no-python",
        nsys,
        "profile",
        "-t",
        NSYS_TRACE,
        "-o",
        os.path.join(out_dir, "rank%q{RANK}"),
        *worker,
    ]


def torchrun_python(argv0: str, default: str = "python") -> str:
    """The interpreter in torchrun's shebang (the one its workers run), else default."""
    path = shutil.which(argv0) if os.path.basename(argv0) == "torchrun" else None
    if not path:
        return default
    try:
        with open(path, "rb") as f:
            first = f.readline(4096).decode("utf-8", "replace").strip()
    except OSError:
        return default
    if first.startswith("#!"):
        words = first[2:].split()
        if words and os.path.basename(words[0]) == "env" and len(words) > 1:
            return words[1]
        if words:
            return words[0]
    return default
