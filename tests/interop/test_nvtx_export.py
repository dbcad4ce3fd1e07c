"""Issue 7: NVTXT export (checked against the NVTXT grammar) and the .nsys-rep
export through nvtx.writer (NVTXW), here with a stand-in for the module."""

import re
import sys
import types
from pathlib import Path

import pytest

from collectors.part_writer import PartWriter
from collectors.schema import event_row, rank_dir_name
from diagnose.cli.commands import main
from diagnose.exporters.nsys_rep import write_nsys_rep
from diagnose.exporters.nvtxt import write_nvtxt
from tests.support.jobs import load_run

# NVTXT grammar (Nsight's text NVTX): comment, assignment, declaration, instruction.
COMMENT = re.compile(r"^#.*$")
INTEGER = r"-?(?:\d+|0[xX][0-9a-fA-F]+)"
STRING = r'"[^"\n]*"'
ASSIGN = re.compile(rf"^([A-Za-z_]\w*)\s*=\s*({INTEGER}|{STRING}|[A-Za-z_]\w*)$")
DECLARE = re.compile(r"^@([A-Za-z]+)((?:,\s*[A-Za-z]+)+)$")
INSTRUCTION = re.compile(r"^([A-Za-z]+)((?:,\s*(?:" + INTEGER + "|" + STRING + r"|[^,\"]+))*)$")
ARG = re.compile(rf"\s*({INTEGER}|{STRING}|[^,\"]+)\s*(?:,|$)")
KNOWN_VARIABLES = {"ProcessId", "ThreadId", "CategoryId", "Color", "TimeBase", "Payload"}


def parse_nvtxt(text: str) -> dict:
    """Check every line; return {"ranges": [(start, end, tid, msg, category)], "marks": [...],
    "variables": {...}}."""
    declared, variables, ranges, marks = {}, {}, [], []
    for number, line in enumerate(text.splitlines(), 1):
        where = f"line {number}: {line!r}"
        if not line.strip() or COMMENT.match(line):
            continue
        m = ASSIGN.match(line)
        if m:
            assert m.group(1) in KNOWN_VARIABLES, where
            variables[m.group(1)] = m.group(2)
            continue
        m = DECLARE.match(line)
        if m:
            declared[m.group(1)] = [f.strip() for f in m.group(2).split(",")[1:]]
            continue
        m = INSTRUCTION.match(line)
        assert m, where
        name = m.group(1)
        args = [a for a in ARG.findall(m.group(2).lstrip(",")) if a != ""]
        if name == "SetFileDisplayName":
            continue
        assert name in declared, f"{where}: not declared"
        assert len(args) == len(declared[name]), where
        fields = dict(zip(declared[name], args))
        for key in ("Start", "End", "Time", "ThreadId"):
            if key in fields:
                assert re.fullmatch(INTEGER, fields[key]), where
        assert re.fullmatch(STRING, fields["Message"]), where
        assert "TimeBase" in variables and "ProcessId" in variables, where
        if name == "RangeStartEnd":
            assert int(fields["Start"]) <= int(fields["End"]), where
            ranges.append(
                (
                    int(fields["Start"]),
                    int(fields["End"]),
                    int(fields["ThreadId"]),
                    fields["Message"][1:-1],
                    int(variables.get("CategoryId", 0)),
                )
            )
        else:
            marks.append((int(fields["Time"]), fields["Message"][1:-1]))
    return {"ranges": ranges, "marks": marks, "variables": variables}


@pytest.fixture
def small_run(tmp_path) -> Path:
    """A native-looking run: 2 ranks, a step, phases, an async all-reduce, a mark,
    a kernel, and a name with a quote in it."""
    run = tmp_path / "run"
    for rank in (0, 1):
        w = PartWriter(str(run / "traces" / rank_dir_name(rank)))
        base = 5_000_000_000 + rank * 1000
        w.write_events(
            [
                event_row("step", "step", base, base + 100_000_000, step=0),
                event_row("forward", "forward", base + 1_000_000, base + 30_000_000, step=0),
                event_row("phase", 'say "hi"', base + 2_000_000, base + 3_000_000, step=0),
                event_row(
                    "collective",
                    "all_reduce",
                    base + 40_000_000,
                    base + 40_100_000,
                    step=0,
                    group="0",
                    group_ranks="0,1",
                    seq=0,
                    async_op=True,
                ),
                event_row(
                    "done",
                    "all_reduce",
                    base + 60_000_000,
                    base + 60_000_000,
                    step=0,
                    group="0",
                    group_ranks="0,1",
                    seq=0,
                    async_op=True,
                ),
                event_row(
                    "kernel",
                    "void gemm(float*)",
                    base + 5_000_000,
                    base + 9_000_000,
                    step=0,
                    group="7",
                    detail="compute",
                ),
                event_row("mark", "checkpoint", base + 90_000_000, base + 90_000_000, step=0),
            ]
        )
        w.write_meta(
            {
                "rank": rank,
                "pid": 100 + rank,
                "world_size": 2,
                "clock": {
                    "mono_anchor_ns": 0,
                    "wall_anchor_ns": 1_700_000_000_000_000_000,
                    "offset_to_rank0_ns": rank * 1000,
                    "offset_error_ns": 10,
                },
            }
        )
    return run


