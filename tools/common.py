"""Shared CLI helpers: JSON output, error reporting, building a platform from options."""

from __future__ import annotations

import json
import math
import os
import sys
from typing import Any

import click

from daemon.logs import under_journal
from platforms.errors import HidvfsError


def emit_json(obj: Any) -> None:
    """Strict JSON: NaN and infinities (an empty mean, a ratio of nothing) become null."""
    click.echo(
        json.dumps(_finite(obj), indent=2, sort_keys=False, default=_default, allow_nan=False)
    )


def _finite(o: Any) -> Any:
    """``o`` with every non-finite float replaced by None, recursively (what ``default``
    returns is cleaned too: a dataclass may carry a NaN)."""
    if isinstance(o, float):
        return o if math.isfinite(o) else None
    if isinstance(o, dict):
        return {k: _finite(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_finite(v) for v in o]
    if isinstance(o, (str, int)) or o is None:
        return o
    return _finite(_default(o))


def _default(o: Any):
    if hasattr(o, "to_dict"):
        return o.to_dict()
    if hasattr(o, "__dataclass_fields__"):
        from dataclasses import asdict

        return asdict(o)
    if isinstance(o, (set, frozenset, tuple)):
        return list(o)
    return str(o)


def _quiet_broken_pipe(code: int = 0) -> None:
    """`hidvfs ... | head`: the reader went away; stop quietly like other Unix tools, with
    exit ``code``: ``hidvfs run`` passes its command's, which a closed pipe must not turn
    into 0."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except OSError:
        pass
    sys.exit(code)


#: import name -> the distribution ``pip`` installs it from
DISTRIBUTIONS = {"sklearn": "scikit-learn", "skl2onnx": "skl2onnx", "onnx": "onnx"}
#: the modules each optional extra of pyproject.toml brings, as import names
EXTRAS = {
    "train": ("onnx", "skl2onnx", "sklearn"),
    "cluster": ("onnx", "skl2onnx", "sklearn"),
    "report": ("matplotlib",),
}


def missing_modules(modules) -> list[str]:
    """The top-level modules of ``modules`` that cannot be imported, found without importing
    them (``importlib.util.find_spec``), so a command can refuse before minutes of work."""
    import importlib.util

    missing = []
    for name in modules:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a broken install, or a module without a spec
            found = False
        if not found:
            missing.append(name)
    return missing


def missing_extra_message(command: str, extra: str, needed) -> str | None:
    """One line saying that ``command`` needs the ``extra`` (and which of ``needed`` are
    missing), or None when every module of ``needed`` is installed."""
    missing = missing_modules(needed)
    if not missing:
        return None
    names = ", ".join(DISTRIBUTIONS.get(m, m) for m in EXTRAS[extra])
    lacking = ", ".join(DISTRIBUTIONS.get(m, m) for m in missing)
    return (
        f"{command} needs the {extra} extra ({names}; missing: {lacking}): "
        f'pip install "hidvfs[{extra}]"'
    )


def require_extra(command: str, extra: str, needed) -> None:
    """Exit 2 with one line when a module of ``needed`` (import names) is not installed."""
    message = missing_extra_message(command, extra, needed)
    if message:
        fail(message)


class Failed(SystemExit):
    """What :func:`fail` raises: the exit ``code`` of a SystemExit that keeps its ``message``,
    so that a command can pass the reason on (the daemon: to systemd, as ``STATUS=``)."""

    def __init__(self, message: str, code: int = 2):
        super().__init__(code)
        self.message = message


def not_empty(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """Click callback: an option given as ``''`` (an unset shell variable, say) is refused,
    not read as "not given": ``--sim "$BOARD"`` with BOARD empty ran the daemon on the real
    board, ``--policy ''`` the default policy."""
    if isinstance(value, str) and not value.strip():
        why = (
            "empty"
            if getattr(param, "required", False)
            else ("empty; leave the option out for its default")
        )
        raise click.BadParameter(why, ctx, param)
    return value


def check_outputs(
    outputs: dict[str, str | None], inputs: dict[str, str | None], tree: str | None = None
) -> None:
    """Refuse an output file that is one of the command's inputs, another output, or a file
    inside the sysfs ``tree`` it drives: ``--status-file c.yaml`` with ``--config c.yaml``
    replaced the config with status JSON."""
    seen: dict[str, str] = {}
    for flag, path in inputs.items():
        if path:
            seen[os.path.realpath(path)] = flag
    root = os.path.realpath(tree) if tree else None
    for flag, path in outputs.items():
        if not path:
            continue
        real = os.path.realpath(path)
        if real in seen:
            fail(f"{flag} {path}: is also {seen[real]}; it would be written over")
        if root and root != os.sep and (real == root or real.startswith(root + os.sep)):
            fail(f"{flag} {path}: is inside the tree {tree}; write it elsewhere")
        seen[real] = flag


class OutputFolderError(ValueError):
    """An output option whose folder cannot be made or written: one line naming the option,
    the path and why (:class:`Friendly` and :func:`guard_errors` print it, exit 2)."""


#: filesystems that hold the kernel's files, not the user's: no output folder is made there
#: (a mkdir under /sys/fs/cgroup would make a cgroup)
PSEUDO_FILESYSTEMS = frozenset(
    {"proc", "sysfs", "cgroup", "cgroup2", "debugfs", "tracefs", "securityfs", "pstore",
     "configfs", "bpf", "efivarfs", "devpts"}
)  # fmt: skip


def _fs_type(path: str) -> str | None:
    """The type of the filesystem ``path`` is on (the longest mount point above it in
    /proc/self/mounts), or None when the mount table cannot be read."""
    try:
        with open("/proc/self/mounts", encoding="utf-8", errors="replace") as f:
            mounts = [line.split()[1:3] for line in f if len(line.split()) >= 3]
    except OSError:
        return None
    real, best, kind = os.path.realpath(path), "", None
    for point, fstype in mounts:
        point = point.replace("\\040", " ")
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, fstype
    return kind


def _why_not_writable(folder: str, err: OSError | None = None, *, named: bool = False) -> str:
    """Why no file can be made in ``folder``: a pseudo or read-only filesystem, else the
    error's reason, else no permission (``named``: said with the folder's name)."""
    fstype = _fs_type(folder)
    if fstype in PSEUDO_FILESYSTEMS:
        return f"{folder} is on the {fstype} pseudo filesystem"
    try:
        if os.statvfs(folder).f_flag & os.ST_RDONLY:
            return f"{folder} is on a read-only filesystem"
    except OSError:
        pass
    if err is not None:
        return err.strerror or str(err)
    return f"{folder} is not writable" if named else "permission denied"


def ensure_parent(option: str, path: str | os.PathLike[str], *, folder: bool = False) -> None:
    """Make the missing folders above the output ``path`` of ``option`` (mode 0o755) and check
    that a file can be made in its folder, or raise :class:`OutputFolderError`: a file in the
    way, no permission, a read-only or pseudo filesystem (/proc, /sys) are said before any
    work, not when its results are written. ``folder``: ``path`` is an output folder (the
    command makes it; an existing one is checked itself). Call it once the option's other
    checks have passed (an output that is an input, one inside a tree, see
    :func:`check_outputs`) and before the long work. A device or a FIFO (``/dev/null``,
    ``/dev/stdout``) needs nothing made: it passes as it is."""
    import stat
    import tempfile

    full = os.path.abspath(os.fspath(path))
    try:
        mode = os.stat(full).st_mode
    except OSError:
        mode = None
    if mode is not None and (stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)):
        return
    if mode is not None and full.startswith(("/dev/", "/proc/")):
        return  # /dev/stdout or /proc/self/fd/N: a stream the shell opened (to a file too)
    is_dir = mode is not None and stat.S_ISDIR(mode)
    if mode is not None and is_dir != folder:
        kind, want = ("a folder", "a file") if is_dir else ("a file", "a folder")
        raise OutputFolderError(f"{option} {path}: is {kind}; give {want}")
    where = full if is_dir else os.path.dirname(full)
    # the nearest folder that exists: the missing ones are made in it
    there = where
    while not os.path.lexists(there):
        there = os.path.dirname(there)
    why = None
    if not os.path.isdir(there):
        why = f"{there} is a file, not a folder"
    elif not os.access(there, os.W_OK | os.X_OK) or (
        there != where and _fs_type(there) in PSEUDO_FILESYSTEMS
    ):
        why = _why_not_writable(there, named=there != where)
    if why is None and there != where:
        try:
            os.makedirs(where, mode=0o755, exist_ok=True)
        except OSError as err:
            why = _why_not_writable(there, err)
    if why is not None:
        what = "is not writable" if os.path.isdir(where) else "cannot be made"
        raise OutputFolderError(
            f"{option} {path}: its folder {where} {what} ({why}); choose another {option}"
        )
    # os.access says yes to root anywhere (/proc, a read-only mount): make a file for real
    try:
        fd, probe = tempfile.mkstemp(dir=where, prefix=".hidvfs-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise OutputFolderError(
            f"{option} {path}: its folder {where} is not writable "
            f"({_why_not_writable(where, err)}); choose another {option}"
        ) from None


def stops_on_signals(fn):
    """SIGTERM and SIGHUP end the decorated command as Ctrl-C does ("interrupted", exit 130,
    its own KeyboardInterrupt cleanup run), not with a silent 143: for long computations
    (training, evaluations) whose stop by `kill` or a dropped session should read the same."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from daemon.stopsignals import InterruptOnSignals

        with InterruptOnSignals():
            return fn(*args, **kwargs)

    return wrapper


