"""Issue 22: Flight Recorder dumps read safely and turned into a hang diagnosis.

The real dump sets (tests/data/flight_recorder) come with the truth
(fault_injection.log) and nvidia-resiliency-ext's own attribution
(nvrx_reference.txt); diagnose must name exactly the faulted ranks."""

import json
import os
import pickle
import re
import shutil
import subprocess
import sys

import pytest

from diagnose.rundir.flight_recorder_reader import MAX_DUMP_BYTES, DumpError, read_dump
from tests.support.flight_recorder_sets import import_dumps, nvrx_reference, plain_load
from tests.support.jobs import fixture_path, run_diagnose


def _truth(folder):
    text = (folder / "fault_injection.log").read_text()
    ranks = [int(r) for r in re.search(r"Fault ranks: \[([\d, ]+)\]", text).group(1).split(",")]
    kinds = dict((int(r), k) for r, k in re.findall(r"Rank (\d+), fault_type: (\w+)", text))
    return ranks, kinds


# fault type -> the role its dumps show: a GPU error stops the device completing
# work its peers completed; a rank holding the GIL never enqueues the next collective
ROLE_OF_FAULT = {"GPU_ERROR": "device stopped", "LOCK_GIL": "missing"}


@pytest.mark.parametrize("dump_set", ["gpu_error_1st", "lock_gil_1st"])
def test_real_dump_sets_name_exactly_the_faulted_ranks(dump_set, tmp_path):
    folder = fixture_path("flight_recorder", dump_set)
    truth, kinds = _truth(folder)
    nvrx = nvrx_reference(folder)
    proc, findings = import_dumps(folder, tmp_path / "run")
    top = findings[0]
    assert top["kind"] == "hang" and top["severity"] == "critical", findings
    assert [f for f in findings if f["kind"] == "hang"] == [top]
    assert top["ranks"] == sorted(truth), top
    m = top["metrics"]
    for rank in truth:
        assert m[f"rank{rank}_role"] == ROLE_OF_FAULT[kinds[rank]], (rank, m)
    # the group and op where it stopped: what nvrx names too
    assert m["group_desc"] == nvrx["desc"] and m["op"] == nvrx["op"]
    assert m["sizes"] == nvrx["size"] and nvrx["desc"] in top["title"] and nvrx["op"] in top["title"]
    waiting = [int(r) for r in m["waiting_rank_list"].split(",")]
    assert set(waiting).isdisjoint(truth) and m["waiting_ranks"] == len(waiting)
    assert set(waiting) | set(truth) == {int(r) for r in m["group_ranks"].split(",")}
    if dump_set == "gpu_error_1st":
        # nvrx names rank 12 only: it asks who is missing from the collective the
        # others wait in (#20537), and rank 14 did enqueue it. But rank 14 stopped
        # completing at #20530, with rank 12, while 13 and 15 completed to #20536.
        assert nvrx["missing"] == [12]
        assert m["rank12_seq"] == m["rank14_seq"] == 20530 and m["seq"] == 20537
        dump14 = read_dump(str(folder / "_dump_14"))
        ep = next(e["pg_id"] for e in dump14["entries"] if e["group"] == m["group"])
        assert dump14["pg_status"][ep]["enqueued"] >= m["seq"] > dump14["pg_status"][ep]["completed"]
        assert "rank 14 device stopped at #20530" in top["title"]
    else:
        assert nvrx["missing"] == sorted(truth)
        # their buffers are empty: said, not guessed
        assert "rank 9's buffer is empty" in m["buffers_cannot_tell"]
    # every group a culprit stopped in is named once, in one finding
    for rank in truth:
        assert m["group"] in m[f"rank{rank}_groups"] and m[f"rank{rank}_groups"].count(";") >= 1
    assert "hang" in proc.stdout and str(truth[0]) in proc.stdout


def test_pickle_and_json_of_one_dump_read_alike(tmp_path):
    """The JSON form's quirks (0 timestamps, string pg_status values, lists for tuples)."""
    raw = plain_load(fixture_path("flight_recorder", "gpu_error_1st", "_dump_13"))
    as_json = dict(
        raw,
        pg_status={k: {f: str(v) for f, v in s.items()} for k, s in raw["pg_status"].items()},
        entries=[
            dict(
                e, time_discovered_started_ns=0, time_discovered_completed_ns=0, process_group=list(e["process_group"])
            )
            for e in raw["entries"]
        ],
    )
    (tmp_path / "rank_13.json").write_text(json.dumps(as_json))
    a = read_dump(str(fixture_path("flight_recorder", "gpu_error_1st", "_dump_13")))
    b = read_dump(str(tmp_path / "rank_13.json"))
    assert (a["rank"], a["format"], b["rank"], b["format"]) == (13, "pickle", 13, "json")
    assert a["pg_status"] == b["pg_status"] and a["entries"] == b["entries"] and a["groups"] == b["groups"]


