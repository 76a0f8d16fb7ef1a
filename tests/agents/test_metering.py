"""Metered power for rewards: the plant's meter fills rails the board cannot see, nothing else."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from agents.metering import METER_RAIL, metered, tick_power_w
from platforms.observation import Observation, RailObs


def _obs(t: float, rails=()) -> Observation:
    return Observation(t=t, board="b", clusters=(), zones=(), rails=tuple(rails))


def test_tick_power_is_the_mean_over_each_tick():
    # total energy grows at 2 W then 4 W; cpu at 1 W throughout
    trace = [(0.0, 0.0, 0.0), (1.0, 2.0, 1.0), (2.0, 6.0, 2.0)]
    total, cpu = tick_power_w([0.0, 0.5, 1.0], trace)
    np.testing.assert_allclose(total, [2.0, 2.0, 4.0])
    np.testing.assert_allclose(cpu, [1.0, 1.0, 1.0])


def test_tick_power_needs_a_trace():
    assert tick_power_w([0.0], []) is None
    assert tick_power_w([0.0], [(1.0, 0.0, 0.0)]) is None


def test_missing_rails_are_filled_from_the_meter():
    res = SimpleNamespace(energy_trace=((0.0, 0.0, 0.0), (2.0, 6.0, 2.0)))
    out = metered([_obs(0.0), _obs(1.0)], res)
    assert [o.total_power_w for o in out] == pytest.approx([3.0, 3.0])
    assert [o.cpu_power_w for o in out] == pytest.approx([1.0, 1.0])
    assert {r.name for r in out[0].rails} == {METER_RAIL, METER_RAIL + "-cpu"}


def test_sensor_samples_give_way_to_the_meter_other_rails_stay():
    res = SimpleNamespace(energy_trace=((0.0, 0.0, 0.0), (2.0, 6.0, 2.0)))
    seen = [
        _obs(
            0.0,
            [
                RailObs("VDD_IN", "total", 5000.0),
                RailObs("CPU", "cpu", 700.0),
                RailObs("DDR", "sub", 300.0),
            ],
        )
    ]
    out = metered(seen, res)
    assert out[0].total_power_w == pytest.approx(3.0) and out[0].cpu_power_w == pytest.approx(1.0)
    assert out[0].rail("sub").power_mw == 300.0


def test_without_a_meter_nothing_changes():
    seen = [_obs(0.0), _obs(1.0)]
    assert metered(seen, SimpleNamespace()) == seen


def test_simulated_run_records_the_plant_meter():
    from agents.governors import make_governor
    from bots_bench.workload import WorkloadSpec, default_items
    from daemon.simrun import run_sim
    from platforms.spec import load_board

    spec = load_board("rubikpi3")
    items = default_items(spec, 1, WorkloadSpec(duration_s=0.5, load=0.6, cls="test"))[:2]
    res = run_sim("rubikpi3", make_governor("maxfreq"), items, seed=1, period_s=0.05)
    t, e, c = np.array(res.energy_trace).T
    assert np.all(np.diff(t) >= 0) and np.all(np.diff(e) >= -1e-12) and np.all(np.diff(c) >= -1e-12)
    assert e[-1] == pytest.approx(res.energy_j) and c[-1] == pytest.approx(res.cpu_energy_j)
    assert 0 < c[-1] < e[-1]
    # `daemon --sim` keeps no per-tick trace (a day-long run grew by hundreds of MB with it),
    # only the final reading, and the run is the same
    lean = run_sim(
        "rubikpi3", make_governor("maxfreq"), items, seed=1, period_s=0.05, keep_energy_trace=False
    )
    assert len(res.energy_trace) > 5 and lean.energy_trace == res.energy_trace[-1:]
    assert lean.energy_j == res.energy_j


def test_a_run_is_metered_to_its_last_finish_whatever_the_policy_period():
    """The loop stops at its first tick after the last job finished, up to a period later;
    what the jobs cost must not depend on that period (a 50 ms policy against a 10 ms one)."""
    from agents.governors import make_governor
    from bots_bench.workload import WorkloadSpec, default_items
    from daemon.simrun import run_sim
    from platforms.spec import load_board

    spec = load_board("tx2")
    items = default_items(spec, 3, WorkloadSpec(duration_s=0.5, load=0.6, cls="test"))[:2]
    runs = {
        p: run_sim("tx2", make_governor("maxfreq"), items, seed=3, period_s=p) for p in (0.01, 0.05)
    }
    for res in runs.values():
        last = max(j.finish_t for j in res.jobs)
        t, e, c = np.array(res.energy_trace).T
        assert res.t_end > last  # the idle tail the loop ran on
        total, cpu = res.jobs_energy()
        assert total < res.energy_j and cpu < res.cpu_energy_j
        # the trace's cumulative meter at the finish, within its piecewise-linear reading
        assert total == pytest.approx(float(np.interp(last, t, e)), rel=2e-3)
    fast, slow = runs[0.01], runs[0.05]
    assert fast.makespan_s == pytest.approx(slow.makespan_s, rel=1e-3)
    assert fast.jobs_energy()[0] == pytest.approx(slow.jobs_energy()[0], rel=2e-3)
    # the whole run's energy is not comparable: it grows with the tail
    assert slow.t_end - max(j.finish_t for j in slow.jobs) > fast.t_end - max(
        j.finish_t for j in fast.jobs
    )


def test_a_run_cut_short_has_no_jobs_energy():
    from agents.governors import make_governor
    from bots_bench.workload import WorkloadSpec, default_items
    from daemon.simrun import run_sim
    from platforms.spec import load_board

    spec = load_board("tx2")
    items = default_items(spec, 3, WorkloadSpec(duration_s=0.5, load=0.6, cls="test"))[:2]
    res = run_sim("tx2", make_governor("maxfreq"), items, seed=3, period_s=0.05, duration_s=0.05)
    assert any(j.finish_t is None for j in res.jobs)
    assert res.jobs_energy_j is None
    assert res.jobs_energy() == (res.energy_j, res.cpu_energy_j)
