"""Issue 7: `diagnose run --nsys` (command rewriting, and the message when nsys is
absent), `--torch-profiler STEPS` end to end, and bad input to `diagnose import`."""

import gzip
import json
import os
import sqlite3
import subprocess
import sys

import pytest

from diagnose.run.nsys_wrap import TORCHRUN_FLAGS, nsys_command, split_torchrun, torchrun_python
from tests.support.jobs import REPO, fixture_path, job_env, load_run, run_diagnose, torchrun

KINETO = fixture_path("kineto")
NSYS_OUT = "-o /r/nsys/rank%q{RANK}".split()
NSYS = ["nsys", "profile", "-t", "cuda,nvtx,osrt"]


def test_torchrun_flags_match_torch():
    from torch.distributed.run import get_args_parser

    flags = {o for a in get_args_parser()._actions if a.option_strings and a.nargs == 0 for o in a.option_strings}
    assert flags == TORCHRUN_FLAGS


@pytest.mark.parametrize(
    "argv, expected",
    [
        (
            ["torchrun", "--nproc-per-node", "8", "--standalone", "train.py", "--lr", "3e-4"],
            [
                "torchrun",
                "--nproc-per-node",
                "8",
                "--standalone",
                "--no-python",
                *NSYS,
                *NSYS_OUT,
                "/py",
                "train.py",
                "--lr",
                "3e-4",
            ],
        ),
        (
            ["torchrun", "--nnodes=2", "-m", "pkg.train", "-x"],
            ["torchrun", "--nnodes=2", "--no-python", *NSYS, *NSYS_OUT, "/py", "-m", "pkg.train", "-x"],
        ),
        (
            ["torchrun", "--no-python", "--nproc_per_node", "2", "./prog", "a"],
            ["torchrun", "--nproc_per_node", "2", "--no-python", *NSYS, *NSYS_OUT, "./prog", "a"],
        ),
        (
            ["/v/bin/python3", "-m", "torch.distributed.run", "--nproc-per-node", "2", "t.py"],
            [
                "/v/bin/python3",
                "-m",
                "torch.distributed.run",
                "--nproc-per-node",
                "2",
                "--no-python",
                *NSYS,
                *NSYS_OUT,
                "/v/bin/python3",
                "t.py",
            ],
        ),
        (["bash", "launch.sh"], [*NSYS, "-o", "/r/nsys/job", "bash", "launch.sh"]),
    ],
)
def test_nsys_command_rewrites_the_worker_program(argv, expected):
    assert nsys_command(argv, "/r", python="/py") == expected


