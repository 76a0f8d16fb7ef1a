"""Plant simulator throughput: task events per second (goal >= 200,000/s) and idle stepping.

Rates are measured in process CPU time, so that other work on a shared machine does not
distort them; pytest-benchmark's own (wall-clock) statistics are kept alongside.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from platforms.dag import DAG, make_dag
from platforms.sim.plant import Plant, SimJob
from platforms.spec import load_board

GOAL_EVENTS_PER_S = 200_000
TX2 = load_board("tx2")


def large_random_dag(n: int = 200_000, seed: int = 1, fan: int = 3, window: int = 64) -> DAG:
    """Each task depends on up to ``fan`` earlier tasks within ``window``; ~0.1-0.5 ms tasks."""
    rng = np.random.default_rng(seed)
    k = rng.integers(0, fan + 1, size=n)
    k[0] = 0
    src, dst = [], []
    for i in np.flatnonzero(k):
        s = np.unique(rng.integers(max(0, i - window), i, size=k[i]))
        src.append(s)
        dst.append(np.full(s.size, i))
    cycles = rng.uniform(2e5, 1e6, n)
    mem = rng.uniform(0.0, 5e-5, n)
    return make_dag("large", cycles, mem, np.concatenate(src), np.concatenate(dst))


@pytest.fixture(scope="module")
def big_dag() -> DAG:
    return large_random_dag()


def _events_per_s(run) -> tuple[float, Plant]:
    t0 = time.process_time()
    plant = run()
    return plant.n_task_events / (time.process_time() - t0), plant


def test_bench_task_events_one_large_dag(benchmark, big_dag):
    def run() -> Plant:
        plant = Plant(TX2, online=TX2.cpus)
        plant.submit(SimJob(big_dag, "large"))
        plant.run_until_idle()
        return plant

    rates = []

    def measured():
        rate, plant = _events_per_s(run)
        rates.append(rate)
        return plant

    plant = benchmark.pedantic(measured, rounds=1, iterations=1)
    assert plant.n_task_events == big_dag.n and not plant.active_jobs()
    rate = max(rates)
    benchmark.extra_info["task_events_per_s"] = round(rate)
    print(
        f"\nplant: {rate:,.0f} task events/s (CPU time), {big_dag.n} tasks, {plant.t:.2f} s simulated"
    )


def test_bench_task_events_shared_cores(benchmark, big_dag):
    """Four jobs on overlapping core sets with mixed priorities: the slower sharing paths."""
    n = big_dag.n // 4
    part = make_dag("quarter", big_dag.cycles[:n], big_dag.mem_s[:n], *_edges_below(big_dag, n))

    def run() -> Plant:
        plant = Plant(TX2, online=TX2.cpus)
        pids = [plant.submit(SimJob(part, f"j{i}", release_t=0.2 * i)) for i in range(4)]
        plant.set_affinity(pids[1], (0, 3, 4))
        plant.set_priority(pids[2], rt_priority=10)
        plant.set_priority(pids[3], 0, nice=5)
        plant.run_until_idle()
        return plant

    rates = []

    def measured():
        rate, plant = _events_per_s(run)
        rates.append(rate)
        return plant

    plant = benchmark.pedantic(measured, rounds=1, iterations=1)
    assert plant.n_task_events == 4 * n
    benchmark.extra_info["task_events_per_s"] = round(max(rates))
    print(f"\nplant, 4 sharing jobs: {max(rates):,.0f} task events/s (CPU time)")


def _edges_below(dag: DAG, n: int):
    src = np.repeat(np.arange(dag.n), np.diff(dag.succ_ptr))
    keep = (src < n) & (dag.succ_idx < n)
    return src[keep], dag.succ_idx[keep]


def test_bench_idle_thermal_stepping(benchmark):
    """Virtual seconds per CPU second with nothing running (10 ms thermal steps)."""
    plant = Plant(load_board("rubikpi3"))

    def run():
        t0 = time.process_time()
        plant.run_until_idle()
        start = plant.t
        while plant.t < start + 60.0:
            plant.advance(start + 60.0)
        return 60.0 / (time.process_time() - t0)

    speed = benchmark.pedantic(run, rounds=1, iterations=1)
    benchmark.extra_info["virtual_s_per_cpu_s"] = round(speed)
    print(f"\nidle plant: {speed:,.0f}x real time")
