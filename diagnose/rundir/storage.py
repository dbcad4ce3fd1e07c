"""Where a run directory is: a local path, or an fsspec URL ("s3://bucket/runs/job",
"gs://...", "file:///shared/runs/job", "memory://..."): storage that the analysis'
workers share (docs/large-runs.md). Everything that reads a run directory for the
analysis, and writes its analysis/, goes through these functions: a local path
the os module's way, as before; a URL fsspec's (`pip install 'diagnose[cluster]'`,
plus the protocol's own package: s3fs, gcsfs, ...). A path built from a URL
(join, glob) keeps its protocol, so that it is again a URL.
"""

import builtins
import glob as local_glob
import os
import shutil

from collectors.part_writer import atomic_write_bytes
from diagnose.errors import UserError


def is_url(path) -> bool:
    return isinstance(path, str) and "://" in path


def _fs(url: str):
    """(fsspec filesystem, path within it) of a URL; one line for a URL it cannot serve."""
    try:
        from fsspec.core import url_to_fs
    except ImportError:
        raise UserError(f"{url}: reading a run from a URL needs fsspec: pip install 'diagnose[cluster]'") from None
    try:
        return url_to_fs(url)
    except (ImportError, ValueError) as exc:  # an unknown protocol, or its package missing
        raise UserError(f"{url}: {str(exc).splitlines()[0]}") from None


def join(base: str, *names: str) -> str:
    if is_url(base):
        return "/".join([base.rstrip("/"), *names])
    return os.path.join(base, *names)


def exists(path: str) -> bool:
    if not is_url(path):
        return os.path.exists(path)
    fs, inner = _fs(path)
    return fs.exists(inner)


def isdir(path: str) -> bool:
    if not is_url(path):
        return os.path.isdir(path)
    fs, inner = _fs(path)
    return fs.isdir(inner)


def isfile(path: str) -> bool:
    if not is_url(path):
        return os.path.isfile(path)
    fs, inner = _fs(path)
    return fs.isfile(inner)


def folders(path: str) -> list[str]:
    """The names of the folders in a folder (OSError when it is missing); from a URL
    one listing, not a request per entry."""
    if not is_url(path):
        return [name for name in os.listdir(path) if os.path.isdir(os.path.join(path, name))]
    fs, inner = _fs(path)
    return [
        entry["name"].rstrip("/").rsplit("/", 1)[-1]
        for entry in fs.ls(inner, detail=True)
        if entry.get("type") == "directory"
    ]


def glob(folder: str, pattern: str) -> list[str]:
    """The paths in `folder` whose names match `pattern` (no pattern characters in folder)."""
    if not is_url(folder):
        return local_glob.glob(os.path.join(local_glob.escape(folder), pattern))
    fs, inner = _fs(folder)
    return [join(folder, match.rsplit("/", 1)[-1]) for match in fs.glob(inner.rstrip("/") + "/" + pattern)]


def open(path: str, mode: str = "rb"):
    if not is_url(path):
        return builtins.open(path, mode)
    fs, inner = _fs(path)
    return fs.open(inner, mode)


def makedirs(path: str) -> None:
    if not is_url(path):
        os.makedirs(path, exist_ok=True)
        return
    fs, inner = _fs(path)
    fs.makedirs(inner, exist_ok=True)


def remove(path: str) -> None:
    """A file or a folder, if there."""
    if not is_url(path):
        if os.path.isdir(path):
            shutil.rmtree(path)
        elif os.path.exists(path):
            os.remove(path)
        return
    fs, inner = _fs(path)
    if fs.exists(inner):
        fs.rm(inner, recursive=True)


def write_bytes(path: str, data: bytes) -> None:
    """Locally under a temporary name and renamed into place; to a URL in one put
    (an object store's put is whole or nothing)."""
    if not is_url(path):
        atomic_write_bytes(path, data)
        return
    fs, inner = _fs(path)
    fs.pipe_file(inner, data)