def fail(message: str, code: int = 2) -> None:
    """``hidvfs: error: <message>`` on stderr, then exit ``code``. When stderr is the journal,
    each line gets the ``<3>`` prefix, so that ``journalctl -p err`` shows it."""
    text = f"hidvfs: error: {message}"
    if under_journal():
        text = "\n".join(f"<3>{line}" for line in text.splitlines())
    click.echo(text, err=True)
    raise Failed(message, code)


class Friendly(click.Group):
    """A group whose commands turn HidvfsError/ValueError/OSError into one clear line."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            _quiet_broken_pipe()
        except (HidvfsError, ValueError, OSError) as err:
            fail(str(err))


def guard_errors(fn):
    """Decorator for plain commands: same clean error handling as :class:`Friendly`."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except BrokenPipeError:
            _quiet_broken_pipe()
        except (HidvfsError, ValueError, OSError) as err:
            fail(str(err))

    return wrapper


class FiniteFloatRange(click.FloatRange):
    """A FloatRange that refuses nan and inf (a usage error naming the option): nan passes
    every bound and inf an open one, and then ran to nan results or failed deep in a run."""

    def convert(self, value, param, ctx):
        rv = super().convert(value, param, ctx)
        if not math.isfinite(rv):
            self.fail(f"{rv} is not a finite number.", param, ctx)
        return rv
