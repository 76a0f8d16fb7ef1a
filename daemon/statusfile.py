"""Atomic JSON files (the status file, the restore snapshot): written to a temp file in the
same folder, fsynced, renamed, so a reader or a crash never sees half a file."""

from __future__ import annotations

import json
import os
import tempfile


def fsync_dir(directory: str) -> None:
    """Make a rename or unlink in ``directory`` durable (best effort)."""
    try:
        dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)


def write_json_atomic(path: str, obj, *, dir_mode: int = 0o777, durable_dir: bool = False) -> str:
    """Write ``obj`` as JSON to ``path`` atomically; ``durable_dir`` also fsyncs the folder."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path)) or "."
    os.makedirs(directory, mode=dir_mode, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=1, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if durable_dir:
        fsync_dir(directory)
    return path


def write_status(path: str, status: dict) -> None:
    """The daemon's JSON status (``--status-file``)."""
    write_json_atomic(path, status)
