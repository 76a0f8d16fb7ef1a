"""A simulated campaign run meters the job, not the control loop's idle tail after it."""

from __future__ import annotations

import pytest

from agents.governors import make_governor
from bots_bench.campaign_sim import SimRunConfig, run_one


def _fixed_top(period_s: float):
    """``performance`` deciding every ``period_s``: the same settings at any period."""
    gov = make_governor("performance")
    gov.period_s = period_s
    return gov


@pytest.mark.parametrize("bench", ["fib", "sparselu"])
def test_the_same_settings_at_another_period_cost_the_same_energy(bench):
    recs = {}
    for period in (0.01, 0.05):
        cfg = SimRunConfig(bench=bench, cls="test", policy=f"top-{period}", seed=0, board="tx2")
        recs[period] = run_one(cfg, lambda name, spec, p=period: (_fixed_top(p), []))
        assert recs[period]["ok"], recs[period]["error"]
    fast, slow = recs[0.01], recs[0.05]
    assert fast["makespan_s"] == pytest.approx(slow["makespan_s"], rel=1e-6)
    # before the fix the 50 ms run paid its longer idle tail: several % of a short run
    assert fast["energy_j"] == pytest.approx(slow["energy_j"], rel=1e-3)
    assert fast["cpu_energy_j"] == pytest.approx(slow["cpu_energy_j"], rel=1e-3)
    assert fast["edp"] == pytest.approx(fast["energy_j"] * fast["makespan_s"])
