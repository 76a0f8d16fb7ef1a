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


def _changeable_by_others(
    st: os.stat_result, *, inside: bool, sticky_note: str = "inside the tree a new name is read"
) -> str | None:
    """Why another user than root could change the entry ``st`` describes (owned by them, or
    a folder they can write), or None. Above a tree, a sticky folder (``/tmp``) is fine: its
    other users can add names but not move the tree's own, root-owned one. Inside a tree it
    is not: a name the daemon finds by listing (a policy, a thermal zone) or a file it reads
    when it appears could be theirs (``sticky_note`` says which of these, for a sticky one)."""
    if st.st_uid != 0:
        return f"is owned by uid {st.st_uid}"
    if not stat.S_ISDIR(st.st_mode):
        return None  # a file's or a link's own bits cannot redirect a path
    by_others = st.st_mode & stat.S_IWOTH or (st.st_mode & stat.S_IWGRP and st.st_gid != 0)
    if by_others and (inside or not st.st_mode & stat.S_ISVTX):
        who = "others" if st.st_mode & stat.S_IWOTH else f"group {st.st_gid}"
        sticky = f" (sticky, but {sticky_note})" if inside and st.st_mode & stat.S_ISVTX else ""
        return f"is a folder writable by {who}{sticky}"
    return None


#: the kernel's limit on the links one lookup follows (ELOOP beyond it)
_MAX_LINKS = 40


def _judge_lookup(start: str, rel: str) -> tuple[str, str | None, str | None]:
    """Look up ``rel`` from the resolved folder ``start`` (or from ``/`` when it is absolute)
    one name at a time, as the kernel does, and judge every place whose owner decides where
    it ends: each folder a name is looked up in (owned by root and not writable by another
    user; sticky is fine, its other users cannot move root's names), each symbolic link met on
    the way, the last name's own owner (root), and, when a name is missing, the folder it is
    missing from (nobody else may make it there, sticky or not).

    Returns ``(resolved, where, why)``: ``where`` the first such place another user could
    change (``why`` says how), else both None. A lookup that fails for good (a file where a
    folder is needed, too many links) reaches nothing, so nothing is said of it."""
    names = [n for n in rel.split("/") if n not in ("", ".")]
    names.reverse()
    cur, links = (os.sep if rel.startswith("/") else start), 0
    while names:
        try:
            here = os.lstat(cur)
        except OSError:
            return cur, None, None
        why = _changeable_by_others(here, inside=False)
        if why:
            return cur, cur, why
        name = names.pop()
        if name == "..":
            cur = os.path.dirname(cur)
            continue
        nxt = os.path.join(cur, name)
        try:
            st = os.lstat(nxt)
        except FileNotFoundError:
            # whoever can add a name to this folder decides what will be found here
            why = _changeable_by_others(
                here, inside=True, sticky_note=f"anyone may make {name} there"
            )
            return os.path.join(nxt, *reversed(names)), (cur if why else None), why
        except OSError:
            return nxt, None, None
        if stat.S_ISLNK(st.st_mode):
            if st.st_uid != 0:  # a link's owner may replace it, even in a sticky folder
                return nxt, nxt, f"is owned by uid {st.st_uid}"
            links += 1
            if links > _MAX_LINKS:
                return nxt, None, None
            try:
                target = os.readlink(nxt)
            except OSError:
                return nxt, None, None
            if target.startswith("/"):
                cur = os.sep
            names.extend(reversed([n for n in target.split("/") if n not in ("", ".")]))
            continue
        if not names:  # the end: its owner may change what it holds
            if st.st_uid != 0:
                return nxt, nxt, f"is owned by uid {st.st_uid}"
            return nxt, None, None
        if not stat.S_ISDIR(st.st_mode):
            return nxt, None, None  # ENOTDIR: the lookup reaches nothing
        cur = nxt
    return cur, None, None


