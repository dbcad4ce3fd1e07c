"""Issue 45 item 4: the hang finding leads with the op the job stalled on, the
earliest-created pending entry among the waiting ranks, not the smallest group a
culprit stops; a culprit whose buffer is empty is told by its `pg_status`.

The dump sets are the committed lock_gil_1st (ranks 9 and 14 hold the GIL, the
others stall in EXPERT_MODEL_PARALLEL_GROUP's all_to_all, nvrx_reference.txt)
and variants of it written to tmp_path."""

import hashlib
import json
import pickle

from tests.support.flight_recorder_sets import import_dumps, nvrx_reference, plain_load
from tests.support.jobs import fixture_path

LOCK_GIL = fixture_path("flight_recorder", "lock_gil_1st")
RANKS = range(16)


def _raw_set():
    return {r: plain_load(LOCK_GIL / f"_dump_{r}") for r in RANKS}


def _write_set(raw, folder):
    folder.mkdir()
    for rank, dump in raw.items():
        (folder / f"_dump_{rank}").write_bytes(pickle.dumps(dump, protocol=2))
    return folder


def _config_ranks(config):
    return json.loads(config["ranks"])  # a JSON list written as a string


def _pending(dump, group, seq):
    return next(e for e in dump["entries"] if e["process_group"][0] == group and e["collective_seq_id"] == seq)


def test_the_stalled_op_is_the_waiters_earliest_pending_one_not_a_later_op_of_a_smaller_group(tmp_path):
    """Only rank 9 holds the GIL: rank 14 gets rank 13's counters and entries (both
    are members of the same EP 72, TP 38 and 64 groups, under the same local ids),
    keeping its own pg_config. Rank 9 then stops one op in each of EP 72 (8 ranks,
    all_to_all #45265), 64 (8 ranks) and TP 37 (4 ranks, _reduce_scatter_base
    #88684); the waiters entered the all_to_all first, then the TP op, then 64's."""
    raw = _raw_set()
    raw[14] = dict(raw[14], pg_status=raw[13]["pg_status"], entries=raw[13]["entries"])
    for waiter in (8, 10, 11):  # what the case stands on, by each waiter's clock
        a2a, tp, dp = (_pending(raw[waiter], *op) for op in (("72", 45265), ("37", 88684), ("64", 15118)))
        assert a2a["time_created_ns"] < tp["time_created_ns"] < dp["time_created_ns"]
    config = raw[8]["pg_config"]
    assert len(_config_ranks(config["72"])) == 8 > len(_config_ranks(config["37"])) == 4

    _, findings = import_dumps(_write_set(raw, tmp_path / "one_gil"), tmp_path / "run")
    top = findings[0]
    assert top["kind"] == "hang" and top["ranks"] == [9], top
    m = top["metrics"]
    nvrx = nvrx_reference(LOCK_GIL)  # the op nvidia-resiliency-ext names on the untouched set
    assert (m["group"], m["group_desc"], m["op"], m["sizes"], m["seq"]) == (
        "72",
        nvrx["desc"],
        nvrx["op"],
        nvrx["size"],
        45265,
    ), m
    assert top["title"].startswith(
        f"hang in {nvrx['desc']} (group 72, ranks 8,9,10,11,12,13,14,15): {nvrx['op']} #45265"
    ), top["title"]
    # the other ops rank 9 left its peers waiting in, in the order they were entered
    also = m["also_pending"]
    assert also.index("_reduce_scatter_base #88684 in group 37") < also.index("all_reduce #15118 in group 64"), also
    assert "rank 9 completed #45264 and never enqueued #45265" in top["title"]


def test_an_empty_buffer_culprit_is_told_by_its_pg_status(tmp_path):
    """Ranks 9 and 14 dumped no entry; their pg_status still says how far they got."""
    raw = _raw_set()
    for rank in (9, 14):
        assert raw[rank]["entries"] == []
        # what the sentence rests on: a counter that completed #45264 and enqueued nothing more
        assert {
            "last_enqueued_collective": 45264,
            "last_started_collective": -1,
            "last_completed_collective": 45264,
        } in raw[rank]["pg_status"].values()
    _, findings = import_dumps(LOCK_GIL, tmp_path / "run")
    top = findings[0]
    assert top["ranks"] == [9, 14] and top["metrics"]["seq"] == 45265, top
    for rank in (9, 14):
        assert f"rank {rank} completed #45264 and never enqueued #45265" in top["title"], top["title"]
        assert top["metrics"][f"rank{rank}_role"] == "missing"


def _hashed(name: str) -> str:
    # torch's hashed group names (use_hashed_name): no creation order can be read from them
    return hashlib.sha1(name.encode()).hexdigest()


def test_an_empty_buffer_culprit_whose_counters_cannot_be_placed_is_said_unknown(tmp_path):
    raw = _raw_set()
    for dump in raw.values():
        dump["pg_config"] = {_hashed(k): dict(c, name=_hashed(c["name"])) for k, c in dump["pg_config"].items()}
        for e in dump["entries"]:
            e["process_group"] = (_hashed(e["process_group"][0]), e["process_group"][1])
    _, findings = import_dumps(_write_set(raw, tmp_path / "hashed"), tmp_path / "run")
    top = findings[0]
    assert top["ranks"] == [9, 14] and top["metrics"]["op"] == "nccl:all_to_all", top
    for rank in (9, 14):
        assert f"rank {rank} completed" not in top["title"]
        assert (
            f"rank {rank} missing at #45265: its buffer is empty and its pg_status cannot be tied to "
            f"group {_hashed('72')}, so how far it got there is unknown" in top["title"]
        ), top["title"]
