"""Straggler balancing across nodes of unequal speed."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.balance import Rebalancer, balance, bubble_ratio, equal_count_split, kk_split, lpt_split


def test_bubble_ratio_definition():
    assert bubble_ratio([2.0, 2.0]) == 0.0
    assert bubble_ratio([1.0, 3.0]) == pytest.approx(1 - 2 / 3)
    assert bubble_ratio([]) == 0.0


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_balancing_halves_the_bubble_on_skewed_costs(seed):
    rng = np.random.default_rng(seed)
    costs = rng.lognormal(0.0, 1.3, size=256)  # heavy-tailed sample costs
    speeds = np.array([1.0, 1.0, 1.0, 1.0, 1.69, 1.69, 0.6, 0.6])  # tx2, orin-nx, a throttled board
    naive = equal_count_split(costs, speeds)
    split = balance(costs, speeds)
    assert split.bubble <= 0.5 * naive.bubble
    assert split.makespan < naive.makespan
    assert sorted(i for p in split.parts for i in p) == list(range(costs.size))


@settings(max_examples=40, deadline=None)
@given(
    costs=st.lists(st.floats(0.0, 100.0), min_size=1, max_size=60),
    speeds=st.lists(st.floats(0.2, 4.0), min_size=1, max_size=6),
)
def test_partitions_are_complete_and_finish_times_consistent(costs, speeds):
    w, s = np.array(costs), np.array(speeds)
    for split in (kk_split(w, s), lpt_split(w, s), balance(w, s)):
        assert sorted(i for p in split.parts for i in p) == list(range(w.size))
        expect = np.array([w[list(p)].sum() for p in split.parts]) / s
        np.testing.assert_allclose(split.finish, expect, rtol=1e-9, atol=1e-9)
    # never worse than LPT, which is within 4/3 - 1/(3k) of the optimum on identical nodes
    assert balance(w, s).makespan <= lpt_split(w, s).makespan + 1e-9
    lower = max(w.sum() / s.sum(), (w.max() / s.max()) if w.size else 0.0)
    assert balance(w, s).makespan >= lower - 1e-9


def test_kk_solves_a_perfect_two_way_split():
    # {8, 7, 6, 5, 4} on two equal nodes: KK + local search reach 15 / 15
    split = kk_split([8, 7, 6, 5, 4], [1.0, 1.0])
    assert split.makespan == 15.0 and split.bubble == 0.0


def test_backlogs_are_respected():
    split = balance([4.0, 4.0], [1.0, 1.0], offsets=[8.0, 0.0])
    assert split.parts[0] == ()  # the busy node gets nothing
    assert split.makespan == 8.0


def test_bad_inputs_name_the_argument():
    with pytest.raises(ValueError, match="speeds"):
        balance([1.0], [0.0])
    with pytest.raises(ValueError, match="costs"):
        balance([-1.0], [1.0])
    with pytest.raises(ValueError, match="offsets"):
        balance([1.0], [1.0], offsets=[1.0, 2.0])


def test_rebalance_when_a_node_throttles():
    rng = np.random.default_rng(5)
    costs = rng.lognormal(0.0, 1.0, size=120)
    speeds = np.array([1.0, 1.7, 1.0])
    rb = Rebalancer(costs, speeds, threshold=0.1)
    first = rb.split_
    assert rb.update(speeds * 0.95, pending=range(60, 120)) is None  # within the threshold
    pending = np.arange(60, 120)
    throttled = speeds.copy()
    throttled[1] = 0.8  # the fast board hits its thermal cap
    stale_finish = (
        np.array([costs[[i for i in p if i >= 60]].sum() for p in first.parts]) / throttled
    )
    new = rb.update(throttled, pending=pending, busy_s=[0.0, 2.0, 0.0])
    assert new is not None and rb.replans_ == 1
    assert sorted(i for p in new.parts for i in p) == pending.tolist()
    assert new.makespan < stale_finish.max() + 2.0
    assert new.bubble < bubble_ratio(stale_finish)
