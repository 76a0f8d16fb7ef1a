"""One controller per board: an exclusive ``flock`` on the tree's cpufreq folder.

The state dir's lock keeps two daemons from sharing a snapshot; it does not keep two daemons
with their own state dirs off one board, and those undo each other: the second saves the
first's settings as its "originals" and puts them back after the first has restored. The
lock lives on the board itself (``devices/system/cpu/cpufreq``, which every cpufreq board
has and a fake tree copies), so it holds whatever state dir, config or user a daemon has, and
the kernel drops it when the process dies.
"""

from __future__ import annotations

import errno
import fcntl
import os

from platforms import paths
from platforms.errors import HidvfsError
from platforms.sysfs import DirSysfs


class TreeBusy(HidvfsError):
    """Another process holds the board's lock; the message names the tree."""


class HeldFlock:
    """An exclusive ``flock`` held on an open file descriptor until :meth:`release` (closing
    it drops the lock; so does the process's end). Subclasses open and lock in ``acquire``."""

    _fd: int | None = None

    def acquire(self):  # pragma: no cover - every subclass has its own
        raise NotImplementedError

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock
            self._fd = None

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


class TreeLock(HeldFlock):
    """Hold the lock of ``sysfs``'s tree until :meth:`release` (or the process ends). A tree
    without a cpufreq folder has nothing to control and takes no lock."""

    def __init__(self, sysfs: DirSysfs):
        self.sysfs = sysfs
        self.path = sysfs.abspath(paths.CPUFREQ)
        self._fd: int | None = None

    def acquire(self) -> TreeLock:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return self
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            os.close(fd)
            if err.errno in (errno.EWOULDBLOCK, errno.EACCES):
                raise TreeBusy(
                    f"another hidvfs daemon is controlling {self.sysfs.root} (with another state "
                    "dir); stop it first (sudo systemctl stop hidvfs): two would undo each other"
                ) from None
            raise TreeBusy(f"{self.path}: cannot lock ({err.strerror})") from None
        self._fd = fd
        return self
