"""Training workers (``agents train --workers N``) die with the process that forked them.

``daemon=True`` only acts on a clean interpreter exit: a trainer killed by a signal left its
workers running for minutes, writing into the models folder. On Linux each worker asks the
kernel for SIGKILL when its parent dies (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import time
from agents.trainboard import _run_forked
_run_forked([lambda: time.sleep(120) or {}, lambda: time.sleep(120) or {}], 2)
"""


def _children(proc: psutil.Process, n: int, timeout: float = 30.0) -> list[psutil.Process]:
    t_end = time.monotonic() + timeout
    while time.monotonic() < t_end:
        kids = proc.children()
        if len(kids) >= n:
            return kids
        time.sleep(0.05)
    raise AssertionError(f"{n} workers did not start")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_workers_die_when_the_trainer_is_killed():
    parent = subprocess.Popen([sys.executable, "-c", SCRIPT], cwd=ROOT)
    kids: list[psutil.Process] = []
    try:
        kids = _children(psutil.Process(parent.pid), 2)
        time.sleep(0.3)  # the workers are past their set-up
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(10)
        _, alive = psutil.wait_procs(kids, timeout=10)
        assert alive == [], f"workers outlived their parent: {[p.pid for p in alive]}"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        for p in kids:  # only the workers this test started, by pid
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass


def test_a_worker_whose_parent_is_alive_keeps_running():
    from agents.trainboard import _run_forked

    assert _run_forked([lambda: {"pid": os.getpid()}], 1)[0]["pid"] != os.getpid()
