"""The deadline feasibility check: when it says no policy meets every deadline, none does."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents.factory import make_policy_stack
from agents.governors import make_governor
from daemon.simrun import run_sim
from platforms.sim.energy_floor import FloorJob
from platforms.sim.feasibility import window_load, worst_window
from platforms.sim.plant import SimJob
from platforms.spec import load_board
from tests.platforms.test_energy_floor import chain, fan


def cl(n: int, speed: float):
    return SimpleNamespace(n=n, speed=speed)


def test_window_load_puts_stalls_on_the_slowest_cores():
    slow_first = [cl(2, 1e9), cl(2, 2e9)]
    # 1 s of stall fills one slow core: 1e9 + 2 x 2e9 cycles of room are left
    assert window_load(5e9, 1.0, 1.0, slow_first) == pytest.approx(1.0)
    assert window_load(2.5e9, 1.0, 1.0, slow_first) == pytest.approx(0.5)
    # more stall than the four cores have: the stall's share of the core time
    assert window_load(0.0, 6.0, 1.0, slow_first) == pytest.approx(1.5)
    assert window_load(0.0, 0.0, 0.0, slow_first) == 0.0
    assert math.isinf(window_load(1.0, 0.0, 0.0, slow_first))


def test_a_critical_path_longer_than_the_deadline_is_infeasible():
    spec = load_board("tx2")
    fastest = max(c.capacity * c.fmax_khz * 1e3 for c in spec.clusters)
    dag = chain(4, 1e8)  # 4e8 cycles in a row
    path = 4e8 / fastest
    ok = worst_window(spec, [FloorJob(1.0, dag, 1.0 + 1.01 * path)])
    assert ok is not None and not ok.infeasible
    late = worst_window(spec, [FloorJob(1.0, dag, 1.0 + 0.99 * path)])
    assert late.infeasible and late.jobs == (0,) and "critical path" in late.reason


def test_two_jobs_in_one_window_overload_it():
    spec = load_board("tx2")
    dag = fan(30, 2e8)  # 32 tasks of 0.1-0.15 s: far more parallel than 6 cores
    one = worst_window(spec, [FloorJob(0.0, dag, 0.8)])
    assert one is not None and not one.infeasible
    both = worst_window(spec, [FloorJob(0.0, dag, 0.8), FloorJob(0.1, dag, 0.8)])
    assert both.infeasible and both.jobs == (0, 1)
    assert both.load > one.load
    # a job without a deadline adds nothing; no deadline at all: nothing to check
    assert worst_window(spec, [FloorJob(0.0, dag, 0.8), FloorJob(0.0, dag)]).load == one.load
    assert worst_window(spec, [FloorJob(0.0, dag)]) is None


def test_fewer_online_cores_hold_less():
    spec = load_board("tx2")
    jobs = [FloorJob(0.0, fan(30, 2e8), 1.5)]
    assert worst_window(spec, jobs, online=spec.cpus[:2]).load > worst_window(spec, jobs).load
    with pytest.raises(ValueError, match="no online core"):
        worst_window(spec, jobs, online=[99])


POLICIES = {
    "maxfreq": lambda board: (make_governor("maxfreq"), []),
    "schedutil": lambda board: (make_governor("schedutil"), []),
    "hidvfs": lambda board: make_policy_stack("hidvfs", load_board(board)),
}

mixes = st.lists(
    st.tuples(
        st.sampled_from(["chain", "fan"]),
        st.floats(5e7, 3e8),  # cycles per task
        st.floats(0.0, 0.01),  # stall per task
        st.floats(0.0, 0.3),  # release
        st.floats(0.8, 4.0),  # deadline, x the job's least time alone on the board
    ),
    min_size=1,
    max_size=4,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    board=st.sampled_from(["tx2", "orin-nx", "rubikpi3"]),
    policy=st.sampled_from(sorted(POLICIES)),
    mix=mixes,
    seed=st.integers(0, 50),
)
def test_a_run_that_meets_every_deadline_is_never_called_infeasible(board, policy, mix, seed):
    """Soundness: the check relaxes, it never adds a constraint a schedule must obey.
    (Deadlines of 0.8-4 x a job's least time alone: about half the runs meet them all.)"""
    spec = load_board(board)
    fastest = max(c.capacity * c.fmax_khz * 1e3 for c in spec.clusters)
    items = []
    for i, (kind, cyc, mem, rel, x) in enumerate(mix):
        dag = chain(4, cyc, mem) if kind == "chain" else fan(6, cyc, mem)
        tau = dag.cycles / fastest + dag.mem_s
        least = max(float(dag.span(tau)), float(tau.sum()) / len(spec.cpus))
        job = SimJob(dag=dag, name=f"{kind}#{i}", release_t=rel, deadline_s=x * least)
        items.append((job, None))
    pol, stages = POLICIES[policy](board)
    res = run_sim(board, pol, items, seed=seed, stages=stages)
    jobs = [
        FloorJob(j.release_t, res.executed_dags[j.pid], j.release_t + j.deadline_s)
        for j in res.jobs
    ]
    w = worst_window(spec, jobs)
    if all(j.deadline_met for j in res.jobs):
        assert not w.infeasible, w.reason
