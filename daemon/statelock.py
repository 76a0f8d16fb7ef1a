"""One daemon per state dir: an exclusive ``flock`` on ``<state_dir>/lock`` for the whole run.

Why: two daemons sharing a state dir restore each other's snapshot underneath the other, the
one that stops first deletes ``restore.json`` while the other still holds the board, and the
next start then saves the leftovers as "originals", losing the true ones for good. The lock
is taken before anything is read or written, and the kernel drops it when the process dies,
so a crash never leaves a stale lock behind.
"""

from __future__ import annotations

import errno
import fcntl
import os

from platforms.errors import HidvfsError
from platforms.privatedir import private_dir
from platforms.treelock import HeldFlock

LOCK_NAME = "lock"


class StateDirBusy(HidvfsError):
    """Another daemon holds the state dir (or it cannot be used); the message says which."""


class StateLock(HeldFlock):
    """Hold ``<state_dir>/lock`` until :meth:`release` (or the process ends)."""

    def __init__(self, state_dir: str | os.PathLike[str]):
        self.state_dir = os.fspath(state_dir)
        self.path = os.path.join(self.state_dir, LOCK_NAME)
        self._fd: int | None = None

    def acquire(self) -> StateLock:
        writable = True
        try:
            private_dir(self.state_dir)  # not another user's: root acts on what is in it
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        except OSError as err:
            fd = self._read_only(err)
            if fd is None:
                raise StateDirBusy(
                    f"state dir {self.state_dir}: cannot use it ({err.strerror}); give a "
                    "writable folder with --state-dir or the config's state_dir"
                ) from None
            writable = False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            holder = _read_pid(fd)
            os.close(fd)
            if err.errno in (errno.EWOULDBLOCK, errno.EACCES):
                who = f" (pid {holder})" if holder else ""
                raise StateDirBusy(
                    f"another hidvfs daemon{who} is running with state dir {self.state_dir}; "
                    "stop it first (sudo systemctl stop hidvfs), or give this one its own "
                    "--state-dir"
                ) from None
            raise StateDirBusy(f"{self.path}: cannot lock ({err.strerror})") from None
        if not writable:  # locked all the same: a crash's snapshot can still be given back
            self._fd = fd
            return self
        try:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
        except OSError as err:
            os.close(fd)
            raise StateDirBusy(
                f"{self.path}: cannot write the daemon's pid ({err.strerror})"
            ) from None
        self._fd = fd
        return self

    def _read_only(self, err: OSError) -> int | None:
        """The lock file opened read-only when the state dir's file system is (a disk
        remounted read-only after errors): ``flock`` works on it, so the next start can
        still lock the dir and give back what a crashed run left in ``restore.json``
        before it is refused for want of a writable dir. None when that cannot help."""
        if err.errno != errno.EROFS or not os.path.isfile(self.path):
            return None
        try:
            return os.open(self.path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            return None


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode(errors="replace").strip()
        return int(text) if text else None
    except (OSError, ValueError):
        return None
