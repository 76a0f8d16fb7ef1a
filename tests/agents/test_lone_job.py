"""What the README says of the shipped Jetson agents on a job alone (the main BOTS campaign):
they run it as fast as maxfreq for no more board energy. Their reward charges the whole
board's energy, and on the Jetsons the rest of the board pays for every second a job runs
(agents/TRAINING-LOG.md, stop 29). A retrain that breaks this must change the README too."""

from __future__ import annotations

import pytest

from bots_bench.campaign_sim import SimRunConfig, run_one
from tools.policies import build_policy_stack


@pytest.mark.parametrize("board", ["tx2", "orin-nx"])
@pytest.mark.parametrize("bench", ["fib", "health"])
def test_the_jetson_agents_run_a_lone_job_like_maxfreq(board, bench):
    recs = {
        pol: run_one(SimRunConfig(bench, "test", pol, 0, board), build_policy_stack)
        for pol in ("hidvfs", "maxfreq")
    }
    for r in recs.values():
        assert r["ok"], r["error"]
    h, m = recs["hidvfs"], recs["maxfreq"]
    assert h["makespan_s"] <= 1.01 * m["makespan_s"]
    assert h["energy_j"] <= 1.01 * m["energy_j"]
    assert h["edp"] <= 1.02 * m["edp"]
