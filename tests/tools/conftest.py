"""Fixtures of the CLI tests."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def as_nobody() -> list[str] | None:
    """The command prefix that runs this Python as ``nobody`` (None when that cannot be done
    here: not root, no setpriv, or a Python that user cannot reach). CAP_DAC_READ_SEARCH is
    kept when needed, so that a Python under a private home (/root) can be read: it lets
    nothing be written."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        return None
    base = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]
    read_only = ["--inh-caps", "+dac_read_search", "--ambient-caps", "+dac_read_search"]
    for extra in ([], read_only):
        cmd = [*base, *extra, sys.executable]
        probe = subprocess.run([*cmd, "-c", "import tools.cli"], cwd=ROOT, capture_output=True)
        if probe.returncode == 0:
            return cmd
    return None


@pytest.fixture
def nobody():
    cmd = as_nobody()
    if cmd is None:
        pytest.skip("needs root, setpriv and a Python the user nobody can run")
    return cmd
