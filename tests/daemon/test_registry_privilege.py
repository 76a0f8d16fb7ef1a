"""What a user who is not root may get through the registry: only its own processes (not a
setuid program it started), no more real-time priority than its processes' RLIMIT_RTPRIO,
a bounded share of the job table; registrations that fail closed; log lines a job name
cannot forge; a malformed request that stays a bad request (security audit F1, F2a, F9, F10).

The live cases run a process as another user with ``setpriv`` (as test_live_jobs does), and
need root."""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import subprocess
import sys
import time

import pytest

from agents.policy import Decision, JobSetting
from daemon.actuator import MAX_JOB_RT_PRIORITY, REAPPLY_S, Actuator
from daemon.jobs import JobTable
from daemon.registry import (
    INTERNAL_ERROR_LOG_S,
    MAX_JOBS_PER_UID,
    ROOT_JOB_RESERVE,
    JobRegistry,
    RequestError,
    parse_request,
)
from platforms.liveprocs import LiveProcessControl
from platforms.observation import ClusterObs, Observation
from platforms.procs import NoProcesses, SetidProcess
from platforms.sysfs import DirSysfs

CPUS = tuple(sorted(os.sched_getaffinity(0)))
IS_ROOT = os.geteuid() == 0
SETPRIV = shutil.which("setpriv")
PRLIMIT = shutil.which("prlimit")
needs_root = pytest.mark.skipif(
    not IS_ROOT or SETPRIV is None or PRLIMIT is None,
    reason="needs root, setpriv and prlimit (runs processes as another user)",
)
needs_root_and_two_cpus = pytest.mark.skipif(
    not IS_ROOT or SETPRIV is None or PRLIMIT is None or len(CPUS) < 2,
    reason="needs root, setpriv, prlimit and 2 usable CPUs",
)
NOBODY = 65534


def _can_raise_rtprio() -> bool:
    """Whether this machine lets the tests give a process RLIMIT_RTPRIO > 0 (a container
    without CAP_SYS_RESOURCE does not)."""
    return (
        PRLIMIT is not None
        and subprocess.run([PRLIMIT, "--rtprio=30:30", "true"], capture_output=True).returncode == 0
    )


needs_rtprio = pytest.mark.skipif(
    not IS_ROOT or PRLIMIT is None or not _can_raise_rtprio(),
    reason="needs to raise RLIMIT_RTPRIO (CAP_SYS_RESOURCE)",
)
SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]


def obs(t=0.0) -> Observation:
    c = ClusterObs("c", 0, CPUS, CPUS, (1000,), 1.0, None, None, None, None)
    return Observation(t, "toy", (c,), (), ())


def _sched(pid):
    return os.sched_getscheduler(pid), os.sched_getparam(pid).sched_priority


def _wait_ids(pid, uid_field):
    """Wait until ``pid`` runs with the uids setpriv gives it (it execs once they are set)."""
    for _ in range(200):
        try:
            with open(f"/proc/{pid}/status") as f:
                line = next(x for x in f if x.startswith("Uid:"))
            if line.split()[1:4] == uid_field and "setpriv" not in os.readlink(f"/proc/{pid}/exe"):
                return
        except (OSError, StopIteration):
            pass
        time.sleep(0.01)
    raise AssertionError(f"pid {pid} never took uids {uid_field}")


@pytest.fixture
def spawn():
    procs = []

    def start(argv, uid_field):
        p = subprocess.Popen(argv)
        procs.append(p)
        _wait_ids(p.pid, uid_field)
        return p

    yield start
    for p in procs:
        p.kill()
        p.wait()


def su_like(rtprio=0):
    """A process like `su` run by user nobody: real uid nobody's, effective and saved root's."""
    return [PRLIMIT, f"--rtprio={rtprio}:{rtprio}", SETPRIV, f"--ruid={NOBODY}", *SLEEP], [
        str(NOBODY),
        "0",
        "0",
    ]


def nobodys(rtprio=0):
    """A plain process of user nobody (every id nobody's)."""
    argv = [
        PRLIMIT,
        f"--rtprio={rtprio}:{rtprio}",
        SETPRIV,
        f"--reuid={NOBODY}",
        f"--regid={NOBODY}",
        "--clear-groups",
        *SLEEP,
    ]
    return argv, [str(NOBODY)] * 3


