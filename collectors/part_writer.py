"""Crash-safe files of one rank's trace folder.

Every file is written to a temporary name and renamed into place, so a rank
killed at any instant leaves only whole, readable files behind. No fsync: the
threat is a killed process, not a lost machine, and the page cache survives the
former.
"""
import json
import os

import pyarrow.parquet as pq

from collectors.schema import SCHEMA_VERSION, events_table, samples_table


def atomic_write_bytes(path: str, data: bytes) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def atomic_write_json(path: str, obj) -> None:
    atomic_write_bytes(path, json.dumps(obj, indent=1, default=str).encode())


class PartWriter:
    """Writes numbered event/sample part files and meta.json into one rank folder."""

    def __init__(self, rank_dir: str):
        self.rank_dir = rank_dir
        os.makedirs(rank_dir, exist_ok=True)
        self._part_index = {"events": 0, "samples": 0}

    def _write_table(self, prefix: str, table) -> str:
        self._part_index[prefix] += 1
        path = os.path.join(self.rank_dir, f"{prefix}-{self._part_index[prefix]:06d}.parquet")
        tmp = f"{path}.tmp-{os.getpid()}"
        pq.write_table(table, tmp, compression="zstd", use_dictionary=True,
                       write_statistics=False)
        os.replace(tmp, path)
        return path

    def write_events(self, rows) -> str | None:
        return self._write_table("events", events_table(rows)) if rows else None

    def write_samples(self, rows) -> str | None:
        return self._write_table("samples", samples_table(rows)) if rows else None

    def write_meta(self, meta: dict) -> None:
        atomic_write_json(os.path.join(self.rank_dir, "meta.json"),
                          {"schema_version": SCHEMA_VERSION, **meta})

    def write_json(self, name: str, obj) -> None:
        atomic_write_json(os.path.join(self.rank_dir, name), obj)
