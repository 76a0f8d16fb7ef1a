"""Placement decision latency on a 100-node cluster and simulator replay speed.

A *decision* is placing one task: the time of a ``place`` call divided by the tasks it
placed (calls that place several tasks at once, e.g. when many nodes free up together, are
amortised). The figure reported is the thread's CPU time, which is what a decision costs (never asserted); the
wall-clock p99 (inflated by preemption on a shared CI machine) and the per-call p99 are
printed too. Run with ``-s`` to see the figures.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from agents.placement.heuristics import make_heuristic
from agents.placement.higfrl import HigfrlPlacer
from platforms.cluster.simcluster import Workload, capacity, parse_nodes_spec, simulate
from platforms.cluster.synthetic import SyntheticConfig, synthetic_trace

NODES_100 = "tx2:40,orin-nx:30,rubikpi3:30"


class Timed:
    def __init__(self, inner):
        self.inner = inner
        self.name = inner.name
        self.per_task: list[float] = []
        self.wall_task: list[float] = []
        self.per_call: list[float] = []
        self.placed: list[int] = []

    def reset(self, workload, nodes, seed):
        self.inner.reset(workload, nodes, seed)

    def place(self, view):
        w0, c0 = time.perf_counter(), time.thread_time()
        out = self.inner.place(view)
        dt, wall = time.thread_time() - c0, time.perf_counter() - w0
        self.per_call.append(dt)
        self.placed.extend(t for t, _ in out)
        if out:
            self.per_task.append(dt / len(out))
            self.wall_task.append(wall / len(out))
        return out


@pytest.fixture(scope="module")
def big_cluster():
    nodes = parse_nodes_spec(NODES_100)
    cfg = SyntheticConfig(n_jobs=150, seed=77, load=1.0, capacity=capacity(nodes))
    return Workload.from_jobs(synthetic_trace(cfg).jobs), nodes


@pytest.mark.parametrize("policy", ["higfrl", "heft", "tetris", "sjf"])
def test_decision_p99_on_100_nodes(benchmark, big_cluster, policy):
    """Reports the p99 CPU time per placed task (the issue's budget: 5 ms); asserts only that
    every task was placed once."""
    w, nodes = big_cluster
    timed = Timed(HigfrlPlacer() if policy == "higfrl" else make_heuristic(policy))
    benchmark.pedantic(lambda: simulate(w, nodes, timed), rounds=1, iterations=1)
    p99_task = float(np.percentile(timed.per_task, 99)) * 1e3
    p99_call = float(np.percentile(timed.per_call, 99)) * 1e3
    benchmark.extra_info["p99_ms_cpu"] = round(p99_task, 3)
    assert sorted(timed.placed) == list(range(w.n_tasks))
    p99_wall = float(np.percentile(timed.wall_task, 99)) * 1e3
    print(
        f"\n{policy}: {len(nodes)} nodes, {w.n_tasks} tasks, decision p99 {p99_task:.2f} ms cpu "
        f"({p99_wall:.2f} ms wall), median {np.median(timed.per_task) * 1e3:.2f} ms, per-call p99 {p99_call:.2f} ms"
    )


def test_replay_10k_tasks(benchmark):
    nodes = parse_nodes_spec("tx2:8,orin-nx:8,rubikpi3:8")
    cfg = SyntheticConfig(n_jobs=1000, seed=5, load=0.9, capacity=capacity(nodes))
    w = Workload.from_jobs(synthetic_trace(cfg).jobs)
    assert w.n_tasks >= 10_000
    t0 = time.perf_counter()
    res = benchmark.pedantic(
        lambda: simulate(w, nodes, make_heuristic("fifo")), rounds=1, iterations=1
    )
    dt = time.perf_counter() - t0
    print(
        f"\nreplay: {w.n_tasks} tasks on {len(nodes)} nodes in {dt:.2f} s (fifo), makespan {res.makespan:.0f} s"
    )
    assert np.isfinite(res.finish).all()
