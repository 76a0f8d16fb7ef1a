"""platforms.sim.energy_floor: no policy run on the plant spends less than the floor."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents.factory import make_policy_stack
from agents.governors import make_governor
from agents.static import StaticFraction
from daemon.simrun import run_sim
from platforms.dag import DagBuilder
from platforms.sim.energy_floor import (
    EnergyFloor,
    FloorJob,
    _core_energy,
    _Cores,
    episode_energy_floor,
    episode_min_time,
    yds_groups,
)
from platforms.sim.plant import SimJob
from platforms.spec import load_board


def test_yds_cuts_the_densest_interval_first():
    # B is dense inside A's window: it runs alone at 5 cycles/s, A fills the rest at 10/8
    groups = yds_groups([(0.0, 10.0, 10.0), (4.0, 6.0, 10.0)])
    assert groups == [pytest.approx((2.0, 10.0)), pytest.approx((8.0, 10.0))]


def test_yds_with_a_common_deadline_runs_suffixes_of_releases():
    # 2 cycles released at 0 and 8 at 1, all due at 2: the suffix from 1 is the densest
    groups = yds_groups([(0.0, 2.0, 2.0), (1.0, 2.0, 8.0)])
    assert groups == [pytest.approx((1.0, 8.0)), pytest.approx((1.0, 2.0))]
    # a job that cannot use the time before the next release leaves it idle
    groups = yds_groups([(0.0, 1.0, 1.0), (5.0, 6.0, 1.0)])
    assert sorted(g for g, _ in groups) == pytest.approx([1.0, 1.0])


def test_yds_a_tie_to_rounding_cuts_the_interval_holding_both_jobs():
    # [r2, 2] and [r1, 2] have the same density in floats (r1, r2 and c2 vanish next to 1):
    # cutting [r1, 2] first squeezed job 2 into [r2, r1], 1e111 times denser afterwards
    jobs = [(1.8270056094948457e-157, 2.0, 1.0), (1.3193223465273537e-278, 1.0, 1.4e-45)]
    assert yds_groups(jobs) == [pytest.approx((2.0, 1.0))]


jobs_st = st.lists(
    st.tuples(st.floats(0.0, 5.0), st.floats(0.1, 5.0), st.floats(0.0, 10.0)),
    min_size=1,
    max_size=6,
).map(lambda js: [(r, r + w, c) for r, w, c in js])


@given(jobs_st)
def test_yds_groups_keep_the_work_and_do_not_speed_up_later(jobs):
    groups = yds_groups(jobs)
    assert sum(c for _, c in groups) == pytest.approx(sum(c for _, _, c in jobs))
    lo, hi = min(r for r, _, _ in jobs), max(d for _, d, _ in jobs)
    assert sum(g for g, _ in groups) <= hi - lo + 1e-9
    dens = [c / g for g, c in groups]
    # each later cut is no denser than the one before (the YDS invariant)
    assert all(b <= a * (1 + 1e-9) + 1e-12 for a, b in zip(dens, dens[1:]))


@given(jobs_st)
def test_yds_beats_running_each_job_evenly_in_its_window(jobs):
    """For a convex cost of the rate (here rate^2), the YDS profile costs no more than
    every job spreading its work evenly over its own window (a feasible schedule)."""
    groups = yds_groups(jobs)
    yds = sum(c * c / g for g, c in groups)
    # the even schedule: sum the rates of overlapping windows on a fine grid
    edges = sorted({x for r, d, _ in jobs for x in (r, d)})
    even = 0.0
    for a, b in zip(edges, edges[1:]):
        rate = sum(c / (d - r) for r, d, c in jobs if r <= a and d >= b)
        even += rate * rate * (b - a)
    assert yds <= even * (1 + 1e-9) + 1e-12


def chain(n: int, cycles: float, mem_s: float = 0.0):
    b = DagBuilder("chain")
    prev: tuple[int, ...] = ()
    for _ in range(n):
        prev = (b.add(cycles, mem_s, prev),)
    return b.build()


def fan(n: int, cycles: float, mem_s: float = 0.0):
    b = DagBuilder("fan")
    root = b.add(cycles, mem_s)
    kids = [b.add(cycles, mem_s, (root,)) for _ in range(n)]
    b.add(cycles, mem_s, kids)
    return b.build()


def test_min_time_is_the_larger_of_path_and_work():
    # a chain of 4 x 1e9 cycles at 2e9 cycles/s: 2 s after its release at 1 s
    assert episode_min_time([FloorJob(1.0, chain(4, 1e9))], 2e9, 4) == pytest.approx(3.0)
    # 18 tasks of 1 s on 2 cores: the work bound, 9 s
    assert episode_min_time([FloorJob(0.0, fan(16, 2e9))], 2e9, 2) == pytest.approx(9.0)
    assert episode_min_time([], 2e9, 2) == 0.0


def test_core_energy_fills_the_cheapest_segments_and_refuses_too_much_work():
    cores = [_Cores(2, 0.1, ((1e-9, 1e9), (3e-9, 1e9)))]
    assert _core_energy(cores, 0.0, 2.0) == pytest.approx(0.4)  # 2 idle cores for 2 s
    # 3e9 cycles in 1 s: 2e9 on the cheap segment of both cores, 1e9 on the dear one
    assert _core_energy(cores, 3e9, 1.0) == pytest.approx(0.2 + 2.0 + 3.0)
    assert math.isinf(_core_energy(cores, 5e9, 1.0))


def test_saving_ceiling():
    fl = EnergyFloor(t_min_s=1.0, t_board_s=1.0, total_j=8.0, cpu_j=2.0)
    assert fl.saving_ceiling(10.0, 4.0) == pytest.approx((0.2, 0.5))
    assert fl.saving_ceiling(0.0, 0.0) == (0.0, 0.0)


def make_job(kind: str, size: float, mem: float, release: float, i: int) -> SimJob:
    dag = chain(4, size, mem) if kind == "chain" else fan(6, size, mem)
    return SimJob(dag=dag, name=f"{kind}#{i}", release_t=release)


POLICIES = {
    "maxfreq": lambda board: (make_governor("maxfreq"), []),
    "powersave": lambda board: (make_governor("powersave"), []),
    "schedutil": lambda board: (make_governor("schedutil"), []),
    "static0.6": lambda board: (StaticFraction(0.6), []),
    "hidvfs": lambda board: make_policy_stack("hidvfs", load_board(board)),
}

mixes = st.lists(
    st.tuples(
        st.sampled_from(["chain", "fan"]),
        st.floats(2e7, 2e8),
        st.floats(0.0, 0.02),
        st.floats(0.0, 0.5),
    ),
    min_size=1,
    max_size=3,
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    board=st.sampled_from(["tx2", "orin-nx", "rubikpi3"]),
    policy=st.sampled_from(sorted(POLICIES)),
    mix=mixes,
    seed=st.integers(0, 50),
)
def test_no_policy_spends_less_than_the_floor(board, policy, mix, seed):
    items = [(make_job(k, c, m, r, i), None) for i, (k, c, m, r) in enumerate(mix)]
    pol, stages = POLICIES[policy](board)
    res = run_sim(board, pol, items, seed=seed, stages=stages)
    jobs = [FloorJob(j.release_t, res.executed_dags[j.pid]) for j in res.jobs]
    fl = episode_energy_floor(load_board(board), jobs)
    assert res.t_end >= fl.t_min_s - 1e-9
    assert res.energy_j >= fl.total_j * (1 - 1e-9)
    assert res.cpu_energy_j >= fl.cpu_j * (1 - 1e-9)


def test_deadlines_raise_the_floor_and_unmeetable_ones_are_dropped():
    spec = load_board("tx2")
    dag = fan(6, 2e8, 0.005)
    loose = episode_energy_floor(spec, [FloorJob(0.0, dag), FloorJob(0.05, dag)])
    tight = episode_energy_floor(
        spec, [FloorJob(0.0, dag, deadline_t=0.2), FloorJob(0.05, dag, deadline_t=0.25)]
    )
    assert tight.deadlines and not loose.deadlines
    assert tight.cpu_j > loose.cpu_j
    # 1 ms for 8 tasks of 0.1 s: no schedule meets it, so the floor ignores deadlines
    impossible = episode_energy_floor(spec, [FloorJob(0.0, dag, deadline_t=0.001)])
    plain = episode_energy_floor(spec, [FloorJob(0.0, dag)])
    assert not impossible.deadlines
    assert impossible.total_j == pytest.approx(plain.total_j)


def test_fewer_online_cores_take_longer():
    spec = load_board("tx2")
    dag = fan(6, 2e8)
    one = episode_energy_floor(spec, [FloorJob(0.0, dag)], online=spec.cpus[:1])
    every = episode_energy_floor(spec, [FloorJob(0.0, dag)])
    assert one.t_min_s > every.t_min_s and math.isfinite(one.total_j)
    with pytest.raises(ValueError, match="no online core"):
        episode_energy_floor(spec, [FloorJob(0.0, dag)], online=[99])