# -- F1 (a): a setuid program the user started is not the user's to register ------------------


def _reg(**kw):
    kw.setdefault("now", lambda: 0.0)
    kw.setdefault("alive", lambda pid: True)
    return JobRegistry(JobTable(), **kw)


def test_a_process_running_a_setuid_program_is_refused_to_a_user_and_taken_from_root():
    def owner(pid):
        raise SetidProcess(pid, (1000, 0, 0), (1000, 1000, 1000))

    reg = _reg(pid_owner=owner)
    with pytest.raises(
        RequestError,
        match=r"setuid program .*1000/0/0.*is registered by root \(sudo hidvfs run -- CMD\)",
    ):
        reg.register(77, peer_uid=1000)
    assert reg.table.get(77) is None
    assert reg.register(77, peer_uid=0).pid == 77  # root keeps today's behaviour


def test_a_setuid_parent_is_not_taken_as_the_adopter_nor_its_owner_as_a_users():
    def owner(pid):
        if pid == 50:
            raise SetidProcess(pid, (1000, 0, 0), (1000,) * 3)
        return 1000

    reg = _reg(pid_owner=owner, parent_of=lambda pid: 50, start_time=float)
    assert reg.register(10, adopter=True, peer_uid=1000).adopter is None
    reg.register(50, peer_uid=0)  # root registered the setuid process
    with pytest.raises(RequestError, match="registered by uid 0"):
        reg.unregister(50, peer_uid=1000)


@needs_root
def test_the_owner_of_a_setuid_process_is_no_one_user(spawn):
    procs = LiveProcessControl()
    su = spawn(*su_like())
    with pytest.raises(SetidProcess, match=f"setuid program .*{NOBODY}/0/0"):
        procs.owner_uid(su.pid)
    plain = spawn(*nobodys())
    assert procs.owner_uid(plain.pid) == NOBODY
    sg = spawn(
        [SETPRIV, f"--reuid={NOBODY}", f"--rgid={NOBODY}", "--clear-groups", *SLEEP],
        [str(NOBODY)] * 3,
    )
    with pytest.raises(SetidProcess, match="setgid program"):
        procs.owner_uid(sg.pid)  # real gid nobody's, effective root's


@needs_root
def test_a_user_cannot_register_the_su_it_started_but_its_own_process(spawn):
    """The audit's F1: `su user -c ...` (real uid the user's, effective root's) was taken as
    the user's and then given root's real-time allowance."""
    procs = LiveProcessControl()
    reg = JobRegistry(
        JobTable(),
        now=time.monotonic,
        alive=procs.alive,
        pid_owner=procs.owner_uid,
        start_time=procs.start_time,
        unmanageable=procs.unmanageable,
        parent_of=procs.parent,
    )
    su = spawn(*su_like())
    with pytest.raises(RequestError, match="setuid program.*is registered by root"):
        reg.register(su.pid, peer_uid=NOBODY)
    plain = spawn(*nobodys())
    entry = reg.register(plain.pid, peer_uid=NOBODY)
    assert entry.registrant_uid == NOBODY and entry.start_time == procs.start_time(plain.pid)
    assert reg.register(su.pid, peer_uid=0).pid == su.pid  # root may


# -- F1 (b): a user's job gets no more real-time priority than RLIMIT_RTPRIO allows ----------


class _Procs(NoProcesses):
    """One job, pid 10: root's shortcut says 99, its processes' RLIMIT_RTPRIO ``limit``."""

    def __init__(self, limit=0):
        self.limit = limit
        self.exe = "/usr/bin/job"
        self.prio: dict[int, tuple[int, int]] = {}
        self.limit_reads = 0

    def alive(self, pid):
        return True

    def start_time(self, pid):
        return 1.0

    def identity(self, pid):
        return (1.0, self.exe)

    def get_affinity(self, pid):
        return CPUS

    def set_affinity(self, pid, cpus):
        pass

    def set_priority(self, pid, rt_priority=0, nice=0):
        self.prio[pid] = (rt_priority, nice)

    def rt_allowed(self, pid):
        return 99  # its effective uid is 0 (a setuid program)

    def rt_limit(self, pid):
        self.limit_reads += 1
        return self.limit


