"""Split-conformal shield: certify an action only when its response-time bound meets the deadline.

Calibration (reference/models.md 2.1-2.4): signed scores s_i = y_i - y_hat_i on n held-out
points, q = s_(k) with k = ceil((n + 1)(1 - alpha)) the k-th smallest, q = +inf when k > n
(n < 1/alpha - 1), and the one-sided bound U(x) = y_hat(x) + q, so P(Y <= U) >= 1 - alpha
for exchangeable data. The direct index s_(k) is the definition (the code uses it);
``np.quantile(s, k/n, method="inverted_cdf")`` agrees with it up to the float rounding of
k/n (k/n * n need not be exactly k: a few (n, alpha) pairs land one order statistic off).
(``method="higher"`` at k/n returns s_(k+1) whenever k < n, one order statistic above.)

:class:`AdaptiveConformal` tracks a drifting miscoverage with the Gibbs-Candes update
alpha_{t+1} = alpha_t + gamma (alpha - err_t); alpha_t <= 0 gives an infinite bound (never
an error), alpha_t >= 1 an empty set (always an error).

:class:`Shield` is post-posed (models.md 3): it keeps the policy's proposal when its bound
meets the remaining deadline, else the cheapest certified candidate, else the
maximum-performance one. Choosing among K candidates by their bounds only has the union
bound sum_a alpha_a (models.md 2.5.1); keeping the proposal exactly where its own bound
passes is a selection too. With ``correct_selection`` every candidate, the proposal
included, is certified at a share of alpha that sums to alpha over the K: the proposal at
``alpha * proposal_share`` and each fallback at ``alpha (1 - proposal_share) / (K - 1)``
(weighted Bonferroni). The maximum-performance fallback is one of the K, so its reported
bound and ``certified`` flag are at its own share too (never at the full alpha, a bound
looked at after the others failed); it is reached only when no candidate passed at its
share, so it comes back uncertified. The default share is 1/2: the proposal is what runs
on most ticks, and at alpha / K for every candidate (``proposal_share=None``, the
reference's recipe) the rubikpi3 agents spent 2.9 % more energy on 60 tuning mixes, at 1/2
only 0.2 % more than the rule before stop 34 (agents/TRAINING-LOG.md). That rule kept the
proposal at alpha and corrected only the fallbacks, a union bound of alpha (2 - 1/K): a constructed pool of heteroscedastic
residuals reached 0.149 at alpha 0.1, K = 2. The claim is a violation rate under
exchangeability, never "never unsafe" (models.md 2.5, 3).
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

#: tolerance on (n + 1)(1 - alpha) so that 0.7 * 10 = 7.000000000000001 still gives k = 7
_EPS = 1e-9


def conformal_rank(n: int, alpha: float) -> int:
    """k = ceil((n + 1)(1 - alpha)): the rank of the calibration quantile (may exceed n)."""
    return math.ceil((n + 1) * (1.0 - alpha) - _EPS)


def min_calibration_size(alpha: float) -> int:
    """Smallest n with a finite quantile: n >= 1/alpha - 1 (19 at 0.05, 99 at 0.01)."""
    n = max(math.ceil(1.0 / alpha - 1.0 - _EPS), 0)
    while conformal_rank(n, alpha) > n:
        n += 1
    return n


def quantile_of_sorted(scores: Sequence[float] | np.ndarray, alpha: float) -> float:
    """s_(k) of ascending ``scores``; +inf when k > n (or alpha <= 0), -inf when alpha >= 1."""
    n = len(scores)
    if alpha >= 1.0:
        return -math.inf
    if alpha <= 0.0:
        return math.inf
    k = conformal_rank(n, alpha)
    if k > n:
        return math.inf
    return float(scores[k - 1])


def _scores(residuals: Any) -> np.ndarray:
    r = np.asarray(residuals, dtype=np.float64).reshape(-1)
    if not np.all(np.isfinite(r)):
        bad = int(np.flatnonzero(~np.isfinite(r))[0])
        raise ValueError(f"residuals must be finite; residual {bad} is {float(r[bad])!r}")
    return np.sort(r)


def _check_alpha(owner: str, alpha: float) -> None:
    if not (isinstance(alpha, (int, float)) and 0.0 < alpha < 1.0):
        raise ValueError(
            f"The 'alpha' parameter of {owner} must be in (0, 1). Got {alpha!r} instead."
        )


class Calibrator(Protocol):
    """What the shield needs from a calibrator."""

    @property
    def alpha_now(self) -> float: ...

    def q(self, alpha: float | None = None) -> float: ...


class SplitConformal:
    """One-sided split-conformal bound on signed residuals (y - y_hat).

    Parameters: ``alpha`` miscoverage. Attributes after :meth:`fit`: ``scores_`` (sorted),
    ``n_``, ``k_`` (rank, may exceed n) and ``q_`` (+inf when n < 1/alpha - 1).
    """

    def __init__(self, alpha: float = 0.1):
        self.alpha = alpha

    def fit(self, residuals: Any) -> SplitConformal:
        _check_alpha("SplitConformal", self.alpha)
        self.scores_ = _scores(residuals)
        self.n_ = int(self.scores_.shape[0])
        self.k_ = conformal_rank(self.n_, self.alpha)
        self.q_ = quantile_of_sorted(self.scores_, self.alpha)
        return self

    def _check_fitted(self) -> None:
        if not hasattr(self, "q_"):
            raise RuntimeError("SplitConformal is not fitted; call fit(residuals) first")

    @property
    def alpha_now(self) -> float:
        return self.alpha

    def q(self, alpha: float | None = None) -> float:
        """The score quantile at ``alpha`` (default: the fitted one)."""
        self._check_fitted()
        if alpha is None or alpha == self.alpha:
            return self.q_
        return quantile_of_sorted(self.scores_, alpha)

    def upper(self, pred: Any) -> Any:
        """pred + q (scalar or array); +inf when the calibration set is too small."""
        self._check_fitted()
        return pred + self.q_


class AdaptiveConformal:
    """Adaptive conformal inference (Gibbs & Candes 2021) on a one-sided signed-score bound.

    ``gamma`` is the step (the paper's default 0.005); ``window`` keeps only the last
    ``window`` scores (None: all); ``online`` adds each observed score to the pool. The
    long-run miss rate obeys |mean err - alpha| <= (max(alpha_1, 1 - alpha_1) + gamma)/(gamma T)
    for any sequence.

    err_t is 1{Y_t > yhat_t + q_t} with q_t the quantile the bound was ISSUED with (the
    set C_t(alpha_t) of the recursion), not the quantile when the outcome arrives: outcomes
    come late (a response time is known when its job ends), and alpha_t has moved since.

    Two units of update, matching two units of calibration:

    * :meth:`update`: one bound, one err, one score y - yhat (a pool of per-point scores).
    * :meth:`update_job`: all the bounds issued for one job, scored when it ends: ONE err
      (did any of its bounds miss?) and ONE score (its largest residual). This is the unit
      when the pool holds one score per job (the shipped shield: ``agents.rtmodel.job_scores``,
      TRAINING-LOG.md "stop 30"): q(alpha) of that pool bounds every decision of a job at once,
      so its miss event is "some bound of the job missed". Counting one err per bound
      instead would see a per-bound miss rate well below alpha at q(alpha) (a job's largest
      residual is above its others) and drive alpha_t up and q down until alpha of the
      BOUNDS miss: per-decision calibration back by the recursion, below 1 - alpha per job.
      One update per job also weighs a long job (many bounds) as much as a short one, as the
      calibration does. The guarantee is then on the long-run fraction of jobs that missed
      (T = jobs scored), up to the slack of the feedback delay (bounds in flight were issued
      at earlier alpha_t).
    """

    def __init__(
        self,
        alpha: float = 0.1,
        gamma: float = 0.005,
        alpha_init: float | None = None,
        window: int | None = None,
        online: bool = True,
    ):
        self.alpha = alpha
        self.gamma = gamma
        self.alpha_init = alpha_init
        self.window = window
        self.online = online

    def fit(self, residuals: Any) -> AdaptiveConformal:
        _check_alpha("AdaptiveConformal", self.alpha)
        if not (isinstance(self.gamma, (int, float)) and self.gamma > 0):
            raise ValueError(
                f"The 'gamma' parameter of AdaptiveConformal must be > 0. Got {self.gamma!r} instead."
            )
        if self.window is not None and not (isinstance(self.window, int) and self.window >= 1):
            raise ValueError(
                f"The 'window' parameter of AdaptiveConformal must be an int >= 1 or None. Got {self.window!r} instead."
            )
        s = _scores(residuals)
        order = np.asarray(residuals, dtype=np.float64).reshape(-1)
        if self.window is not None:
            order = order[-self.window :]
            s = np.sort(order)
        self.recent_: deque[float] = deque(order.tolist())
        self.sorted_: list[float] = s.tolist()
        self.alpha_t_ = float(self.alpha if self.alpha_init is None else self.alpha_init)
        self.alpha_1_ = self.alpha_t_
        self.t_ = 0
        self.misses_ = 0
        return self

    def _check_fitted(self) -> None:
        if not hasattr(self, "alpha_t_"):
            raise RuntimeError("AdaptiveConformal is not fitted; call fit(residuals) first")

    @property
    def alpha_now(self) -> float:
        self._check_fitted()
        return self.alpha_t_

    def q(self, alpha: float | None = None) -> float:
        self._check_fitted()
        return quantile_of_sorted(self.sorted_, self.alpha_t_ if alpha is None else alpha)

    def upper(self, pred: Any) -> Any:
        return pred + self.q()

    def update(self, y: float, pred: float, q: float | None = None) -> bool:
        """Record the outcome of one bound ``pred + q``; returns err_t (True = miss).

        ``q``: the quantile the bound was issued with (None: the current one, for a bound
        scored before any other update). The score ``y - pred`` joins the pool (``online``).
        """
        qi = self.q() if q is None else q
        return self._step(not (y <= pred + qi), float(y - pred))

    def update_job(
        self,
        y: Sequence[float] | np.ndarray,
        pred: Sequence[float] | np.ndarray,
        q: Sequence[float] | np.ndarray,
    ) -> bool:
        """Record the outcome of one job's issued bounds ``pred[i] + q[i]`` (``y[i]`` the
        realised value for bound i): one err (any bound missed) and one score (the largest
        residual ``y[i] - pred[i]``), as the per-job calibration pool. Returns err."""
        if not (len(y) == len(pred) == len(q)) or not len(y):
            raise ValueError(
                f"update_job needs one y, pred and q per bound, got {len(y)}, {len(pred)}, {len(q)}"
            )
        err = any(not (yi <= pi + qi) for yi, pi, qi in zip(y, pred, q))
        return self._step(err, max(float(yi - pi) for yi, pi in zip(y, pred)))

    def _step(self, err: bool, score: float) -> bool:
        """alpha_{t+1} = alpha_t + gamma (alpha - err_t); ``score`` joins the pool (``online``)."""
        self._check_fitted()
        self.alpha_t_ += self.gamma * (self.alpha - (1.0 if err else 0.0))
        self.t_ += 1
        self.misses_ += int(err)
        if self.online and math.isfinite(score):
            self.recent_.append(score)
            bisect.insort(self.sorted_, score)
            if self.window is not None and len(self.recent_) > self.window:
                old = self.recent_.popleft()
                del self.sorted_[bisect.bisect_left(self.sorted_, old)]
        return err

    @property
    def miss_rate(self) -> float:
        """Empirical long-run error rate so far (nan before the first update)."""
        return self.misses_ / self.t_ if self.t_ else math.nan

    def regret_bound(self) -> float:
        """The Gibbs-Candes bound on |miss_rate - alpha| after the updates seen so far."""
        if not self.t_:
            return math.inf
        return (max(self.alpha_1_, 1.0 - self.alpha_1_) + self.gamma) / (self.gamma * self.t_)


# --------------------------------------------------------------------------------------------
# The shield


@dataclass(frozen=True)
class Candidates:
    """Candidate actions for one job, with one feature row each.

    ``proposed`` indexes the policy's choice; ``safest`` the maximum-performance action
    (default: the last one).
    """

    actions: Sequence[Any]
    features: np.ndarray  # [k, d]
    proposed: int = 0
    safest: int = -1


@dataclass(frozen=True)
class ShieldResult:
    index: int
    action: Any
    upper_s: float  # response-time bound of the chosen action (inf: not certified)
    certified: bool
    intervened: bool
    event: str


Predictor = Callable[[np.ndarray], np.ndarray]


class Shield:
    """Post-posed conformal shield over a response-time predictor (any callable, e.g. ONNX)."""

    def __init__(
        self,
        predictor: Predictor,
        calibrator: Calibrator,
        correct_selection: bool = True,
        proposal_share: float | None = 0.5,
    ):
        if proposal_share is not None and not 0.0 < proposal_share < 1.0:
            raise ValueError(
                f"The 'proposal_share' parameter of Shield must be in (0, 1) or None. "
                f"Got {proposal_share!r} instead."
            )
        self.predictor = predictor
        self.calibrator = calibrator
        self.correct_selection = correct_selection
        self.proposal_share = proposal_share

    def quantiles(self, k: int) -> tuple[float, float]:
        """(proposal's, each fallback's) score quantile among ``k`` candidates, at
        :meth:`alphas`; both q(alpha now) without the correction, with one candidate or when
        q(alpha now) is already infinite (a pool too small)."""
        q0 = self.calibrator.q()
        if not (math.isfinite(q0) and self.correct_selection and k > 1):
            return q0, q0
        a_prop, a_sel = self.alphas(k)
        return self.calibrator.q(a_prop), self.calibrator.q(a_sel)

    def fallback_q(self, k: int) -> float:
        """Each fallback's score quantile among ``k`` candidates (``quantiles(k)[1]``)."""
        return self.quantiles(k)[1]

    def alphas(self, k: int) -> tuple[float, float]:
        """(proposal's, each fallback's) miscoverage among ``k`` candidates: they sum to the
        calibrator's alpha now, so the chosen one's bound holds at 1 - alpha whichever it is;
        both alpha without the correction or with one candidate."""
        a = self.calibrator.alpha_now
        if not self.correct_selection or k <= 1:
            return a, a
        share = 1.0 / k if self.proposal_share is None else self.proposal_share
        return a * share, a * (1.0 - share) / (k - 1)

    def filter(
        self,
        candidates: Candidates,
        remaining_deadline: float,
        cost: Sequence[float] | np.ndarray | Callable[[Any], float],
    ) -> ShieldResult:
        """Proposal if pred + q <= deadline, else the cheapest certified candidate, else safest
        (each candidate's bound at its share of alpha, :meth:`alphas`)."""
        feats = np.asarray(candidates.features)
        k = len(candidates.actions)
        if feats.ndim != 2 or feats.shape[0] != k or k == 0:
            raise ValueError(
                f"features must be [k, d] with k = {k} candidates, got shape {feats.shape}"
            )
        pred = np.asarray(self.predictor(feats), dtype=np.float64).reshape(-1)
        if pred.shape[0] != k:
            raise ValueError(f"predictor returned {pred.shape[0]} values for {k} candidates")
        return self.select(
            candidates.actions,
            pred,
            remaining_deadline,
            cost,
            candidates.proposed,
            candidates.safest,
        )

    def select(
        self,
        actions: Sequence[Any],
        pred: np.ndarray | list[float],
        remaining_deadline: float,
        cost: Sequence[float] | np.ndarray | Callable[[Any], float],
        proposed: int = 0,
        safest: int = -1,
    ) -> ShieldResult:
        """:meth:`filter` on predictions already made (``pred``: one per action).

        Lets a caller run the predictor once for the candidates of many jobs.
        """
        k = len(actions)
        p = proposed % k
        s = safest % k
        d = float(remaining_deadline)
        q0 = self.calibrator.q()
        a_prop, a_sel = self.alphas(k)
        corrected = math.isfinite(q0) and self.correct_selection and k > 1
        q_prop = self.calibrator.q(a_prop) if corrected else q0
        # plain floats: a handful of candidates per job, where numpy's per-call cost dominates
        pv = pred if isinstance(pred, list) else np.asarray(pred, np.float64).reshape(-1).tolist()
        u_p = pv[p] + q_prop
        if math.isfinite(u_p) and u_p <= d:
            return ShieldResult(
                p,
                actions[p],
                u_p,
                True,
                False,
                f"shield: proposal certified (U={u_p:.4g} s <= D={d:.4g} s)",
            )
        why = (
            f"proposal bound U={u_p:.4g} s > D={d:.4g} s"
            if math.isfinite(u_p)
            else "proposal not certifiable (infinite bound)"
        )
        q_sel = self.calibrator.q(a_sel) if corrected else q0
        upper = [x + q_sel for x in pv]
        idx = [i for i, u in enumerate(upper) if i != p and math.isfinite(u) and u <= d]
        if math.isfinite(q0) and idx:
            costs = self._costs(cost, actions)
            i = min(idx, key=lambda i: (costs[i], upper[i], i))
            return ShieldResult(
                i,
                actions[i],
                upper[i],
                True,
                True,
                f"shield: {why}; cheapest certified candidate {i} (U={upper[i]:.4g} s)",
            )
        # at the fallback's own share (models.md 2.5.1): at q0 the K shares would sum past alpha
        u_s = pv[s] + (q_prop if s == p else q_sel)
        certified = bool(math.isfinite(u_s) and u_s <= d)
        return ShieldResult(
            s,
            actions[s],
            u_s if math.isfinite(u_s) else math.inf,
            certified,
            s != p,
            f"shield: {why}; no candidate certified; maximum-performance fallback {s}",
        )

    @staticmethod
    def _costs(cost: Any, actions: Sequence[Any]) -> np.ndarray:
        if callable(cost):
            return np.array([float(cost(a)) for a in actions])
        c = np.asarray(cost, dtype=np.float64).reshape(-1)
        if c.shape[0] != len(actions):
            raise ValueError(f"cost has {c.shape[0]} values for {len(actions)} candidates")
        return c


__all__ = [
    "SplitConformal",
    "AdaptiveConformal",
    "Shield",
    "Candidates",
    "ShieldResult",
    "conformal_rank",
    "min_calibration_size",
    "quantile_of_sorted",
]
