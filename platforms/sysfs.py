"""The sysfs access contract and the directory backend.

Paths are always relative to a root, e.g. ``devices/system/cpu/cpufreq/policy0/scaling_cur_freq``
(``proc/stat`` is served the same way). Backends:

- :class:`DirSysfs` on a real root (``/``) or on a fake tree in a folder,
- ``platforms.trace.ReplaySysfs`` serving a recorded trace,
- ``platforms.sim.simsysfs.SimSysfs`` exposing the plant simulator.

A failed read raises :class:`SysfsUnavailable` naming the file; a refused write raises
:class:`SysfsWriteError` naming file, value and errno. Nothing above this module calls ``open()``
on sysfs.
"""

from __future__ import annotations

import errno
import os
import stat
from abc import ABC, abstractmethod

from platforms.errors import SysfsUnavailable, SysfsWriteError

# Values that mean "no reading" even though the read itself succeeded.
_UNSUPPORTED = ("<unsupported>",)


class SysfsBackend(ABC):
    """Read/write/list/exists on paths relative to a root."""

    #: short name for logs and traces (``dir``, ``replay``, ``sim``)
    kind: str = "abstract"

    @abstractmethod
    def read(self, path: str) -> str:
        """Return the stripped text of ``path`` or raise :class:`SysfsUnavailable`."""

    @abstractmethod
    def write(self, path: str, value: str) -> None:
        """Write ``value`` to ``path`` or raise :class:`SysfsWriteError`."""

    @abstractmethod
    def list(self, path: str) -> list[str]:
        """Sorted entry names of the folder ``path`` (empty when it does not exist)."""

    @abstractmethod
    def exists(self, path: str) -> bool:
        """True when ``path`` exists (file or folder)."""

    def writable(self, path: str) -> bool:
        """True when a write to ``path`` could succeed (permission check only)."""
        return self.exists(path)

    # -- helpers shared by every backend -------------------------------------------------
    def read_int(self, path: str) -> int:
        text = self.read(path)
        try:
            return int(text.split()[0])
        except (ValueError, IndexError):
            raise SysfsUnavailable(path, f"not an integer: {text!r}") from None

    def read_ints(self, path: str) -> list[int]:
        text = self.read(path)
        try:
            return [int(x) for x in text.split()]
        except ValueError:
            raise SysfsUnavailable(path, f"not a list of integers: {text!r}") from None

    def read_exact(self, path: str) -> str:
        """:meth:`read`, refusing text a byte of which did not decode: a value to be written
        back must give the kernel the bytes it printed. Every backend decodes leniently (a
        stray byte must not blind the sensing), so a U+FFFD stands for a lost byte; checked
        here, above :meth:`read`, it holds for wrappers and subclasses that override it."""
        text = self.read(path)
        if "\ufffd" in text:
            raise SysfsUnavailable(path, f"not valid UTF-8: {text!r}")
        return text

    def read_or(self, path: str, fallback: str | None = None) -> str | None:
        try:
            return self.read(path)
        except SysfsUnavailable:
            return fallback


def check_value(path: str, text: str) -> str:
    """Normalise a raw read: strip, and refuse empty or '<unsupported>' values."""
    value = text.strip().strip("\x00")
    if value == "":
        raise SysfsUnavailable(path, "empty file")
    if value in _UNSUPPORTED:
        raise SysfsUnavailable(path, value)
    return value


class DirSysfs(SysfsBackend):
    """sysfs under a directory: the live tree when ``root='/'``, a fake tree otherwise.

    Each read opens the file on its own (sysfs values are regenerated per open) and maps every
    failure mode seen on the boards (ENOENT, EAGAIN, ENODATA, EACCES, empty, the CPython text
    layer's ``TypeError`` on a failed read) to :class:`SysfsUnavailable`.
    """

    kind = "dir"

    def __init__(self, root: str | os.PathLike[str] = "/"):
        self.root = os.path.abspath(os.fspath(root))
        # Paths are sysfs-relative (``devices/...``, ``class/...``) plus ``proc/...``. A fake
        # tree holds both in one folder. A full filesystem root (``/``, or a copied root that
        # has ``sys/`` and no ``devices/``) maps them onto ``<root>/sys`` and ``<root>/proc``.
        full_root = self.root == "/" or (
            os.path.isdir(os.path.join(self.root, "sys"))
            and not os.path.isdir(os.path.join(self.root, "devices"))
        )
        self._sys = os.path.join(self.root, "sys") if full_root else self.root
        self._proc = (
            os.path.join(self.root, "proc") if full_root else os.path.join(self.root, "proc")
        )

    def __repr__(self) -> str:
        return f"DirSysfs({self.root!r})"

    def abspath(self, path: str) -> str:
        path = path.lstrip("/")
        if path == "proc" or path.startswith("proc/"):
            return os.path.join(self._proc, path[5:]) if len(path) > 5 else self._proc
        return os.path.join(self._sys, path)

    def read(self, path: str) -> str:
        full = self.abspath(path)
        try:
            # Binary read: avoids the text layer's TypeError on EAGAIN (CPython < 3.14).
            with open(full, "rb", buffering=0) as f:
                raw = f.read(65536)
        except FileNotFoundError:
            raise SysfsUnavailable(path, "no such file") from None
        except IsADirectoryError:
            raise SysfsUnavailable(path, "is a directory") from None
        except PermissionError:
            raise SysfsUnavailable(path, "permission denied") from None
        except OSError as err:
            name = errno.errorcode.get(err.errno or 0, str(err.errno))
            raise SysfsUnavailable(path, f"read failed: {name}") from None
        except (TypeError, ValueError) as err:  # pragma: no cover - CPython text-layer quirk
            raise SysfsUnavailable(path, f"read failed: {err}") from None
        if raw is None:
            raise SysfsUnavailable(path, "read failed: EAGAIN")
        return check_value(path, raw.decode("utf-8", errors="replace"))

    def write(self, path: str, value: str) -> None:
        full = self.abspath(path)
        try:
            # No O_CREAT: a write never creates a file the kernel lacks (as ``echo >`` would
            # in a fake tree). O_TRUNC is what the shell does and sysfs ignores it.
            fd = os.open(full, os.O_WRONLY | os.O_TRUNC)
        except OSError as err:
            raise SysfsWriteError(path, value, err.errno, err.strerror or "") from None
        try:
            os.write(fd, value.encode())
        except OSError as err:
            raise SysfsWriteError(path, value, err.errno, err.strerror or "") from None
        finally:
            os.close(fd)

    def list(self, path: str) -> list[str]:
        try:
            return sorted(os.listdir(self.abspath(path)))
        except OSError:
            return []

    def exists(self, path: str) -> bool:
        return os.path.exists(self.abspath(path))

    def writable(self, path: str) -> bool:
        return os.access(self.abspath(path), os.W_OK)