def _one_cpu_fifo(act, t=0.0):
    return act.apply(Decision({}, jobs={10: JobSetting((CPUS[0],), 90)}), obs(t))


@pytest.mark.skipif(len(CPUS) < 2, reason="FIFO is never given on every online CPU")
@pytest.mark.parametrize("registrant, rt", [(1000, 0), (0, 36), (None, 36)])
def test_a_users_job_gets_only_its_rlimit_root_and_in_process_jobs_as_before(
    tmp_path, registrant, rt
):
    procs = _Procs(limit=0)
    act = Actuator(DirSysfs(tmp_path), procs, live_jobs=True)
    act.registered_by(10, registrant)
    _one_cpu_fifo(act)
    assert procs.prio[10] == (rt, 0)


@pytest.mark.skipif(len(CPUS) < 2, reason="FIFO is never given on every online CPU")
def test_a_users_limit_is_read_again_when_the_job_execs_and_at_each_reapply(tmp_path):
    procs = _Procs(limit=20)
    act = Actuator(DirSysfs(tmp_path), procs, live_jobs=True)
    act.registered_by(10, 1000)
    _one_cpu_fifo(act, 0.0)
    assert procs.prio[10] == (20, 0) and procs.limit_reads == 1
    _one_cpu_fifo(act, 0.125)
    assert procs.limit_reads == 1  # same process, same executable: not read every tick
    procs.limit, procs.exe = 0, "/usr/bin/su"  # it exec'd something with a lower limit
    _one_cpu_fifo(act, 0.25)
    assert procs.limit_reads == 2 and procs.prio[10] == (0, 0)  # placed again at once
    procs.limit = 10  # its tree changed (a child with another limit): seen at the reapply
    _one_cpu_fifo(act, 0.25 + REAPPLY_S / 2)
    assert procs.limit_reads == 2
    _one_cpu_fifo(act, 0.25 + REAPPLY_S)
    assert procs.limit_reads == 3 and procs.prio[10] == (10, 0)


@needs_root_and_two_cpus
def test_a_users_job_running_as_root_gets_no_fifo(tmp_path, spawn):
    """The audit's F1 end to end on the actuator: the job's process runs with effective uid
    0 (a setuid program the user's registered process exec'd) and RLIMIT_RTPRIO 0. Root's
    shortcut used to give it FIFO (and the whole tree with it)."""
    su = spawn(*su_like(rtprio=0))
    procs = LiveProcessControl()
    assert procs.rt_allowed(su.pid) == 99  # what the root shortcut says
    act = Actuator(DirSysfs(tmp_path), procs, live_jobs=True)
    act.registered_by(su.pid, NOBODY)
    act.apply(Decision({}, jobs={su.pid: JobSetting((CPUS[0],), 90)}), obs())
    assert _sched(su.pid)[0] == os.SCHED_OTHER
    act.release_all()


@needs_root_and_two_cpus
def test_a_users_own_process_without_rtprio_gets_sched_other(tmp_path, spawn):
    """Unchanged for an ordinary own process: RLIMIT_RTPRIO 0, SCHED_OTHER."""
    procs = LiveProcessControl()
    none = spawn(*nobodys(rtprio=0))
    act = Actuator(DirSysfs(tmp_path), procs, live_jobs=True)
    act.registered_by(none.pid, NOBODY)
    act.apply(Decision({}, jobs={none.pid: JobSetting((CPUS[0],), 90)}), obs())
    assert _sched(none.pid)[0] == os.SCHED_OTHER
    act.release_all()


@needs_root_and_two_cpus
@needs_rtprio
def test_a_users_own_process_gets_what_its_rlimit_allows(tmp_path, spawn):
    procs = LiveProcessControl()
    some = spawn(*nobodys(rtprio=30))
    act = Actuator(DirSysfs(tmp_path), procs, live_jobs=True)
    act.registered_by(some.pid, NOBODY)
    act.apply(Decision({}, jobs={some.pid: JobSetting((CPUS[0],), 90)}), obs())
    assert _sched(some.pid) == (os.SCHED_FIFO, min(30, round(90 * MAX_JOB_RT_PRIORITY / 99)))
    act.release_all()
    assert _sched(some.pid) == (os.SCHED_OTHER, 0)


