"""Issue 5: a fuzz test corrupts copies of a real run dir in 200 seeded ways.
Analysis must never raise, and every rank left intact is still analyzed
(docs/run-directory.md, "Defensive reading")."""

import json
import os
import random
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from diagnose.cli.after_run import analyze_run

CASES = 200  # issue 5: at least 200 seeded corruptions


def _rank_dirs(run):
    return sorted((run / "traces").iterdir())


def _parts(rank_dir):
    return sorted(rank_dir.glob("*.parquet"))


def mutate(run, rng: random.Random) -> set:
    """Corrupt the copy; return the ranks whose data was touched."""
    try:
        return _mutate(run, rng)
    except (OSError, ValueError, pa.ArrowException, IndexError):
        # a mutation that reads a file an earlier one already destroyed: the
        # whole tree counts as touched, the analysis must still not raise
        return {0, 1}


def _mutate(run, rng: random.Random) -> set:
    rank_dirs = [d for d in _rank_dirs(run) if d.name.split("-")[1].isdigit()]
    victim = rng.choice(rank_dirs)
    rank = int(victim.name.split("-")[1])
    if rank not in (0, 1):
        return set()
    parts = _parts(victim)
    part = rng.choice(parts) if parts else None
    kind = rng.randrange(20)
    if kind == 0 and part:  # truncated part
        data = part.read_bytes()
        part.write_bytes(data[: rng.randrange(len(data))])
    elif kind == 1 and part:  # garbage bytes
        part.write_bytes(rng.randbytes(rng.randrange(1, 4096)))
    elif kind == 2:  # missing meta.json
        (victim / "meta.json").unlink(missing_ok=True)
    elif kind == 3:  # garbage meta.json
        (victim / "meta.json").write_bytes(rng.randbytes(rng.randrange(0, 300)))
    elif kind == 4:  # meta.json of the wrong shape
        (victim / "meta.json").write_text(
            json.dumps(
                rng.choice(
                    [
                        [],
                        "x",
                        {"clock": "x"},
                        {"clock": {"offset_to_rank0_ns": "abc", "mono_anchor_ns": None}},
                        {"world_size": "many", "clock": {"wall_anchor_ns": 1}},
                        {"exception": 5},
                    ]
                )
            )
        )
    elif kind == 5:  # emptied rank dir
        for f in victim.iterdir():
            f.unlink()
    elif kind == 6:  # unknown files, odd names
        name = rng.choice([b"notes.txt", b"events-zz.parquet", b"\xff\xfe-bad.parquet", b"events-\xe9.parquet"])
        with open(os.path.join(os.fsencode(victim), name), "wb") as f:
            f.write(rng.randbytes(64))
        return set()
    elif kind == 7:  # non-UTF-8 rank folder
        os.mkdir(os.path.join(os.fsencode(run / "traces"), b"rank-\xff\xfe"))
        return set()
    elif kind == 8:  # duplicate rank
        shutil.copytree(victim, run / "traces" / f"rank-{rank}")
        return set()
    elif kind == 9:  # missing rank
        shutil.rmtree(victim)
    elif kind == 10 and (victim / "meta.json").exists():  # newer schema version
        try:
            meta = json.loads((victim / "meta.json").read_text())
        except ValueError:
            return {rank}
        if isinstance(meta, dict):
            meta["schema_version"] = 99
            (victim / "meta.json").write_text(json.dumps(meta))
        return set()
    elif kind == 11:  # a foreign parquet file
        pq.write_table(pa.table({"a": [1, 2], "b": ["x", "y"]}), victim / "events-999999.parquet")
        return set()
    elif kind == 12 and part:  # right names, wrong types
        table = pq.read_table(part)
        pq.write_table(
            pa.table(
                {**{n: table.column(n) for n in table.column_names}, "start_ns": pa.array(["soon"] * table.num_rows)}
            ),
            part,
        )
    elif kind == 13:  # garbage progress/dump files
        (victim / "progress.json").write_bytes(rng.randbytes(50))
        (victim / "watchdog-1.json").write_text("[1, 2")
        return set()
    elif kind == 14:  # garbage manifest
        (run / "manifest.json").write_bytes(
            rng.choice(
                [
                    b"",
                    b"{",
                    b"[]",
                    json.dumps({"argv": 5}).encode(),
                    json.dumps({"exit_status": "x", "hang": 3}).encode(),
                ]
            )
        )
        return set()
    elif kind == 15 and part:  # absurd values in a valid file
        table = pq.read_table(part)
        n = table.num_rows
        pq.write_table(
            table.set_column(
                table.column_names.index("end_ns"),
                "end_ns",
                pa.array([rng.choice([-1, 0, 2**62]) for _ in range(n)], pa.int64()),
            ),
            part,
        )
    elif kind == 16 and part:  # zero-byte part
        part.write_bytes(b"")
    elif kind == 17:  # a directory where a part should be
        (victim / "events-999998.parquet").mkdir()
        return set()
    elif kind == 18:  # stale analysis output
        (run / "analysis").mkdir(exist_ok=True)
        (run / "analysis" / "findings.json").write_text("not json")
        return set()
    else:  # several of the above at once
        touched = set()
        for _ in range(3):
            touched |= mutate(run, rng)
        return touched
    return {rank}


@pytest.fixture(scope="module")
def pristine(ddp_run, tmp_path_factory):
    copy = tmp_path_factory.mktemp("pristine") / "run"
    shutil.copytree(ddp_run, copy, ignore=shutil.ignore_patterns("analysis", "report.html", "trace.json.gz"))
    return copy


def test_fuzzed_run_dirs_never_raise_and_keep_intact_ranks(pristine, tmp_path):
    for seed in range(CASES):
        rng = random.Random(seed)
        run_dir = tmp_path / f"case{seed}"
        shutil.copytree(pristine, run_dir)
        touched = mutate(run_dir, rng)
        warnings = []
        run, findings = analyze_run([run_dir], outputs=False, warn=warnings.append)
        assert isinstance(findings, list)
        analyzed = set(run.steps()["rank"])
        intact = {0, 1} - touched
        assert intact <= analyzed, (seed, touched, analyzed, warnings)
        shutil.rmtree(run_dir)
