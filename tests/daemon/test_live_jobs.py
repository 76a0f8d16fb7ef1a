"""The actuator on real processes (as the board daemon runs it): what it gives a job is
vetted, and everything is given back when the job leaves or the daemon stops."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys

import pytest

import daemon.jobrestore as jobrestore
from agents.policy import Decision, JobSetting
from daemon.actuator import DEMOTED_NICE_GAP, MAX_JOB_RT_PRIORITY, Actuator
from daemon.jobrestore import JobOriginals, jobs_path, restore_stale_jobs
from daemon.jobs import JobEntry, JobTable
from daemon.registry import JobRegistry, RequestError
from platforms.liveprocs import LiveProcessControl
from platforms.observation import ClusterObs, Observation
from platforms.procs import NoProcesses, ProcessGone
from platforms.sysfs import DirSysfs

CPUS = tuple(sorted(os.sched_getaffinity(0)))
IS_ROOT = os.geteuid() == 0
needs_root_and_two_cpus = pytest.mark.skipif(
    not IS_ROOT or len(CPUS) < 2, reason="needs root (SCHED_FIFO) and 2 usable CPUs"
)


def obs(online=CPUS, t=0.0) -> Observation:
    c = ClusterObs("c", 0, tuple(online), tuple(online), (1000,), 1.0, None, None, None, None)
    return Observation(t, "toy", (c,), (), ())


@pytest.fixture
def sleeper():
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield p
    p.kill()
    p.wait()


def _sched(pid):
    return os.sched_getscheduler(pid), os.sched_getparam(pid).sched_priority


@needs_root_and_two_cpus
def test_a_job_gets_its_own_affinity_and_priority_back_when_released(tmp_path, sleeper):
    act = Actuator(DirSysfs(tmp_path), LiveProcessControl(), live_jobs=True)
    before = (os.sched_getaffinity(sleeper.pid), _sched(sleeper.pid))
    act.apply(Decision({}, jobs={sleeper.pid: JobSetting((CPUS[0],), 90)}), obs())
    assert os.sched_getaffinity(sleeper.pid) == {CPUS[0]}
    # scaled below the kernel's interrupt threads (FIFO 50), order kept
    assert _sched(sleeper.pid) == (os.SCHED_FIFO, round(90 * MAX_JOB_RT_PRIORITY / 99))
    assert act.managed() == {sleeper.pid}
    act.release_all()  # the daemon stops (or the job unregisters)
    assert (os.sched_getaffinity(sleeper.pid), _sched(sleeper.pid)) == before
    assert act.managed() == set()


@needs_root_and_two_cpus
def test_real_time_on_every_online_cpu_is_refused(tmp_path, sleeper):
    """A busy FIFO job on every core starves the daemon and the kernel's threads."""
    act = Actuator(DirSysfs(tmp_path), LiveProcessControl(), live_jobs=True)
    act.apply(Decision({}, jobs={sleeper.pid: JobSetting(CPUS, 90)}), obs())
    assert _sched(sleeper.pid)[0] == os.SCHED_OTHER
    act.release_all()


@needs_root_and_two_cpus
def test_jobs_ordered_on_shared_cpus_keep_their_order_live(tmp_path, sleeper):
    """90 above 89 on the same CPU: scaled to the live range they must not become equals."""
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        act = Actuator(DirSysfs(tmp_path), LiveProcessControl(), live_jobs=True)
        jobs = {sleeper.pid: JobSetting((CPUS[0],), 90), other.pid: JobSetting((CPUS[0],), 89)}
        act.apply(Decision({}, jobs=jobs), obs())
        hi, lo = _sched(sleeper.pid), _sched(other.pid)
        assert hi[0] == lo[0] == os.SCHED_FIFO
        assert MAX_JOB_RT_PRIORITY >= hi[1] > lo[1] >= 1
        act.release_all()
    finally:
        other.kill()
        other.wait()


@needs_root_and_two_cpus
def test_best_effort_work_stays_below_a_job_refused_real_time(tmp_path, sleeper):
    """The decision ran the deadline job FIFO above the best-effort one; under SCHED_OTHER the
    best-effort job is niced below it instead, and gets its own nice back when released."""
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        act = Actuator(DirSysfs(tmp_path), LiveProcessControl(), live_jobs=True)
        jobs = {sleeper.pid: JobSetting(CPUS, 90), other.pid: JobSetting((CPUS[0],))}
        act.apply(Decision({}, jobs=jobs), obs())
        assert _sched(sleeper.pid)[0] == os.SCHED_OTHER
        assert os.getpriority(os.PRIO_PROCESS, other.pid) == DEMOTED_NICE_GAP
        act.release_all()
        assert os.getpriority(os.PRIO_PROCESS, other.pid) == 0
    finally:
        other.kill()
        other.wait()


