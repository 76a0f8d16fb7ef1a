"""One look at every process per round of placements (audit F2): the tree walks of a round
share one pass over /proc instead of several per job, so a tick does not cost jobs x all
processes; outside a round each walk still reads the processes as they are now."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from agents.policy import Decision, JobSetting
from daemon.actuator import REAPPLY_S, Actuator
from platforms.liveprocs import LiveProcessControl, ProcessMap
from platforms.observation import ClusterObs, Observation
from platforms.sysfs import DirSysfs

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux /proc")
CPUS = tuple(sorted(os.sched_getaffinity(0)))

# parent -> child -> grandchild, and a child that exits unreaped (a zombie)
TREE = """
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time\\n"
    "g = subprocess.Popen(['sleep', '60'])\\n"
    "print(g.pid, flush=True)\\n"
    "time.sleep(60)"], stdout=subprocess.PIPE)
grand = int(child.stdout.readline())
dead = subprocess.Popen(["true"])
while True:  # wait until it is a zombie, without reaping it
    with open(f"/proc/{dead.pid}/stat") as f:
        if f.read().rsplit(")", 1)[1].split()[0] == "Z":
            break
    time.sleep(0.01)
print(child.pid, grand, dead.pid, flush=True)
sys.stdin.readline()
child.kill()
"""


@pytest.fixture
def tree():
    p = subprocess.Popen(
        [sys.executable, "-c", TREE], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    child, grand, zombie = map(int, p.stdout.readline().split())
    yield p, child, grand, zombie
    for pid in (grand, child):
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
    p.stdin.close()
    p.wait(10)


@pytest.fixture
def sleepers():
    ps = [subprocess.Popen(["sleep", "60"]) for _ in range(8)]
    yield ps
    for p in ps:
        p.kill()
        p.wait()


def obs(t=0.0) -> Observation:
    c = ClusterObs("c", 0, CPUS, CPUS, (1000,), 1.0, None, None, None, None)
    return Observation(t, "toy", (c,), (), ())


@linux
def test_the_descendants_come_from_one_map_with_their_start_times(tree):
    p, child, grand, zombie = tree
    procs = LiveProcessControl()
    below = procs.descendants(p.pid)
    assert [pid for pid, _ in below] == [child, grand]  # parents first; no zombie
    assert all(start == procs.start_time(pid) for pid, start in below)
    assert zombie not in ProcessMap().below(p.pid)
    assert set(procs.tids(p.pid)) >= {p.pid, child, grand}


@linux
def test_a_walk_outside_a_round_sees_a_process_forked_since_one_inside_does_not():
    p = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys\n"
            "sys.stdin.readline()\n"
            "c = subprocess.Popen(['sleep', '60'])\n"
            "print(c.pid, flush=True)\n"
            "sys.stdin.readline()\n"
            "c.kill()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        procs = LiveProcessControl()
        assert procs.descendants(p.pid) == []
        with procs.process_map():
            assert procs.descendants(p.pid) == []
            p.stdin.write(b"\n")
            p.stdin.flush()
            child = int(p.stdout.readline())
            assert procs.descendants(p.pid) == []  # the round's map: found at the next one
        assert [c for c, _ in procs.descendants(p.pid)] == [child]
    finally:
        p.stdin.close()
        p.wait(10)


@linux
def test_a_round_of_placements_reads_the_process_list_once(tmp_path, sleepers, monkeypatch):
    scans = []
    real = os.listdir

    def counting(path="."):
        if path in ("/proc", b"/proc"):
            scans.append(path)
        return real(path)

    procs = LiveProcessControl()
    act = Actuator(DirSysfs(tmp_path), procs, live_jobs=True)
    jobs = {p.pid: JobSetting(CPUS, 0, 3) for p in sleepers}
    monkeypatch.setattr(os, "listdir", counting)
    act.apply(Decision({}, jobs=jobs), obs(0.0))  # first placement of 8 jobs
    first = len(scans)
    act.apply(Decision({}, jobs=jobs), obs(0.1))  # nothing due: no look at all
    quiet = len(scans) - first
    act.apply(Decision({}, jobs=jobs), obs(REAPPLY_S + 0.1))  # all 8 re-applied
    again = len(scans) - first - quiet
    act.release_all()
    released = len(scans) - first - quiet - again
    monkeypatch.undo()
    assert (first, quiet, again) == (1, 0, 1)
    # a release rechecks each job's tree as it is now: from its children files, or where the
    # kernel has none, from a new pass for each job's walks
    assert released == 1 if not procs._no_children_files else released <= 1 + 2 * len(jobs)
    if os.geteuid() == 0:  # (a user may not lower a nice value back)
        assert all(os.getpriority(os.PRIO_PROCESS, p.pid) == 0 for p in sleepers)


def _forking_job():
    """A job that forks a `sleep` child when sent SIGUSR1."""
    return subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, subprocess, time\n"
            "kids = []\n"
            "signal.signal(signal.SIGUSR1, lambda *a: kids.append(subprocess.Popen(['sleep', '60'])))\n"
            "print('ready', flush=True)\n"
            "time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
    )


@linux
@pytest.mark.parametrize("fresh", [True, False])
def test_a_child_forked_during_a_release_round_gets_its_settings_back_too(fresh):
    """A release has no next round: a child forked after the round's look at /proc kept
    the job's SCHED_FIFO for good. With ``fresh_recheck`` (releases) each walk's recheck
    reads the tree as it is now; a placement round keeps the shared map (the next one,
    within 5 s, finds the child)."""
    import signal
    import time

    job = _forking_job()
    job.stdout.readline()
    procs = LiveProcessControl()
    try:
        procs.set_priority(job.pid, 10, 0)
    except PermissionError:
        job.kill()
        pytest.skip("SCHED_FIFO needs root or an RLIMIT_RTPRIO here")
    try:
        with procs.process_map(fresh_recheck=fresh):
            procs.descendants(job.pid)  # the round's map is read: no child yet
            os.kill(job.pid, signal.SIGUSR1)
            for _ in range(100):
                if ProcessMap().below(job.pid):
                    break
                time.sleep(0.02)
            procs.set_priority(job.pid, 0, 0)  # the give-back
        (child,) = ProcessMap().below(job.pid)
        expected = os.SCHED_OTHER if fresh else os.SCHED_FIFO
        assert os.sched_getscheduler(child) == expected
    finally:
        for pid in ProcessMap().below(job.pid):
            os.kill(pid, signal.SIGKILL)
        job.kill()
        job.wait()


@linux
def test_the_tree_as_it_is_now_without_children_files(tree, monkeypatch):
    """On a kernel built without CONFIG_PROC_CHILDREN the recheck reads a new process map,
    with the same answer."""
    import builtins

    p, child, grand, zombie = tree
    procs = LiveProcessControl()
    with_files = sorted(set(procs._tree_now(p.pid)) - {zombie})  # a map leaves zombies out
    real_open = builtins.open

    def no_children(path, *a, **k):
        if str(path).endswith("/children"):
            raise FileNotFoundError(path)
        return real_open(path, *a, **k)

    monkeypatch.setattr(builtins, "open", no_children)
    fallback = LiveProcessControl()
    assert sorted(fallback._tree_now(p.pid)) == with_files
    assert {child, grand} <= set(with_files) and fallback._no_children_files


@linux
def test_a_release_inside_another_round_keeps_its_fresh_recheck():
    procs = LiveProcessControl()
    with procs.process_map():
        assert not procs._round.fresh
        with procs.process_map(fresh_recheck=True):
            assert procs._round.fresh
        assert not procs._round.fresh


# J starts M, a forking job of its own (SIGUSR1: fork a sleep), prints M's pid and waits
_J = (
    "import subprocess, sys, time\n"
    "m = subprocess.Popen([sys.executable, '-c', "
    "'import signal, subprocess, time\\n"
    "kids = []\\n"
    "signal.signal(signal.SIGUSR1, lambda *a: kids.append(subprocess.Popen([\\'sleep\\', \\'60\\'])))\\n"
    "time.sleep(60)'])\n"
    "print(m.pid, flush=True)\n"
    "time.sleep(60)\n"
)


@linux
def test_a_forgotten_jobs_member_gives_back_what_it_forked_since(tmp_path):
    """The job ended; the child it left (a member, seen at the placement) had forked a
    process since: that one inherited the job's SCHED_FIFO and was never seen. forget gives
    it back too (it kept the real-time priority for good)."""
    import signal
    import time

    job = subprocess.Popen([sys.executable, "-c", _J], stdout=subprocess.PIPE)
    member = int(job.stdout.readline())
    procs = LiveProcessControl()
    act = Actuator(DirSysfs(tmp_path), procs, live_jobs=True)
    grand = None
    try:
        time.sleep(0.3)  # M has set its handler
        if len(CPUS) < 2:
            pytest.skip("real-time priority is never given on every online CPU")
        # one CPU: never SCHED_FIFO on every online CPU
        report = act.apply(Decision({}, jobs={job.pid: JobSetting(CPUS[:1], 10, 0)}), obs())
        if report.errors or os.sched_getscheduler(member) != os.SCHED_FIFO:
            pytest.skip("SCHED_FIFO needs root or an RLIMIT_RTPRIO here")
        os.kill(member, signal.SIGUSR1)  # M forks G after the placement
        for _ in range(100):
            below = ProcessMap().below(member)
            if below:
                grand = below[0]
                break
            time.sleep(0.02)
        assert grand is not None and os.sched_getscheduler(grand) == os.SCHED_FIFO
        job.kill()
        job.wait()
        act.forget(job.pid)  # the loop saw the job end
        assert os.sched_getscheduler(member) == os.SCHED_OTHER
        assert os.sched_getscheduler(grand) == os.SCHED_OTHER
    finally:
        for pid in (grand, member):
            if pid is not None:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        job.kill()
        job.wait()
