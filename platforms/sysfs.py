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