@needs_root_and_two_cpus
def test_another_users_process_gets_no_more_real_time_than_its_rlimit(tmp_path):
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("setpriv not installed")
    p = subprocess.Popen(
        [
            "prlimit",
            "--rtprio=0:0",
            setpriv,
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            sys.executable,
            "-c",
            "import time; time.sleep(60)",
        ]
    )
    try:
        import time

        time.sleep(0.5)  # let it drop its privileges
        procs = LiveProcessControl()
        assert procs.rt_allowed(p.pid) == 0
        act = Actuator(DirSysfs(tmp_path), procs, live_jobs=True)
        act.apply(Decision({}, jobs={p.pid: JobSetting((CPUS[0],), 90)}), obs())
        assert _sched(p.pid)[0] == os.SCHED_OTHER  # not the FIFO it could never take itself
    finally:
        p.kill()
        p.wait()


def test_a_cpu_set_the_kernel_refuses_is_an_error_not_a_crash(tmp_path, sleeper):
    act = Actuator(DirSysfs(tmp_path), LiveProcessControl(), live_jobs=True)
    rep = act.apply(Decision({}, jobs={sleeper.pid: JobSetting((max(CPUS) + 64,))}), obs())
    assert rep.errors and "placement failed" in rep.errors[0]


def test_a_live_placement_is_written_again_after_a_while(tmp_path, sleeper):
    """A job may change its own affinity: the same decision is written again every 5 s."""
    act = Actuator(DirSysfs(tmp_path), LiveProcessControl(), live_jobs=True)
    d = Decision({}, jobs={sleeper.pid: JobSetting((CPUS[0],))})
    act.apply(d, obs(t=0.0))
    os.sched_setaffinity(sleeper.pid, set(CPUS))
    act.apply(d, obs(t=1.0))
    assert os.sched_getaffinity(sleeper.pid) == set(CPUS)  # cached: not yet
    act.apply(d, obs(t=6.0))
    assert os.sched_getaffinity(sleeper.pid) == {CPUS[0]}
    act.release_all()


@pytest.mark.parametrize(
    "pid, why", [(1, "init"), (os.getpid(), "the daemon itself"), (2, "kernel thread")]
)
def test_init_the_daemon_and_kernel_threads_cannot_be_jobs(pid, why):
    procs = LiveProcessControl()
    if pid == 2 and not os.path.exists("/proc/2"):
        pytest.skip("no kthreadd in this pid namespace")
    reg = JobRegistry(now=lambda: 0.0, alive=procs.alive, unmanageable=procs.unmanageable)
    with pytest.raises(RequestError, match=why):
        reg.register(pid, None, "hi", "x", peer_uid=0)


def test_a_reused_pid_ends_the_job_instead_of_steering_the_newcomer(tmp_path):
    """The job's process ended and another one got its pid: the job is done."""
    from agents.governors import make_governor
    from daemon.loop import ControlLoop
    from platforms.clock import VirtualClock
    from platforms.faketree import write_fake_tree
    from platforms.platform import Platform
    from platforms.spec import load_board

    class Reused(NoProcesses):
        def alive(self, pid):
            return True

        def get_affinity(self, pid):
            return (0,)

        def start_time(self, pid):
            return 200.0  # not the 100.0 the job was registered with

    spec = load_board("tx2")
    write_fake_tree(spec, tmp_path)
    table = JobTable()
    table.register(JobEntry(pid=4242, name="old", release_t=0.0, start_time=100.0))
    loop = ControlLoop(
        Platform(spec, DirSysfs(tmp_path), Reused(), VirtualClock(1.0), kind="fake"),
        make_governor("schedutil"),
        jobs=table,
    )
    res = loop.tick()
    assert [o.pid for o in res.finished] == [4242] and len(table) == 0


def test_a_placement_the_kernel_refuses_is_logged_once_not_every_five_seconds(tmp_path):
    class Refusing(NoProcesses):
        def set_affinity(self, pid, cpus):
            raise ValueError(f"pid {pid}: CPU set {list(cpus)} has no online CPU")

        def get_affinity(self, pid):
            return (0,)

        def set_priority(self, pid, rt_priority=0, nice=0):
            pass

    act = Actuator(DirSysfs(tmp_path), Refusing(), live_jobs=True)
    d = Decision({}, jobs={5: JobSetting((7,))})
    errors = [e for k in range(300) for e in act.apply(d, obs(t=0.1 * k)).errors]
    assert len(errors) == 1 and "placement failed" in errors[0]


def test_stale_job_originals_touch_only_the_same_process(tmp_path):
    """A pid now naming another process is left alone; a corrupt file is dropped."""
    import logging

    from daemon.jobrestore import JobOriginals, jobs_path, restore_stale_jobs

    calls = []

    class Procs(NoProcesses):
        def start_time(self, pid):
            return {1: 10.0, 2: 99.0}.get(pid)

        def set_affinity(self, pid, cpus):
            calls.append(("aff", pid, cpus))

        def set_priority(self, pid, rt_priority=0, nice=0):
            calls.append(("prio", pid, rt_priority, nice))

    store = JobOriginals(tmp_path)
    store.record(1, 10.0, (0, 1), (0, 0))
    store.record(2, 20.0, (0,), (0, 5))  # pid 2 was reused since (start time 99)
    log = logging.getLogger("job-restore-test")
    assert restore_stale_jobs(tmp_path, Procs(), log) == 1
    assert calls == [("aff", 1, (0, 1)), ("prio", 1, 0, 0)]
    assert not os.path.exists(jobs_path(tmp_path))
    with open(jobs_path(tmp_path), "w") as f:
        f.write("{not json")
    assert restore_stale_jobs(tmp_path, Procs(), log) == 0
    assert not os.path.exists(jobs_path(tmp_path))
    store = JobOriginals(tmp_path)
    store.record(3, None, (0,), (0, 0))
    store.drop(3)
    assert not os.path.exists(jobs_path(tmp_path))  # nothing steered: no file