TWO = """
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
print(child.pid, flush=True)
sys.stdin.readline()
child.kill()
"""


def test_the_limit_of_a_users_job_is_the_lowest_of_its_tree_root_counting_for_nothing(
    monkeypatch,
):
    import resource

    import platforms.liveprocs as liveprocs

    p = subprocess.Popen([sys.executable, "-c", TWO], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        child = int(p.stdout.readline())
        limits = {p.pid: 50, child: 50}
        real = resource.prlimit

        def prlimit(pid, which, *args):
            assert which == resource.RLIMIT_RTPRIO and not args
            return (limits[pid], limits[pid]) if pid in limits else real(pid, which)

        monkeypatch.setattr(liveprocs.resource, "prlimit", prlimit)
        procs = LiveProcessControl()
        assert procs.rt_limit(p.pid) == 50
        limits[child] = 10
        assert procs.rt_limit(p.pid) == 10  # the child the placement also sets
        limits[child] = resource.RLIM_INFINITY
        assert procs.rt_limit(p.pid) == 50
        if IS_ROOT:
            assert procs.rt_allowed(p.pid) == 99  # root's process: what root's jobs get
        start, exe = procs.identity(p.pid)
        assert start == procs.start_time(p.pid)
        assert exe == os.path.realpath(sys.executable)
    finally:
        p.stdin.close()
        p.wait(10)


# -- F9: registration fails closed and checks again under the lock ----------------------------


def test_a_vanished_pid_is_refused_not_taken():
    reg = _reg(pid_owner=lambda pid: None)  # its /proc entry went between the checks
    with pytest.raises(RequestError, match="does not exist"):
        reg.register(5, peer_uid=1000)
    reg = _reg(pid_owner=lambda pid: 1000, start_time=lambda pid: None)
    with pytest.raises(RequestError, match="does not exist"):
        reg.register(5, peer_uid=1000)
    with pytest.raises(RequestError, match="does not exist"):
        reg.register(5, peer_uid=0)  # for root too: no start time, no process
    assert len(reg.table) == 0


def test_the_start_time_is_read_first_and_checked_again_under_the_lock():
    starts = {5: 100.0}
    owners = {5: 1000}
    reads = []

    def start_time(pid):
        reads.append("start")
        return starts.get(pid)

    def owner(pid):
        reads.append("owner")
        return owners.get(pid)

    def profile_for(name):  # meanwhile the process ends and another takes its pid
        starts[5] = 200.0
        return None

    reg = _reg(pid_owner=owner, start_time=start_time, profile_for=profile_for)
    with pytest.raises(RequestError, match="ended while it was being registered"):
        reg.register(5, peer_uid=1000)
    assert reads[:2] == ["start", "owner"]
    assert len(reg.table) == 0

    starts[5] = 100.0

    def runs_su(name):  # meanwhile it exec'd a setuid program
        owners[5] = None
        return None

    reg = _reg(pid_owner=owner, start_time=start_time, profile_for=runs_su)
    with pytest.raises(RequestError, match="does not exist"):
        reg.register(5, peer_uid=1000)
    owners[5] = 1000
    reg = _reg(pid_owner=owner, start_time=start_time)
    assert reg.register(5, peer_uid=1000).start_time == 100.0


# -- F2 (a): a per-user quota and slots kept for root ------------------------------------------


def test_one_user_has_a_quota_and_root_keeps_a_reserve():
    assert MAX_JOBS_PER_UID == 64 and ROOT_JOB_RESERVE == 32
    reg = _reg(
        pid_owner=lambda pid: pid // 1000 * 1000,
        max_jobs=10,
        max_jobs_per_uid=3,
        root_job_reserve=4,
    )
    for pid in (1001, 1002, 1003):
        reg.register(pid, peer_uid=1000)
    with pytest.raises(RequestError, match=r"uid 1000 has 3 registered jobs, .*limit 3 per uid"):
        reg.register(1004, peer_uid=1000)
    for pid in (2001, 2002, 2003):
        reg.register(pid, peer_uid=2000)  # another user has its own quota
    with pytest.raises(
        RequestError, match=r"limit 6 for clients that are not root; the last 4 of 10"
    ):
        reg.register(3001, peer_uid=3000)  # users have filled all but root's reserve
    for pid in range(4):
        reg.register(pid + 1, peer_uid=0)  # root still registers, up to the global limit
    with pytest.raises(RequestError, match=r"too many registered jobs \(limit 10\)"):
        reg.register(9, peer_uid=0)
    reg.unregister(1001, peer_uid=1000)
    with pytest.raises(RequestError, match="kept for root"):
        reg.register(1004, peer_uid=1000)  # its quota has room, the users' share not
    for pid in range(4):
        reg.unregister(pid + 1, peer_uid=0)
    assert reg.register(1004, peer_uid=1000).pid == 1004


def test_the_default_limits_keep_room_for_root():
    reg = _reg(pid_owner=lambda pid: 1000)
    assert (reg.max_jobs, reg.max_jobs_per_uid, reg.root_job_reserve) == (1024, 64, 32)
    assert _reg(max_jobs=2).root_job_reserve == 1  # at most half of a small table


# -- F10: names cannot forge log fields; a huge integer is a bad request -----------------------


def _fields(message: str) -> dict[str, str]:
    return dict(kv.split("=", 1) for kv in shlex.split(message))


def test_a_job_name_cannot_forge_fields_of_its_log_line(caplog):
    reg = _reg(pid_owner=lambda pid: 1000)
    with caplog.at_level(logging.INFO, logger="hidvfs.registry"):
        reg.register(5, None, "lo", "fib criticality=hi uid=0", peer_uid=1000)
        reg.unregister(5, peer_uid=1000)
    lines = [r.getMessage() for r in caplog.records]
    registered = _fields(next(x for x in lines if x.startswith("event=job_registered")))
    assert registered["name"] == "fib criticality=hi uid=0"
    assert registered["criticality"] == "lo" and registered["uid"] == "1000"
    gone = _fields(next(x for x in lines if x.startswith("event=job_unregistered")))
    assert gone["name"] == "fib criticality=hi uid=0" and "criticality" not in gone


def test_the_job_done_line_quotes_the_name_too(caplog):
    from daemon.jobs import JobOutcome
    from daemon.loop import ControlLoop

    out = JobOutcome(5, "a b=c", "lo", 0.0, 1.5, None)
    with caplog.at_level(logging.INFO, logger="hidvfs.loop"):
        ControlLoop._log_done(out)
    assert _fields(caplog.records[-1].getMessage())["name"] == "a b=c"


def test_an_integer_of_more_digits_than_python_converts_is_a_bad_request(caplog):
    line = b'{"op": "register", "pid": ' + b"7" * 5000 + b"}"
    with pytest.raises(RequestError, match="malformed JSON"):
        parse_request(line)
    reg = _reg()
    with caplog.at_level(logging.DEBUG, logger="hidvfs.registry"):
        answer = reg.handle_line(line)
    assert answer["ok"] is False and "malformed JSON" in answer["error"]
    assert "internal error" not in answer["error"]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_a_repeated_internal_error_is_logged_with_its_traceback_once(caplog, monkeypatch):
    def broken(pid):
        raise RuntimeError(f"broken for pid {pid}")

    reg = _reg(alive=broken)
    clock = [1000.0]
    reg.now = lambda: clock[0]  # the registry's clock
    with caplog.at_level(logging.DEBUG, logger="hidvfs.registry"):
        for pid in range(1, 501):  # another message each time: still one place
            answer = reg.handle_line(b'{"op": "register", "pid": %d}' % pid)
            assert answer["error"].startswith("internal error: RuntimeError: broken for pid")
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and errors[0].exc_info is not None
    caplog.clear()
    clock[0] += INTERNAL_ERROR_LOG_S + 1
    with caplog.at_level(logging.DEBUG, logger="hidvfs.registry"):
        reg.handle_line(b'{"op": "register", "pid": 9}')
        reg.handle_line(b'{"op": "register", "pid": 9}')
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and errors[0].exc_info is None  # one line, no traceback again
    assert _fields(errors[0].getMessage())["repeats"] == "499"
