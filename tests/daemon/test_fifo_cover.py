"""SCHED_FIFO never on every online CPU, across jobs: the CPUs of all the jobs one round
gives real-time priority leave at least one online CPU free of them (two jobs on CPU 0 and
CPU 1 of a two-CPU machine would starve kernel threads, the daemon and sshd as one job on
both would). The job that would complete the cover gets the usual fallback instead."""

from __future__ import annotations

import logging

from hypothesis import given
from hypothesis import strategies as st

from agents.policy import Decision, JobSetting
from daemon.actuator import DEMOTED_NICE_GAP, Actuator, fifo_cover_kept
from platforms.observation import ClusterObs, JobObs, Observation
from platforms.procs import NoProcesses, ProcessGone
from platforms.sysfs import DirSysfs


class _Procs(NoProcesses):
    """Live processes as a kernel keeps their settings; every write recorded."""

    def __init__(self, pids=(10, 20, 30, 40), machine=None):
        self.starts = {pid: float(pid) for pid in pids}
        self.aff: dict[int, tuple] = {}
        self.prio: dict[int, tuple] = {}
        self.calls: list[tuple] = []
        self.machine = machine

    def alive(self, pid):
        return pid in self.starts

    def start_time(self, pid):
        return self.starts.get(pid)

    def _check(self, pid):
        if pid not in self.starts:
            raise ProcessGone(pid)

    def get_affinity(self, pid):
        self._check(pid)
        return self.aff.get(pid, (0, 1, 2, 3))

    def get_priority(self, pid):
        self._check(pid)
        return self.prio.get(pid, (0, 0))

    def set_affinity(self, pid, cpus):
        self._check(pid)
        self.aff[pid] = tuple(cpus)
        self.calls.append(("aff", pid, tuple(cpus)))

    def set_priority(self, pid, rt_priority=0, nice=0):
        self._check(pid)
        self.prio[pid] = (rt_priority, 0) if rt_priority else (0, nice)
        self.calls.append(("prio", pid, rt_priority, nice))

    def machine_cpus(self):
        return self.machine


def obs(clusters=((0, 1),), t=0.0, jobs=()) -> Observation:
    cs = tuple(
        ClusterObs(f"c{k}", k, tuple(cpus), tuple(cpus), (1000,), 1.0, None, None, None, None)
        for k, cpus in enumerate(clusters)
    )
    js = tuple(JobObs(pid, f"j{pid}", crit, 0.0, t, None) for pid, crit in jobs)
    return Observation(t, "toy", cs, (), (), js)


def fifo(procs, pid) -> bool:
    return procs.prio.get(pid, (0, 0))[0] > 0


def test_two_jobs_on_complementary_cpus_do_not_both_get_fifo(tmp_path):
    procs = _Procs()
    act = Actuator(DirSysfs(tmp_path), procs, live_jobs=True)
    jobs = {10: JobSetting((0,), 90), 20: JobSetting((1,), 80)}
    act.apply(Decision({}, jobs=jobs), obs())
    assert fifo(procs, 10)  # the higher decided priority keeps it
    assert not fifo(procs, 20)  # the lower one would have completed the cover
    assert procs.prio[20] == (0, 0)


def test_the_fallback_nices_best_effort_work_on_the_cpus_of_the_job_that_lost_fifo(tmp_path):
    procs = _Procs()
    act = Actuator(DirSysfs(tmp_path), procs, live_jobs=True)
    jobs = {
        10: JobSetting((0,), 90),
        20: JobSetting((1,), 80),
        30: JobSetting((1,)),  # best effort next to the job that falls back
        40: JobSetting((0,)),  # best effort next to a job still FIFO: untouched
    }
    act.apply(Decision({}, jobs=jobs), obs())
    assert procs.prio[30] == (0, DEMOTED_NICE_GAP)
    assert procs.prio[40] == (0, 0)


def test_a_lower_job_that_does_not_complete_the_cover_keeps_fifo(tmp_path):
    """The rule is a cover, not a count: a third job on CPUs already covered keeps FIFO."""
    procs = _Procs()
    act = Actuator(DirSysfs(tmp_path), procs, live_jobs=True)
    jobs = {10: JobSetting((0,), 90), 20: JobSetting((1, 2), 80), 30: JobSetting((0, 1), 70)}
    act.apply(Decision({}, jobs=jobs), obs(clusters=((0, 1), (2, 3))))
    assert fifo(procs, 10) and fifo(procs, 20) and fifo(procs, 30)
    act2 = Actuator(DirSysfs(tmp_path), procs := _Procs(), live_jobs=True)
    jobs[40] = JobSetting((3,), 60)  # CPU 3 was the last free one
    act2.apply(Decision({}, jobs=jobs), obs(clusters=((0, 1), (2, 3))))
    assert [fifo(procs, p) for p in (10, 20, 30, 40)] == [True, True, True, False]


def test_a_hi_job_on_its_reserved_cluster_keeps_fifo_over_a_higher_lo_job(tmp_path):
    """A HI job holds its reserved cluster at FIFO 50, below the 90 a LO job's policy may
    give: for the cover it still comes first."""
    procs = _Procs()
    act = Actuator(DirSysfs(tmp_path), procs, live_jobs=True)
    jobs = {10: JobSetting((0, 1), 50), 20: JobSetting((2, 3), 90)}
    o = obs(clusters=((0, 1), (2, 3)), jobs=[(10, "hi"), (20, "lo")])
    act.apply(Decision({}, jobs=jobs), o)
    assert fifo(procs, 10) and not fifo(procs, 20)


