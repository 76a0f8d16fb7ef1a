"""One full hidvfs decision: three agents (ONNX) + federated gate + conformal shield + spill.

Goal: p99 under 1 ms on this machine, for every board, with several deadline jobs running.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from agents.learned import make_hidvfs
from platforms.spec import load_board
from tests.agents.test_learned import observations


def _busy(board: str):
    """Observations with the most deadline jobs (the costliest to gate and shield)."""
    obs = list(observations(board))
    obs.sort(key=lambda o: -sum(j.deadline_s is not None for j in o.jobs))
    return obs[:20]


def _decide(pol, obs):
    d = pol.decide(obs)
    for st in pol.stages:
        d = st(d, obs)
    return d


@pytest.mark.parametrize("board", ["tx2", "orin-nx", "rubikpi3"])
def test_bench_full_decision(benchmark, board):
    pol = make_hidvfs(load_board(board))
    obs = _busy(board)
    assert max(sum(j.deadline_s is not None for j in o.jobs) for o in obs) >= 2
    pol.reset(0)
    for o in obs:  # warm-up
        _decide(pol, o)
    times = []
    for _ in range(15):
        for o in obs:
            t0 = time.perf_counter()
            _decide(pol, o)
            times.append(time.perf_counter() - t0)
    p99 = float(np.percentile(times, 99))
    it = iter(obs * 1000)
    d = benchmark(lambda: _decide(pol, next(it)))
    assert d.freq_khz
    assert p99 < 1e-3, f"p99 {p99 * 1e3:.3f} ms"
