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