def test_the_choice_holds_tick_after_tick_and_is_logged_once(tmp_path, caplog):
    procs = _Procs()
    act = Actuator(DirSysfs(tmp_path), procs, live_jobs=True)
    d = Decision({}, jobs={20: JobSetting((1,), 80), 10: JobSetting((0,), 90)})
    with caplog.at_level(logging.INFO, logger="hidvfs.actuator"):
        for k in range(200):  # 20 s of ticks, re-applied every 5 s
            act.apply(d, obs(t=0.1 * k))
            assert fifo(procs, 10) and not fifo(procs, 20)
    falls = [r.message for r in caplog.records if "event=job_fifo_cover_fallback" in r.message]
    assert len(falls) == 1 and "pid=20" in falls[0]
    assert ("prio", 10, 20, 0) not in procs.calls  # the other never went SCHED_OTHER...
    assert not any(c[:2] == ("prio", 20) and c[2] > 0 for c in procs.calls)  # ...nor this FIFO


def test_equal_priorities_fall_back_by_pid_whatever_the_decision_order(tmp_path):
    for order in ((10, 20), (20, 10)):
        procs = _Procs()
        act = Actuator(DirSysfs(tmp_path), procs, live_jobs=True)
        cpus = {10: (0,), 20: (1,)}
        act.apply(Decision({}, jobs={p: JobSetting(cpus[p], 80) for p in order}), obs())
        assert fifo(procs, 10) and not fifo(procs, 20)


def test_fifo_comes_back_when_the_other_job_leaves(tmp_path, caplog):
    procs = _Procs()
    act = Actuator(DirSysfs(tmp_path), procs, live_jobs=True)
    act.apply(Decision({}, jobs={10: JobSetting((0,), 90), 20: JobSetting((1,), 80)}), obs())
    assert not fifo(procs, 20)
    act.release(10)
    with caplog.at_level(logging.INFO, logger="hidvfs.actuator"):
        act.apply(Decision({}, jobs={20: JobSetting((1,), 80)}), obs(t=1.0))
    assert fifo(procs, 20)
    assert "event=job_fifo_cover_lifted pid=20" in caplog.text


def test_a_fifo_job_left_out_of_the_decision_still_counts(tmp_path):
    """Placed FIFO in an earlier round and not in this decision, it keeps its placement: a
    new job on the remaining CPUs would complete the cover."""
    procs = _Procs()
    act = Actuator(DirSysfs(tmp_path), procs, live_jobs=True)
    act.apply(Decision({}, jobs={10: JobSetting((0,), 60)}), obs())
    act.apply(Decision({}, jobs={20: JobSetting((1,), 90)}), obs(t=1.0))
    assert fifo(procs, 10) and not fifo(procs, 20)


def test_a_job_refused_fifo_by_its_rlimit_frees_its_cpus_for_others(tmp_path):
    class Limited(_Procs):
        def rt_allowed(self, pid):
            return 0 if pid == 10 else 99

    procs = Limited()
    act = Actuator(DirSysfs(tmp_path), procs, live_jobs=True)
    act.apply(Decision({}, jobs={10: JobSetting((0,), 90), 20: JobSetting((1,), 80)}), obs())
    assert not fifo(procs, 10) and fifo(procs, 20)


def test_the_cover_is_of_the_machines_cpus(tmp_path):
    """On a fake tree the jobs' CPUs are this machine's: four of them, two still free."""
    procs = _Procs(machine=frozenset({0, 1, 2, 3}))
    act = Actuator(DirSysfs(tmp_path), procs, live_jobs=True)
    act.apply(Decision({}, jobs={10: JobSetting((0,), 90), 20: JobSetting((1,), 80)}), obs())
    assert fifo(procs, 10) and fifo(procs, 20)


cpus = st.frozensets(st.integers(0, 4), max_size=5).map(lambda s: tuple(sorted(s)))


@given(
    st.dictionaries(st.integers(1, 9), st.tuples(cpus, st.integers(0, 99)), max_size=7),
    st.frozensets(st.integers(1, 9)),
    st.frozensets(st.integers(0, 4), min_size=1),
)
def test_the_fifo_jobs_never_cover_every_online_cpu(jobs, hi, online):
    decided = {pid: JobSetting(c, rt) for pid, (c, rt) in jobs.items()}
    out = fifo_cover_kept(decided, decided, online, hi)
    assert out.keys() == decided.keys()
    covered = set()
    for pid, s in out.items():
        assert s.cpus == decided[pid].cpus and s.nice == decided[pid].nice
        assert s.rt_priority in (0, decided[pid].rt_priority)
        if s.rt_priority:
            covered |= set(s.cpus or online)
    assert not set(online) <= covered
    # only a job that would complete the cover with those kept before it loses FIFO
    order = sorted(
        (p for p in decided if decided[p].rt_priority),
        key=lambda p: (p not in hi, -decided[p].rt_priority, p),
    )
    before: set[int] = set()
    for pid in order:
        mine = set(decided[pid].cpus or online)
        assert (out[pid].rt_priority == 0) == (set(online) <= before | mine)
        if out[pid].rt_priority:
            before |= mine