def test_split_torchrun_and_shebang(tmp_path, monkeypatch):
    assert split_torchrun(["python", "train.py"]) is None
    assert split_torchrun(["torchrun", "--rdzv-endpoint", "h:1", "--", "t.py", "-v"]) == (
        ["torchrun"],
        ["--rdzv-endpoint", "h:1"],
        ["t.py", "-v"],
    )
    script = tmp_path / "torchrun"
    script.write_text("#!/opt/env/bin/python3.11\nimport sys\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert torchrun_python("torchrun") == "/opt/env/bin/python3.11"
    assert torchrun_python("mpirun", default="python") == "python"


def test_run_with_torch_profiler_and_absent_nsys(tmp_path):
    """One rank, CPU: the profiler window is written and imported; --nsys without
    nsys on PATH is one line and the job runs anyway."""
    out = tmp_path / "run"
    env = job_env(
        PATH=os.pathsep.join(
            p for p in os.environ["PATH"].split(os.pathsep) if not os.path.exists(os.path.join(p, "nsys"))
        )
    )
    proc = run_diagnose(
        [
            "run",
            "--out",
            out,
            "--no-analyze",
            "--nsys",
            "--torch-profiler",
            "2-3",
            "--",
            *torchrun(1, "samples/ddp_mlp.py", "--steps", 6, "--hidden", 64),
        ],
        env=env,
    )
    nsys_lines = [line for line in proc.stderr.splitlines() if "--nsys" in line]
    assert nsys_lines == ["diagnose: --nsys: nsys (Nsight Systems) is not on PATH; running without it"]
    trace = out / "traces" / "rank-00000" / "torch_profiler" / "rank-00000.pt.trace.json.gz"
    events = json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
    steps = sorted(e["name"] for e in events if e.get("name", "").startswith("ProfilerStep#"))
    assert steps == ["ProfilerStep#2", "ProfilerStep#3"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["torch_profiler"] == {"steps": [2, 3], "imported_kernels": {"0": 0}}  # CPU: no kernels
    assert manifest["nsys"]["used"] is False
    run = load_run(out)
    assert (run.events()["name"] == "torch_profiler_export").sum() == 1


def test_run_with_nsys_wraps_each_rank(tmp_path):
    """A stand-in `nsys` on PATH: the rewritten torchrun command runs each worker
    through it, with the collectors still active inside."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "nsys"
    fake.write_text(
        "#!/bin/sh\n# profile -t TRACE -o OUT PROGRAM...\nshift; shift; shift; shift; out=$1; shift\n"
        'echo "$*" > "$(echo "$out" | sed "s/%q{RANK}/$RANK/").nsys-rep"\nexec "$@"\n'
    )
    fake.chmod(0o755)
    out = tmp_path / "run"
    env = job_env(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    proc = run_diagnose(
        [
            "run",
            "--out",
            out,
            "--no-analyze",
            "--nsys",
            "--",
            *torchrun(2, "samples/ddp_mlp.py", "--steps", 3, "--hidden", 64),
        ],
        env=env,
    )
    assert "each rank runs under nsys" in proc.stderr
    for rank in (0, 1):
        report = (out / "nsys" / f"rank{rank}.nsys-rep").read_text()
        assert report.split()[1:] == ["samples/ddp_mlp.py", "--steps", "3", "--hidden", "64"]
    run = load_run(out)
    assert run.ranks == [0, 1] and len(run.steps()) == 6
    assert json.loads((out / "manifest.json").read_text())["nsys"]["used"] is True


def _diagnose_exe() -> list:
    exe = REPO / ".venv" / "bin" / "diagnose"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "diagnose"]


def _truncated_gzip_trace() -> bytes:
    events = [
        {"ph": "X", "cat": "cpu_op", "name": f"aten::op{i}", "ts": i, "dur": 1, "pid": 1, "tid": 1} for i in range(5000)
    ]
    data = gzip.compress(json.dumps({"traceEvents": events}).encode())
    return data[: len(data) // 2]


@pytest.mark.parametrize(
    "fmt, make, reason",
    [
        ("kineto", lambda d: (d / "x.json").write_text('{"not": "a trace"}'), "no traceEvents"),
        ("kineto", lambda d: (d / "x.json.gz").write_bytes(_truncated_gzip_trace()), "truncated or corrupt gzip"),
        ("nsys", lambda d: (d / "x.sqlite").write_bytes(b"definitely not sqlite" * 100), "not an SQLite"),
        (
            "nsys",
            lambda d: sqlite3.connect(d / "x.sqlite").execute("CREATE TABLE t (a)").connection.commit(),
            "without Nsight Systems kernel or NVTX tables",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, fmt, make, reason):
    make(tmp_path)
    (bad,) = [p for p in tmp_path.iterdir()]
    proc = subprocess.run(
        [*_diagnose_exe(), "import", fmt, str(bad), "--out", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and reason in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists()


def test_import_cli_refuses_a_non_empty_out(tmp_path):
    trace = str(KINETO / "hta" / "execution_trace" / "benchmark_simple_add_trace.json.gz")
    first = subprocess.run(
        [*_diagnose_exe(), "import", "kineto", trace, "--out", str(tmp_path / "r")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert first.returncode == 0 and "imported" in first.stdout
    again = subprocess.run(
        [*_diagnose_exe(), "import", "kineto", trace, "--out", str(tmp_path / "r")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert again.returncode == 2 and "is not empty" in again.stderr and again.stderr.count("\n") == 1