def _within(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


#: what to do instead, said after :func:`untrusted_tree_entry`'s reason by every command
UNTRUSTED_TREE_ADVICE = (
    "so another user can change what root reads and writes there (a symlink planted in the "
    "tree, or one leading through a folder of theirs, redirects a write to any file); as "
    "root, use a tree root made itself (`hidvfs fake-sysfs BOARD DIR` as root) in folders "
    "no other user can write, not root's copy or chown of another user's tree (`cp -r` and "
    "`chown -R` keep their links pointing where they chose, `cp -rL` reads what those name "
    "with root's rights into the copy), or run as the tree's owner without sudo (a fake tree "
    "needs no root)"
)


def untrusted_tree_entry(root: str | os.PathLike[str], *, euid: int | None = None) -> str | None:
    """For a process running as root on a fake tree (``--sysfs-root DIR``, not ``/``): the
    first path, with why, that lets another user change what the tree's paths name, else
    None.

    Judged: the folders :class:`DirSysfs` reads (the tree itself, or ``sys/`` and ``proc/``
    of a copied root filesystem, whose other folders it never opens) and the lookup of each
    from ``/`` (every folder above it, as given and as its links resolve; a link on the way
    counts); then every entry under them (``lstat``): each must be owned by root, and no
    folder writable by another user (above the tree, a sticky one such as ``/tmp`` is fine,
    inside it not). :class:`DirSysfs` opens its paths by name and follows links, which a real
    sysfs needs (``cpuN/cpufreq`` -> ``policyN``) and fake trees have too, so each link in
    the tree is resolved and judged as well: one that resolves inside the tree is fine; one
    that resolves outside must get there through folders no other user can change, links
    owned by root and, when its target exists, a target owned by root (a folder it leads to
    is judged as the tree is). On a tree another user controls, a link planted there made root
    write a frequency into a root-only file, or read one into a world-readable trace; a
    root-owned link in it (``cp -r`` by root of a user's tree) that points through a folder
    of theirs did the same. A tree nobody else can change stays so for the whole run, so one
    look at the start is enough.

    ``euid`` defaults to this process's; any other than 0 is never refused (a user runs on
    their own tree with their own rights), nor is the live tree ``/``. A tree that does not
    exist is not refused here: its start fails later, said as such."""
    euid = os.geteuid() if euid is None else euid
    root = os.path.abspath(os.fspath(root))
    if euid != 0 or root == os.path.abspath(os.sep) or not os.path.isdir(root):
        return None
    sysfs = DirSysfs(root)
    tops = [sysfs._sys]
    if not _within(sysfs._proc, sysfs._sys):
        tops.append(sysfs._proc)
    walk: list[str] = []  # resolved folders to walk, each judged as a tree
    for top in tops:
        real, where, why = _judge_lookup(os.sep, top)
        if why:
            return f"{where} {why}"
        if os.path.isdir(real) and not os.path.islink(real):
            walk.append(real)
    seen: set[tuple[int, int]] = set()
    walked = list(walk)  # a link resolving under one of these needs no walk of its own
    stack = list(reversed(walk))
    while stack:
        folder = stack.pop()
        try:
            st = os.lstat(folder)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) in seen:
            continue
        seen.add((st.st_dev, st.st_ino))
        why = _changeable_by_others(st, inside=True)
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
                est = entry.stat(follow_symlinks=False)
                why = _changeable_by_others(est, inside=True)
                if why is None and stat.S_ISLNK(est.st_mode):
                    target = os.readlink(entry.path)
            except OSError:
                continue
            if why:
                return f"{entry.path} {why}"
            if not stat.S_ISLNK(est.st_mode):
                continue
            real, where, why = _judge_lookup(folder, target)
            if why:
                shown = os.path.realpath(entry.path)
                if where == shown:
                    return f"{entry.path} links to {shown}, which {why}"
                return f"{entry.path} links to {shown} by way of {where}, which {why}"
            if os.path.isdir(real) and not any(_within(real, w) for w in walked):
                walked.append(real)  # a folder outside the tree: what is under it is read
                subfolders.append(real)
        stack.extend(reversed(subfolders))  # depth first, in name order
    return None
