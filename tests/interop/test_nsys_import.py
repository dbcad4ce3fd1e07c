"""Issue 7: Nsight Systems SQLite import: the real export in tests/data/nsys, and
a 2-rank synthetic export built on the real file's own table definitions."""

import sqlite3
from pathlib import Path

import pytest

from diagnose.analysis.findings.run_detectors import detect
from diagnose.importers.nsys import import_nsys
from diagnose.importers.nsys_export import decode_global_id
from tests.support.jobs import fixture_path, load_run

REAL = fixture_path("nsys", "tc_report1.sqlite")

# NVTX_EVENTS is not in the real export (it has no NVTX); its definition is the
# one in Nsight Systems' SQLite export schema reference.
NVTX_EVENTS_DDL = """CREATE TABLE NVTX_EVENTS (
    start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL, rangeId INTEGER,
    category INTEGER, color INTEGER, text TEXT, globalTid INTEGER, endGlobalTid INTEGER,
    textId INTEGER, domainId INTEGER, uint64Value INTEGER, int64Value INTEGER,
    doubleValue REAL, uint32Value INTEGER, int32Value INTEGER, floatValue REAL,
    jsonTextId INTEGER, jsonText TEXT, binaryData TEXT)"""
COPIED = ("StringIds", "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "TARGET_INFO_SESSION_START_TIME")
MS = 1_000_000


def test_real_export_kernel_count_and_time_match_cupti_table(tmp_path):
    with sqlite3.connect(f"file:{REAL}?mode=ro", uri=True) as con:
        count, total_ns = con.execute('SELECT count(*), sum("end" - start) FROM CUPTI_ACTIVITY_KIND_KERNEL').fetchone()
        memcpy = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY").fetchone()[0]
        gpid = con.execute("SELECT globalPid FROM CUPTI_ACTIVITY_KIND_KERNEL LIMIT 1").fetchone()[0]
        pid = con.execute("SELECT pid FROM PROCESSES WHERE globalPid = ?", (gpid,)).fetchone()[0]
    run_dir, _ = import_nsys([str(REAL)], str(tmp_path / "run"))
    run = load_run(run_dir)
    kernels = run.kernels()
    launched = kernels[kernels["kind"] != "memory"]
    assert len(launched) == count
    assert int((launched["end_ns"] - launched["start_ns"]).sum()) == total_ns
    assert len(kernels) == count + memcpy
    assert decode_global_id(gpid)[0] == pid == run.rank_meta[0]["pid"]
    syncs = run.events()[run.events()["kind"] == "sync"]
    assert list(syncs["name"].astype(str)) == ["cudaEventSynchronize"]


NCCL_COMM_ID = 12715772615376301750
SEND_RECV = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"


def _synthetic(
    path: Path, pid: int, session_start_ns: int, steps: list, nccl_nvtx: bool = False, p2p: tuple = ()
) -> None:
    """One rank's export: NVTX ranges from our domain, kernels launched inside
    them. nccl_nvtx: NCCL's own NVTX range (domain "NCCL", the payload entries
    of NCCL's schema as nsys exports them in jsonText) around the all-reduce's
    launch, and per step an all_to_all (PyTorch's nccl:all_to_all range, as
    under emit_nvtx) launching two SendRecv kernels. p2p: (NCCL range, its
    payload, launch, kernel start, kernel end) of sends and recvs."""
    with sqlite3.connect(f"file:{REAL}?mode=ro", uri=True) as real:
        ddl = {n: sql for n, sql in real.execute("SELECT name, sql FROM sqlite_master WHERE type='table'")}
    con = sqlite3.connect(path)
    for table in COPIED:
        con.execute(ddl[table])
    con.execute(NVTX_EVENTS_DDL)
    strings = {}

    def sid(text):
        if text not in strings:
            strings[text] = len(strings) + 1
            con.execute("INSERT INTO StringIds VALUES (?, ?)", (strings[text], text))
        return strings[text]

    gtid = (1 << 48) | (pid << 24) | pid
    gpid = (1 << 48) | (pid << 24)
    con.execute("INSERT INTO TARGET_INFO_SESSION_START_TIME VALUES (?, '', '', 0)", (session_start_ns,))
    con.execute(
        "INSERT INTO NVTX_EVENTS (start, eventType, text, globalTid, domainId) VALUES (0, 75, 'diagnose', ?, 1)",
        (gtid,),
    )
    con.execute(
        "INSERT INTO NVTX_EVENTS (start, eventType, text, globalTid, domainId) VALUES (0, 75, 'NCCL', ?, 2)", (gtid,)
    )
    categories = {kind: i + 1 for i, kind in enumerate(("forward", "backward", "optimizer", "data"))}
    for kind, cat in categories.items():
        con.execute(
            "INSERT INTO NVTX_EVENTS (start, eventType, category, text, globalTid, domainId) "
            "VALUES (0, 33, ?, ?, ?, 1)",
            (cat, kind, gtid),
        )
    corr = [1000]

    def nvtx(kind, name, start, end):
        con.execute(
            "INSERT INTO NVTX_EVENTS (start, end, eventType, category, textId, globalTid, "
            "domainId) VALUES (?, ?, 59, ?, ?, ?, 1)",
            (start, end, categories[kind], sid(name), gtid),
        )

    def call(text, start, end, domain, payload=None):
        con.execute(
            "INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid, domainId, jsonText) "
            "VALUES (?, ?, 59, ?, ?, ?, ?)",
            (start, end, text, gtid, domain, payload),
        )

    def kernel(name, launch, start, end, stream):
        corr[0] += 1
        con.execute(
            "INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME (start, end, eventClass, globalTid, "
            "correlationId, nameId, returnValue) VALUES (?, ?, 0, ?, ?, ?, 0)",
            (launch, launch + 5000, gtid, corr[0], sid("cudaLaunchKernel_v7000")),
        )
        con.execute(
            "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL (start, end, deviceId, contextId, streamId, "
            "correlationId, globalPid, demangledName, shortName, registersPerThread, gridX, "
            "gridY, gridZ, blockX, blockY, blockZ, staticSharedMemory, dynamicSharedMemory, "
            "localMemoryPerThread, localMemoryTotal, gridId) "
            "VALUES (?, ?, 0, 1, ?, ?, ?, ?, ?, 32, 1, 1, 1, 128, 1, 1, 0, 0, 0, 0, ?)",
            (start, end, stream, corr[0], gpid, sid(name), sid(name.split("(")[0]), corr[0]),
        )

    for s in steps:  # all times relative to this rank's session start
        t = s["t"]
        nvtx("data", "data_wait", t, t + s["data"])
        t += s["data"]
        nvtx("forward", "forward", t, t + 10 * MS)
        kernel("void gemm_fwd(float*)", t + MS, t + 2 * MS, t + 9 * MS, 7)
        t += 10 * MS
        nvtx("backward", "backward", t, t + 20 * MS)
        kernel("void gemm_bwd(float*)", t + MS, t + 2 * MS, t + s.get("bwd_end", 15 * MS), 7)
        kernel(
            "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
            t + 2 * MS,
            s["nccl"],
            s["nccl_end"],
            20,
        )
        if nccl_nvtx:
            call(
                "ncclAllReduce",
                t + 2 * MS - 1000,
                t + 2 * MS + 9000,
                2,
                '{"NCCL communicator ID": %d, "Rank": 0, "Message size [bytes]": 4194304, '
                '"Reduction operation": "ncclSum"}' % NCCL_COMM_ID,
            )
            call("nccl:all_to_all", t + 3 * MS, t + 4 * MS, 0)
            kernel(SEND_RECV, t + 3 * MS + 100_000, s["nccl_end"] + MS, s["nccl_end"] + 2 * MS, 20)
            kernel(SEND_RECV, t + 3 * MS + 300_000, s["nccl_end"] + 2 * MS, s["nccl_end"] + 3 * MS, 20)
        t += 20 * MS
        nvtx("optimizer", "optimizer", t, t + 5 * MS)
    for text, payload, launch, start, end in p2p:
        call(text, launch - 1000, launch + 9000, 2, payload)
        kernel(SEND_RECV, launch, start, end, 20)
    con.commit()
    con.close()


def test_synthetic_two_rank_export_matches_the_native_picture(tmp_path):
    """Rank 1's session starts 7 ms after rank 0's; its data loading is 3 ms slower,
    so its all-reduce starts 3 ms later on the GPU and rank 0's waits 3 ms."""
    base, lag = 1_700_000_000_000_000_000, 7 * MS
    step_ms = 50 * MS
    plan = {0: [], 1: []}
    for k in range(4):
        start = k * step_ms + 1 * MS  # wall offset from `base`
        for rank, extra in ((0, 0), (1, 3 * MS)):
            data = 4 * MS + extra
            nccl = start + data + 10 * MS + 14 * MS  # after this rank's backward kernel
            nccl_end = start + 4 * MS + 3 * MS + 10 * MS + 14 * MS + 2 * MS  # same instant on both
            shift = -lag if rank == 1 else 0  # to this rank's session time
            plan[rank].append({"t": start + shift, "data": data, "nccl": nccl + shift, "nccl_end": nccl_end + shift})
    paths = []
    for rank, pid, start in ((0, 4101, base), (1, 4102, base + lag)):
        path = tmp_path / f"rank{rank}.sqlite"
        _synthetic(path, pid, start, plan[rank])
        paths.append(str(path))
    run = load_run(import_nsys(paths[::-1], str(tmp_path / "run"))[0])

    assert run.ranks == [0, 1] and run.rank_meta[1]["pid"] == 4102
    steps = run.steps()
    assert sorted(steps.groupby("rank")["step"].count().tolist()) == [4, 4]
    breakdown = run.breakdown().set_index(["rank", "step"])
    for rank, data_ms in ((0, 4.0), (1, 7.0)):
        rows = breakdown.loc[rank].loc[1:]  # step 0 starts at the first range
        assert rows["forward_ms"].tolist() == pytest.approx([10.0] * 3)
        assert rows["backward_ms"].tolist() == pytest.approx([20.0] * 3)
        assert rows["optimizer_ms"].tolist() == pytest.approx([5.0] * 3)
        assert rows["data_wait_ms"].tolist() == pytest.approx([data_ms] * 3)
    arrivals = run.arrivals()
    assert len(arrivals) == 8 and (arrivals["members"] == 2).all()
    assert set(arrivals["name"]) == {"all_reduce"}
    wait = arrivals.groupby("rank")["wait_ms"].median()
    assert wait[0] == pytest.approx(3.0) and wait[1] == pytest.approx(0.0)
    assert (arrivals["last_rank"] == 1).all()
    assert arrivals["transfer_ms"].median() == pytest.approx(2.0)
    kernels = run.kernels()
    assert (kernels.groupby("rank")["kind"].value_counts().unstack()["communication"] == 4).all()
    assert (kernels["correlation"] > 0).all() and set(kernels["stream"]) == {7, 20}
    tb = run.temporal_breakdown()
    assert (tb[["idle_frac", "compute_frac", "non_compute_frac"]].sum(axis=1)).tolist() == pytest.approx([1, 1])
    assert set(run.collectives()["group_ranks"]) == {"0,1"}  # the imported ranks: an export names no group
    found = detect(run)
    assert [w for w in run.warnings if "detector" in w] == []
    # rank 1 is late for a host reason (its input), not its GPU: no straggler on device compute
    (stall,) = found  # and nothing else
    assert stall["kind"] == "input_stall"
    assert stall["ranks"] == [1] and stall["stage"] is None and stall["callsite"] is None
    assert stall["metrics"]["device_time"] == 1.0  # the GPU idles while rank 1 waits for its input


def test_synthetic_export_with_a_slower_gpu_names_the_straggler(tmp_path):
    """Rank 1's backward kernel takes 17 ms instead of 13 ms, so its all-reduce
    kernel starts 4 ms after rank 0's, and both end together."""
    base, step_ms = 1_700_000_000_000_000_000, 50 * MS
    plan = {0: [], 1: []}
    for k in range(6):
        start = k * step_ms + MS
        for rank, slower in ((0, 0), (1, 4 * MS)):
            t_bwd = start + 4 * MS + 10 * MS
            plan[rank].append(
                {
                    "t": start,
                    "data": 4 * MS,
                    "bwd_end": 15 * MS + slower,
                    "nccl": t_bwd + 15 * MS + slower,
                    "nccl_end": t_bwd + 15 * MS + 4 * MS + 2 * MS,
                }
            )
    paths = []
    for rank, pid in ((0, 4101), (1, 4102)):
        path = tmp_path / f"rank{rank}.sqlite"
        _synthetic(path, pid, base, plan[rank], nccl_nvtx=True)
        paths.append(str(path))
    run = load_run(import_nsys(paths, str(tmp_path / "run"))[0])
    # the collectives are what the NVTX ranges around their launches say: the
    # all-reduce on NCCL's communicator, with its size; the all_to_all's two
    # SendRecv kernels one collective, from the first's start to the second's end
    calls = run.collectives()
    assert len(calls) == 2 * 6 * 2 and (calls.groupby(["group", "seq"])["rank"].nunique() == 2).all()
    by_op = calls.groupby("name")
    assert set(by_op["group"].unique().map(tuple)) == {(f"nccl:{NCCL_COMM_ID}",), ("nccl:comm0",)}
    assert set(calls.loc[calls["name"] == "all_reduce", "bytes"]) == {4194304}
    to_all = calls[calls["name"] == "all_to_all"]
    assert ((to_all["exit_ns"] - to_all["issue_ns"]) == 2 * MS).all()
    assert set(run.events()["name"].astype(str)) & {"ncclAllReduce", "nccl:all_to_all"} == set()  # not phases
    arrivals = run.arrivals()
    arrivals = arrivals[arrivals["name"] == "all_reduce"]
    assert (arrivals["expected_members"] == 2).all() and (arrivals["last_rank"] == 1).all()
    found = detect(run)
    assert [w for w in run.warnings if "detector" in w] == []
    (straggler,) = [f for f in found if f["kind"] == "straggler"]
    assert straggler["ranks"] == [1] and straggler["stage"] is None and straggler["callsite"] is None
    assert straggler["metrics"]["device_time"] == 1.0 and straggler["metrics"]["wait_is_lower_bound"] == 0.0
    assert straggler["metrics"]["waiting_caused_ms_per_step"] == pytest.approx(4.0)
    assert straggler["metrics"]["busy_ratio_x"] == pytest.approx(24 / 20)


@pytest.mark.parametrize("peer_known", [True, False])
def test_nccl_send_and_recv_ranges_with_a_peer_are_matched_as_pairs(tmp_path, peer_known):
    """NCCL's ncclSend / ncclRecv NVTX payload says the peer ("Peer rank"): rank
    0 sends 3 messages to rank 1, whose recv kernels start 2 ms later, and each
    pair ends together. Without the peer they stay collectives, as before."""
    late, base = 2 * MS, 1_700_000_000_000_000_000
    paths = []
    for rank, pid, text, peer in ((0, 4101, "ncclSend", 1), (1, 4102, "ncclRecv", 0)):
        payload = '{"NCCL communicator ID": %d, "Message size [bytes]": 4096%s}' % (
            NCCL_COMM_ID,
            ', "Peer rank": %d' % peer if peer_known else "",
        )
        sends = [
            (text, payload, i * 10 * MS, i * 10 * MS + MS + (late if rank else 0), i * 10 * MS + MS + late + MS)
            for i in range(3)
        ]
        path = tmp_path / f"rank{rank}.sqlite"
        _synthetic(path, pid, base, [], p2p=sends)
        paths.append(str(path))
    # without the peer, a send and a recv at one position of the communicator
    # are refused as one collective (their ops differ): the loader says so
    run = load_run(
        import_nsys(paths, str(tmp_path / "run"))[0],
        expected_warnings=() if peer_known else ("3 of 3 collectives differ (op or size)",),
    )
    events = run.events()
    if not peer_known:
        assert not (events["kind"] == "p2p").any()
        assert set(events.loc[events["kind"] == "collective", "name"].astype(str)) == {"send", "recv"}
        return
    p2p = events[events["kind"] == "p2p"]
    assert set(p2p["group"].astype(str)) == {"0->1"} and set(p2p["detail"].astype(str)) == {"gpu"}
    assert p2p.groupby("rank")["peer"].apply(set).to_dict() == {0: {1}, 1: {0}}
    assert (p2p["bytes"] == 4096).all()
    arrivals = run.arrivals()
    assert len(arrivals) == 6 and (arrivals.groupby("seq")["rank"].nunique() == 2).all()
    assert (arrivals["last_rank"] == 1).all()
    wait = arrivals.groupby("name")["wait_ms"].apply(list)
    assert wait["send"] == pytest.approx([2.0] * 3) and wait["recv"] == pytest.approx([0.0] * 3)