class _Payload:
    """Unpickled by pickle.load, this runs a shell command (that is the danger)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _hostile(tmp_path):
    good = fixture_path("flight_recorder", "gpu_error_1st", "_dump_0").read_bytes()
    marker = tmp_path / "EXECUTED"
    raw = plain_load(fixture_path("flight_recorder", "gpu_error_1st", "_dump_0"))
    evil_ranks = dict(
        raw, pg_config={"0": {"name": "0", "desc": "default_pg", "ranks": f"__import__('os').system('touch {marker}')"}}
    )
    return marker, {
        "truncated": good[: len(good) // 2],
        "empty": b"",
        "foreign": b"\x89PNG\r\n\x1a\n" + os.urandom(64),
        "json_list": b"[1, 2, 3]",
        "other_dict": pickle.dumps({"hello": "world"}, protocol=2),
        "reduce_payload": pickle.dumps({"version": "2.9", "pg_status": {}, "entries": [_Payload(marker)]}),
        "ranks_expression": pickle.dumps(evil_ranks, protocol=2),
    }


def test_hostile_dumps_give_one_line_and_never_run_code(tmp_path):
    marker, cases = _hostile(tmp_path)
    # the payload is real: the plain unpickler would run it
    subprocess.run(
        [sys.executable, "-c", "import pickle,sys; pickle.loads(sys.stdin.buffer.read())"],
        input=cases["reduce_payload"],
        check=True,
    )
    assert marker.exists()
    marker.unlink()
    for name, data in cases.items():
        folder = tmp_path / name
        folder.mkdir()
        (folder / "rank_0").write_bytes(data)
        proc = run_diagnose(["import", "flight-recorder", folder, "--out", tmp_path / f"out-{name}"], check=False)
        assert proc.returncode != 0, (name, proc.stdout)
        err = proc.stderr.strip()
        assert len(err.splitlines()) == 1 and "Traceback" not in err and "rank_0" in err, (name, err)
        assert not marker.exists(), name
        assert not (tmp_path / f"out-{name}").exists(), name  # nothing imported from a bad set
    assert (
        "global"
        in run_diagnose(
            ["import", "flight-recorder", tmp_path / "reduce_payload", "--out", tmp_path / "o"], check=False
        ).stderr
    )


def test_oversized_and_unnamed_dumps_are_refused_before_reading(tmp_path):
    big = tmp_path / "rank_3"
    with open(big, "wb") as f:
        f.truncate(MAX_DUMP_BYTES + 1)  # sparse: costs no disk
    with pytest.raises(DumpError, match="rank_3: .* over the"):
        read_dump(str(big))
    (tmp_path / "nodigits").write_bytes(b"{}")
    with pytest.raises(DumpError, match="no rank in the file name"):
        read_dump(str(tmp_path / "nodigits"))
    proc = run_diagnose(["import", "flight-recorder", big, "--out", tmp_path / "o"], check=False)
    assert proc.returncode != 0 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_desync_and_stuck_roles(tmp_path):
    """Two 3-rank groups built the way a 2.10 dump says it: rank 2 issues a broadcast
    where its peers all-reduce (desync); with timing on, rank 1 started #7 of
    group 1 and never completed it while rank 0 completed it (stuck)."""
    from diagnose.analysis.tables.collective_divergence import diverge

    def entry(pg_id, name, seq, op, sizes):
        return {
            "pg_id": pg_id,
            "process_group": (name, f"G{name}"),
            "collective_seq_id": seq,
            "profiling_name": op,
            "input_sizes": [sizes],
            "input_dtypes": ["Float"],
            "state": "scheduled",
            "time_created_ns": 1000 + seq,
            "is_p2p": False,
        }

    def dump(rank, g0, g1, e):
        return {
            "version": "2.10",
            "pg_config": {"": {"name": "", "desc": "", "ranks": "[]"}},
            "pg_status": {
                "0": dict(
                    zip(("last_enqueued_collective", "last_started_collective", "last_completed_collective"), g0)
                ),
                "1": dict(
                    zip(("last_enqueued_collective", "last_started_collective", "last_completed_collective"), g1)
                ),
            },
            "entries": e,
        }

    ops = {0: "gloo:all_reduce", 1: "gloo:all_reduce", 2: "gloo:broadcast"}
    for rank in range(3):
        g1 = (7, 7, 6) if rank == 1 else (7, 7, 7)
        e = [entry(0, "0", 5, ops[rank], [4]), entry(1, "1", 6, "gloo:all_reduce", [2])]
        (tmp_path / f"rank_{rank}").write_bytes(pickle.dumps(dump(rank, (5, 5, 4), g1, e)))
    from diagnose.rundir.flight_recorder_reader import read_dumps

    result = diverge(read_dumps([str(tmp_path)]))
    roles = {r: c["role"] for r, c in result["culprits"].items()}
    assert roles == {2: "desync", 1: "stuck"}, result["culprits"]
    assert result["culprits"][1]["seq"] == {"1": 7}


@pytest.mark.parametrize(
    "message,victim",
    [
        (
            "[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=20537, OpType=ALLTOALL, "
            "NumelIn=20961280, NumelOut=20961280, Timeout(ms)=600000) ran for 600021 milliseconds before timing out.",
            True,
        ),
        (
            "Some NCCL operations have failed or timed out. Due to the asynchronous nature of CUDA kernels, subsequent "
            "GPU operations might run on corrupted/incomplete data.",
            True,
        ),
        (
            "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 20000ms "
            "for recv operation to complete",
            True,
        ),
        ("NCCL communicator was aborted on rank 5.", True),
        ("CUDA error: an illegal memory access was encountered", False),
        ("The size of tensor a (4) must match the size of tensor b (5) at non-singleton dimension 0", False),
    ],
)
def test_backend_watchdog_aborts_are_victims_not_causes(message, victim):
    from diagnose.analysis.detectors.rank_failure import _died_of_a_peer

    assert _died_of_a_peer({"exception": {"type": "RuntimeError", "message": message}}) is victim


def test_a_job_its_nccl_watchdog_ended_is_a_hang_named_by_the_dumps(tmp_path):
    """No diagnose watchdog report: the backend's timeout ended the job first, every
    rank raised its watchdog's abort, and the backend dumped on timeout."""
    from diagnose.analysis.findings.run_detectors import detect
    from tests.support.jobs import load_run
    from tests.support.synthetic_run import write_synthetic_run

    out = write_synthetic_run(str(tmp_path / "run"), ranks=4, steps=8)
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    manifest.update(exit_status=1, hang=None)
    (tmp_path / "run" / "manifest.json").write_text(json.dumps(manifest))
    for rank in range(4):
        meta_path = tmp_path / "run" / "traces" / f"rank-{rank:05d}" / "meta.json"
        meta = json.loads(meta_path.read_text())
        meta["exception"] = {
            "type": "RuntimeError",
            "mono_ns": 10**9 + rank,
            "message": "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9) ran "
            "for 600000 milliseconds before timing out.",
        }
        meta_path.write_text(json.dumps(meta))
    shutil.copytree(fixture_path("flight_recorder", "lock_gil_1st"), tmp_path / "run" / "flight_recorder")
    findings = detect(load_run(out))
    kinds = [f["kind"] for f in findings if f["severity"] == "critical"]
    assert kinds == ["hang"], findings
    assert findings[0]["ranks"] == [9, 14]


