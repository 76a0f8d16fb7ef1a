"""A benchmark dies with the campaign that launched it; a thread id is not a job."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from platforms.liveprocs import (
    LiveProcessControl,
    kill_orphaned_jobs,
    record_job,
    thread_group,
)

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux /proc and prctl")

# a stand-in for a campaign: spawns a job the way the native runner does, says its pid, waits
_CAMPAIGN = """
import sys, time
from platforms.liveprocs import spawn_job
proc = spawn_job(sys.argv[2:], {"PATH": "/usr/bin:/bin"}, None,
                 record_in=sys.argv[1] if sys.argv[1] != "-" else None)
print(proc.pid, flush=True)
time.sleep(120)
"""


def _dead(pid: int) -> bool:
    """Gone, or a zombie nobody reaps (init in a container may not)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except FileNotFoundError:
        return True
    return stat[stat.rindex(b")") + 2 :].split()[0] == b"Z"


def _wait(cond, timeout: float = 5.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


def _session_members(sid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(b")") + 2 :].split()
        if int(fields[3]) == sid and fields[0] != b"Z":
            out.append(int(entry))
    return out


def _kill(pids) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _campaign(record_dir: str, *argv: str) -> tuple[subprocess.Popen, int]:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    camp = subprocess.Popen(
        [sys.executable, "-c", _CAMPAIGN, record_dir, *argv],
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": root},
    )
    job = int(camp.stdout.readline())
    return camp, job


@linux
def test_a_sigkilled_campaign_takes_its_kernel_with_it():
    """The kernel runs in its own session: it used to keep running (and share the board with
    the resumed campaign's runs) after the campaign was SIGKILLed."""
    camp, job = _campaign("-", "sleep", "60")
    try:
        assert not _dead(job)
        camp.kill()
        camp.wait()
        assert _wait(lambda: _dead(job)), "the kernel outlived its campaign"
    finally:
        camp.kill()
        camp.wait()
        _kill([job])


@linux
def test_the_next_campaign_kills_what_a_killed_one_left(tmp_path):
    state = str(tmp_path / "state")
    camp, job = _campaign(state, "sh", "-c", "sleep 60 & wait")
    members: list[int] = []
    try:
        assert _wait(lambda: len(_session_members(job)) == 2)  # sh and its sleep
        members = _session_members(job)
        (record,) = os.listdir(state)
        assert json.loads((tmp_path / "state" / record).read_text())["pid"] == job
        camp.kill()
        camp.wait()
        assert _wait(lambda: _dead(job))  # the leader, by its parent-death signal
        (left,) = [p for p in members if p != job]
        assert not _dead(left)  # its child is not covered by the signal: the record is
        assert kill_orphaned_jobs(state) == [left]
        assert _wait(lambda: _dead(left))
        assert os.listdir(state) == []
    finally:
        camp.kill()
        camp.wait()
        _kill(members + [job])


@linux
def test_a_running_campaigns_record_and_a_stale_one_kill_nothing(tmp_path):
    state = str(tmp_path)
    child = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        path = record_job(state, child.pid)  # this process, alive: its job is not a leftover
        assert kill_orphaned_jobs(state) == [] and os.path.exists(path)
        # a dead campaign whose job's pid now names another process: stale, nothing killed
        rec = json.loads(open(path).read())
        rec.update(owner_start=-1, start=rec["start"] - 1)
        with open(path, "w") as f:
            json.dump(rec, f)
        assert kill_orphaned_jobs(state) == [] and child.poll() is None
        assert not os.path.exists(path)
    finally:
        child.kill()
        child.wait()


@linux
def test_a_thread_id_is_refused_as_a_job():
    """A tid has a /proc entry too: a thread of the daemon registered as a job passed the
    daemon-itself and ancestor checks and got SCHED_FIFO."""
    procs = LiveProcessControl()
    ev = threading.Event()
    t = threading.Thread(target=ev.wait)
    t.start()
    try:
        tid = t.native_id
        assert tid != os.getpid() and thread_group(tid) == os.getpid()
        why = procs.unmanageable(tid)
        assert why is not None and "thread" in why and str(os.getpid()) in why
        assert thread_group(os.getpid()) == os.getpid()
        assert procs.unmanageable(os.getpid()) == "that is the daemon itself"
    finally:
        ev.set()
        t.join()


@linux
def test_a_thread_of_another_process_is_refused():
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import threading,sys; threading.Thread(target=sys.stdin.read).start()",
        ],
        stdin=subprocess.PIPE,
    )
    try:
        assert _wait(lambda: len(os.listdir(f"/proc/{child.pid}/task")) == 2)
        tid = max(int(t) for t in os.listdir(f"/proc/{child.pid}/task"))
        why = LiveProcessControl().unmanageable(tid)
        assert why is not None and f"process {child.pid}" in why
        assert LiveProcessControl().unmanageable(child.pid) is None
    finally:
        child.stdin.close()
        child.wait()
