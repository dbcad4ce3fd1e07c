"""Issue 20: sends and receives in imported Kineto traces are p2p pairs.

PyTorch (>= 2.1, torch/csrc/profiler/util.cpp saveNcclMeta) writes on a send's
NCCL kernel "Collective name": "send" and "Dst Rank" (the peer's global rank),
on a recv's "recv" and "Src Rank". Such a kernel call becomes a "p2p" row as a
native run writes one (group "SRC->DST", seq the n-th message of the pair), so
that matching pairs the send with its recv. The traces here are synthetic, in
the shape of those args; a trace without the peer keys stays as before.
"""

import json

import pytest

from diagnose.importers import kineto, kineto_scan
from diagnose.importers.kineto import import_kineto
from tests.support import kineto_perturb
from tests.support.jobs import load_run
from tests.support.kineto_scan_paths import scan_path_tables

LATE_US = 30  # how much later rank 1's recv kernels start than rank 0's sends
MESSAGES = 3
FIRST_SEND_US = 200
EVERY_US = 100
TRANSFER_US = 10  # after both kernels are running, the data moves in this long
NELEMS = 1024  # floats: 4 KiB per message


def _kernel(name, ts, dur, correlation, **args):
    return {
        "ph": "X",
        "cat": "kernel",
        "name": name,
        "pid": 0,
        "tid": 20,
        "ts": ts,
        "dur": dur,
        "args": {"stream": 20, "correlation": correlation, **args},
    }


def _launch(ts, correlation):
    return {
        "ph": "X",
        "cat": "cuda_runtime",
        "name": "cudaLaunchKernel",
        "pid": 1,
        "tid": 1,
        "ts": ts,
        "dur": 2,
        "args": {"correlation": correlation},
    }


def _rank_trace(rank: int, peer_keys: bool = True, peer_as_string: bool = False) -> dict:
    """One all_reduce on both ranks, then rank 0 sends MESSAGES to rank 1: the
    recv kernels start LATE_US later, and each pair ends together (NCCL: a
    send's kernel runs until its recv has taken the data)."""
    meta = {"Process Group Name": "0", "Process Group Ranks": "[0, 1]", "dtype": "Float", "In msg nelems": NELEMS}
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#5", "pid": 1, "tid": 1, "ts": 50, "dur": 1000},
        _launch(60, 1),
        _kernel(
            "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*)",
            100,
            50,
            1,
            **{"Collective name": "allreduce", "Seq": 0, **meta},
        ),
    ]
    op, peer_key, peer = ("send", "Dst Rank", 1) if rank == 0 else ("recv", "Src Rank", 0)
    for i in range(MESSAGES):
        start = FIRST_SEND_US + EVERY_US * i + (LATE_US if rank == 1 else 0)
        end = FIRST_SEND_US + EVERY_US * i + LATE_US + TRANSFER_US
        args = {"Collective name": op, "Rank": 1 - rank, "Seq": 1 + i, **meta}  # ("Rank": the peer's group rank)
        if peer_keys:
            args[peer_key] = str(peer) if peer_as_string else peer
        events += [
            _launch(start - 20, 10 + i),
            _kernel(
                "ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)", start, end - start, 10 + i, **args
            ),
        ]
    return {
        "traceEvents": events,
        "baseTimeNanoseconds": 1_700_000_000_000_000_000,
        "distributedInfo": {"rank": rank, "world_size": 2, "backend": "nccl"},
    }


def _import(tmp_path, traces):
    paths = [kineto_perturb.write(t, tmp_path / f"rank{r}.json") for r, t in enumerate(traces)]
    return import_kineto(paths, str(tmp_path / "run"))[0]


