"""The real-time cover rules on a simulated board (``Actuator(rt_cover_rules=True)``,
``run_sim(rt_cover_rules=True)``): as the daemon on a board, no job runs SCHED_FIFO on every
online CPU, nor do the real-time jobs together hold them all; the job that loses SCHED_FIFO
runs SCHED_OTHER in the plant, best-effort jobs on its CPUs niced below it. Without the
switch the plant runs the decision as given (what agent evaluation did until now)."""

from __future__ import annotations

import pytest

from agents.policy import Decision, JobSetting, Policy
from bots_bench.dags import generate
from daemon.actuator import DEMOTED_NICE_GAP, Actuator
from daemon.simrun import run_sim
from platforms.observation import JobObs
from platforms.sense import Sensor
from platforms.sim import make_sim_platform
from platforms.sim.plant import SimJob
from platforms.spec import load_board

BOARD = "tx2"  # a57 on CPUs 0, 3, 4, 5; denver on 1, 2


def _board(*jobs: SimJob):
    spec = load_board(BOARD)
    platform = make_sim_platform(spec, online=spec.cpus)
    plant = platform.sysfs.plant
    pids = [plant.submit(j) for j in jobs]
    obs = Sensor(spec, platform.sysfs).read(plant.t)
    obs = obs.with_jobs(
        tuple(
            JobObs(pid, j.name, j.criticality, 0.0, 0.0, j.deadline_s) for pid, j in zip(pids, jobs)
        )
    )
    return platform, plant, pids, obs, tuple(spec.cpus)


def _dl(name="dl", crit="hi"):
    return SimJob(generate("fib", "test"), name, deadline_s=1.0, criticality=crit)


def _be(name="be"):
    return SimJob(generate("sort", "test"), name)


@pytest.mark.parametrize("rules", [True, False])
def test_fifo_on_every_online_cpu_runs_sched_other_in_the_plant_with_the_rules(rules):
    platform, plant, (dl, be), obs, every = _board(_dl(), _be())
    act = Actuator(platform.sysfs, platform.procs, rt_cover_rules=rules)
    decision = Decision({}, jobs={dl: JobSetting(every, 90), be: JobSetting(every)})
    report = act.apply(decision, obs)
    if rules:  # as on a board: SCHED_OTHER, the best-effort job niced below it
        assert (plant.jobs[dl].rt_priority, plant.jobs[dl].nice) == (0, 0)
        assert (plant.jobs[be].rt_priority, plant.jobs[be].nice) == (0, DEMOTED_NICE_GAP)
        assert report.fifo_dropped == [dl] and report.niced_below == [be]
    else:  # as decided: SCHED_FIFO on every CPU, the best-effort job untouched
        assert plant.jobs[dl].rt_priority == 90
        assert (plant.jobs[be].rt_priority, plant.jobs[be].nice) == (0, 0)
        assert report.fifo_dropped == [] and report.niced_below == []
    assert plant.jobs[dl].cpus == plant.jobs[be].cpus == every


@pytest.mark.parametrize("rules", [True, False])
def test_two_fifo_jobs_that_cover_the_board_keep_the_hi_one_real_time(rules):
    """A HI job on denver at 50, a LO job on the a57 cluster at 90: together they hold every
    CPU. With the rules the HI job comes first and keeps SCHED_FIFO; the LO job runs
    SCHED_OTHER and the best-effort job on its cluster is niced below it."""
    platform, plant, (hi, lo, be), obs, _ = _board(_dl("hi"), _dl("lo", "lo"), _be())
    act = Actuator(platform.sysfs, platform.procs, rt_cover_rules=rules)
    decision = Decision(
        {},
        jobs={
            hi: JobSetting((1, 2), 50),
            lo: JobSetting((0, 3, 4, 5), 90),
            be: JobSetting((0, 3, 4, 5)),
        },
    )
    act.apply(decision, obs)
    assert plant.jobs[hi].rt_priority == 50
    if rules:
        assert plant.jobs[lo].rt_priority == 0
        assert plant.jobs[be].nice == DEMOTED_NICE_GAP
    else:
        assert plant.jobs[lo].rt_priority == 90
        assert plant.jobs[be].nice == 0


