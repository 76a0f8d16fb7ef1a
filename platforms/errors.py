"""Typed errors of the platforms layer.

Every error names the file (and, for writes, the value and errno) so that a log line is enough
to find the cause. Callers report an unreadable value as *unavailable*, never as 0.
"""

from __future__ import annotations

import errno as _errno


class HidvfsError(Exception):
    """Base class of every error hidvfs raises on purpose."""


class SysfsUnavailable(HidvfsError):
    """A sysfs value could not be read: missing, EAGAIN/ENODATA, empty or '<unsupported>'."""

    def __init__(self, path: str, reason: str):
        self.path = path
        self.reason = reason
        super().__init__(f"{path}: unavailable ({reason})")


class SysfsWriteError(HidvfsError):
    """The kernel (or the fake tree) refused a write."""

    def __init__(self, path: str, value: str, errno: int | None, reason: str = ""):
        self.path = path
        self.value = value
        self.errno = errno
        name = _errno.errorcode.get(errno, str(errno)) if errno is not None else "no errno"
        detail = f": {reason}" if reason else ""
        super().__init__(f"write {value!r} to {path} failed ({name}){detail}")


class SpecError(HidvfsError):
    """A board spec (or config) is malformed: names the file, the key and what was expected."""

    def __init__(
        self, file: str, key: str, expected: str, got: object = None, *, message: str | None = None
    ):
        """``message``: the whole text, for a reason that is a sentence of its own (one that
        already says what was expected would read "expected ... expected ..." wrapped)."""
        self.file = file
        self.key = key
        self.expected = expected
        self.got = got
        got_txt = "" if got is None else f", got {got!r}"
        super().__init__(message or f"{file}: key '{key}': expected {expected}{got_txt}")


class UnknownBoard(HidvfsError):
    """No board spec with this name."""


class TraceError(HidvfsError):
    """A trace file is truncated, corrupt or of an unknown version; names the line."""

    def __init__(self, file: str, line: int, reason: str):
        self.file = file
        self.line = line
        self.reason = reason
        super().__init__(f"{file}: line {line}: {reason}")
