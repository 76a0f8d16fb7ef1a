"""The adaptive shield online: the bounds the shield issued for a job are scored, each against
the q it was issued with, against the job's real response when it ends, and the calibration
moves (Gibbs-Candes), one update and one pool score per job as the per-job calibration."""

from __future__ import annotations

import math

import numpy as np
import pytest

from agents.factory import make_policy_stack
from agents.policy import Decision, JobSetting
from agents.shield import AdaptiveConformal, Shield, SplitConformal
from agents.stages import ShieldStage
from daemon.config import parse_config, policy_options
from daemon.simrun import run_sim
from platforms.observation import ClusterObs, JobObs, JobProfile, Observation
from platforms.spec import load_board


class Recorder(AdaptiveConformal):
    def update_job(self, y, pred, q):
        self.calls = getattr(self, "calls", []) + [(list(y), list(pred), list(q))]
        return super().update_job(y, pred, q)


def _stage(cal):
    return ShieldStage(lambda x: x, Shield(lambda x: x, cal))


def test_job_done_scores_each_bound_against_the_real_remaining_time():
    cal = Recorder(0.1, gamma=0.05).fit([0.0, 0.1, 0.2])
    stage = _stage(cal)
    stage.pending[7] = [(1.0, math.log(2.0), 0.2), (2.0, math.log(1.5), 0.1)]
    assert stage.job_done(7, 3.5) == 2
    assert len(cal.calls) == 1  # one update for the job
    y, pred, q = cal.calls[0]
    assert y == pytest.approx([math.log(2.5), math.log(1.5)])
    assert pred == pytest.approx([math.log(2.0), math.log(1.5)]) and q == [0.2, 0.1]
    assert stage.job_done(7, 4.0) == 0 and 7 not in stage.pending  # scored once
    assert stage.calibration()["updates"] == 1
    # log(2.5) - log(2) = 0.223 > 0.2: the first bound missed, so the job did
    assert cal.misses_ == 1 and cal.alpha_now == pytest.approx(0.1 + 0.05 * (0.1 - 1.0))


def test_a_bound_is_scored_with_the_q_it_was_issued_with_not_the_current_one():
    cal = AdaptiveConformal(alpha=0.1, gamma=0.05, online=True).fit(np.linspace(-0.2, 0.2, 40))
    stage = _stage(cal)
    q_issue = cal.q()
    stage.pending[1] = [(0.0, 0.0, q_issue)]  # predicted 1 s, bound exp(q_issue) = 1.18 s
    for pid in range(2, 12):  # other jobs end far over their bounds: alpha_t falls, q grows
        stage.pending[pid] = [(0.0, 0.0, cal.q())]
        stage.job_done(pid, 2.0)
    assert cal.q() > math.log(1.3) > q_issue  # 1.3 s is inside the CURRENT bound
    misses, alpha_t = cal.misses_, cal.alpha_now
    stage.job_done(1, 1.3)  # but over the bound issued: a miss, alpha_t falls again
    assert cal.misses_ == misses + 1
    assert cal.alpha_now == pytest.approx(alpha_t + 0.05 * (0.1 - 1.0))
    # and the other way: issued with a large q, a response inside it is no miss
    stage.pending[50] = [(0.0, 0.0, 1.0)]
    misses = cal.misses_
    stage.job_done(50, 2.0)  # log 2 = 0.69 <= 1.0
    assert cal.misses_ == misses


def test_one_job_adds_one_score_its_largest_residual():
    cal = AdaptiveConformal(alpha=0.1, gamma=0.05).fit(np.linspace(-0.2, 0.2, 40))
    stage = _stage(cal)
    n0 = len(cal.sorted_)
    marks = [(0.05 * i, math.log(1.0 - 0.05 * i) - 0.01 * i, cal.q()) for i in range(10)]
    stage.pending[99] = marks
    assert stage.job_done(99, 1.0) == 10
    assert len(cal.sorted_) == n0 + 1 and cal.t_ == 1  # one score, one update
    assert cal.recent_[-1] == pytest.approx(0.09)  # the largest residual (the last bound's)
    assert 0.09 in [pytest.approx(s) for s in cal.sorted_]


def test_update_job_misses_when_any_bound_missed():
    cal = AdaptiveConformal(alpha=0.1, gamma=0.1, online=False).fit([0.0] * 20)
    assert cal.update_job([0.5, 0.5], [0.0, 0.0], [1.0, 0.4]) is True  # the second missed
    assert cal.update_job([0.5, 0.5], [0.0, 0.0], [1.0, 0.5]) is False  # closed set
    assert cal.update_job([9.0], [0.0], [math.inf]) is False  # infinite set: never a miss
    assert cal.update_job([-9.0], [0.0], [-math.inf]) is True  # empty set: always a miss
    assert cal.t_ == 4 and cal.misses_ == 2 and len(cal.sorted_) == 20  # not online
    with pytest.raises(ValueError, match="one y, pred and q"):
        cal.update_job([0.0], [0.0, 0.0], [0.0])
    with pytest.raises(ValueError, match="one y, pred and q"):
        cal.update_job([], [], [])


def test_update_scores_against_the_issued_q_when_given():
    cal = AdaptiveConformal(alpha=0.1, gamma=0.1).fit(np.linspace(0.0, 1.0, 30))
    assert cal.q() > 0.5
    assert cal.update(0.5, 0.0, q=0.4) is True  # issued with 0.4: missed
    assert cal.update(0.5, 0.0, q=0.6) is False


