"""The shield's response-time data and predictor.

Every deadline job's rows are recorded during training and calibration episodes
(:class:`RtCollector`, the features of :func:`agents.rtfeatures.rt_features` and the log of the
job's remaining response time); :func:`fit_response_time` fits gradient-boosted trees on the
training rows and a one-sided split-conformal q on held-out calibration jobs (one score per
job, its largest residual: :func:`job_scores`), and :func:`coverage` is the empirical check of
that bound on further held-out jobs. The board pipeline (:mod:`agents.trainboard`) exports the
predictor to ONNX and the scores to the reference file the daemon calibrates from.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from agents.policy import Decision
from agents.rtfeatures import rt_features
from platforms.observation import Observation


class RtCollector:
    """A last decision stage recording (t, pid, RT features) of every deadline job."""

    def __init__(self):
        self.rows: list[tuple[float, int, np.ndarray]] = []

    def __call__(self, decision: Decision, obs: Observation) -> Decision:
        for j in obs.jobs:
            if j.deadline_s is None or j.profile is None:
                continue
            x = rt_features(obs, decision, j.pid)
            if x is not None:
                self.rows.append((obs.t, j.pid, x))
        return decision

    def dataset(self, result) -> tuple[np.ndarray, np.ndarray]:
        """(X, log remaining response time) for the jobs that finished."""
        X, y, _ = self.dataset_with_jobs(result)
        return X, y

    def dataset_with_jobs(self, result) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`dataset` and the pid of each row's job."""
        fin = {j.pid: j.finish_t for j in getattr(result, "jobs", []) if j.finish_t is not None}
        xs, ys, pids = [], [], []
        for t, pid, x in self.rows:
            if pid in fin and fin[pid] > t:
                xs.append(x)
                ys.append(math.log(max(fin[pid] - t, 1e-4)))
                pids.append(pid)
        if not xs:
            return np.zeros((0, 8), np.float32), np.zeros(0), np.zeros(0, np.int64)
        return np.stack(xs), np.array(ys), np.array(pids, np.int64)


@dataclass
class RtModel:
    estimator: object
    scores: np.ndarray  # signed calibration residuals (log scale)
    q: float
    alpha: float
    n_train: int
    n_cal: int

    def predict(self, X: np.ndarray) -> np.ndarray:
        return self.estimator.predict(np.asarray(X, np.float32))


def job_scores(scores: np.ndarray, jobs: np.ndarray) -> np.ndarray:
    """Each job's largest residual: its bound holds at every decision iff it holds at that."""
    if len(scores) == 0:
        return np.zeros(0)
    order = np.argsort(jobs, kind="stable")
    _, starts = np.unique(jobs[order], return_index=True)
    return np.maximum.reduceat(np.asarray(scores)[order], starts)


def fit_response_time(
    X: np.ndarray,
    y: np.ndarray,
    X_cal: np.ndarray,
    y_cal: np.ndarray,
    alpha: float,
    seed: int,
    jobs_cal: np.ndarray | None = None,
) -> RtModel:
    """Gradient-boosted trees on log response time; split-conformal q on the calibration set.

    With ``jobs_cal`` (a job id per calibration row) the conformal scores are one per job,
    its largest residual. The rows of one job, tick after tick, are far from exchangeable
    draws (the effective sample is nearer the jobs than the rows, and a row quantile's
    coverage swung 0.87-0.94 from one calibration set to another); jobs are the unit that
    is, and a q from them bounds every decision of a job at once with probability 1 - alpha.
    """
    from sklearn.ensemble import GradientBoostingRegressor

    from agents.shield import SplitConformal

    est = GradientBoostingRegressor(
        n_estimators=120, max_depth=3, learning_rate=0.1, subsample=0.8, random_state=seed
    )
    est.fit(np.asarray(X, np.float32), y)
    pred = est.predict(np.asarray(X_cal, np.float32))
    scores = np.asarray(y_cal) - pred
    if jobs_cal is not None:
        scores = job_scores(scores, np.asarray(jobs_cal))
    cal = SplitConformal(alpha).fit(scores)
    return RtModel(est, cal.scores_, float(cal.q_), alpha, len(y), len(scores))


def coverage(
    model: RtModel,
    X: np.ndarray,
    y: np.ndarray,
    q: float | None = None,
    jobs: np.ndarray | None = None,
) -> float:
    """Empirical P(y <= prediction + q) on held-out data: per row, or with ``jobs`` (a job id
    per row) per job, a job covered when every one of its rows is."""
    if len(y) == 0:
        return math.nan
    qq = model.q if q is None else q
    scores = np.asarray(y) - model.predict(X)
    if jobs is not None:
        scores = job_scores(scores, np.asarray(jobs))
    return float(np.mean(scores <= qq))


def collect_rt_jobs(
    policy_factory: Callable[[RtCollector], object],
    run_episode: Callable[..., object],
    make_mix: Callable[[int], list],
    seeds: list[int],
    on_episode: Callable[[int], None] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Run ``policy_factory(collector)`` on the given seeds: the response-time rows, their
    targets and a job id per row (unique across the episodes). ``on_episode(k)`` is called
    after the k-th episode (1-based: progress). The episode results are not kept: 512 of
    them (the shield's calibration and coverage runs) held about 400 MB."""
    xs, ys, js = [], [], []
    for k, s in enumerate(seeds):
        coll = RtCollector()
        pol = policy_factory(coll)
        X, y, pids = coll.dataset_with_jobs(run_episode(pol, make_mix(s), s))
        xs.append(X)
        ys.append(y)
        js.append(pids + k * (1 << 32))
        if on_episode is not None:
            on_episode(k + 1)
    X = np.concatenate(xs) if xs else np.zeros((0, 8), np.float32)
    y = np.concatenate(ys) if ys else np.zeros(0)
    j = np.concatenate(js) if js else np.zeros(0, np.int64)
    return X, y, j
