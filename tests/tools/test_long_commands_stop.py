"""Long computations end on SIGTERM or SIGHUP as on Ctrl-C: "interrupted", exit 130, no
partial output (they used to die silently with 143 / 129)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "args, sig",
    [
        (["coordinator", "evaluate", "--jobs", "500", "--json"], signal.SIGTERM),
        (["agents", "eval", "--board", "tx2", "--seeds", "50", "--json"], signal.SIGHUP),
    ],
)
def test_a_stop_signal_interrupts_as_ctrl_c_does(args, sig):
    proc = subprocess.Popen(
        [sys.executable, "-m", "tools.cli", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    time.sleep(4.0)  # well into its work (imports and model loads take about 1 s)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-2000:]
    assert err.rstrip().endswith("interrupted") and out == ""
