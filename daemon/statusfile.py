"""Atomic JSON files (the status file, the restore snapshot): written to a temp file in the
same folder, fsynced, renamed, so a reader or a crash never sees half a file."""

from __future__ import annotations

import json

from platforms.atomicfile import write_text_atomic

__all__ = ["status_mode", "write_json_atomic", "write_status"]


def write_json_atomic(
    path: str,
    obj,
    *,
    mode: int | None = None,
    dir_mode: int = 0o777,
    durable_dir: bool = False,
) -> str:
    """Write ``obj`` as JSON to ``path`` atomically (``mode``: its permission bits, else
    0600); ``durable_dir`` also fsyncs the folder."""
    text = json.dumps(obj, indent=1, sort_keys=True) + "\n"
    return write_text_atomic(path, text, mode=mode, dir_mode=dir_mode, durable_dir=durable_dir)


def write_status(path: str, status: dict) -> None:
    """The daemon's JSON status (``--status-file``), for dashboards and scripts to read: a new
    file is 0644 (the status holds no secret), an existing one keeps its mode (an atomic
    rewrite used to turn it into mkstemp's 0600) when :func:`status_mode` trusts it."""
    write_json_atomic(path, status, mode=status_mode(path))


#: the widest mode a status file gets: never writable by others, never setuid/setgid/sticky
STATUS_MODE_MAX = 0o644


def status_mode(path: str) -> int:
    """The mode for a status file rewritten at ``path``: the existing file's permission bits
    (an administrator's 0600 or 0640 is kept), narrowed to :data:`STATUS_MODE_MAX`, when it
    is a regular file owned by this process's user; else 0644. What is at the path is looked
    at, not followed (``lstat``): a symlink, or a file another user made (a 4777 one in a
    1777 folder made root's status file setuid and world-writable), gives no mode."""
    import os
    import stat

    try:
        st = os.lstat(path)
    except OSError:
        return STATUS_MODE_MAX
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        return STATUS_MODE_MAX
    return stat.S_IMODE(st.st_mode) & STATUS_MODE_MAX
