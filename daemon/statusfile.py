"""Atomic JSON files (the status file, the restore snapshot): written to a temp file in the
same folder, fsynced, renamed, so a reader or a crash never sees half a file."""

from __future__ import annotations

import json

from platforms.atomicfile import kept_mode, write_text_atomic

__all__ = ["status_mode", "write_json_atomic", "write_status"]


def write_json_atomic(
    path: str,
    obj,
    *,
    mode: int | None = None,
    dir_mode: int = 0o777,
    durable_dir: bool = False,
    stream_nonblocking: bool = False,
) -> str:
    """Write ``obj`` as JSON to ``path`` atomically (``mode``: its permission bits, else
    0600); ``durable_dir`` also fsyncs the folder; ``stream_nonblocking``: a FIFO is not
    waited on (:func:`platforms.atomicfile.write_bytes_atomic`)."""
    text = json.dumps(obj, indent=1, sort_keys=True) + "\n"
    return write_text_atomic(
        path,
        text,
        mode=mode,
        dir_mode=dir_mode,
        durable_dir=durable_dir,
        stream_nonblocking=stream_nonblocking,
    )


def write_status(path: str, status: dict, *, stream_nonblocking: bool = False) -> None:
    """The daemon's JSON status (``--status-file``), for dashboards and scripts to read: a new
    file is 0644 (the status holds no secret), an existing one keeps its mode (an atomic
    rewrite used to turn it into mkstemp's 0600) when :func:`status_mode` trusts it."""
    write_json_atomic(path, status, mode=status_mode(path), stream_nonblocking=stream_nonblocking)


#: the widest mode a status file gets: never writable by others, never setuid/setgid/sticky
STATUS_MODE_MAX = 0o644


def status_mode(path: str) -> int:
    """The mode for a status file rewritten at ``path``
    (:func:`platforms.atomicfile.kept_mode`, at most :data:`STATUS_MODE_MAX`)."""
    return kept_mode(path, ceiling=STATUS_MODE_MAX)
