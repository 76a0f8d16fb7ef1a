"""One full hidvfs decision: three agents (ONNX) + federated gate + conformal shield + spill.

Goal: p99 under 1 ms on this machine, for every board, on the observations with the most
deadline jobs (the costliest to gate and shield). Figures are reported (``-s``), never
asserted. ``cpu`` is this thread's CPU time for the same decisions: it leaves out the time
the scheduler gave to other processes, so a wall-clock p99 far above it is a time slice.

Measured 2026-12-02 on this 2-core VM, shared with other engineers' jobs (load 1.2-2.2; its
speed drifts by ~2x over minutes, hence ranges), 9 runs per board, wall-clock full decision:

| board | before: median | before: p99 | after: median | after: p99 |
|---|---|---|---|---|
| tx2 | 0.75-1.42 ms | 1.24-2.82 ms | 0.46-0.85 ms | 0.67-1.04 ms |
| orin-nx | 0.83-1.55 ms | 1.59-3.67 ms | 0.44-0.80 ms | 0.64-1.13 ms |
| rubikpi3 | 0.72-1.26 ms | 1.22-2.23 ms | 0.45-0.79 ms | 0.65-1.22 ms |

p99 < 1 ms held in 16 of the 27 runs after (for all three boards in the fastest spell),
in none before. On 2026-12-03, a fresh VM of the same kind without that load, same code and
models: 11 runs per board (2 with a CPU hog on the other core), p99 0.40-0.58 ms (tx2),
0.47-0.61 ms (orin-nx), 0.35-0.69 ms (rubikpi3), under 1 ms in all 33. Under heavier load (4+ runnable processes on the 2 cores) the wall-clock
p99 is a ~5 ms time slice for either version, while the CPU-time p99 after stays at
0.8-1.1 ms. What remains: three onnxruntime calls (~12 us each warm, 20-35 us inside the
decision), observation features (~60 us), the gate's analysis and safest point (~110 us),
the shield's rows and selection (~60 us).

Since 2026-12-06 (stop 28) every decision here runs as the daemon's loop runs it: with the
garbage collector held (daemon.gchold), its collection after. Mid-decision a young
collection walks the decision's live temporaries (and promotes them); after it, almost
nothing is left to walk (``deferred_gc`` p99 ~1 us). Same code and models, the two run
alternately 20 observations x 60 rounds, p99 without -> with the hold, 12 pairs: tx2
1073 -> 844, 678 -> 581, 580 -> 522 us; orin-nx 965 -> 815, 714 -> 739, 611 -> 562 us;
rubikpi3 958 -> 863, 808 -> 757, 944 -> 861 us (medians equal within 3 %). A full
collection (~6 ms with the models loaded) never lands in a decision either.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from agents.learned import make_hidvfs
from agents.mixed import daemon_stages, plan_reservation
from daemon.gchold import collector_held
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
    """Each decision as the daemon's loop runs it: with the garbage collector held
    (daemon.gchold); ``deferred_gc`` is the collection it made due, run after it."""
    pol = make_hidvfs(load_board(board))
    obs = _busy(board)
    assert max(sum(j.deadline_s is not None for j in o.jobs) for o in obs) >= 2
    pol.reset(0)
    for o in obs:  # warm-up
        _decide(pol, o)
    full, own, cpu, deferred = [], [], [], []
    gate = pol.stages[0]
    for _ in range(reps):
        for o in obs:
            with collector_held():
                c0 = time.thread_time()
                t0 = time.perf_counter()
                d = pol.decide(o)
                t1 = time.perf_counter()
                d = gate(d, o)
                t2 = time.perf_counter()
                for st in pol.stages[1:]:
                    d = st(d, o)
                t3 = time.perf_counter()
                cpu.append(time.thread_time() - c0)
            t4 = time.perf_counter()
            _ = [()]  # the first allocation after the hold runs what the decision made due
            deferred.append(time.perf_counter() - t4)
            full.append(t3 - t0)
            own.append((t1 - t0) + (t3 - t2))
    # "cpu": this thread's CPU time for the same decisions; on a shared machine it leaves out
    # the time the scheduler gave to other processes (wall-clock p99 there is a time slice)
    return {
        "full": np.array(full),
        "agents": np.array(own),
        "cpu": np.array(cpu),
        "deferred_gc": np.array(deferred),
    }


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
    assert np.all(t["cpu"] >= 0)
    # Figures are reported, never asserted (goal: full p99 under 1 ms; see the module docstring).
    print(
        f"\n{board}: full decision median {np.median(t['full']) * 1e3:.3f} ms, "
        f"p99 {np.percentile(t['full'], 99) * 1e3:.3f} ms; "
        f"cpu median {np.median(t['cpu']) * 1e3:.3f} ms, p99 {np.percentile(t['cpu'], 99) * 1e3:.3f} ms; "
        f"deferred collection p99 {np.percentile(t['deferred_gc'], 99) * 1e3:.3f} ms"
    )


@pytest.mark.parametrize("board", BOARDS)
def test_bench_daemon_decision_with_a_reserved_cluster(benchmark, board):
    """The daemon's stack when a HI job holds a cluster: the policy's stages run on the
    unreserved part and on each HI job's cluster (agents.mixed.AroundReservation), then the
    reservation. Observations: those of the recorded set where a HI job reserves a cluster."""
    pol = make_hidvfs(load_board(board))
    obs = [o for o in observations(board) if plan_reservation(o).hi]
    assert obs
    obs.sort(key=lambda o: -len(o.jobs))
    obs = obs[:20]
    stages = daemon_stages(pol.stages)
    pol.reset(0)

    def decide(o):
        d = pol.decide(o)
        for st in stages:
            d = st(d, o)
        return d

    it = iter(obs * 1000)
    d = benchmark(lambda: decide(next(it)))
    assert d.freq_khz
    full = []
    for _ in range(15):
        for o in obs:
            with collector_held():  # as the daemon's loop runs it (daemon.gchold)
                t0 = time.perf_counter()
                decide(o)
                full.append(time.perf_counter() - t0)
    full = np.array(full)
    benchmark.extra_info.update(
        {"median_ms": float(np.median(full) * 1e3), "p99_ms": float(np.percentile(full, 99) * 1e3)}
    )
    print(
        f"\n{board}: daemon decision with a reserved cluster, median "
        f"{np.median(full) * 1e3:.3f} ms, p99 {np.percentile(full, 99) * 1e3:.3f} ms"
    )
