"""One full hidvfs decision: three agents (ONNX) + federated gate + conformal shield + spill.

Goal: p99 under 1 ms on this machine, for every board, on the observations with the most
deadline jobs (the costliest to gate and shield). Not met yet: see agents/TRAINING.md
("Decision latency") for the split (Python features/masks, the gate's repair search, the
shield's rows; one onnxruntime call is ~12 us).
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from agents.learned import make_hidvfs
from platforms.spec import load_board
from tests.agents.test_learned import observations

BOARDS = ["tx2", "orin-nx", "rubikpi3"]


def _busy(board: str):
    obs = list(observations(board))
    obs.sort(key=lambda o: -sum(j.deadline_s is not None for j in o.jobs))
    return obs[:20]


def _decide(pol, obs):
    d = pol.decide(obs)
    for st in pol.stages:
        d = st(d, obs)
    return d


def _timings(board: str, reps: int = 15) -> dict[str, np.ndarray]:
    pol = make_hidvfs(load_board(board))
    obs = _busy(board)
    assert max(sum(j.deadline_s is not None for j in o.jobs) for o in obs) >= 2
    pol.reset(0)
    for o in obs:  # warm-up
        _decide(pol, o)
    full, own = [], []
    gate = pol.stages[0]
    for _ in range(reps):
        for o in obs:
            t0 = time.perf_counter()
            d = pol.decide(o)
            t1 = time.perf_counter()
            d = gate(d, o)
            t2 = time.perf_counter()
            for st in pol.stages[1:]:
                d = st(d, o)
            t3 = time.perf_counter()
            full.append(t3 - t0)
            own.append((t1 - t0) + (t3 - t2))
    return {"full": np.array(full), "agents": np.array(own)}


@pytest.mark.parametrize("board", BOARDS)
def test_bench_full_decision(benchmark, board):
    pol = make_hidvfs(load_board(board))
    obs = _busy(board)
    it = iter(obs * 1000)
    d = benchmark(lambda: _decide(pol, next(it)))
    assert d.freq_khz
    t = _timings(board)
    benchmark.extra_info.update(
        {
            k: {"median_ms": float(np.median(v) * 1e3), "p99_ms": float(np.percentile(v, 99) * 1e3)}
            for k, v in t.items()
        }
    )
    assert np.all(np.isfinite(t["full"])) and np.all(t["agents"] <= t["full"])
    # Figures are reported, never asserted (goal: full p99 under 1 ms; see agents/TRAINING.md).
    print(
        f"\n{board}: full decision median {np.median(t['full']) * 1e3:.3f} ms, "
        f"p99 {np.percentile(t['full'], 99) * 1e3:.3f} ms"
    )
