"""The adaptive shield online: every bound the shield issued for a job is scored against the
job's real response when it ends, and the calibration moves (Gibbs-Candes)."""

from __future__ import annotations

import math

import pytest

from agents.factory import make_policy_stack
from agents.hidvfs import ShieldStage
from agents.shield import AdaptiveConformal, Shield, SplitConformal
from daemon.config import parse_config, policy_options
from daemon.simrun import run_sim
from platforms.spec import load_board


class Recorder(AdaptiveConformal):
    def update(self, y, pred):
        self.calls = getattr(self, "calls", []) + [(y, pred)]
        return super().update(y, pred)


def test_job_done_scores_each_bound_against_the_real_remaining_time():
    cal = Recorder(0.1, gamma=0.05).fit([0.0, 0.1, 0.2])
    stage = ShieldStage(lambda x: x, Shield(lambda x: x, cal))
    stage.pending[7] = [(1.0, math.log(2.0)), (2.0, math.log(1.5))]
    assert stage.job_done(7, 3.5) == 2
    assert cal.calls == [
        pytest.approx((math.log(2.5), math.log(2.0))),
        pytest.approx((math.log(1.5), math.log(1.5))),
    ]
    assert stage.job_done(7, 4.0) == 0 and 7 not in stage.pending  # scored once
    assert stage.calibration()["updates"] == 2


def test_a_static_calibration_learns_nothing():
    stage = ShieldStage(lambda x: x, Shield(lambda x: x, SplitConformal(0.1).fit([0.0] * 20)))
    assert not stage.learns and stage.calibration() is None


def test_adaptive_hidvfs_updates_its_calibration_in_the_control_loop():
    from bots_bench.workload import WorkloadSpec, default_items

    spec = load_board("tx2")
    pol, stages = make_policy_stack("hidvfs", spec, adaptive_gamma=0.01)
    items = default_items(spec, 3, WorkloadSpec(duration_s=20.0, load=0.6, cls="test"))
    res = run_sim("tx2", pol, items, seed=3, stages=stages)
    shield = res.status["shield"]
    dl_done = sum(1 for j in res.jobs if j.deadline_s is not None and j.finish_t is not None)
    assert dl_done > 0 and shield["updates"] >= dl_done  # at least one bound per deadline job
    assert shield["alpha"] == pytest.approx(0.1)
    # alpha_t moved by gamma x (alpha - err) per update, as Gibbs-Candes prescribes
    n, miss = shield["updates"], shield["miss_rate"] * shield["updates"]
    assert shield["alpha_t"] == pytest.approx(0.1 + 0.01 * (0.1 * n - miss), abs=1e-6)
    plain, st = make_policy_stack("hidvfs", spec)
    assert run_sim("tx2", plain, items, seed=3, stages=st).status["shield"] is None


def test_config_turns_it_on_for_hidvfs_only():
    cfg = parse_config({"shield": {"adaptive": True, "gamma": 0.02}})
    assert policy_options(cfg) == {"adaptive_gamma": 0.02}
    assert policy_options(parse_config({"shield": {"adaptive": True}, "policy": "schedutil"})) == {}
    assert policy_options(parse_config({})) == {}
    with pytest.raises(Exception, match="shield.gamma"):
        parse_config({"shield": {"gamma": 0}})
