"""The built-in default workload: a seeded mix of BOTS jobs arriving over time.

Used by ``hidvfs daemon --sim BOARD`` and by training. Arrivals are Poisson with a rate chosen
so the offered load is about ``load`` of the board's capacity; a fraction of the jobs carries a
soft deadline of ``slack x reference makespan`` and some of those are high-criticality.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from bots_bench.reference import measure_reference
from platforms.observation import JobProfile
from platforms.sim.plant import SimJob
from platforms.spec import BoardSpec

DEFAULT_KERNELS = (
    "fib",
    "nqueens",
    "sort",
    "sparselu",
    "strassen",
    "fft",
    "health",
    "uts",
    "floorplan",
    "knapsack",
    "alignment",
    "concom",
)


@dataclass(frozen=True)
class WorkloadSpec:
    duration_s: float = 60.0
    load: float = 0.6
    cls: str = "small"
    deadline_fraction: float = 0.7
    hi_fraction: float = 0.2
    slack: float = 1.5
    kernels: tuple[str, ...] = DEFAULT_KERNELS


#: distinct DAG instances per kernel in a mix; jobs reuse them (DAGs are immutable)
DAG_POOL = 4


@lru_cache(maxsize=256)
def _pooled_dag(kernel: str, cls: str, variant: int):
    from bots_bench.dags import generate

    return generate(kernel, cls, seed=variant)


def default_mix(spec: BoardSpec, seed: int = 0, w: WorkloadSpec | None = None) -> list[SimJob]:
    return [job for job, _ in default_items(spec, seed, w)]


def lone_item(spec: BoardSpec, kernel: str, cls: str, seed: int) -> tuple[SimJob, JobProfile]:
    """One job of ``kernel`` released at once, without a deadline (a lone BOTS run), its task
    graph one of the pool's drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    dag = _pooled_dag(kernel, cls, int(rng.integers(DAG_POOL)))
    prof = measure_reference(spec.name, kernel, cls, 0)
    return SimJob(dag=dag, name=f"{kernel}.{cls}#0", release_t=0.0), prof


def default_items(
    spec: BoardSpec, seed: int = 0, w: WorkloadSpec | None = None
) -> list[tuple[SimJob, JobProfile]]:
    """The mix with each job's reference profile, as the daemon's job table wants them."""
    w = w or WorkloadSpec()
    rng = np.random.default_rng(seed)
    profiles = {k: measure_reference(spec.name, k, w.cls, 0) for k in w.kernels}
    # Reference makespans use the reference cluster alone; the whole board is roughly
    # (board capacity / reference capacity) faster for a stream of jobs.
    mean_ref = float(np.mean([p.ref_makespan_s for p in profiles.values()]))
    rate = w.load / mean_ref if mean_ref > 0 else 1.0
    items: list[tuple[SimJob, JobProfile]] = []
    t = float(rng.exponential(1.0 / rate))
    i = 0
    while t < w.duration_s:
        kernel = w.kernels[int(rng.integers(len(w.kernels)))]
        prof = profiles[kernel]
        has_deadline = bool(rng.random() < w.deadline_fraction)
        crit = "hi" if has_deadline and rng.random() < w.hi_fraction else "lo"
        dag = _pooled_dag(kernel, w.cls, int(rng.integers(DAG_POOL)))
        job = SimJob(
            dag=dag,
            name=f"{kernel}.{w.cls}#{i}",
            deadline_s=w.slack * prof.ref_makespan_s if has_deadline else None,
            criticality=crit,
            release_t=t,
        )
        items.append((job, prof))
        i += 1
        t += float(rng.exponential(1.0 / rate))
    return items
