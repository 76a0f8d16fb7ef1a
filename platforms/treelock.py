"""One controller per board: an exclusive ``flock`` on the tree's cpufreq folder.

The state dir's lock keeps two daemons from sharing a snapshot; it does not keep two daemons
with their own state dirs off one board, and those undo each other: the second saves the
first's settings as its "originals" and puts them back after the first has restored. The
lock lives on the board itself (``devices/system/cpu/cpufreq``, which every cpufreq board
has and a fake tree copies), so it holds whatever state dir, config or user a daemon has, and
the kernel drops it when the process dies.

A refused start names the holder when it can: a ``flock`` carries no data and sysfs takes no
file beside it, so the holder's pid is read from ``/proc/locks`` and what it is (a daemon, a
native campaign, a profile measurement) from its command line, which every hidvfs version
has; a holder that cannot be told is "another hidvfs process".
"""

from __future__ import annotations

import errno
import fcntl
import os

import psutil

from platforms import paths
from platforms.errors import HidvfsError
from platforms.liveprocs import program_name
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
            busy = err.errno in (errno.EWOULDBLOCK, errno.EACCES)
            holder = lock_holder(fd) if busy else None  # while fd still names the folder
            os.close(fd)
            if busy:
                raise TreeBusy(busy_message(self.sysfs.root, holder)) from None
            raise TreeBusy(f"{self.path}: cannot lock ({err.strerror})") from None
        self._fd = fd
        return self


#: where the kernel lists the held locks, with their holders' pids
PROC_LOCKS = "/proc/locks"
#: a campaign, study or measurement: waited for or stopped, then run again
_WAIT = "wait for it to finish or stop it first (kill {pid})"
#: the command that holds the board (the words after ``hidvfs``) -> what it is, what to do
_HOLDERS = {
    ("daemon",): ("another hidvfs daemon", "stop it first (sudo systemctl stop hidvfs)"),
    ("bots", "run"): (
        "a native BOTS campaign",
        "wait for it to finish or stop it first (kill {pid}: its finished runs are kept and a "
        "re-run of it resumes)",
    ),
    ("bots", "study"): ("a native BOTS study", _WAIT),
    ("bots", "profile"): ("a BOTS profile measurement", _WAIT),
    ("profile", "measure"): ("a profile measurement", _WAIT),
}
_ANY = "wait for it to finish or stop it first (a daemon: sudo systemctl stop hidvfs)"


def busy_message(root: object, pid: int | None) -> str:
    """Why ``root`` cannot be controlled now: what holds it and what to do about it (a
    daemon is stopped with systemctl; a campaign ends by itself), never a guess."""
    words = holder_command(pid) if pid else None
    who, advice = _HOLDERS.get(words, ("another hidvfs process", _ANY))
    if pid is None:
        where = " (a daemon, a native BOTS campaign or a profile measurement)"
    else:
        where = f" (pid {pid}, hidvfs {' '.join(words)})" if words else f" (pid {pid})"
    advice = advice.format(pid=pid)
    return f"{who} is controlling {root}{where}; {advice}: two would undo each other"


def lock_holder(fd: int) -> int | None:
    """The pid holding the ``flock`` on ``fd``'s file, from :data:`PROC_LOCKS`; None when it
    names none (no /proc, or a holder in another pid namespace, listed as pid 0)."""
    st = os.fstat(fd)
    inode = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        with open(PROC_LOCKS) as f:
            for line in f:
                # "1: FLOCK  ADVISORY  WRITE 4242 00:17:1234 0 EOF" (a waiter's has "->")
                fields = line.split()
                if fields[1:2] == ["FLOCK"] and fields[5:6] == [inode]:
                    pid = int(fields[4])
                    return pid if pid > 0 else None
    except (OSError, ValueError):
        return None
    return None


def holder_command(pid: int) -> tuple[str, ...] | None:
    """The hidvfs command ``pid`` runs (:func:`command_words`); None when it is gone."""
    try:
        return command_words(psutil.Process(pid).cmdline())
    except psutil.Error:
        return None


def command_words(argv: list[str]) -> tuple[str, ...] | None:
    """The hidvfs command of ``argv`` as its first words (``("bots", "run")``) when it is one
    of :data:`_HOLDERS`; None for another command or program."""
    args = hidvfs_args(argv)
    if args is None:
        return None
    words = []
    for arg in args:
        if arg.startswith("-") or len(words) == 2:
            break
        words.append(arg)
    for n in (1, 2):
        if tuple(words[:n]) in _HOLDERS:
            return tuple(words[:n])
    return None


def hidvfs_args(argv: list[str]) -> list[str] | None:
    """What follows the program in a hidvfs command line (``hidvfs ...``, ``python3
    /usr/bin/hidvfs ...`` as a console script runs, ``python -m tools.cli ...``); None for
    another program's. The program is told as for the rival daemons
    (:func:`platforms.liveprocs.program_name`)."""
    prog = program_name("", argv)
    if prog not in ("hidvfs", "tools.cli"):
        return None
    i = next(i for i, a in enumerate(argv) if a and os.path.basename(a) == prog)
    return argv[i + 1 :]
