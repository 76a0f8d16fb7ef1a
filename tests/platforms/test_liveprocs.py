"""Live process control on real, multi-threaded child processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from platforms.liveprocs import LiveProcessControl
from platforms.procs import ProcessGone

CPUS = sorted(os.sched_getaffinity(0))
needs_two_cpus = pytest.mark.skipif(len(CPUS) < 2, reason="needs at least 2 usable CPUs")

# A parent with 4 worker threads that spawns a child with 3 worker threads; both wait on stdin.
_WORKER = """
import sys, threading
ev = threading.Event()
for _ in range({n}):
    threading.Thread(target=ev.wait, daemon=True).start()
sys.stdin.read()
"""
_PARENT = """
import subprocess, sys, threading
child = subprocess.Popen([sys.executable, "-c", {child!r}], stdin=subprocess.PIPE)
ev = threading.Event()
for _ in range(4):
    threading.Thread(target=ev.wait, daemon=True).start()
sys.stdin.read()
child.stdin.close()
child.wait()
"""


def _threads_of(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except FileNotFoundError:
        return []


def _children_of(pid: int) -> list[int]:
    out = []
    for tid in _threads_of(pid):
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(x) for x in f.read().split()]
        except FileNotFoundError:
            pass
    return out


@pytest.fixture
def tree():
    """(parent pid, child pid): 5 threads in the parent, 4 in the child."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _PARENT.format(child=_WORKER.format(n=3))], stdin=subprocess.PIPE
    )
    deadline = time.monotonic() + 10
    child = None
    while time.monotonic() < deadline:
        kids = _children_of(proc.pid)
        if kids and len(_threads_of(proc.pid)) >= 5 and len(_threads_of(kids[0])) >= 4:
            child = kids[0]
            break
        time.sleep(0.02)
    assert child is not None, "the test process tree did not start"
    yield proc.pid, child
    proc.stdin.close()
    proc.wait(10)


@needs_two_cpus
def test_affinity_of_every_thread_of_the_tree(tree):
    parent, child = tree
    pc = LiveProcessControl()
    tids = _threads_of(parent) + _threads_of(child)
    assert len(tids) >= 9
    assert set(pc.tids(parent)) == set(tids)
    target = (CPUS[1],)
    pc.set_affinity(parent, target)
    for tid in tids:
        assert os.sched_getaffinity(tid) == {CPUS[1]}, tid
    assert pc.get_affinity(parent) == target
    pc.set_affinity(parent, tuple(CPUS))
    for tid in tids:
        assert os.sched_getaffinity(tid) == set(CPUS)


def test_nice_of_every_thread(tree):
    parent, child = tree
    pc = LiveProcessControl()
    pc.set_priority(parent, rt_priority=0, nice=7)
    for tid in _threads_of(parent) + _threads_of(child):
        assert os.getpriority(os.PRIO_PROCESS, tid) == 7
        assert os.sched_getscheduler(tid) == os.SCHED_OTHER
    assert pc.get_priority(parent) == (0, 7)


def test_sched_fifo_of_every_thread(tree):
    parent, child = tree
    pc = LiveProcessControl()
    try:
        pc.set_priority(parent, rt_priority=10)
    except PermissionError as err:
        assert "CAP_SYS_NICE" in str(err) and str(parent) in str(err)
        pytest.skip("SCHED_FIFO not permitted here")
    for tid in _threads_of(parent) + _threads_of(child):
        assert os.sched_getscheduler(tid) == os.SCHED_FIFO
        assert os.sched_getparam(tid).sched_priority == 10
    assert pc.get_priority(parent) == (10, 0)
    pc.set_priority(parent, rt_priority=0, nice=0)  # and back to normal
    for tid in _threads_of(parent) + _threads_of(child):
        assert os.sched_getscheduler(tid) == os.SCHED_OTHER


def test_cpu_time_of_a_busy_tree():
    busy = "import sys, time\nprint('go', flush=True)\nt = time.time()\nwhile time.time() - t < 1.0: pass\nsys.stdin.read()"
    proc = subprocess.Popen(
        [sys.executable, "-c", busy], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert proc.stdout.readline().strip() == b"go"
        pc = LiveProcessControl()
        first = pc.cpu_time(proc.pid)
        assert first >= 0.0
        # The child spins for 1 s; on a loaded machine it gets only part of a core, so wait
        # (bounded) until its CPU time has clearly grown instead of assuming a share.
        end = time.monotonic() + 10.0
        second = first
        while time.monotonic() < end and second - first <= 0.1:
            time.sleep(0.05)
            second = pc.cpu_time(proc.pid)
        assert second - first > 0.1
    finally:
        proc.stdin.close()
        proc.wait(10)


def test_vanished_pid_raises_process_gone():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    pc = LiveProcessControl()
    assert not pc.alive(proc.pid)
    for call in (
        lambda: pc.set_affinity(proc.pid, (CPUS[0],)),
        lambda: pc.set_priority(proc.pid, 0, 0),
        lambda: pc.cpu_time(proc.pid),
        lambda: pc.get_affinity(proc.pid),
    ):
        with pytest.raises(ProcessGone) as exc:
            call()
        assert exc.value.pid == proc.pid
    assert pc.owner_uid(proc.pid) is None


def test_zombie_counts_as_gone():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # exited but not reaped yet
        with open(f"/proc/{proc.pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                break
        time.sleep(0.01)
    pc = LiveProcessControl()
    try:
        assert not pc.alive(proc.pid)
        with pytest.raises(ProcessGone):
            pc.set_affinity(proc.pid, (CPUS[0],))
    finally:
        proc.wait()


def test_alive_and_owner_of_ourselves():
    pc = LiveProcessControl()
    assert pc.alive(os.getpid())
    assert pc.owner_uid(os.getpid()) == os.getuid()


def test_invalid_arguments_are_refused():
    pc = LiveProcessControl()
    me = os.getpid()
    with pytest.raises(ValueError, match="empty CPU set"):
        pc.set_affinity(me, ())
    with pytest.raises(ValueError, match="rt_priority"):
        pc.set_priority(me, rt_priority=100)
    with pytest.raises(ValueError, match="nice"):
        pc.set_priority(me, nice=25)


def test_unusable_cpu_set_names_the_cpus(tree):
    parent, _ = tree
    with pytest.raises(ValueError, match=r"\[4095\]"):
        LiveProcessControl().set_affinity(parent, (4095,))


def test_permission_error_is_explained(monkeypatch, tree):
    parent, _ = tree

    def deny(tid, mask):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "sched_setaffinity", deny)
    with pytest.raises(PermissionError) as exc:
        LiveProcessControl().set_affinity(parent, (CPUS[0],))
    assert "needs root" in str(exc.value) and str(parent) in str(exc.value)


def test_a_process_start_time_is_ticks_since_boot_and_tells_processes_apart():
    """Ticks since boot, not psutil's wall-clock create time: an NTP step must not make a
    live job look like a reused pid."""
    procs = LiveProcessControl()
    a = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
    try:
        t = procs.start_time(a.pid)
        with open(f"/proc/{a.pid}/stat", "rb") as f:
            stat = f.read()
        assert t == float(stat[stat.rindex(b")") + 2 :].split()[19])
        assert procs.start_time(a.pid) == t  # stable
        assert procs.start_time(os.getpid()) <= t
    finally:
        a.kill()
        a.wait()
    assert procs.start_time(a.pid) is None  # gone
