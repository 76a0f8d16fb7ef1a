"""Split-conformal quantile, coverage, ACI long-run bound and the shield's fallback order."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from agents.shield import (
    AdaptiveConformal,
    Candidates,
    Shield,
    SplitConformal,
    conformal_rank,
    min_calibration_size,
)

# ---------------------------------------------------------------------------------- quantile


@pytest.mark.parametrize(
    ("n", "alpha", "k"),
    [
        (19, 0.05, 19),  # the smallest set with a finite bound at 5 %
        (18, 0.05, 19),  # k > n: +inf
        (100, 0.10, 91),  # ceil(90.9)
        (10, 0.20, 9),  # ceil(8.8)
        (9, 0.70, 3),  # 10 * 0.3 evaluates to 3.0000000000000004 in floating point
        (99, 0.01, 99),
        (200, 0.05, 191),
    ],
)
def test_rank_matches_hand_values(n, alpha, k):
    assert conformal_rank(n, alpha) == k


def test_quantile_is_the_kth_smallest_signed_residual():
    s = np.array([0.3, -1.0, 2.5, 0.0, -0.2, 1.1, 0.7, -0.5, 4.0, 0.9])  # n = 10
    cal = SplitConformal(alpha=0.2).fit(s)
    assert cal.k_ == 9 and cal.q_ == 2.5  # sorted: -1 -.5 -.2 0 .3 .7 .9 1.1 2.5 4
    assert cal.upper(10.0) == 12.5
    np.testing.assert_allclose(cal.upper(np.array([1.0, 2.0])), [3.5, 4.5])
    assert SplitConformal(alpha=0.05).fit(s).q_ == math.inf  # n < 1/alpha - 1
    assert min_calibration_size(0.05) == 19 and min_calibration_size(0.01) == 99
    assert min_calibration_size(0.1) == 9


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(-1e3, 1e3), min_size=1, max_size=300),
    st.floats(0.005, 0.6),
)
def test_quantile_matches_numpy(residuals, alpha):
    s = np.asarray(residuals)
    n = s.size
    k = math.ceil((n + 1) * (1 - alpha) - 1e-9)
    q = SplitConformal(alpha).fit(s).q_
    if k > n:
        assert q == math.inf
        return
    assert q == np.sort(s)[k - 1]
    # numpy's estimators name the same order statistic; their probabilities are taken inside
    # the interval that selects it (k / n itself can land a float ulp past it: 15/29 x 29)
    assert q == np.quantile(s, (k - 0.5) / n, method="inverted_cdf")
    if n > 1:
        assert q == np.quantile(s, (k - 1.5) / (n - 1) if k > 1 else 0.0, method="higher")
    # models.md 2.1 states np.quantile(s, k/n, method="higher"); that is one order statistic
    # higher (s_(k+1)) whenever k < n, so it over-covers: never below the exact quantile.
    assert np.quantile(s, k / n, method="higher") >= q
    if k < n:
        assert np.quantile(s, k / n, method="higher") == np.sort(s)[k]


def test_fit_validates():
    with pytest.raises(ValueError, match="'alpha' parameter of SplitConformal"):
        SplitConformal(alpha=1.5).fit([1.0])
    with pytest.raises(ValueError, match="residual 1 is nan"):
        SplitConformal().fit([1.0, float("nan")])
    with pytest.raises(RuntimeError, match="not fitted"):
        SplitConformal().upper(1.0)


# ---------------------------------------------------------------------------------- coverage


@pytest.mark.parametrize(("n", "alpha"), [(100, 0.10), (200, 0.05)])
def test_coverage_matches_the_beta_law(n, alpha):
    rng = np.random.default_rng(20260110)
    trials, m = 400, 2000
    # a biased predictor and heavy-tailed, skewed noise: the signed scores absorb both
    x = rng.uniform(0, 1, size=(trials, n + m))
    y = 2.0 * x + 1.0 + rng.standard_t(3, size=x.shape) + 0.3 * rng.exponential(1.0, size=x.shape)
    pred = 2.0 * x + 0.8
    scores = np.sort(y[:, :n] - pred[:, :n], axis=1)
    k = conformal_rank(n, alpha)
    q = scores[:, k - 1]
    for i in range(3):  # the class agrees with the vectorised quantile
        assert SplitConformal(alpha).fit(y[i, :n] - pred[i, :n]).q_ == q[i]
    cover = (y[:, n:] <= pred[:, n:] + q[:, None]).mean(axis=1)
    ell = math.floor((n + 1) * alpha)
    law = stats.beta(n + 1 - ell, ell)
    se = cover.std(ddof=1) / math.sqrt(trials)
    assert cover.mean() >= 1 - alpha - 3 * se  # marginal guarantee
    assert cover.mean() <= 1 - alpha + 1 / (n + 1) + 3 * se  # distinct scores: upper bound
    assert abs(cover.mean() - law.mean()) <= 3 * se
    # spread: the Beta sd plus the binomial noise of m test points
    expected_sd = math.sqrt(law.var() + law.mean() * (1 - law.mean()) / m)
    assert 0.75 * expected_sd <= cover.std(ddof=1) <= 1.25 * expected_sd
    lo, hi = law.ppf(0.005), law.ppf(0.995)
    assert np.mean((cover >= lo) & (cover <= hi)) >= 0.95  # 99 % band, test-set noise aside


# ---------------------------------------------------------------------------------- ACI


def _run_aci(alpha, gamma, ys, preds, adversary=None):
    aci = AdaptiveConformal(alpha=alpha, gamma=gamma).fit(np.random.default_rng(0).normal(size=50))
    for y, p in zip(ys, preds):
        if adversary is not None:
            y = adversary(aci, p)
        aci.update(y, p)
    return aci


@pytest.mark.parametrize("gamma", [0.05, 0.01])
def test_aci_long_run_error_rate_bound_on_adversarial_sequences(gamma):
    alpha, T = 0.1, 1000
    rng = np.random.default_rng(7)
    preds = np.zeros(T)

    def always_miss(aci, p):  # lands just outside the bound whenever the bound is finite
        u = aci.upper(p)
        return u + 1.0 if math.isfinite(u) else p

    drift = np.cumsum(rng.normal(0.05, 1.0, size=T))  # a random walk the scores lag behind
    regimes = np.where((np.arange(T) // 100) % 2 == 0, 0.1, 10.0) * rng.normal(size=T)
    bound = (max(alpha, 1 - alpha) + gamma) / (gamma * T)
    for ys, adv in ((preds, always_miss), (drift, None), (regimes, None)):
        aci = _run_aci(alpha, gamma, ys, preds, adv)
        assert aci.t_ == T
        assert aci.regret_bound() == pytest.approx(bound)
        assert abs(aci.miss_rate - alpha) <= bound
    # the always-miss adversary really pushes ACI to its infinite-set edge
    aci = _run_aci(alpha, gamma, preds, preds, always_miss)
    assert aci.alpha_now <= 0.0 + gamma


def test_aci_edge_cases():
    aci = AdaptiveConformal(alpha=0.1, gamma=0.5, alpha_init=-0.2).fit([0.0, 1.0, 2.0])
    assert aci.q() == math.inf and aci.update(1e9, 0.0) is False  # infinite set: never a miss
    assert aci.alpha_now == pytest.approx(-0.2 + 0.5 * 0.1)
    aci = AdaptiveConformal(alpha=0.1, gamma=0.5, alpha_init=1.0).fit([0.0, 1.0, 2.0])
    assert aci.q() == -math.inf and aci.update(-1e9, 0.0) is True  # empty set: always a miss
    assert aci.alpha_now == pytest.approx(1.0 + 0.5 * (0.1 - 1.0))
    win = AdaptiveConformal(alpha=0.5, window=3).fit([5.0, 6.0, 7.0, 8.0])
    assert sorted(win.sorted_) == [6.0, 7.0, 8.0]
    win.update(1.0, 0.0)  # score 1 enters, 6 leaves
    assert win.sorted_ == [1.0, 7.0, 8.0]


# ---------------------------------------------------------------------------------- the shield


def fixed(preds):
    preds = np.asarray(preds, dtype=float)

    def predictor(features):
        assert features.shape[0] == preds.shape[0]
        return preds

    return predictor


CAL = SplitConformal(alpha=0.2).fit(np.linspace(-1.0, 1.0, 9))  # k = 8 of 9 -> q = 0.75


def cands(k, proposed=0, safest=-1):
    return Candidates(
        actions=[f"a{i}" for i in range(k)],
        features=np.zeros((k, 3)),
        proposed=proposed,
        safest=safest,
    )


def test_proposal_kept_when_its_bound_meets_the_deadline():
    assert CAL.q_ == pytest.approx(0.75)
    shield = Shield(fixed([1.0, 0.5, 0.2]), CAL, correct_selection=False)
    r = shield.filter(cands(3), 1.8, cost=[1, 2, 3])
    assert (r.index, r.certified, r.intervened) == (0, True, False)
    assert r.upper_s == pytest.approx(1.75)
    # with the selection correction the proposal is one of 3 candidates too, at alpha / 2
    # (2.0 > 1.8), and each fallback at alpha / 4, where CAL's 9 scores give no finite bound:
    # nothing is certified, the maximum-performance fallback included
    r = Shield(fixed([1.0, 0.5, 0.2]), CAL).filter(cands(3), 1.8, cost=[1, 2, 3])
    assert (r.index, r.certified) == (2, False) and "no candidate certified" in r.event
    assert r.upper_s == math.inf


def test_the_proposal_is_certified_at_its_share_of_alpha():
    cal = SplitConformal(alpha=0.2).fit(np.arange(100.0) / 100)
    assert cal.q() == pytest.approx(0.80) and cal.q(0.2 / 4) == pytest.approx(0.95)
    assert cal.q(0.2 / 2) == pytest.approx(0.90)
    preds, cost = [0.2, 0.1, 0.05, 0.0], [0, 9, 5, 9]
    # at alpha its bound (1.0) meets D = 1.05; among 4 at alpha / 4 it does not (1.15)
    r = Shield(fixed(preds), cal, correct_selection=False).filter(cands(4), 1.05, cost=cost)
    assert (r.index, r.intervened) == (0, False)
    equal = Shield(fixed(preds), cal, proposal_share=None)
    assert equal.alphas(4) == pytest.approx((0.05, 0.05))
    r = equal.filter(cands(4), 1.05, cost=cost)
    assert r.index == 2 and r.upper_s == pytest.approx(0.05 + 0.95)
    # by default half of alpha goes to the proposal (1.1 > 1.05 still), the rest is split
    # over the 3 fallbacks
    split = Shield(fixed(preds), cal)
    assert split.alphas(4) == pytest.approx((0.1, 0.1 / 3))
    assert split.filter(cands(4), 1.05, cost=cost).index != 0
    assert split.filter(cands(4), 1.1, cost=cost).index == 0  # 0.2 + 0.90 <= 1.1
    assert split.alphas(1) == (0.2, 0.2)
    with pytest.raises(ValueError, match="'proposal_share' parameter of Shield must be in"):
        Shield(fixed(preds), cal, proposal_share=1.0)


def test_the_chosen_action_misses_at_most_alpha_under_heteroscedastic_residuals():
    """Each action is noisy for half the jobs (the proposal for one half, the fallback for
    the other), so either action alone is exchangeable with the pooled calibration. But the
    proposal's bound passes only where the proposal is the noisy one, and the fallback then
    runs where it is: at q(alpha) the chosen action misses about 2 alpha. Certified among
    K = 2 at alpha / 2 each, it misses at most alpha (the union bound, models.md 2.5.1)."""
    rng = np.random.default_rng(7)
    alpha = 0.1

    def draw(n):
        noisy = rng.random(n) < 0.5
        return noisy, np.where(noisy, 1.0, 0.1) * rng.standard_normal(n)

    _, cal_scores = draw(50000)
    cal = SplitConformal(alpha=alpha).fit(cal_scores)
    n = 20000
    noisy, eps0 = draw(n)
    eps1 = np.where(noisy, 0.1, 1.0) * rng.standard_normal(n)
    pred0 = np.where(noisy, 0.0, 1.2)  # a quiet proposal never passes D = 1.5
    pred1 = np.full(n, -1.0)
    rates = {}
    for correct in (False, True):
        shield = Shield(lambda x: x, cal, correct_selection=correct)
        miss = 0
        for i in range(n):
            r = shield.select(["p", "f"], [pred0[i], pred1[i]], 1.5, [0.0, 1.0], 0, 1)
            y = (pred0[i] + eps0[i]) if r.index == 0 else (pred1[i] + eps1[i])
            miss += y > r.upper_s
        rates[correct] = miss / n
    assert rates[False] > 1.5 * alpha  # the test can fail: the old rule misses ~2 alpha
    assert rates[True] <= alpha + 0.01


def test_cheapest_certified_candidate_when_the_proposal_fails():
    shield = Shield(fixed([1.5, 0.5, 0.2, 0.1]), CAL, correct_selection=False)
    r = shield.filter(cands(4), 1.3, cost=[0.0, 5.0, 1.0, 9.0])
    assert (r.action, r.certified, r.intervened) == ("a2", True, True)
    assert "cheapest certified candidate 2" in r.event
    r = shield.filter(cands(4), 1.3, cost=lambda a: {"a1": 1.0, "a2": 4.0, "a3": 2.0}.get(a, 0.0))
    assert r.action == "a1"


def test_maximum_performance_fallback_when_nothing_is_certified():
    r = Shield(fixed([3.0, 2.0, 1.0]), CAL).filter(cands(3, safest=2), 1.0, cost=[1, 2, 3])
    assert (r.index, r.certified, r.intervened) == (2, False, True)
    assert "maximum-performance fallback 2" in r.event
    # too small a calibration set: q = +inf, nothing is certifiable
    tiny = SplitConformal(alpha=0.05).fit([0.0, 0.1])
    r = Shield(fixed([0.0, 0.0]), tiny).filter(cands(2), 100.0, cost=[0, 1])
    assert (r.index, r.certified) == (1, False) and "infinite bound" in r.event
    # a NaN prediction is never certified
    r = Shield(fixed([math.nan, 0.1]), CAL, correct_selection=False).filter(
        cands(2), 5.0, cost=[0, 1]
    )
    assert r.index == 1 and r.certified


def test_the_maximum_performance_fallback_is_reported_at_its_share_not_at_alpha():
    """F7: the fallback is one of the K candidates, so its bound and flag are at its share
    (alpha (1 - share) / (K - 1)); at q(alpha) it was reported certified although its bound
    at its share fails, a (K + 1)-th look at the pool past the union bound."""
    cal = SplitConformal(alpha=0.2).fit(np.arange(100.0) / 100)
    assert cal.q() == pytest.approx(0.80) and cal.q(0.1) == pytest.approx(0.90)
    preds, d = [0.5, 0.15], 1.0  # proposal 0.5 + 0.90 > 1; fallback 0.15 + 0.90 > 1
    shield = Shield(fixed(preds), cal)  # K = 2: alpha / 2 each
    assert shield.alphas(2) == pytest.approx((0.1, 0.1))
    r = shield.filter(cands(2), d, cost=[0, 1])
    assert r.index == 1 and "maximum-performance fallback 1" in r.event
    # 0.15 + q(alpha) = 0.95 <= 1 would pass: the old rule reported it certified at 0.95
    assert not r.certified and r.upper_s == pytest.approx(0.15 + 0.90)
    assert shield.quantiles(2) == pytest.approx((0.90, 0.90))
    # the action is the same, and so is everything without the correction (one share: alpha)
    plain = Shield(fixed(preds), cal, correct_selection=False)
    assert plain.quantiles(2) == pytest.approx((0.80, 0.80))
    r0 = plain.filter(cands(2), d, cost=[0, 1])
    assert (r0.index, r0.certified) == (1, True) and "cheapest certified" in r0.event
    # too small a pool for the share: the fallback's bound is infinite, never certified
    r = Shield(fixed([1.0, 0.5, 0.2]), CAL).filter(cands(3), 1.8, cost=[1, 2, 3])
    assert CAL.q() + 0.2 <= 1.8 and (r.certified, r.upper_s) == (False, math.inf)


def test_selection_among_k_is_certified_at_alpha_over_k():
    cal = SplitConformal(alpha=0.2).fit(np.arange(100.0) / 100)
    assert cal.q() == pytest.approx(0.80)  # k = ceil(101 * 0.8) = 81
    assert cal.q(0.2 / 4) == pytest.approx(0.95)  # k = ceil(101 * 0.95) = 96
    preds, cost = [2.0, 0.1, 0.05, 0.25], [0, 9, 5, 0]
    # at alpha the three fallbacks pass (0.90, 0.85, 1.05 <= 1.1) and the cheapest is a3 ...
    r = Shield(fixed(preds), cal, correct_selection=False).filter(cands(4), 1.1, cost=cost)
    assert r.index == 3
    # ... but choosing among 4 only keeps P(miss) <= alpha at alpha / 4: a3 (1.20) fails
    r = Shield(fixed(preds), cal, proposal_share=None).filter(cands(4), 1.1, cost=cost)
    assert r.index == 2 and r.upper_s == pytest.approx(0.05 + 0.95)


def test_filter_validates_shapes():
    with pytest.raises(ValueError, match=r"features must be \[k, d\]"):
        Shield(fixed([1.0]), CAL).filter(Candidates(["a", "b"], np.zeros((3, 2))), 1.0, cost=[0, 0])
    with pytest.raises(ValueError, match="cost has 1 values"):
        Shield(fixed([9.0, 0.0]), CAL, correct_selection=False).filter(cands(2), 1.0, cost=[0])


def _reference_select(pred, cal, correct, d, cost, p, s):
    """The shield's rule with numpy arrays throughout (the oracle for the float-list path);
    inf + -inf is NaN here on purpose (a non-finite bound never passes), hence no warning."""
    with np.errstate(invalid="ignore"):
        return _reference_rule(pred, cal, correct, d, cost, p, s)


def _reference_rule(pred, cal, correct, d, cost, p, s):
    pred = np.asarray(pred, dtype=np.float64)
    k = len(pred)
    q0 = cal.q()
    fix = correct and k > 1 and math.isfinite(q0)
    # the proposal is one of the k candidates too: half of alpha, the rest split over the others
    q_prop = cal.q(cal.alpha_now / 2) if fix else q0
    q_sel = cal.q(cal.alpha_now / (2 * (k - 1))) if fix else q0
    u_p = pred[p] + q_prop
    if math.isfinite(u_p) and u_p <= d:
        return p, float(u_p), True, False
    upper = pred + q_sel
    ok = np.isfinite(upper) & (upper <= d)
    ok[p] = False
    if math.isfinite(q0) and ok.any():
        c = np.asarray(cost, dtype=np.float64)
        i = min(np.flatnonzero(ok).tolist(), key=lambda i: (c[i], upper[i], i))
        return i, float(upper[i]), True, True
    u_s = pred[s] + (q_prop if s == p else q_sel)  # the fallback at its own share too
    ok_s = bool(math.isfinite(u_s) and u_s <= d)
    return s, float(u_s) if math.isfinite(u_s) else math.inf, ok_s, s != p


PREDS = st.one_of(st.floats(-3.0, 3.0), st.sampled_from([math.nan, math.inf, -math.inf]))


@settings(max_examples=300, deadline=None)
@given(
    preds=st.lists(PREDS, min_size=1, max_size=12),
    d=st.floats(-1.0, 4.0),
    correct=st.booleans(),
    data=st.data(),
)
def test_select_on_predictions_follows_the_rule_and_filter(preds, d, correct, data):
    k = len(preds)
    p = data.draw(st.integers(0, k - 1))
    s = data.draw(st.integers(-1, k - 1))
    cost = data.draw(st.lists(st.integers(0, 5), min_size=k, max_size=k))
    cal = data.draw(st.sampled_from([CAL, SplitConformal(alpha=0.05).fit([0.0, 0.1])]))
    shield = Shield(fixed(preds), cal, correct_selection=correct)
    acts = [f"a{i}" for i in range(k)]
    got = shield.select(acts, np.array(preds), d, cost, p, s)
    i, upper, certified, intervened = _reference_select(preds, cal, correct, d, cost, p, s % k)
    assert (got.index, got.action, got.certified, got.intervened) == (
        i,
        acts[i],
        certified,
        intervened,
    )
    assert got.upper_s == upper or (math.isnan(got.upper_s) and math.isnan(upper))
    # the same choice through filter() (one predictor call) and from a plain list
    assert shield.filter(cands(k, p, s), d, cost) == got
    assert shield.select(acts, list(map(float, preds)), d, cost, p, s) == got