def _changeable_by_others(st: os.stat_result, *, inside: bool) -> str | None:
    """Why another user than root could change the entry ``st`` describes (owned by them, or
    a folder they can write), or None. Above a tree, a sticky folder (``/tmp``) is fine: its
    other users can add names but not move the tree's own, root-owned one. Inside a tree it
    is not: a name the daemon finds by listing (a policy, a thermal zone) or a file it reads
    when it appears could be theirs."""
    if st.st_uid != 0:
        return f"is owned by uid {st.st_uid}"
    if not stat.S_ISDIR(st.st_mode):
        return None  # a file's or a link's own bits cannot redirect a path
    by_others = st.st_mode & stat.S_IWOTH or (st.st_mode & stat.S_IWGRP and st.st_gid != 0)
    if by_others and (inside or not st.st_mode & stat.S_ISVTX):
        who = "others" if st.st_mode & stat.S_IWOTH else f"group {st.st_gid}"
        sticky = (
            " (sticky, but inside the tree a new name is read)"
            if inside and (st.st_mode & stat.S_ISVTX)
            else ""
        )
        return f"is a folder writable by {who}{sticky}"
    return None


def _folders_above(path: str) -> list[str]:
    """``/``, ``/a``, ``/a/b`` for ``/a/b/c``: every folder a lookup of ``path`` goes through."""
    out, cur = [], path
    while True:
        parent = os.path.dirname(cur)
        if parent == cur:
            break
        out.append(parent)
        cur = parent
    return out[::-1]


def untrusted_tree_entry(root: str | os.PathLike[str], *, euid: int | None = None) -> str | None:
    """For a process running as root on a fake tree (``--sysfs-root DIR``, not ``/``): the
    first path, with why, that lets another user change what the tree's paths name, else
    None. Checked: the folders above the tree (as given and as resolved: a link on the way
    counts), the tree's root and every entry under it (``lstat``, links not followed). Each
    must be owned by root, and no folder writable by another user (above the tree, a sticky
    one such as ``/tmp`` is fine). :class:`DirSysfs` opens its paths by name and follows
    links, which a real sysfs needs (``cpuN/cpufreq`` -> ``policyN``) and fake trees have
    too; on a tree another user controls, a link planted there made root write a frequency
    into a root-only file, or read one into a world-readable trace. A tree nobody else can
    change stays so for the whole run, so one look at the start is enough.

    ``euid`` defaults to this process's; any other than 0 is never refused (a user runs on
    their own tree with their own rights), nor is the live tree ``/``."""
    euid = os.geteuid() if euid is None else euid
    root = os.path.abspath(os.fspath(root))
    if euid != 0 or root == os.path.abspath(os.sep):
        return None
    real = os.path.realpath(root)
    for top in dict.fromkeys((root, real)):
        for folder in _folders_above(top):
            try:
                why = _changeable_by_others(os.lstat(folder), inside=False)
            except OSError:
                continue  # what cannot be looked at fails the start later, said as such
            if why:
                return f"{folder} {why}"
        if top != real:  # the tree's own name as given (it may be a link)
            try:
                st = os.lstat(top)
            except OSError:
                continue
            if st.st_uid != 0:
                return f"{top} is owned by uid {st.st_uid}"
    stack = [real]
    while stack:
        folder = stack.pop()
        try:
            why = _changeable_by_others(os.lstat(folder), inside=True)
        except OSError:
            continue
        if why:
            return f"{folder} {why}"
        try:
            with os.scandir(folder) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError:
            continue
        subfolders = []
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    subfolders.append(entry.path)
                    continue
                why = _changeable_by_others(entry.stat(follow_symlinks=False), inside=True)
            except OSError:
                continue
            if why:
                return f"{entry.path} {why}"
        stack.extend(reversed(subfolders))  # depth first, in name order
    return None