class _FifoEverywhere(Policy):
    """Gives each deadline job SCHED_FIFO 90 on every online CPU, the others SCHED_OTHER
    there, every cluster at its top frequency."""

    name = "fifo-everywhere"
    period_s = 0.05

    def decide(self, obs):
        every = tuple(sorted(c for cl in obs.clusters for c in cl.online))
        freq = {cl.name: cl.freqs_khz[-1] for cl in obs.clusters if cl.freqs_khz}
        return Decision(
            freq,
            {j.pid: JobSetting(every, 90 if j.deadline_s else 0) for j in obs.jobs},
        )


def _run(rules: bool, monkeypatch):
    """One run of a deadline job (SCHED_FIFO on every CPU as decided) beside a best-effort
    job; the plant's (rt, nice) of both at every tick while both run."""
    import daemon.simrun as simrun

    boards = []

    def platform(*args, **kwargs):  # the run's board, to read the plant at every tick
        boards.append(make_sim_platform(*args, **kwargs))
        return boards[-1]

    monkeypatch.setattr(simrun, "make_sim_platform", platform)
    seen: list[dict[int, tuple[int, int]]] = []

    def watch(_res):
        jobs = boards[-1].sysfs.plant.jobs
        if len(jobs) == 2 and all(st.released and not st.done for st in jobs.values()):
            seen.append({pid: (st.rt_priority, st.nice) for pid, st in jobs.items()})

    dl = SimJob(generate("sort", "test", seed=0), "dl", deadline_s=1.0, criticality="hi")
    be = SimJob(generate("sort", "test", seed=1), "be")
    res = run_sim(
        BOARD, _FifoEverywhere(), [(dl, None), (be, None)], rt_cover_rules=rules, on_tick=watch
    )
    return res, seen


def test_run_sim_actuates_under_the_rules_when_asked(monkeypatch):
    on, seen_on = _run(True, monkeypatch)
    off, seen_off = _run(False, monkeypatch)
    dl, be = (j.pid for j in on.jobs)
    assert len(seen_on) >= 5 and len(seen_off) >= 5  # side by side for a while
    # with the rules, as on a board: SCHED_OTHER, the best-effort job niced below it
    assert all(s == {dl: (0, 0), be: (0, DEMOTED_NICE_GAP)} for s in seen_on)
    assert on.rt_cover_rules and on.fifo_dropped_ticks >= len(seen_on)
    assert on.fifo_dropped_jobs == (dl,) and on.niced_below_jobs == (be,)
    # without them, as decided: SCHED_FIFO on every CPU, the best-effort job untouched
    assert all(s == {dl: (90, 0), be: (0, 0)} for s in seen_off)
    assert not off.rt_cover_rules and off.fifo_dropped_ticks == 0
    assert off.fifo_dropped_jobs == () and off.niced_below_jobs == ()
    # the deadline job now shares its cores with the best-effort one (at about 1:10)
    assert on.jobs[0].makespan_s > off.jobs[0].makespan_s


def test_the_switch_follows_live_jobs_and_a_live_actuator_cannot_drop_it(tmp_path):
    from platforms.procs import NoProcesses
    from platforms.sysfs import DirSysfs

    assert Actuator(DirSysfs(tmp_path), NoProcesses()).rt_cover_rules is False
    assert Actuator(DirSysfs(tmp_path), NoProcesses(), live_jobs=True).rt_cover_rules is True
    with pytest.raises(ValueError, match="cover rules"):
        Actuator(DirSysfs(tmp_path), NoProcesses(), live_jobs=True, rt_cover_rules=False)


def test_demoted_deadline_jobs_ordered_by_nice_are_not_counted_as_best_effort():
    """Two deadline jobs on every CPU at FIFO 80 and 79 both run SCHED_OTHER, the second
    niced below the first; `niced_below` (cover_niced_jobs: best-effort jobs niced below a
    demoted one) counted it although no best-effort job ran."""
    platform, plant, (a, b), obs, every = _board(_dl("a", "lo"), _dl("b", "lo"))
    act = Actuator(platform.sysfs, platform.procs, rt_cover_rules=True)
    report = act.apply(Decision({}, jobs={a: JobSetting(every, 80), b: JobSetting(every, 79)}), obs)
    assert sorted(report.fifo_dropped) == sorted([a, b]) and report.niced_below == []
    assert plant.jobs[a].nice == 0 and plant.jobs[b].nice > 0  # the decided order, by nice
