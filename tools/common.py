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
from platforms.outputs import OutputFolderError, ensure_parent  # noqa: F401 - the CLI's names


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


def trusted_sysfs_root(ctx, param, value):
    """``--sysfs-root``: as root, refuse a tree another user could change (a link they plant
    in it redirects root's reads and writes: :func:`platforms.sysfs.untrusted_tree_entry`)."""
    if value is None:
        return value
    from platforms.sysfs import UNTRUSTED_TREE_ADVICE, untrusted_tree_entry

    why = untrusted_tree_entry(value)
    if why:
        raise click.BadParameter(f"{why}, {UNTRUSTED_TREE_ADVICE}", ctx=ctx, param=param)
    return value


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


def same_file(path: str, stream) -> bool:
    """Whether ``path`` is the file the open ``stream`` (sys.stdout, sys.stderr) writes to:
    /dev/stdout, /dev/fd/1, or the file or pipe the shell sent it to."""
    try:
        a, b = os.stat(path), os.fstat(stream.fileno())
    except (OSError, ValueError, AttributeError):  # io.UnsupportedOperation is both
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)
