"""The fast scans of a Kineto trace (diagnose/importers/kineto_scan.py: msgspec,
and the C scan of diagnose/importers/_kineto_c.c) against the dict path, on the
real fixtures in tests/data/kineto and on odd inputs they must hand over; and a
gzip of several members read whole. The import itself: test_kineto_import.py."""

import glob
import json

import pytest

from tests.support.jobs import fixture_path

KINETO = fixture_path("kineto")
HTA = json.loads(fixture_path("hta_temporal_breakdown.json").read_text())["sets"]


def test_fast_scan_gives_the_rows_of_the_dict_path(tmp_path):
    """The msgspec scan (diagnose/importers/kineto_scan.py) is only a speed-up: on
    every fixture, and on traces it must hand over (a non-object args, a string
    timestamp, an unknown phase), the rows and facts equal the dict path's."""
    from diagnose.importers import kineto, kineto_scan
    from diagnose.importers.kineto_io import parse_trace, read_trace_bytes

    def both(path):
        raw = read_trace_bytes(path)
        return (
            kineto.file_table(path),
            kineto.trace_table(parse_trace(raw, path)),
            kineto_scan.scan(raw, False, kineto._classify) is not None,
        )

    scanned = 0
    for name, info in HTA.items():
        for f in info["files"]:
            (fast, fast_facts), (slow, slow_facts), used_scan = both(str(KINETO / name / f))
            assert fast.equals(slow) and fast_facts == slow_facts, f"{name}/{f}"
            scanned += used_scan
    assert scanned >= 12  # the fixtures take the fast path
    source = json.loads(read_trace_bytes(str(KINETO / "hta" / "trace_filter" / "sampled_rank-0.json.gz")))
    events = source["traceEvents"]
    kernel = next(i for i, e in enumerate(events) if isinstance(e.get("args"), dict) and "stream" in e["args"])
    for label, change in [
        ("args", lambda e: e.update(args=[1, 2])),
        ("ts", lambda e: e.update(ts="12")),
        ("ph", lambda e: e.update(ph="Z")),
    ]:
        trace = json.loads(json.dumps(source))
        change(trace["traceEvents"][kernel])
        path = tmp_path / f"{label}.json"
        path.write_text(json.dumps(trace))
        (fast, fast_facts), (slow, slow_facts), used_scan = both(str(path))
        assert fast.equals(slow) and fast_facts == slow_facts and not used_scan, label


def test_a_gzip_of_several_members_is_read_whole(tmp_path):
    """libdeflate decodes one gzip member; a file of several (gzip'ed in pieces,
    bgzip) must still import all of its events, through zlib."""
    import gzip

    from diagnose.importers import kineto
    from diagnose.importers.kineto_io import read_trace_bytes

    source = KINETO / "hta" / "trace_filter" / "sampled_rank-0.json.gz"
    text = read_trace_bytes(str(source))
    cut = len(text) // 2
    pieces = tmp_path / "pieces.json.gz"
    pieces.write_bytes(gzip.compress(bytes(text[:cut])) + gzip.compress(bytes(text[cut:])))
    assert read_trace_bytes(str(pieces)) == text
    whole, whole_facts = kineto.file_table(str(source))
    table, facts = kineto.file_table(str(pieces))
    assert table.equals(whole) and facts == whole_facts and table.num_rows > 1000


def _scan_both(text: bytes, gpu_only: bool = False):
    """(native_scan's result, the msgspec scan's), GPU args reduced to the keys
    the importer reads from them; None where a path hands over."""
    import msgspec

    from diagnose.importers import kineto, kineto_scan

    def comparable(result):
        if not result:
            return result
        facts, cpu, gpu, launches, pids, ranges = result
        read = (
            "Collective name",
            "Process Group Name",
            "Process Group Ranks",
            "Seq",
            "seq",
            "In msg nelems",
            "dtype",
            "Dst Rank",
            "Src Rank",
        )
        return (
            facts,
            cpu,
            [row[:7] + ({k: row[7].get(k) for k in read},) for row in gpu],
            launches,
            list(pids.items()),
            ranges,
        )

    try:
        reference = kineto_scan._scan(kineto_scan._TRACE.decode(text), gpu_only, kineto._classify)
    except (msgspec.DecodeError, msgspec.ValidationError):
        reference = None
    try:
        native = kineto_scan.native_scan(text, gpu_only, kineto._classify)
    except (msgspec.DecodeError, msgspec.ValidationError):
        native = None
    return comparable(native), comparable(reference)