def test_nvtxt_parses_and_keeps_every_range_on_the_rank_clock(small_run):
    run = load_run(small_run)
    paths = write_nvtxt(run)
    assert [Path(p).name for p in paths] == ["rank-00000.nvtxt", "rank-00001.nvtxt"]
    for rank, path in enumerate(paths):
        parsed = parse_nvtxt(Path(path).read_text())
        assert parsed["variables"]["TimeBase"] == "Manual"
        assert parsed["variables"]["ProcessId"] == str(100 + rank)
        by_name = {r[3]: r for r in parsed["ranges"]}
        base = 5_000_000_000 + rank * 1000
        assert by_name["step"][:3] == (base, base + 100_000_000, 1)
        assert by_name["forward"][:2] == (base + 1_000_000, base + 30_000_000)
        assert by_name["all_reduce"][:3] == (base + 40_000_000, base + 60_000_000, 2)  # to completion
        assert by_name["void gemm(float*)"][2] == 4
        assert "say 'hi'" in by_name
        assert parsed["marks"] == [(base + 90_000_000, "checkpoint")]
        assert by_name["forward"][4] != by_name["step"][4]  # a category per kind


class FakeWriter(types.ModuleType):
    """Stand-in for nvtx.writer: records what the export writes."""

    def __init__(self):
        super().__init__("nvtx.writer")
        self.calls = []
        self.WriterError = RuntimeError
        fake = self

        class Stream:
            def __init__(self, name):
                self.name = name

            def __enter__(self):
                fake.calls.append(("open", self.name))
                return self

            def __exit__(self, *exc):
                fake.calls.append(("close", self.name))

            def write_startend(self, start, end, *, message=None, color=None, category=None):
                fake.calls.append(("range", self.name, start, end, message, category))

            def write_mark(self, timestamp, *, message=None, color=None, category=None):
                fake.calls.append(("mark", self.name, timestamp, message, category))

        class Session:
            def __init__(self, name, *, backend, config=None):
                fake.calls.append(("session", name, backend))

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                fake.calls.append(("end",))

            def get_domain(self, name=None):
                return ("domain", name)

            def create_stream(self, name, *, domain=None, **kwargs):
                assert domain == ("domain", "diagnose")
                return Stream(name)

        self.Session = Session
        self.load_backend = lambda path: ("backend", path)


def test_nsys_rep_goes_through_nvtx_writer(small_run, tmp_path, monkeypatch):
    backend = tmp_path / "libNvtxwBackend.so"
    backend.write_bytes(b"")
    fake = FakeWriter()
    monkeypatch.setitem(sys.modules, "nvtx.writer", fake)
    monkeypatch.setenv("NSYS_WRITER_BACKEND", str(tmp_path))
    run = load_run(small_run)
    out = write_nsys_rep(run, str(tmp_path / "out.nsys-rep"))
    assert out == str(tmp_path / "out.nsys-rep")
    assert fake.calls[0] == ("session", str(tmp_path / "out"), ("backend", str(backend)))
    assert ("open", "rank 0") in fake.calls and ("open", "rank 1") in fake.calls
    ranges = [c for c in fake.calls if c[0] == "range" and c[1] == "rank 1"]
    t0 = run.wall_t0_ns
    step = next(c for c in ranges if c[4] == "step")
    assert step[2] == t0 and step[3] - step[2] == 100_000_000  # rank 1 aligned onto rank 0
    reduce = next(c for c in ranges if c[4] == "all_reduce")
    assert reduce[3] - reduce[2] == 20_000_000 and reduce[5] == "collective"
    assert [c[3] for c in fake.calls if c[0] == "mark"] == ["checkpoint", "checkpoint"]
    assert fake.calls[-1] == ("end",)


def test_nsys_rep_without_backend_is_one_line_and_exit_2(small_run, monkeypatch, capsys):
    monkeypatch.setenv("NSYS_WRITER_BACKEND", str(small_run / "nowhere"))
    with pytest.raises(SystemExit) as exited:
        main(["export", str(small_run), "--format", "nsys-rep"])
    assert exited.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "libNvtxwBackend.so" in err and "--format nvtxt" in err