def test_sends_and_recvs_with_a_peer_are_matched_as_pairs(tmp_path):
    run = load_run(_import(tmp_path, [_rank_trace(0), _rank_trace(1, peer_as_string=True)]))
    events = run.events()
    p2p = events[events["kind"] == "p2p"]
    assert len(p2p) == 2 * MESSAGES
    assert set(p2p["group"].astype(str)) == {"0->1"} and set(p2p["group_ranks"].astype(str)) == {"0,1"}
    assert p2p.groupby("rank")["seq"].apply(list).to_dict() == {0: [0, 1, 2], 1: [0, 1, 2]}
    assert p2p.groupby("rank")["name"].apply(lambda s: set(s.astype(str))).to_dict() == {0: {"send"}, 1: {"recv"}}
    assert p2p.groupby("rank")["peer"].apply(set).to_dict() == {0: {1}, 1: {0}}
    assert (p2p["bytes"] == NELEMS * 4).all() and p2p["async_op"].all()
    assert set(p2p["detail"].astype(str)) == {"gpu"}
    # the all_reduce is still a collective of its process group, numbered by its Seq
    calls = events[events["kind"] == "collective"]
    assert calls["name"].astype(str).tolist() == ["all_reduce"] * 2 and set(calls["seq"]) == {0}

    arrivals = run.arrivals()
    pairs = arrivals[arrivals["kind"] == "p2p"]
    instances = pairs.groupby(["group", "seq"])
    assert len(instances) == MESSAGES and (instances["rank"].nunique() == 2).all()
    assert instances["name"].apply(lambda s: sorted(s.astype(str))).tolist() == [["recv", "send"]] * MESSAGES
    assert (pairs["last_rank"] == 1).all()
    sends = pairs[pairs["name"] == "send"]
    assert sends["wait_ms"].tolist() == pytest.approx([LATE_US / 1000] * MESSAGES)
    assert (pairs[pairs["name"] == "recv"]["wait_ms"] == 0).all()
    # done = the kernel's end: the pair's data moved TRANSFER_US after the recv started
    assert pairs["transfer_ms"].tolist() == pytest.approx([TRANSFER_US / 1000] * len(pairs))


def test_without_a_peer_sends_and_recvs_stay_collectives():
    """Older traces (or a trace that does not say its own rank) carry no peer:
    the kernels stay collective rows of their process group, as before."""
    for rank, op in ((0, "send"), (1, "recv")):
        rows = kineto.trace_table(_rank_trace(rank, peer_keys=False))[0].to_pylist()
        assert not [r for r in rows if r["kind"] == "p2p"]
        calls = [r for r in rows if r["kind"] == "collective"]
        assert [r["name"] for r in calls] == ["all_reduce"] + [op] * MESSAGES
        assert {r["group"] for r in calls} == {"0"} and {r["peer"] for r in calls} == {-1}
    no_rank = _rank_trace(0)
    del no_rank["distributedInfo"]["rank"]
    rows = kineto.trace_table(no_rank)[0].to_pylist()
    assert [r["name"] for r in rows if r["kind"] == "collective"] == ["all_reduce"] + ["send"] * MESSAGES


def test_every_scan_path_reads_the_peer_alike():
    """Peer as a number, as a string, on a kernel whose op comes only from the
    nccl:send range around its launch (no "Collective name": the C scan must
    still hand its args over), and one send of two kernels (one Seq): one row."""
    trace = _rank_trace(0, peer_as_string=True)
    events = trace["traceEvents"]
    last = events[-1]
    del last["args"]["Collective name"]
    events.append(
        {"ph": "X", "cat": "user_annotation", "name": "nccl:send", "pid": 1, "tid": 1, "ts": last["ts"] - 25, "dur": 10}
    )
    second = json.loads(json.dumps(events[4]))  # another kernel of the first send's call (its Seq)
    second["ts"], second["args"]["correlation"] = events[4]["ts"] + events[4]["dur"] + 1, 99
    events.append(second)
    events.append(_launch(second["ts"] - 30, 99))
    tables = scan_path_tables(trace)
    assert len(tables) == 3 or kineto_scan._kineto_c is None
    assert all(t.equals(tables[0]) for t in tables[1:])
    rows = tables[0].to_pylist()
    p2p = [r for r in rows if r["kind"] == "p2p"]
    assert [(r["name"], r["group"], r["seq"], r["peer"]) for r in p2p] == [
        ("send", "0->1", i, 1) for i in range(MESSAGES)
    ]
    dones = [r for r in rows if r["kind"] == "done" and r["group"] == "0->1"]
    assert dones[0]["start_ns"] == 1_700_000_000_000_000_000 + (second["ts"] + second["dur"]) * 1000