def test_the_native_scan_gives_the_msgspec_rows_or_hands_over():
    """The C scan (diagnose/importers/_kineto_c.c) is built wherever there is a
    compiler, and on every fixture and on each odd input below it gives exactly
    the msgspec scan's rows (pids in the same order), or hands the text over
    (None) where it only validates what it does not handle."""
    import shutil

    from diagnose.importers import kineto_scan
    from diagnose.importers.kineto_io import read_trace_bytes

    if kineto_scan._kineto_c is None:
        assert shutil.which("cc") is None and shutil.which("gcc") is None, "a compiler is here: reinstall (make setup)"
        pytest.skip("no C compiler: the native scan was not built")
    natively = 0
    for path in sorted(glob.glob(str(KINETO / "**" / "*.json*"), recursive=True)):
        text = read_trace_bytes(path)
        for gpu_only in (False, True):
            native, reference = _scan_both(text, gpu_only)
            assert native is None or native == reference, path
            natively += native is not None
    assert natively >= 26  # all but the two files msgspec refuses too

    def trace(*events, top=""):
        return ('{"traceEvents": [%s]%s}' % (",".join(events), top)).encode()

    kernel = '{"ph": "X", "cat": "kernel", "name": %s, "pid": 0, "tid": 7, "ts": %s, "dur": %s, "args": %s}'
    plain_args = '{"stream": 7, "correlation": 5, "bytes": 64}'
    launch = '{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 3, "ts": 9, "dur": 2, "args": {"correlation": 5}}'
    step = '{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#4", "pid": %s, "ts": 1.5, "dur": 100}'
    sync = '{"ph": "X", "cat": "cuda_runtime", "name": "cudaDeviceSynchronize", "pid": 3, "ts": 20, "dur": -3}'
    collective = '{"stream": 9, "correlation": 6, "Collective name": "allreduce", "Process Group Ranks": [0, 1], "Seq": 3, "dtype": "Float", "In msg nelems": 10}'
    handled = {
        "plain": trace(
            kernel % ('"k1"', "10", "5", plain_args),
            launch,
            step % 3,
            sync,
            top=', "baseTimeNanoseconds": 1700000000000000000, "distributedInfo": {"rank": 1, "world_size": 2}',
        ),
        "numbers": trace(
            kernel % ('"k"', "1.25e3", "-0", plain_args),
            kernel % ('"k"', "-0.0", "-2.5", plain_args),
            kernel % ('"k"', "12345678901234567", "0.1", '{"stream": 7, "bytes": -4}'),
        ),
        "escapes": trace(
            kernel % ('"k\\u00e9\\"x\\\\"', "1", "1", plain_args),
            step.replace("ProfilerStep#4", "Profiler\\u0053tep#4") % 3,
        ),
        "collective args": trace(
            kernel % ('"ncclDevKernel_AllReduce_Sum_f32"', "1", "2", collective),
            kernel % ('"k"', "1", "2", '{"stream": 7, "bytes": "64"}'),
        ),
        # a p2p peer; on its own (the op from a nccl:send range) it must still hand the args over
        "p2p peers": trace(
            kernel
            % (
                '"ncclDevKernel_SendRecv"',
                "1",
                "2",
                '{"stream": 9, "correlation": 6, "Collective name": "send", "Dst Rank": 1}',
            ),
            kernel % ('"k"', "3", "2", '{"stream": 9, "Src Rank": "0"}'),
        ),
        "nccl ranges and launching threads": trace(
            '{"ph": "X", "cat": "user_annotation", "name": "nccl:all_reduce", "pid": 1, "tid": 4, "ts": 1, "dur": 9, '
            '"args": {"Input Dims": [[3, 2], []], "Input type": ["c10::BFloat16", "Scalar"], "x": {"y": 1}}}',
            '{"ph": "X", "cat": "cpu_op", "name": "nccl:send", "tid": "main", "ts": 2, "dur": 1}',
            '{"ph": "X", "cat": "gpu_user_annotation", "name": "nccl:all_reduce", "tid": 4, "ts": 2, "dur": 1}',
            '{"ph": "X", "cat": "user_annotation", "name": "nccl:", "ts": 2, "dur": 1, "args": null}',
            launch.replace('"pid": 3', '"pid": 3, "tid": "t"'),
            launch.replace('"pid": 3', '"tid": null'),
        ),
        "pids in first-seen order": trace(step % 5, step % 2, step % 5, step % '"main"', step % 2.5, step % 2),
        "other phases": trace(
            '{"ph": "M", "name": 5, "args": {"x": [1, {"y": null}]}}',
            '{"ph": "f", "ts": "x"}',
            kernel % ('"k"', "1", "1", "null"),
            kernel % ('"k"', "null", "1", plain_args),
            kernel % ("null", "1", "1", plain_args),
            kernel % ('"k"', "1", "1", '{"stream": null}'),
            kernel % ('"k"', "1", "1", '{"stream": -1, "correlation": 5}'),
        ),
    }
    for label, text in handled.items():
        for gpu_only in (False, True):
            native, reference = _scan_both(text, gpu_only)
            assert native is not None and native == reference, (label, gpu_only)
    assert _scan_both(trace('{"ph": "i", "ts": 1}'))[0] is False  # no complete event
    handed_over = [
        trace(step % 3)[:-1],
        trace(step % 3) + b"x",
        trace(step % 3, ""),
        trace(step % 3).replace(b"1.5", b"01.5"),
        trace(step % 3).replace(b"1.5", b"NaN"),
        trace(step % 3).replace(b"ProfilerStep", b"Profiler\nStep"),
        trace(step % "true"),
        trace(step % 3).replace(b'"dur"', b'"ts": 2, "dur"'),
        trace(step % 3, "[1]"),
        trace(step % 3).replace(b'"ph": "X"', b'"ph": "Z"'),
        trace(step % 3).replace(b'"name"', b'"n\\u0061me"'),
        trace(kernel % ('"k"', "1", "1", '{"stream": 7.0}')),
        trace(kernel % ('"k"', "1", "1", '{"stream": 7, "correlation": null}')),
        trace(kernel % ('"k"', "123456789012345678901", "1", plain_args)),
        trace(step % 3, top=', "traceEvents": []'),
        trace('{"ph": "M", "args": %s}' % ("[" * 300 + "]" * 300)),
        b"[]",
        b'{"other": 1}',
        trace(launch.replace('"pid": 3', '"tid": 1.5')),
        trace('{"ph": "X", "cat": "user_annotation", "name": "ncc\\u006c:x", "ts": 2, "dur": 1}'),
    ]
    for text in handed_over:
        assert kineto_scan.native_scan(text, False, lambda *a: None) is None, text[:80]
