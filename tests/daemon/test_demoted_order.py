"""A real-time job the daemon must run under SCHED_OTHER (it covers every online CPU, or its
owner may not take real-time priority) still stays ahead of the best-effort jobs that share
its CPUs: they are niced below it (``below_demoted``)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from agents.policy import JobSetting
from daemon.actuator import (
    DEMOTED_NICE_GAP,
    DEMOTED_ORDER_GAP,
    MAX_JOB_RT_PRIORITY,
    below_demoted,
    fifo_levels,
)


def test_a_best_effort_job_on_a_demoted_jobs_cpus_is_niced_below_it():
    decided = {1: JobSetting((0, 1, 2, 3), 90), 2: JobSetting((2, 3)), 3: JobSetting((4, 5))}
    safe = {1: JobSetting((0, 1, 2, 3), 0), 2: JobSetting((2, 3)), 3: JobSetting((4, 5))}
    out = below_demoted(decided, safe)
    assert out[1] == safe[1]
    assert out[2] == JobSetting((2, 3), 0, DEMOTED_NICE_GAP)
    assert out[3] == safe[3]  # other CPUs: untouched


def test_demoted_jobs_keep_the_decided_order_between_them():
    """Two deadline jobs the decision ran at FIFO 80 and 79 on denver, next to a HI job on
    the a57 cluster: together they held every CPU, so both ran SCHED_OTHER at nice 0 and
    shared denver as equals; the gate's deadline order was lost and the tighter one missed
    (tx2, mix 900000, with the board's cover rules)."""
    decided = {
        1: JobSetting((0, 3, 4, 5), 50),
        2: JobSetting((1, 2), 80),
        3: JobSetting((1, 2), 79),
        4: JobSetting((1, 2)),
    }
    safe = {1: decided[1], 2: JobSetting((1, 2)), 3: JobSetting((1, 2)), 4: JobSetting((1, 2))}
    out = below_demoted(decided, safe)
    assert out[1] == decided[1] and out[2].nice == 0
    assert out[3].nice == DEMOTED_ORDER_GAP
    assert out[4].nice == min(19, DEMOTED_ORDER_GAP + DEMOTED_NICE_GAP)
    # on CPUs of their own, demoted jobs keep their nice
    apart = {2: JobSetting((1,)), 3: JobSetting((2,))}
    assert below_demoted({2: JobSetting((1,), 80), 3: JobSetting((2,), 79)}, apart) == apart


def test_nothing_changes_while_real_time_holds():
    decided = {1: JobSetting((0, 1), 90), 2: JobSetting((0, 1))}
    safe = {1: JobSetting((0, 1), 36), 2: JobSetting((0, 1))}
    assert below_demoted(decided, safe) == safe


def test_a_job_on_any_cpu_shares_every_cpu():
    decided = {1: JobSetting((0,), 90), 2: JobSetting(())}
    safe = {1: JobSetting((0,), 0), 2: JobSetting(())}
    assert below_demoted(decided, safe)[2].nice == DEMOTED_NICE_GAP


cpus = st.frozensets(st.integers(0, 5), max_size=6).map(lambda s: tuple(sorted(s)))
setting = st.builds(JobSetting, cpus, st.sampled_from([0, 0, 50, 90]), st.integers(-20, 19))


@given(st.dictionaries(st.integers(1, 8), st.tuples(setting, st.booleans()), max_size=6))
def test_best_effort_is_never_above_a_demoted_job_it_shares_cpus_with(jobs):
    decided = {pid: s for pid, (s, _) in jobs.items()}
    safe = {
        pid: JobSetting(s.cpus, 0 if demote else s.rt_priority, s.nice)
        for pid, (s, demote) in jobs.items()
    }
    out = below_demoted(decided, safe)
    assert out.keys() == safe.keys()
    demoted = {p for p in safe if decided[p].rt_priority > 0 and safe[p].rt_priority == 0}
    for pid, s in out.items():
        assert -20 <= s.nice <= 19 and s.cpus == safe[pid].cpus
        assert s.rt_priority == safe[pid].rt_priority
        assert s.nice >= safe[pid].nice  # only ever lowered in weight
        if decided[pid].rt_priority > 0 and pid not in demoted:
            assert s == safe[pid]  # still real-time: untouched
            continue
        for other in demoted:
            d = out[other]
            if other == pid or not (not d.cpus or not s.cpus or set(d.cpus) & set(s.cpus)):
                continue
            if pid not in demoted:  # best-effort: below every demoted job on its CPUs
                assert s.nice >= min(19, d.nice + DEMOTED_NICE_GAP)
            elif decided[other].rt_priority > decided[pid].rt_priority:  # the decided order
                assert s.nice >= min(19, d.nice + DEMOTED_ORDER_GAP)


def test_neighbouring_priorities_stay_apart_when_scaled():
    """Plain scaling to 1..40 would give 89 and 90 the same FIFO level."""
    assert round(89 * MAX_JOB_RT_PRIORITY / 99) == round(90 * MAX_JOB_RT_PRIORITY / 99)
    lv = fifo_levels({90, 89, 85})
    assert lv[85] < lv[89] < lv[90] <= MAX_JOB_RT_PRIORITY
    assert fifo_levels({90}) == {90: round(90 * MAX_JOB_RT_PRIORITY / 99)}
    assert fifo_levels({0, 99}) == {99: MAX_JOB_RT_PRIORITY}  # rt 0 is SCHED_OTHER, not a level


@given(st.frozensets(st.integers(1, 99), max_size=60))
def test_fifo_levels_keep_the_order_in_range(prios):
    lv = fifo_levels(prios)
    assert set(lv) == set(prios)
    ups = sorted(prios)
    assert all(1 <= lv[p] <= MAX_JOB_RT_PRIORITY for p in ups)
    assert all(lv[a] <= lv[b] for a, b in zip(ups, ups[1:]))  # never inverted
    if len(ups) <= MAX_JOB_RT_PRIORITY:
        assert all(lv[a] < lv[b] for a, b in zip(ups, ups[1:]))  # strict while levels last