def test_the_stage_marks_each_bound_with_the_q_it_issues():
    """A tick of the stage stores q(alpha_t) with the mark; alpha_t then moves, and the job's
    end scores the stored q."""
    cl = ClusterObs("big", 0, (0, 1), (0, 1), (1000, 2000), 1.0, 1000, 1000, 2000, "userspace")
    prof = JobProfile(
        "x", work_s=1.0, span_s=0.1, beta=0.0, ref_makespan_s=1.0, ref_khz=2000, ref_cores=2
    )
    job = JobObs(5, "j5", "hi", 0.0, 0.0, 10.0, (0, 1), profile=prof)
    obs = Observation(0.0, "toy", (cl,), (), (), (job,))
    dec = Decision({"big": 1000}, {5: JobSetting((0, 1))})
    cal = AdaptiveConformal(alpha=0.1, gamma=0.05).fit(np.linspace(-0.2, 0.2, 40))
    # predicted log remaining time 0 (1 s) for every candidate
    stage = ShieldStage(lambda x: np.zeros(len(x)), Shield(lambda x: np.zeros(len(x)), cal))
    q_issue = cal.q()
    stage(dec, obs)
    assert stage.pending[5] == [(0.0, 0.0, q_issue)]
    cal.alpha_t_ = 0.01  # alpha_t moved (q grew) before the job ended
    assert cal.q() > math.log(1.3) > q_issue
    stage.job_done(5, 1.3)
    assert cal.misses_ == 1


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
    assert 0 < shield["updates"] <= dl_done  # one update per deadline job with a bound
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


def _two_jobs_one_cluster(cal):
    """Jobs A (earlier deadline) and B share a cluster at 1 GHz: A is certified at 1 GHz, B
    only at 2 GHz, so B raises the cluster A runs on (rows: log remaining response time)."""
    table = (1_000_000, 1_500_000, 2_000_000)
    cl = ClusterObs(
        "c0", 0, (0, 1, 2, 3), (0, 1, 2, 3), table, 1.0, table[0], *table[::2], "userspace"
    )
    prof = JobProfile("x", 1.0, 0.2, 0.0, 1.0, 2_000_000, 4)
    a = JobObs(1, "a", "lo", 0.0, 0.0, 5.0, cpus=(0, 1), profile=prof, progress=0.0)
    b = JobObs(2, "b", "lo", 0.0, 0.0, 6.0, cpus=(2, 3), profile=prof, progress=0.0)
    obs = Observation(0.0, "toy", (cl,), (), (), (a, b))
    rows = np.log([1.0, 0.8, 0.6, 9.0, 8.0, 2.0])
    stage = ShieldStage(lambda x: rows[: len(x)], Shield(None, cal))
    dec = Decision({"c0": 1_000_000}, {1: JobSetting((0, 1)), 2: JobSetting((2, 3))})
    return stage, stage(dec, obs), rows


def test_a_job_is_marked_and_scored_at_the_frequency_it_runs_at_not_the_one_certified():
    """F6: B raises the shared cluster to 2 GHz after A was certified at 1 GHz. A's mark is
    its prediction at 2 GHz (the executed action, models.md 2.5.2), so a response between the
    1 GHz and the 2 GHz bound is a miss and scores y - yhat(2 GHz), not the optimistic
    y - yhat(1 GHz)."""
    cal = AdaptiveConformal(alpha=0.1, gamma=0.05).fit(np.zeros(50))  # q = 0
    stage, out, rows = _two_jobs_one_cluster(cal)
    assert out.freq_khz["c0"] == 2_000_000
    assert stage.pending[1] == [(0.0, pytest.approx(rows[2]), 0.0)]  # A at 2 GHz, not 1 GHz
    assert stage.pending[2] == [(0.0, pytest.approx(rows[5]), 0.0)]
    # A ends after 0.8 s: inside the 1 GHz bound (1 s), over the 2 GHz one (0.6 s)
    assert stage.job_done(1, 0.8) == 1
    assert cal.misses_ == 1 and cal.alpha_now == pytest.approx(0.1 + 0.05 * (0.1 - 1.0))
    assert cal.recent_[-1] == pytest.approx(math.log(0.8 / 0.6))  # the executed residual


def test_a_raised_job_reports_the_bound_of_the_frequency_it_runs_at():
    """A's reported bound is at 2 GHz, at a fallback's share of alpha (2 GHz is one of A's
    candidates above its proposal); B's is the one its selection certified, unchanged."""
    cal = SplitConformal(alpha=0.1).fit(np.linspace(-0.1, 0.1, 201))
    stage, out, rows = _two_jobs_one_cluster(cal)
    assert out.freq_khz["c0"] == 2_000_000 and not stage.learns
    # among A's 3 candidates: the proposal at alpha / 2, each fallback at alpha / 4
    q_prop, q_fb = cal.q(0.05), cal.q(0.025)
    assert q_fb > q_prop > cal.q()
    assert stage.last_bounds[1] == pytest.approx(math.exp(rows[2] + q_fb))  # was exp(0 + q_prop)
    assert stage.last_bounds[2] == pytest.approx(math.exp(rows[5] + q_fb))  # B's own fallback
    assert stage.shield.quantiles(3) == pytest.approx((q_prop, q_fb))
