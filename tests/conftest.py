"""Shared test setup."""

from __future__ import annotations

import logging

import pytest


@pytest.fixture(autouse=True)
def _hidvfs_logs_reach_caplog():
    """A test that starts the daemon in-process configures the ``hidvfs`` logger (its own
    handler, no propagation); later tests reading logs with caplog would then see nothing,
    depending on the order the tests run in. Each test starts with propagation on."""
    logger = logging.getLogger("hidvfs")
    saved = logger.propagate
    logger.propagate = True
    yield
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
