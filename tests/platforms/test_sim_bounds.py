"""platforms.bounds: makespan bounds, lower convex hull, critical speed, energy lower bounds."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from platforms.bounds import (
    PowerCurve,
    critical_speed,
    critical_speed_continuous,
    dag_energy_lower_bound,
    energy_lower_bound,
    energy_per_cycle,
    hetero_energy_lower_bound,
    hull_power,
    lower_hull,
    makespan_bounds,
    work_span_bounds,
)
from platforms.dag import DagBuilder, make_dag
from platforms.sim.params import parse_sim
from platforms.sim.plant import Plant, SimJob
from platforms.sim.power import core_power_curve
from platforms.spec import load_board

TX2 = load_board("tx2")


def test_work_span_bounds():
    b = work_span_bounds(10.0, 4.0, 3)
    assert (b.lower_s, b.graham_s) == (4.0, 6.0)
    assert work_span_bounds(12.0, 1.0, 4).lower_s == 3.0
    assert work_span_bounds(5.0, 5.0, 8).graham_s == 5.0  # a chain gains nothing
    with pytest.raises(ValueError):
        work_span_bounds(1.0, 2.0, 2)
    with pytest.raises(ValueError):
        work_span_bounds(1.0, 0.5, 0)


def test_makespan_bounds_of_a_fork_join_dag():
    b = DagBuilder("fj")
    root = b.add(1e9)
    kids = [b.add(2e9, 0.5, (root,)) for _ in range(4)]
    b.add(1e9, 0.0, kids)
    dag = b.build()
    mb = makespan_bounds(dag, 1e9, capacity=2.0, m=2)
    # at 1 GHz on capacity 2: root 0.5 s, kids 1.5 s each, join 0.5 s
    assert mb.work_s == pytest.approx(7.0) and mb.span_s == pytest.approx(2.5)
    assert mb.lower_s == pytest.approx(3.5) and mb.graham_s == pytest.approx(2.5 + 4.5 / 2)


curves = st.lists(st.floats(0.01, 5.0), min_size=1, max_size=12).map(
    lambda ps: PowerCurve(tuple(1e8 * (i + 1) for i in range(len(ps))), tuple(ps))
)


@settings(max_examples=200, deadline=None)
@given(curve=curves, frac=st.floats(0.0, 1.0))
def test_lower_hull_is_convex_and_below_every_opp(curve, frac):
    h = lower_hull(curve)
    f, p = curve.freqs_hz, curve.power_w
    assert h[0] == 0 and h[-1] == len(f) - 1
    slopes = [(p[b] - p[a]) / (f[b] - f[a]) for a, b in zip(h, h[1:])]
    assert all(s2 > s1 for s1, s2 in zip(slopes, slopes[1:]))
    for k in range(len(f)):
        assert hull_power(curve, f[k]) <= p[k] + 1e-12
    s = f[0] + frac * (f[-1] - f[0])
    fc = critical_speed(curve)
    assert energy_per_cycle(curve, fc) <= energy_per_cycle(curve, s) + 1e-18


def test_critical_speed_extremes_and_continuous_formula():
    f = tuple(x * 1e8 for x in range(1, 11))
    dyn_only = PowerCurve(f, tuple(1e-27 * x**3 for x in f))
    assert critical_speed(dyn_only) == f[0]  # without static power the slowest OPP wins
    static_heavy = PowerCurve(f, tuple(5.0 + 1e-27 * x**3 for x in f))
    assert critical_speed(static_heavy) == f[-1]  # race to idle
    p_ind, c_e, alpha = 0.2, 1e-28, 3.0
    fs = critical_speed_continuous(p_ind, c_e, alpha)
    grid = np.linspace(fs / 3, fs * 3, 20001)
    assert grid[np.argmin((p_ind + c_e * grid**alpha) / grid)] == pytest.approx(fs, rel=1e-3)


def test_energy_bound_shape():
    curve = core_power_curve(TX2, "a57")
    w, l_ = 4e10, 1e10
    loose = energy_lower_bound(w, l_, 4, 100.0, curve)
    tight = energy_lower_bound(w, l_, 4, 6.0, curve)
    assert loose.feasible and tight.feasible
    assert tight.lower_j >= loose.lower_j > 0
    assert loose.work_j == pytest.approx(w * energy_per_cycle(curve, critical_speed(curve)))
    infeasible = energy_lower_bound(w, l_, 4, 1e10 / curve.freqs_hz[-1] * 0.9, curve)
    assert not infeasible.feasible and math.isinf(infeasible.lower_j)


def test_hetero_bound_is_below_each_core_type():
    spec = load_board("rubikpi3")
    cs = [core_power_curve(spec, c.name) for c in spec.clusters]
    w = 1e10
    het = hetero_energy_lower_bound(w, cs)
    for c in cs:
        assert het <= w / c.capacity * energy_per_cycle(c, critical_speed(c)) + 1e-12


@pytest.mark.parametrize("khz,m", [(2035200, 4), (1113600, 2), (499200, 3), (652800, 1)])
def test_simulated_cpu_energy_is_above_the_energy_lower_bound(khz, m):
    rng = np.random.default_rng(khz + m)
    n = 60
    dst = [i for i in range(1, n) if rng.random() < 0.6]
    src = [int(rng.integers(0, i)) for i in dst]
    dag = make_dag("e", rng.uniform(1e7, 1e8, n), rng.uniform(0, 2e-3, n), src, dst)
    params = dataclasses.replace(parse_sim(TX2), exec_jitter=0.0)
    plant = Plant(TX2, params=params, governor="userspace")
    plant.set_freq("a57", khz)
    plant.advance(0.01)
    e0 = plant.cpu_energy_j
    pid = plant.submit(SimJob(dag, "e"))
    plant.set_affinity(pid, TX2.cluster("a57").cpus[:m])
    plant.run_until_idle()
    makespan = plant.jobs[pid].makespan_s
    bound = dag_energy_lower_bound(dag, core_power_curve(TX2, "a57", params=params), m, makespan)
    assert bound.feasible
    assert plant.cpu_energy_j - e0 >= bound.lower_j > 0
