"""Synthetic ``batch_task.csv`` traces in the exact Alibaba v2018 format.

The shapes follow the published trace statistics (Tian, Zheng, Wang, SoCC'19): sparse DAGs of
bounded depth that decompose into trees, most of them "gather" (many parents merge into one)
and some "scatter"; a few non-DAG jobs of ``task_*`` tasks. Durations are log-normal with a
per-job scale (median near 10 s, a heavy tail capped at ``max_duration_s``); ``plan_cpu`` is
50/100/200 and ``plan_mem`` 0.1-1.1 as in the published sample. Task ids are a random
permutation, so a child may carry a smaller id than its parent, as in the real trace.

Arrivals are Poisson; their rate is set so that the offered load (core-seconds of work per
second) is ``load`` times ``capacity`` (the cluster's sum of cores x speed).
"""

from __future__ import annotations

import base64
import os
from dataclasses import dataclass

import numpy as np

from platforms.cluster.alibaba import TraceLoad, parse_batch_task

# (min tasks, max tasks, probability) of a DAG job's size
SIZE_MIX = ((2, 2, 0.25), (3, 10, 0.45), (11, 30, 0.22), (31, 80, 0.08))
CPU_CHOICES = (50.0, 100.0, 200.0)
CPU_PROBS = (0.3, 0.55, 0.15)


@dataclass(frozen=True)
class SyntheticConfig:
    n_jobs: int = 500
    seed: int = 0
    load: float = 0.7  # offered work / capacity
    capacity: float = 40.0  # sum over nodes of cores x speed
    size_mix: tuple[tuple[int, int, float], ...] = SIZE_MIX
    independent_frac: float = 0.05  # jobs made of independent task_* tasks
    gather_frac: float = 0.6  # level widths shrink (in-trees); scatter_frac: widths grow
    scatter_frac: float = 0.25
    median_duration_s: float = 9.0
    duration_sigma: float = 1.0  # per task, log-space
    job_scale_sigma: float = 0.7  # per job, log-space
    max_duration_s: float = 3000.0
    mem_range: tuple[float, float] = (0.1, 1.1)
    t0: int = 0


def _job_size(rng: np.random.Generator, mix) -> int:
    probs = np.array([m[2] for m in mix], dtype=float)
    k = rng.choice(len(mix), p=probs / probs.sum())
    lo, hi = mix[k][0], mix[k][1]
    return int(rng.integers(lo, hi + 1))


def _levels(rng: np.random.Generator, n: int, shape: str) -> list[int]:
    """Widths of the levels of an ``n``-task DAG (bounded depth)."""
    depth = int(min(n, 1 + rng.geometric(0.35), 2 + int(np.sqrt(n)) + 3))
    depth = max(depth, 2) if n >= 2 else 1
    cuts = np.sort(rng.choice(np.arange(1, n), size=depth - 1, replace=False)) if depth > 1 else []
    widths = np.diff(np.concatenate([[0], cuts, [n]])).astype(int).tolist()
    if shape == "gather":
        widths.sort(reverse=True)
    elif shape == "scatter":
        widths.sort()
    return widths


def _dag_parents(rng: np.random.Generator, widths: list[int]) -> list[list[int]]:
    """Parents (as node indices in level order) of every node."""
    parents: list[list[int]] = []
    start = 0
    prev: list[int] = []
    for w in widths:
        level = list(range(start, start + w))
        for _ in level:
            if not prev:
                parents.append([])
                continue
            k = int(min(len(prev), rng.choice([1, 2, 3], p=[0.65, 0.27, 0.08])))
            parents.append(sorted(rng.choice(prev, size=k, replace=False).tolist()))
        # a gather level must consume every previous node (in-tree), others may leave sinks
        if prev:
            used = {p for v in level for p in parents[v]}
            for p in prev:
                if p not in used and rng.random() < 0.8:
                    parents[level[int(rng.integers(len(level)))]].append(p)
        start += w
        prev = level
    return [sorted(set(p)) for p in parents]


def _asap(parents: list[list[int]], dur: np.ndarray) -> np.ndarray:
    start = np.zeros(len(parents))
    for v, ps in enumerate(parents):  # level order is topological
        if ps:
            start[v] = max(start[p] + dur[p] for p in ps)
    return start


def generate_rows(cfg: SyntheticConfig) -> list[str]:
    """CSV lines (no header, no trailing newline) of a synthetic trace."""
    rng = np.random.default_rng(cfg.seed)
    jobs = []
    total_work = 0.0
    mu = np.log(cfg.median_duration_s)
    for j in range(cfg.n_jobs):
        independent = rng.random() < cfg.independent_frac
        n = int(rng.integers(1, 6)) if independent else _job_size(rng, cfg.size_mix)
        u = rng.random()
        shape = (
            "gather"
            if u < cfg.gather_frac
            else "scatter"
            if u < cfg.gather_frac + cfg.scatter_frac
            else "mixed"
        )
        parents = (
            [[] for _ in range(n)] if independent else _dag_parents(rng, _levels(rng, n, shape))
        )
        scale = rng.lognormal(0.0, cfg.job_scale_sigma)
        dur = np.clip(
            np.ceil(scale * rng.lognormal(mu, cfg.duration_sigma, size=n)), 1, cfg.max_duration_s
        )
        base_cpu = rng.choice(CPU_CHOICES, p=CPU_PROBS)
        cpu = np.where(rng.random(n) < 0.8, base_cpu, rng.choice(CPU_CHOICES, size=n, p=CPU_PROBS))
        lo, hi = cfg.mem_range
        mem = np.round(np.clip(rng.uniform(lo, hi) * rng.uniform(0.7, 1.3, size=n), 0.01, 100), 2)
        inst = np.where(rng.random(n) < 0.6, 1, rng.geometric(0.15, size=n))
        total_work += float((dur * cpu / 100.0).sum())
        jobs.append((j, independent, parents, dur, cpu, mem, inst))
    mean_gap = total_work / max(cfg.n_jobs, 1) / max(cfg.load * cfg.capacity, 1e-12)
    arrivals = cfg.t0 + np.floor(np.cumsum(rng.exponential(mean_gap, size=cfg.n_jobs)))
    lines: list[str] = []
    for (j, independent, parents, dur, cpu, mem, inst), arr in zip(jobs, arrivals):
        n = len(parents)
        ids = rng.permutation(n) + 1
        start = arr + _asap(parents, dur)
        job_name = f"j_{j + 1}"
        rows = []
        for v in range(n):
            if independent:
                name = "task_" + base64.b64encode(rng.bytes(12)).decode()
            else:
                ps = parents[v]
                prefix = "M" if not ps else ("J" if len(ps) > 1 and rng.random() < 0.5 else "R")
                name = f"{prefix}{ids[v]}" + "".join(f"_{ids[p]}" for p in ps)
            rows.append(
                f"{name},{float(inst[v]):.1f},{job_name},1,Terminated,{int(start[v])},"
                f"{int(start[v] + dur[v])},{cpu[v]:.1f},{mem[v]:.2f}"
            )
        rng.shuffle(rows)
        lines.extend(rows)
    return lines


def write_batch_task(path: str | os.PathLike[str], lines: list[str]) -> None:
    with open(path, "w", encoding="utf-8", newline="") as f:
        for line in lines:
            f.write(line + "\n")


def synthetic_trace(cfg: SyntheticConfig) -> TraceLoad:
    """Generate and parse a trace in memory, through the same reader as real files."""
    return parse_batch_task(generate_rows(cfg), source=f"<synthetic seed={cfg.seed}>")