def test_a_rank_blocked_in_the_group_it_lags_in_is_waiting_not_stopped():
    """The `hang` demo's dumps (dp2 x pp2, rank 1 hung): gloo marks a collective
    completed only when its work is retired, so rank 2, blocked in its dp group's
    all-reduce, lags rank 0 by one completion; rank 0 waits in a receive (gloo's
    sends and receives are not in its Flight Recorder). diagnose's own dump says
    both; only rank 1, which never enqueued #31, is the culprit."""
    from diagnose.analysis.tables.collective_divergence import diverge

    def dump(rank, group, enq, done):
        entries = [
            {
                "pg_id": "1",
                "group": group,
                "group_desc": "undefined",
                "seq": s,
                "p2p_seq": 0,
                "is_p2p": False,
                "op": "gloo:all_reduce",
                "input_sizes": [[4]],
                "output_sizes": [[4]],
                "dtypes": ["Float"],
                "state": "scheduled",
                "retired": s <= done,
                "created_ns": s,
                "started_ns": None,
                "completed_ns": None,
                "record_id": s,
            }
            for s in range(done - 2, enq + 1)
        ]
        return {
            "rank": rank,
            "version": "2.10",
            "comm_lib_version": "",
            "groups": {},
            "entries": entries,
            "pg_status": {"1": {"enqueued": enq, "started": -1, "completed": done}},
        }

    dumps = {0: dump(0, "1", 24, 24), 1: dump(1, "2", 30, 30), 2: dump(2, "1", 28, 23), 3: dump(3, "2", 34, 30)}
    witness = {0: {"1->0"}, 2: {"1"}, 3: {"2"}}
    result = diverge(dumps, 4, blocked_in=witness)
    assert {r: c["role"] for r, c in result["culprits"].items()} == {1: "missing"}, result["culprits"]
    assert result["victims"] == [0, 2, 3]
    # without the witness, rank 2's lag reads as a stopped device
    assert diverge(dumps, 4)["culprits"][2]["role"] == "device stopped"