ORPHAN_PARENT = """
import os, sys, time
child = os.fork()
if child == 0:
    time.sleep(60)
    os._exit(0)
print(child, flush=True)
sys.stdin.readline()  # exit when told: the child is reparented and keeps running
"""


@pytest.fixture
def parent_with_child():
    p = subprocess.Popen(
        [sys.executable, "-c", ORPHAN_PARENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    child = int(p.stdout.readline())
    yield p, child
    for pid in (child, p.pid):
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
    p.wait()


@needs_root_and_two_cpus
def test_a_child_the_job_leaves_behind_gets_the_originals_back(tmp_path, parent_with_child):
    """The job's process exits first; its child, reparented to init, is out of its tree but
    still pinned at SCHED_FIFO: the daemon gives it the job's originals when the job ends."""
    p, child = parent_with_child
    before = (os.sched_getaffinity(child), _sched(child))
    act = Actuator(DirSysfs(tmp_path), LiveProcessControl(), live_jobs=True)
    act.apply(Decision({}, jobs={p.pid: JobSetting((CPUS[0],), 90)}), obs())
    assert os.sched_getaffinity(child) == {CPUS[0]} and _sched(child)[0] == os.SCHED_FIFO
    p.stdin.write(b"\n")
    p.stdin.flush()
    p.wait()
    assert os.sched_getaffinity(child) == {CPUS[0]}  # inherited, and kept after the exit
    act.forget(p.pid)  # the loop saw the job's process end
    assert (os.sched_getaffinity(child), _sched(child)) == before
    assert act.managed() == set()


class _Tree(NoProcesses):
    """Job 10 with child 11 (started at 5.0), settings kept per pid as a kernel would: a
    tree call reaches the processes below, an own call the process alone; calls recorded."""

    def __init__(self):
        self.calls = []
        self.starts = {10: 1.0, 11: 5.0}
        self.children = [(11, 5.0)]
        self.aff: dict[int, tuple] = {}
        self.prio: dict[int, tuple] = {}

    def alive(self, pid):
        return pid in self.starts

    def start_time(self, pid):
        return self.starts.get(pid)

    def descendants(self, pid):
        return list(self.children) if pid == 10 else []

    def _reach(self, pid, tree):
        if pid not in self.starts:
            raise ProcessGone(pid)
        return [pid, *(c for c, _ in self.descendants(pid))] if tree else [pid]

    def get_affinity(self, pid):
        return self.aff.get(pid, (0, 1))

    def get_priority(self, pid):
        return self.prio.get(pid, (0, 0))

    def set_affinity(self, pid, cpus, tree=True):
        for p in self._reach(pid, tree):
            self.aff[p] = tuple(cpus)
        self.calls.append(("aff" if tree else "own-aff", pid, cpus))

    def set_priority(self, pid, rt_priority=0, nice=0, tree=True):
        for p in self._reach(pid, tree):
            self.prio[p] = (rt_priority, 0) if rt_priority else (0, nice)
        self.calls.append(("prio" if tree else "own-prio", pid, rt_priority, nice))

    def set_own_affinity(self, pid, cpus):
        self.set_affinity(pid, cpus, tree=False)

    def set_own_priority(self, pid, rt_priority=0, nice=0):
        self.set_priority(pid, rt_priority, nice, tree=False)


def test_a_left_child_is_given_back_only_while_it_is_the_same_process(tmp_path):
    procs = _Tree()
    act = Actuator(DirSysfs(tmp_path), procs, live_jobs=True)
    act.apply(Decision({}, jobs={10: JobSetting((0,))}), obs(online=(0, 1)))
    del procs.starts[10]
    procs.children = []  # job 10 exited, 11 was reparented
    procs.starts[11] = 7.0  # ... and has exited too; another process has pid 11 now
    procs.calls.clear()
    act.forget(10)
    assert procs.calls == []


def test_a_released_job_gives_back_a_child_that_left_its_tree(tmp_path):
    """Unregistered while alive: the tree below it now, and a child that left it earlier."""
    procs = _Tree()
    act = Actuator(DirSysfs(tmp_path), procs, live_jobs=True)
    act.apply(Decision({}, jobs={10: JobSetting((0,))}), obs(online=(0, 1)))
    procs.children = []  # 11 daemonised itself (reparented) but runs on with the placement
    procs.calls.clear()
    act.release(10)
    assert procs.calls == [
        ("aff", 10, (0, 1)),
        ("prio", 10, 0, 0),
        ("own-aff", 11, (0, 1)),  # its own threads: no scan of its tree per member
        ("own-prio", 11, 0, 0),
    ]
    assert procs.aff[11] == (0, 1)


def test_a_crashed_runs_left_children_are_restored_at_the_next_start(tmp_path):
    import logging

    from daemon.jobrestore import JobOriginals, restore_stale_jobs

    procs = _Tree()
    store = JobOriginals(tmp_path)
    act = Actuator(DirSysfs(tmp_path), procs, live_jobs=True, originals=store)
    act.apply(Decision({}, jobs={10: JobSetting((0,))}), obs(online=(0, 1)))
    # the daemon is killed; job 10 exits, its child 11 runs on
    del procs.starts[10]
    procs.calls.clear()
    assert restore_stale_jobs(tmp_path, procs, logging.getLogger("t")) == 1
    assert procs.calls == [("own-aff", 11, (0, 1)), ("own-prio", 11, 0, 0)]


def test_a_cpu_set_the_kernel_narrows_is_reported_once(tmp_path):
    """A job in a cpuset gets only the allowed CPUs of its mask, without an error."""

    class Narrowing(_Tree):
        def set_affinity(self, pid, cpus):
            self.mask = tuple(c for c in cpus if c != 1)

        def get_affinity(self, pid):
            return getattr(self, "mask", (0, 1, 2))

    act = Actuator(DirSysfs(tmp_path), Narrowing(), live_jobs=True)
    d = Decision({}, jobs={10: JobSetting((0, 1))})
    errors = [e for k in range(100) for e in act.apply(d, obs(online=(0, 1, 2), t=0.1 * k)).errors]
    assert len(errors) == 1 and "narrowed CPU set [0, 1] to [0]" in errors[0]
    ok = Decision({}, jobs={10: JobSetting((0, 2))})
    assert act.apply(ok, obs(online=(0, 1, 2), t=20.0)).errors == []


@needs_root_and_two_cpus
def test_a_mask_with_a_cpu_this_machine_lacks_is_reported_on_a_real_process(tmp_path, sleeper):
    missing = os.cpu_count() + 7
    act = Actuator(DirSysfs(tmp_path), LiveProcessControl(), live_jobs=True)
    report = act.apply(Decision({}, jobs={sleeper.pid: JobSetting((CPUS[0], missing))}), obs())
    assert os.sched_getaffinity(sleeper.pid) == {CPUS[0]}
    assert [e for e in report.errors if "narrowed" in e]
    act.release_all()


def test_a_left_child_that_set_its_own_affinity_or_priority_keeps_it(tmp_path):
    procs = _Tree()
    act = Actuator(DirSysfs(tmp_path), procs, live_jobs=True)
    act.apply(Decision({}, jobs={10: JobSetting((0,), 0, 5)}), obs(online=(0, 1)))
    assert procs.aff[11] == (0,) and procs.prio[11] == (0, 5)
    del procs.starts[10]
    procs.children = []
    procs.aff[11] = (1,)  # the helper moved itself after it left the job
    procs.calls.clear()
    act.forget(10)
    assert procs.calls == [("own-prio", 11, 0, 0)]  # the nice it took from the job goes
    assert procs.aff[11] == (1,)


def test_ended_members_make_room_for_new_ones(tmp_path, monkeypatch, caplog):
    """A job running command after command: the ended ones do not fill the cap."""
    import daemon.actuator as actuator

    monkeypatch.setattr(actuator, "MAX_MEMBERS", 4)
    procs = _Tree()
    act = Actuator(DirSysfs(tmp_path), procs, live_jobs=True)
    for k in range(10):  # child 100 + k runs, then ends before the next placement
        procs.starts = {10: 1.0, 100 + k: float(k)}
        procs.children = [(100 + k, float(k))]
        act.apply(Decision({}, jobs={10: JobSetting((0,) if k % 2 else (1,))}), obs(t=k))
    # the ended ones are dropped each time the cap is hit, so the newest is always kept
    assert act._members[10] == {108: 8.0, 109: 9.0}
    del procs.starts[10]
    procs.children = []
    procs.calls.clear()
    act.forget(10)
    assert [c[:2] for c in procs.calls] == [("own-aff", 109), ("own-prio", 109)]
    procs.starts = {20: 1.0, **{200 + k: 1.0 for k in range(6)}}  # 6 live children, cap 4
    procs.descendants = lambda pid: [(200 + k, 1.0) for k in range(6)]
    with caplog.at_level("WARNING", logger="hidvfs.actuator"):
        act.apply(Decision({}, jobs={20: JobSetting((0,))}), obs(t=20.0))
        act.apply(Decision({}, jobs={20: JobSetting((1,))}), obs(t=21.0))
    assert len(act._members[20]) == 4
    assert sum("event=job_members_full" in r.message for r in caplog.records) == 1


def test_a_failed_write_of_the_members_is_not_a_failed_placement(tmp_path, caplog):
    class FullDisk:
        def record(self, *a):
            pass

        def drop(self, pid):
            pass

        def members(self, pid, members):
            raise OSError(28, "No space left on device")

        def placed(self, pid, cpus, rt_priority, nice, before=()):
            raise OSError(28, "No space left on device")

    procs = _Tree()
    act = Actuator(DirSysfs(tmp_path), procs, live_jobs=True, originals=FullDisk())
    d = Decision({}, jobs={10: JobSetting((0,))})
    with caplog.at_level("WARNING", logger="hidvfs.actuator"):
        report = act.apply(d, obs(online=(0, 1)))
    assert report.errors == []
    assert "event=job_originals_write_failed" in caplog.text
    procs.calls.clear()
    act.apply(d, obs(online=(0, 1), t=6.0))  # re-applied after 5 s as any placement
    assert ("aff", 10, (0,)) in procs.calls


def test_a_job_whose_originals_cannot_be_saved_is_not_steered_until_they_are(tmp_path):
    """Steering a job with no crash record would leave it pinned (or SCHED_FIFO) for good if
    the daemon died: the placement waits until its originals are on disk, then goes on."""

    class FlakyDisk:
        def __init__(self):
            self.full, self.recorded = True, []

        def record(self, pid, start, cpus, prio):
            if self.full:
                raise OSError(28, "No space left on device")
            self.recorded.append(pid)

        def drop(self, pid):
            pass

        def members(self, pid, members):
            pass

        def placed(self, pid, cpus, rt_priority, nice, before=()):
            pass

    procs = _Tree()
    disk = FlakyDisk()
    act = Actuator(DirSysfs(tmp_path), procs, live_jobs=True, originals=disk)
    report = act.apply(Decision({}, jobs={10: JobSetting((0,))}), obs(online=(0, 1)))
    assert [c for c in procs.calls if c[0] == "aff"] == []
    assert len(report.errors) == 1 and "could not be saved for a crash restore" in report.errors[0]
    report = act.apply(Decision({}, jobs={10: JobSetting((1,))}), obs(online=(0, 1), t=1.0))
    assert [c for c in procs.calls if c[0] == "aff"] == []  # still not on disk: still not steered
    disk.full = False
    report = act.apply(Decision({}, jobs={10: JobSetting((0,))}), obs(online=(0, 1), t=2.0))
    assert report.errors == [] and disk.recorded == [10]
    assert ("aff", 10, (0,)) in procs.calls


# -- after a crash, a member gets back only what it still has from the last placement ----------

LOG = logging.getLogger("job-restore-placed-test")


def _placed_then_crashed(tmp_path, procs, setting, online=(0, 1)):
    """Job 10 placed with ``setting``; the daemon dies, then job 10 exits (11 runs on)."""
    act = Actuator(DirSysfs(tmp_path), procs, live_jobs=True, originals=JobOriginals(tmp_path))
    act.apply(Decision({}, jobs={10: JobSetting(*setting)}), obs(online=online))
    del procs.starts[10]
    procs.children = []
    procs.calls.clear()


@pytest.fixture
def writes(monkeypatch):
    """Every write of jobs.json (path, content), counted."""
    done = []
    real = jobrestore.write_json_atomic

    def counting(path, obj, **kw):
        done.append((path, json.loads(json.dumps(obj))))
        return real(path, obj, **kw)

    monkeypatch.setattr(jobrestore, "write_json_atomic", counting)
    return done


def test_a_member_that_moved_itself_keeps_its_affinity_after_a_crash(tmp_path):
    procs = _Tree()
    _placed_then_crashed(tmp_path, procs, ((0,), 0, 5))
    procs.aff[11] = (1,)  # the helper moved itself after the placement
    assert restore_stale_jobs(tmp_path, procs, LOG) == 1
    assert procs.calls == [("own-prio", 11, 0, 0)]  # the nice it took from the job goes
    assert procs.aff[11] == (1,) and procs.prio[11] == (0, 0)


def test_a_member_that_set_its_own_priority_keeps_it_after_a_crash(tmp_path):
    procs = _Tree()
    _placed_then_crashed(tmp_path, procs, ((0,), 0, 5))
    procs.prio[11] = (0, -3)  # the helper reniced itself after the placement
    assert restore_stale_jobs(tmp_path, procs, LOG) == 1
    assert procs.calls == [("own-aff", 11, (0, 1))]  # the job's CPU set it took goes
    assert procs.aff[11] == (0, 1) and procs.prio[11] == (0, -3)


def test_a_member_that_set_both_itself_is_left_alone_after_a_crash(tmp_path):
    procs = _Tree()
    _placed_then_crashed(tmp_path, procs, ((0,), 0, 5))
    procs.aff[11], procs.prio[11] = (1,), (0, -3)
    assert restore_stale_jobs(tmp_path, procs, LOG) == 0
    assert procs.calls == []


def test_the_jobs_own_tree_is_restored_as_before(tmp_path):
    procs = _Tree()
    act = Actuator(DirSysfs(tmp_path), procs, live_jobs=True, originals=JobOriginals(tmp_path))
    act.apply(Decision({}, jobs={10: JobSetting((0,), 0, 5)}), obs(online=(0, 1)))
    procs.aff[10] = (1,)  # the job itself moved: its tree still gets the originals
    procs.calls.clear()
    restore_stale_jobs(tmp_path, procs, LOG)
    assert procs.calls[:2] == [("aff", 10, (0, 1)), ("prio", 10, 0, 0)]


def test_the_cpus_the_kernel_narrowed_to_are_the_placement_kept(tmp_path):
    """Asked (0, 2), given (0,): a member on (0,) still has the placement."""

    class Narrowing(_Tree):
        def set_affinity(self, pid, cpus, tree=True):
            super().set_affinity(pid, tuple(c for c in cpus if c != 2), tree)

    procs = Narrowing()
    _placed_then_crashed(tmp_path, procs, ((0, 2), 0, 5), online=(0, 1, 2))
    with open(jobs_path(tmp_path), encoding="utf-8") as f:
        (row,) = json.load(f)["jobs"]
    assert row["placed"] == {"cpus": [0], "rt_priority": 0, "nice": 5}
    assert procs.aff[11] == (0,)
    assert restore_stale_jobs(tmp_path, procs, LOG) == 1
    assert procs.calls == [("own-aff", 11, (0, 1)), ("own-prio", 11, 0, 0)]


def test_a_row_of_the_previous_version_restores_its_members_unconditionally(tmp_path):
    procs = _Tree()
    procs.starts = {11: 5.0}  # job 10 is gone, its member 11 runs on
    procs.aff[11], procs.prio[11] = (1,), (0, -3)  # whoever set them: no placement to tell
    row = {"pid": 10, "start_time": 1.0, "cpus": [0, 1], "rt_priority": 0, "nice": 0}
    row["members"] = [[11, 5.0]]
    data = {"format": jobrestore.FORMAT, "version": 1, "jobs": [row]}
    with open(jobs_path(tmp_path), "w", encoding="utf-8") as f:
        json.dump(data, f)
    assert restore_stale_jobs(tmp_path, procs, LOG) == 1
    assert procs.calls == [("own-aff", 11, (0, 1)), ("own-prio", 11, 0, 0)]


def test_the_placement_is_written_once_per_change(tmp_path, writes):
    procs = _Tree()
    act = Actuator(DirSysfs(tmp_path), procs, live_jobs=True, originals=JobOriginals(tmp_path))
    d = Decision({}, jobs={10: JobSetting((0,), 0, 5)})
    act.apply(d, obs(online=(0, 1)))
    placed = [{k: v for k, v in w[1]["jobs"][0].items() if k.startswith("placed")} for w in writes]
    # the originals, the placement (before its first write), the members it reached
    zero = {"placed": {"cpus": [0], "rt_priority": 0, "nice": 5}}
    assert placed == [{}, zero, zero]
    first = len(writes)
    procs.calls.clear()
    for k in range(1, 301):  # 30 s of ticks: re-applied every 5 s, nothing changed
        act.apply(d, obs(online=(0, 1), t=0.1 * k))
    assert ("aff", 10, (0,)) in procs.calls  # it was re-applied ...
    assert len(writes) == first  # ... and nothing written for it
    act.apply(Decision({}, jobs={10: JobSetting((1,), 0, 5)}), obs(online=(0, 1), t=31.0))
    # a change: the new one with the old before its writes, then the new one alone
    assert len(writes) == first + 2
    (moving,), (done,) = writes[-2][1]["jobs"], writes[-1][1]["jobs"]
    assert moving["placed"] == {"cpus": [1], "rt_priority": 0, "nice": 5}
    assert moving["placed_before"] == [{"cpus": [0], "rt_priority": 0, "nice": 5}]
    assert done["placed"] == {"cpus": [1], "rt_priority": 0, "nice": 5}
    assert "placed_before" not in done


def test_a_placement_not_written_is_tried_again_at_the_next_reapply(tmp_path, monkeypatch, caplog):
    procs = _Tree()
    store = JobOriginals(tmp_path)
    act = Actuator(DirSysfs(tmp_path), procs, live_jobs=True, originals=store)
    real = jobrestore.write_json_atomic

    def full_disk(path, obj, **kw):
        if any("placed" in r for r in obj["jobs"]):
            raise OSError(28, "No space left on device")
        return real(path, obj, **kw)

    monkeypatch.setattr(jobrestore, "write_json_atomic", full_disk)
    d = Decision({}, jobs={10: JobSetting((0,), 0, 5)})
    with caplog.at_level("WARNING", logger="hidvfs.actuator"):
        report = act.apply(d, obs(online=(0, 1)))
    assert report.errors == [] and procs.aff[10] == (0,)  # placed all the same
    assert "event=job_originals_write_failed" in caplog.text
    with caplog.at_level("INFO", logger="hidvfs.actuator"):
        for t in (6.0, 12.0, 18.0):  # still full at each re-apply: tried, not logged again
            act.apply(d, obs(online=(0, 1), t=t))
        assert caplog.text.count("event=job_originals_write_failed") == 1
        monkeypatch.setattr(jobrestore, "write_json_atomic", real)
        act.apply(d, obs(online=(0, 1), t=24.0))
        assert "event=job_placement_saved pid=10" in caplog.text
    with open(jobs_path(tmp_path), encoding="utf-8") as f:
        (row,) = json.load(f)["jobs"]
    assert row["placed"] == {"cpus": [0], "rt_priority": 0, "nice": 5}


class _Crash(BaseException):
    """The daemon dies here (SIGKILL): nothing after it runs, no handler sees it."""


def _moved_then_died(tmp_path, procs, fail_at):
    """Job 10 placed on CPU 0 at nice 5, then moved to CPU 1 at FIFO; the move dies at
    ``fail_at`` (its priority write): job 10 exits after, its member 11 runs on."""
    act = Actuator(DirSysfs(tmp_path), procs, live_jobs=True, originals=JobOriginals(tmp_path))
    act.apply(Decision({}, jobs={10: JobSetting((0,), 0, 5)}), obs(online=(0, 1, 2)))
    real = procs.set_priority

    def dying(pid, rt_priority=0, nice=0, tree=True):
        raise fail_at

    procs.set_priority = dying
    moved = Decision({}, jobs={10: JobSetting((1,), 99, 0)})
    try:
        act.apply(moved, obs(online=(0, 1, 2), t=1.0))
    except _Crash:
        pass
    procs.set_priority = real
    return act


def test_a_crash_halfway_through_a_change_of_placement_is_restored(tmp_path):
    """The affinity went, the priority did not, the daemon died: the member on the new CPUs
    at the old nice gets both back (the file named the new placement and the old one)."""
    procs = _Tree()
    _moved_then_died(tmp_path, procs, _Crash())
    assert procs.aff[11] == (1,) and procs.prio[11] == (0, 5)
    with open(jobs_path(tmp_path), encoding="utf-8") as f:
        (row,) = json.load(f)["jobs"]
    assert row["placed_before"] == [{"cpus": [0], "rt_priority": 0, "nice": 5}]
    del procs.starts[10]
    procs.children = []
    procs.calls.clear()
    assert restore_stale_jobs(tmp_path, procs, LOG) == 1
    assert procs.calls == [("own-aff", 11, (0, 1)), ("own-prio", 11, 0, 0)]


def test_a_change_that_failed_partway_is_given_back_on_release(tmp_path):
    """A refused priority write after the affinity went: release gives the member that holds
    the old nice its originals, not only one holding the whole new placement."""
    procs = _Tree()
    act = _moved_then_died(tmp_path, procs, PermissionError(1, "Operation not permitted"))
    assert procs.aff[11] == (1,) and procs.prio[11] == (0, 5)
    procs.children = []  # 11 left the job's tree
    procs.calls.clear()
    act.release(10)
    assert ("own-aff", 11, (0, 1)) in procs.calls and ("own-prio", 11, 0, 0) in procs.calls
    assert procs.aff[11] == (0, 1) and procs.prio[11] == (0, 0)


def test_a_change_that_went_through_forgets_the_placement_before(tmp_path):
    """Once every write went through, a member back on the old placement set that itself."""
    procs = _Tree()
    act = Actuator(DirSysfs(tmp_path), procs, live_jobs=True, originals=JobOriginals(tmp_path))
    act.apply(Decision({}, jobs={10: JobSetting((0,), 0, 5)}), obs(online=(0, 1, 2)))
    act.apply(Decision({}, jobs={10: JobSetting((1,), 0, 5)}), obs(online=(0, 1, 2), t=1.0))
    procs.aff[11] = (0,)  # the helper moved itself where the job used to be
    procs.children = []
    procs.calls.clear()
    act.release(10)
    assert ("own-aff", 11, (0, 1)) not in procs.calls and procs.aff[11] == (0,)


def test_a_jobs_file_of_a_newer_version_is_set_aside_unread(tmp_path, caplog):
    procs = _Tree()
    row = {"pid": 10, "start_time": 1.0, "cpus": [0, 1], "rt_priority": 0, "nice": 0}
    data = {"format": jobrestore.FORMAT, "version": jobrestore.VERSION + 1, "jobs": [row]}
    with open(jobs_path(tmp_path), "w", encoding="utf-8") as f:
        json.dump(data, f)
    with caplog.at_level("ERROR", logger=LOG.name):
        assert restore_stale_jobs(tmp_path, procs, LOG) == 0
    assert procs.calls == []
    assert "event=job_originals_unknown_version" in caplog.text
    kept = f"{jobs_path(tmp_path)}.version-{jobrestore.VERSION + 1}"
    with open(kept, encoding="utf-8") as f:
        assert json.load(f) == data  # kept whole for the version that wrote it
    assert not os.path.exists(jobs_path(tmp_path))


# -- what a job leaves with `hidvfs run` (a child subreaper) is the job's too ----------------

ADOPTER = """
import os, subprocess, sys
from platforms.liveprocs import adopt_orphans
assert adopt_orphans()
JOB = '''
import os, sys, time
sys.stdin.readline()
if os.fork() == 0:  # a helper that double-forks: its parent exits, it runs on
    if os.fork() == 0:
        print(os.getpid(), flush=True)
        time.sleep(60)
    os._exit(0)
sys.stdin.readline()
'''
job = subprocess.Popen([sys.executable, "-c", JOB], stdin=sys.stdin)
print(job.pid, flush=True)
from daemon.client import wait_reaping
wait_reaping(job)
sys.stdin.readline()
"""


@needs_root_and_two_cpus
def test_a_helper_that_double_forked_out_of_the_job_gets_the_originals_back(tmp_path):
    """Placed, then the job double-forks a helper between two looks (it was never seen
    below the job) and exits: the helper, adopted by the launcher, gets the originals."""
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    p = subprocess.Popen(
        [sys.executable, "-c", ADOPTER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
    )
    procs = LiveProcessControl()
    helper = None
    try:
        job = int(p.stdout.readline())
        before = (os.sched_getaffinity(job), _sched(job))
        act = Actuator(DirSysfs(tmp_path), procs, live_jobs=True)
        act.adopted_by(job, (p.pid, procs.start_time(p.pid)))
        act.apply(Decision({}, jobs={job: JobSetting((CPUS[0],), 90)}), obs())
        p.stdin.write(b"\n")
        p.stdin.flush()
        helper = int(p.stdout.readline())
        assert procs.parent(helper) in (p.pid, job)  # its own parent is gone, or going
        p.stdin.write(b"\n")  # the job exits
        p.stdin.flush()
        for _ in range(200):
            if not procs.alive(job) or procs.start_time(job) is None:
                break
            os.sched_yield()
            subprocess.run(["sleep", "0.01"])
        assert procs.parent(helper) == p.pid  # adopted by the launcher, not by init
        assert os.sched_getaffinity(helper) == {CPUS[0]} and _sched(helper)[0] == os.SCHED_FIFO
        act.forget(job)
        assert (os.sched_getaffinity(helper), _sched(helper)) == before
    finally:
        for pid in (helper, p.pid):
            if pid is not None:
                try:
                    os.kill(pid, 9)
                except ProcessLookupError:
                    pass
        p.wait()


REAPER = """
import os, subprocess, sys, time
from platforms.liveprocs import adopt_orphans
from daemon.client import wait_reaping
assert adopt_orphans()
job = subprocess.Popen(
    [sys.executable, "-c", "import os, sys, time\\n"
     "if os.fork() == 0:\\n"
     "    if os.fork() == 0:\\n"
     "        print(os.getpid(), flush=True)\\n"
     "        time.sleep(0.2)\\n"
     "    os._exit(0)\\n"
     "time.sleep(1.0)\\n"
     "raise SystemExit(7)"],
    stdout=subprocess.PIPE,
)
helper = int(job.stdout.readline())
rc = wait_reaping(job)
try:  # the helper ended (adopted) while the job ran: reaped then, not left a zombie
    os.waitpid(helper, os.WNOHANG)
    reaped = False
except ChildProcessError:
    reaped = True
try:  # nor is anything else left to reap
    os.waitpid(-1, os.WNOHANG)
    empty = False
except ChildProcessError:
    empty = True
print(rc, reaped, empty, flush=True)
"""


def test_the_launcher_reaps_the_orphans_it_adopts_and_keeps_the_jobs_status():
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    out = subprocess.run(
        [sys.executable, "-c", REAPER], capture_output=True, text=True, env=env, timeout=30
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["7", "True", "True"]  # the job's own code; no zombie left


def _registry(parent=50, owners=None):
    owners = owners or {}
    return JobRegistry(
        JobTable(),
        now=lambda: 0.0,
        alive=lambda pid: True,
        pid_owner=lambda pid: owners.get(pid, 1000),
        start_time=lambda pid: float(pid),
        parent_of=lambda pid: parent,
        unmanageable=lambda pid: "the daemon itself" if pid == 2 else None,
    )


def test_a_registered_adopter_is_the_jobs_parent_and_only_one_the_client_owns():
    assert _registry().register(10, adopter=True, peer_uid=1000).adopter == (50, 50.0)
    assert _registry().register(10, peer_uid=1000).adopter is None  # not asked for
    assert _registry(parent=1).register(10, adopter=True).adopter is None  # init
    assert _registry(parent=2).register(10, adopter=True).adopter is None  # the daemon
    theirs = _registry(owners={50: 0})  # the parent is root's, the client is not
    assert theirs.register(10, adopter=True, peer_uid=1000).adopter is None
    assert theirs.register(11, adopter=True, peer_uid=0).adopter == (50, 50.0)


def test_an_adopter_field_that_is_not_a_boolean_is_refused():
    from daemon.registry import parse_request

    line = json.dumps({"op": "register", "pid": 10, "adopter": "yes"}).encode()
    with pytest.raises(RequestError, match="'adopter' must be true or false"):
        parse_request(line)
    assert parse_request(json.dumps({"op": "register", "pid": 10}).encode())["adopter"] is False
