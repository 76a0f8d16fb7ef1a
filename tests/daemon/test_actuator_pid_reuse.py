"""A job released after its pid was reused: the originals are not the newcomer's (audit F8)."""

from __future__ import annotations

import logging

from agents.policy import Decision, JobSetting
from daemon.actuator import Actuator
from platforms.observation import ClusterObs, Observation
from platforms.procs import NoProcesses
from platforms.sysfs import DirSysfs


def obs(t=0.0) -> Observation:
    c = ClusterObs("c", 0, (0, 1), (0, 1), (1000,), 1.0, None, None, None, None)
    return Observation(t, "toy", (c,), (), ())


class _Procs(NoProcesses):
    """pid 10 started at 1.0, with a child 11 (started at 5.0) that leaves its tree."""

    def __init__(self):
        self.starts = {10: 1.0, 11: 5.0}
        self.children = [(11, 5.0)]
        self.calls: list[tuple] = []

    def alive(self, pid):
        return pid in self.starts

    def start_time(self, pid):
        return self.starts.get(pid)

    def descendants(self, pid):
        return list(self.children) if pid == 10 else []

    def get_affinity(self, pid):
        return (0, 1)

    def get_priority(self, pid):
        return (0, 0)

    def set_affinity(self, pid, cpus):
        self.calls.append(("aff", pid, tuple(cpus)))

    def set_priority(self, pid, rt_priority=0, nice=0):
        self.calls.append(("prio", pid, rt_priority, nice))

    def set_own_affinity(self, pid, cpus):
        self.calls.append(("own-aff", pid, tuple(cpus)))

    def set_own_priority(self, pid, rt_priority=0, nice=0):
        self.calls.append(("own-prio", pid, rt_priority, nice))


def _placed(tmp_path):
    procs = _Procs()
    act = Actuator(DirSysfs(tmp_path), procs, live_jobs=True)
    act.apply(Decision({}, jobs={10: JobSetting((0,), 0, 5)}), obs())
    procs.calls.clear()
    return procs, act


def test_a_released_job_whose_pid_names_another_process_is_left_alone(tmp_path, caplog):
    procs, act = _placed(tmp_path)
    procs.starts[10] = 99.0  # the job ended; another process got pid 10 before the loop saw
    procs.children = []  # the job's child was reparented and runs on
    with caplog.at_level(logging.INFO, logger="hidvfs.actuator"):
        act.release(10)
    assert [c for c in procs.calls if c[1] == 10] == []  # the newcomer keeps its own
    assert ("own-aff", 11, (0, 1)) in procs.calls  # the job's member still gets its own
    assert any("event=job_release_skipped pid=10" in r.getMessage() for r in caplog.records)
    assert act.managed() == set()


def test_a_released_job_that_is_still_the_same_process_gets_its_originals(tmp_path):
    procs, act = _placed(tmp_path)
    act.release(10)
    assert procs.calls[:2] == [("aff", 10, (0, 1)), ("prio", 10, 0, 0)]


def test_a_backend_without_start_times_is_released_as_before(tmp_path):
    class NoStarts(_Procs):
        def start_time(self, pid):
            return None

    procs = NoStarts()
    act = Actuator(DirSysfs(tmp_path), procs, live_jobs=True)
    act.apply(Decision({}, jobs={10: JobSetting((0,), 0, 5)}), obs())
    procs.calls.clear()
    act.release(10)
    assert procs.calls[:2] == [("aff", 10, (0, 1)), ("prio", 10, 0, 0)]


def test_a_pid_reused_between_the_rounds_phases_is_not_placed(tmp_path):
    """The originals are read in a round's first phase and the writes come after two saves:
    a pid that names another process by then gets neither the job's CPUs nor its priority."""
    from daemon.jobrestore import JobOriginals

    procs = _Procs()
    store = JobOriginals(tmp_path)
    real_flush = store.flush

    def flush_then_reuse():
        real_flush()
        procs.starts[10] = 99.0  # the job ended and its pid was given to a newcomer

    store.flush = flush_then_reuse
    act = Actuator(DirSysfs(tmp_path), procs, live_jobs=True, originals=store)
    report = act.apply(Decision({}, jobs={10: JobSetting((0,), 0, 5)}), obs())
    assert not [c for c in procs.calls if c[1] == 10]
    assert 10 in report.gone
