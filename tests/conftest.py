"""Shared test setup."""

from __future__ import annotations

import logging
import sys

import pytest


def _ignore_hangup(_signum, _frame) -> None:
    """pytest itself keeps ignoring a hangup; unlike SIG_IGN, a handler is not inherited."""


@pytest.fixture(autouse=True, scope="session")
def _signals_as_in_a_terminal():
    """The tests of what SIGINT and SIGHUP do assume a terminal session's dispositions. Run
    under ``nohup`` (SIGHUP ignored) or as a shell's background job (SIGINT ignored), every
    child would inherit the SIG_IGN, and hidvfs keeps an inherited ignore by design (a
    nohup'd command outlives its session), so those tests failed. A Python handler becomes
    SIG_DFL in an exec'd child: the children see a terminal's dispositions, pytest still
    ignores a hangup, and an in-process SIGINT raises KeyboardInterrupt as Python's default
    does."""
    import signal

    saved = {}
    for sig, handler in (
        (signal.SIGHUP, _ignore_hangup),
        (signal.SIGINT, signal.default_int_handler),
    ):
        if signal.getsignal(sig) is signal.SIG_IGN:
            saved[sig] = signal.signal(sig, handler)
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


@pytest.fixture(autouse=True)
def _no_daemon_outlives_its_test():
    """A test that fails before its daemon stops (a signal that did not end it, a timeout)
    must not leave the process running for the rest of the session (a nohup'd run once left
    one for an hour). Covers every module that starts daemons with ``start_daemon``."""
    yield
    mod = sys.modules.get("tests.daemon.test_daemon_process")
    started = getattr(mod, "STARTED", [])
    while started:
        proc = started.pop()
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture(autouse=True)
def _hidvfs_logs_reach_caplog():
    """A test that starts the daemon in-process configures the ``hidvfs`` logger (its own
    handler, no propagation); later tests reading logs with caplog would then see nothing,
    depending on the order the tests run in. Each test starts with propagation on, and the
    handlers a test added go with it: one bound to that test's captured stderr, closed once it
    ended, printed "I/O operation on closed file" into a later test's output."""
    logger = logging.getLogger("hidvfs")
    saved = logger.propagate
    handlers = list(logger.handlers)
    logger.propagate = True
    yield
    for h in list(logger.handlers):
        if h not in handlers:
            logger.removeHandler(h)
    logger.propagate = saved


@pytest.fixture
def without(monkeypatch):
    """``without("onnx")``: the module looks not installed to ``importlib.util.find_spec``
    (what the extra checks ask) and to ``import`` (what the export would do)."""
    import importlib.util
    import sys

    real = importlib.util.find_spec
    gone: set[str] = set()

    def find_spec(name, *args, **kw):
        return None if name.split(".")[0] in gone else real(name, *args, **kw)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)

    def hide(*names):
        gone.update(names)
        for n in names:
            monkeypatch.setitem(sys.modules, n, None)

    return hide
