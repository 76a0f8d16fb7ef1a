"""Atomic JSON files (the status file, the restore snapshot): written to a temp file in the
same folder, fsynced, renamed, so a reader or a crash never sees half a file."""

from __future__ import annotations

import json

from platforms.atomicfile import write_text_atomic

__all__ = ["write_json_atomic", "write_status"]


def write_json_atomic(path: str, obj, *, dir_mode: int = 0o777, durable_dir: bool = False) -> str:
    """Write ``obj`` as JSON to ``path`` atomically; ``durable_dir`` also fsyncs the folder."""
    text = json.dumps(obj, indent=1, sort_keys=True) + "\n"
    return write_text_atomic(path, text, dir_mode=dir_mode, durable_dir=durable_dir)


def write_status(path: str, status: dict) -> None:
    """The daemon's JSON status (``--status-file``)."""
    write_json_atomic(path, status)
