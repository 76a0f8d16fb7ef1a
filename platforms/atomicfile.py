"""Atomic text files: written to a temporary file in the same folder, fsynced, renamed over
the target, so a reader or a crash sees the old file or the new one, never half of one.

One writer for every file the project must not lose (the daemon's status file and restore
snapshot, the reference-profile store, installed unit and config files, the placer's model)."""

from __future__ import annotations

import os
import stat
import tempfile

from platforms.outputs import is_stream_path, open_output, trusted_link


def fsync_dir(directory: str | os.PathLike[str]) -> None:
    """Make a rename or unlink in ``directory`` durable (best effort)."""
    try:
        dfd = os.open(os.fspath(directory), os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)


def write_text_atomic(
    path: str | os.PathLike[str],
    text: str,
    *,
    mode: int | None = None,
    dir_mode: int = 0o777,
    durable_dir: bool = False,
    stream_nonblocking: bool = False,
) -> str:
    """Write ``text`` (UTF-8) to ``path`` atomically and return the path (see
    :func:`write_bytes_atomic`)."""
    return write_bytes_atomic(
        path,
        text.encode("utf-8"),
        mode=mode,
        dir_mode=dir_mode,
        durable_dir=durable_dir,
        stream_nonblocking=stream_nonblocking,
    )


def written_as_stream(path: str) -> bool:
    """Whether ``path`` is a stream to write as it is rather than a name to rename over: a
    FIFO or a character device (``/dev/null``) that is root's or this user's, or sits in a
    folder nobody else can write, or a symlink this process may write through
    (:func:`platforms.outputs.trusted_link`) that leads to a stream
    (:func:`platforms.outputs.is_stream_path`: ``/dev/stdout``, ``/dev/fd/N``, a user's own
    link to a FIFO). Anything else (a link to a regular file, another user's FIFO in /tmp, a
    link another user planted, a name under a planted link to a folder in /proc) is renamed
    over, which writes into nothing but the folder the name is in."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    if stat.S_ISLNK(st.st_mode):  # a link to a regular file is renamed over, as it always was
        return trusted_link(path) and is_stream_path(path)
    if not (stat.S_ISFIFO(st.st_mode) or stat.S_ISCHR(st.st_mode)):
        return False
    if st.st_uid in (0, os.geteuid()):
        return True
    try:
        folder = os.stat(os.path.dirname(os.path.abspath(path)))
    except OSError:
        return False
    return not folder.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def write_bytes_atomic(
    path: str | os.PathLike[str],
    data: bytes,
    *,
    mode: int | None = None,
    dir_mode: int = 0o777,
    durable_dir: bool = False,
    stream_nonblocking: bool = False,
) -> str:
    """Write ``data`` to ``path`` atomically and return the path (a stream,
    :func:`written_as_stream`, is written as it is: nothing is renamed over it;
    ``stream_nonblocking``: a FIFO is not waited on, for the daemon's status file).

    The temporary file has a name of its own (two writers of one path never share it) and is
    removed on any failure or interruption. ``mode`` sets the file's permission bits before
    it appears (else mkstemp's 0600); ``dir_mode`` is used when the folder has to be
    created; ``durable_dir`` also fsyncs the folder so the rename itself survives a power
    cut. Nothing is done to the temporary by name but the rename and the cleanup's unlink
    (neither follows a symlink): the mode is set on the open descriptor, so a user who can
    write the folder and swaps a symlink in for the temporary cannot make a root writer
    chmod another file."""
    path = os.fspath(path)
    if written_as_stream(path):
        # /dev/null, /dev/stdout, a FIFO: written as a stream. A rename would replace the
        # device node or the link itself (root's `--status-file /dev/null` made /dev/null a
        # regular file); open_output refuses a block device and another user's link. With
        # stream_nonblocking a FIFO is not waited on: no reader (ENXIO) or a full one is an
        # OSError for the caller (the daemon's status writer warns and goes on: a blocking
        # open would stall its control loop). Other writers block, as a shell's `>` does: a
        # pipe they feed gets every byte
        with open_output(path, fifo_nonblocking=stream_nonblocking) as f:
            f.write(data)
        return path
    directory = os.path.dirname(os.path.abspath(path)) or "."
    os.makedirs(directory, mode=dir_mode, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            # on the descriptor, never by name: in a folder another user can write, the name
            # may be a symlink by now, and a chmod by path would change the mode of its target
            if mode is not None:
                os.fchmod(f.fileno(), mode)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)  # a rename acts on the name itself, never on a link's target
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if durable_dir:
        fsync_dir(directory)
    return path


def kept_mode(path: str | os.PathLike[str], *, ceiling: int = 0o644) -> int:
    """The mode for a file rewritten at ``path``: the existing file's permission bits (an
    administrator's 0600 or 0640 is kept), narrowed to ``ceiling``, when it is a regular
    file owned by this process's user; else ``ceiling``. What is at the path is looked at,
    not followed (``lstat``): a symlink, or a file another user made (a 4777 one in a 1777
    folder made root's status file setuid and world-writable), gives no mode."""
    try:
        st = os.lstat(path)
    except OSError:
        return ceiling
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        return ceiling
    return stat.S_IMODE(st.st_mode) & ceiling
