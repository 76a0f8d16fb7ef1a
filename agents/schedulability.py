"""Schedulability analysis of the federated gate: the model and its tests, pure.

What a deadline job needs at one (cluster, OPP) point (:func:`requirement`: light, heavy or
impossible), the light-pool and EDF tests (:func:`pool_fits`, :func:`light_partition`), and
the check of a whole point (:class:`Assignment`, :func:`analyse`); the model itself is set out
in :mod:`agents.gate`'s docstring. It is a module of its own so that the gate, its repair
search (:mod:`agents.gate_repair`) and the tests share one analysis that knows nothing of
decisions or cost: it imports only :mod:`agents.deadlines` and the observation types.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from agents.deadlines import span_bound, span_terms, work_bound
from platforms.observation import ClusterObs, JobObs, JobProfile, Observation

LIGHT, HEAVY, IMPOSSIBLE = 0, 1, 2
_KIND = {LIGHT: "light", HEAVY: "heavy"}
#: ceil() tolerance so that 2.0000000001 cores (float noise) is 2, not 3
_EPS = 1e-9


# --------------------------------------------------------------------------------------------
# Inputs


@dataclass(frozen=True)
class GateCluster:
    """A DVFS domain as the gate sees it: online CPUs, allowed OPPs (ascending), capacity."""

    name: str
    cpus: tuple[int, ...]
    freqs_khz: tuple[int, ...]
    capacity: float

    @property
    def fmax_khz(self) -> int:
        return self.freqs_khz[-1]

    @classmethod
    def from_obs(cls, cl: ClusterObs) -> GateCluster:
        """Online CPUs, and the table entries inside the observed scaling limits."""
        table = tuple(sorted(set(cl.freqs_khz)))
        if not table:
            table = tuple(sorted({f for f in (cl.min_khz, cl.max_khz) if f}))
        hi = cl.max_khz if cl.max_khz is not None else (table[-1] if table else 0)
        lo = min(cl.min_khz if cl.min_khz is not None else 0, hi)
        allowed = tuple(f for f in table if lo <= f <= hi)
        if not allowed and table:
            below = [f for f in table if f <= hi]
            allowed = (below[-1] if below else table[0],)
        return cls(cl.name, tuple(sorted(cl.online)), allowed, float(cl.capacity))


@dataclass(frozen=True)
class GateJob:
    """A deadline job: reference profile, remaining deadline (s), remaining work fraction."""

    pid: int
    profile: JobProfile
    remaining_s: float
    remaining_work: float = 1.0

    @classmethod
    def from_obs(cls, job: JobObs) -> GateJob | None:
        """None for a job without a deadline or without a reference profile (best effort)."""
        if job.profile is None or job.deadline_s is None:
            return None
        rem = 1.0 if job.progress is None else min(max(1.0 - job.progress, 0.0), 1.0)
        return cls(job.pid, job.profile, float(job.remaining_s), rem)


def jobs_from_obs(obs: Observation) -> tuple[GateJob, ...]:
    return tuple(g for g in (GateJob.from_obs(j) for j in obs.jobs) if g is not None)


def clusters_from_obs(obs: Observation) -> tuple[GateCluster, ...]:
    return tuple(GateCluster.from_obs(c) for c in obs.clusters)


# --------------------------------------------------------------------------------------------
# The analysis (pure)


#: (kind, cores, C(f), L(f)) of a job at one point: L(f) is agents.deadlines.span_at's bound
Requirement = tuple[int, int, float, float]


def requirement(job: GateJob, cluster: GateCluster, khz: int) -> Requirement:
    """(kind, cores, C(f), L(f)) of ``job`` at ``khz`` on ``cluster``: LIGHT needs 1 shared
    core (its L(f) is what the light-pool test needs)."""
    d = job.remaining_s
    if not d > 0:
        return IMPOSSIBLE, 0, math.inf, math.inf
    p = job.profile
    c = work_bound(p, khz, cluster.capacity, job.remaining_work)
    a, b, m = span_terms(p)
    span = span_bound(a, b, m, p.span_s, p.ref_khz, cluster.capacity * khz, c)
    if c <= d:
        return LIGHT, 1, c, span
    if span >= d:
        return IMPOSSIBLE, 0, c, span
    return HEAVY, max(1, math.ceil((c - span) / (d - span) - _EPS)), c, span


def requirements(
    job: GateJob, cluster: GateCluster, speeds: Sequence[float] | None = None
) -> list[Requirement]:
    """:func:`requirement` at every OPP of ``cluster`` (ascending), in one loop.

    The repair search needs the whole table per (job, cluster); hoisting the per-job terms
    out of the loop makes it several times cheaper, with the same arithmetic (bit-identical).
    ``speeds`` are ``capacity * f`` per OPP when the caller keeps them precomputed.
    """
    d = job.remaining_s
    if speeds is None:
        speeds = [cluster.capacity * f for f in cluster.freqs_khz]
    if not d > 0:
        return [(IMPOSSIBLE, 0, math.inf, math.inf)] * len(speeds)
    p = job.profile
    w = job.remaining_work * p.work_s
    mem = p.beta * p.work_s
    cpu_left, mem_left = min(w, p.work_s - mem), min(w, mem)  # agents.deadlines.work_bound
    sa, sb, sm = span_terms(p)
    full, ref = p.span_s, p.ref_khz
    ceil = math.ceil
    out: list[Requirement] = []
    for v in speeds:
        r = ref / v
        c = cpu_left * r + (w - cpu_left) if r >= 1.0 else (w - mem_left) * r + mem_left
        # agents.deadlines.span_bound, term for term
        span = min(sa / v + sb, full * r + (sm * (1.0 - r) if r < 1.0 else 0.0), c)
        if c <= d:
            out.append((LIGHT, 1, c, span))
        elif span >= d:
            out.append((IMPOSSIBLE, 0, c, span))
        else:
            n = ceil((c - span) / (d - span) - _EPS)
            out.append((HEAVY, n if n > 1 else 1, c, span))
    return out


def min_cores(
    profile: JobProfile, f: int, capacity: float, D: float, remaining: float = 1.0
) -> int | None:
    """Cores the job needs at frequency ``f`` (kHz) on ``capacity`` with deadline ``D``.

    1 for a light job (C(f) <= D, one sequential core), n_i for a heavy one, None when no
    core count can meet ``D`` (L(f) >= D).
    """
    kind, n, _, _ = requirement(
        GateJob(-1, profile, D, remaining), GateCluster("", (), (f,), capacity), f
    )
    return None if kind == IMPOSSIBLE else n


def edf_fits(jobs: Sequence[tuple[float, float]], m: int) -> bool:
    """Do sequential jobs ``(deadline, work)``, sorted by deadline, fit on ``m`` cores?

    Non-preemptive EDF list schedule of jobs released together: each starts on the first
    core to free up. Exact for <= 3 jobs; sufficient beyond.
    """
    if m <= 0:
        return not jobs
    if m >= len(jobs):
        return all(c <= d for d, c in jobs)
    return edf_list_split(jobs, m) is not None


def edf_list_split(jobs: Sequence[tuple[float, float]], m: int) -> list[list[int]] | None:
    """The split :func:`edf_fits` tests: the job indices each of ``m`` cores runs under the
    EDF list schedule (cores left empty dropped), or None when a job misses its deadline."""
    if m <= 0:
        return [] if not jobs else None
    free = [(0.0, k) for k in range(m)]
    parts: list[list[int]] = [[] for _ in range(m)]
    for i, (d, c) in enumerate(jobs):
        t, k = heapq.heappop(free)
        if t + c > d:
            return None
        parts[k].append(i)
        heapq.heappush(free, (t + c, k))
    return [p for p in parts if p]


def pool_fits(jobs: Sequence[tuple[float, float, float]], m: int) -> bool:
    """Do light jobs ``(deadline, C, L)``, sorted by deadline, meet their deadlines when
    they share ``m`` cores, each free to run on all of them, at priorities in deadline
    order?

    A job can spread over every core of the pool, so a higher-priority one may hold all of
    them (a list schedule of one core per job is not what runs). Work-conserving with
    fixed priorities, job k's critical path waits only while every core is busy with work
    of its priority or above, so R_k <= L_k + (W_k - L_k) / m, W_k the work of the jobs up
    to k; jobs of equal deadline are all counted before each other. On one core this is
    the jobs' sequential sum.
    """
    if m <= 0:
        return not jobs
    n, i = len(jobs), 0
    work = 0.0
    while i < n:
        j = i
        while j < n and jobs[j][0] == jobs[i][0]:
            work += jobs[j][1]
            j += 1
        for d, _, span in jobs[i:j]:
            # one core: the sequential sum itself (L + (W - L) / 1 can round above W, and a
            # lone light job with C(f) = D, which requirement() calls light, would not fit)
            if (work if m == 1 else span + (work - span) / m) > d:
                return False
        i = j
    return True


def light_pool_size(jobs: Sequence[tuple[float, float, float]], limit: int) -> int | None:
    """Fewest cores (<= ``limit``) on which the light jobs ``(deadline, C, L)``, sorted by
    deadline, pass :func:`pool_fits` as one shared pool."""
    for m in range(1, min(len(jobs), limit) + 1):
        if pool_fits(jobs, m):
            return m
    return 0 if not jobs else None


#: light jobs of one cluster beyond which :func:`light_partition` takes the EDF list's split
#: instead of searching every split (the search is exponential in the jobs)
MAX_EXACT_LIGHTS = 6


def light_partition(jobs: Sequence[tuple[float, float]], m: int) -> list[list[int]] | None:
    """A split of sequential jobs ``(deadline, work)``, sorted by deadline, over ``m`` cores
    that meets every deadline, each core running its share in deadline order: the job
    indices per core (cores left empty dropped), or None when no split does.

    Any schedule that runs each job on one core without preemption is such a split, the EDF
    list schedule of :func:`edf_fits` among them, so this finds one whenever a group of light
    jobs fits in any way the analysis accepts (two jobs of equal deadline may need the longer
    one first, which the list does not try). Exact (depth first, cores of equal load tried
    once) up to :data:`MAX_EXACT_LIGHTS` jobs; beyond, the list schedule's own split.
    """
    if m <= 0:
        return [] if not jobs else None
    n = len(jobs)
    if n > MAX_EXACT_LIGHTS:
        return edf_list_split(jobs, m)
    loads = [0.0] * m
    parts = [[] for _ in range(m)]

    def place(i: int) -> bool:
        if i == n:
            return True
        d, c = jobs[i]
        tried: set[float] = set()
        for k in range(m):
            t = loads[k]
            if t in tried or t + c > d:
                continue
            tried.add(t)
            loads[k] = t + c
            parts[k].append(i)
            if place(i + 1):
                return True
            parts[k].pop()
            loads[k] = t
        return False

    return [p for p in parts if p] if place(0) else None


@dataclass(frozen=True)
class Assignment:
    """A point to check: per-cluster frequency and per-deadline-job core set.

    ``others`` are the core sets of the decision's jobs without a deadline (best effort); they
    may not touch heavy cores.
    """

    clusters: tuple[GateCluster, ...]
    jobs: tuple[GateJob, ...]
    freq_khz: Mapping[str, int]
    cpus: Mapping[int, tuple[int, ...]]
    others: tuple[tuple[int, ...], ...] = ()


class JobAlloc(NamedTuple):
    """What the analysis made of one deadline job."""

    pid: int
    cluster: str | None
    cpus: tuple[int, ...]
    kind: str  # "heavy" | "light" | "invalid"
    need: int  # heavy: n_i; light: cores of its pool the EDF test needs; else 0


class _Analysis(NamedTuple):
    reasons: list[str]
    alloc: dict[int, JobAlloc]
    bad_pids: set[int]  # deadline jobs involved in a violation (best-effort overlaps aside)
    bad_clusters: set[str]  # clusters whose frequency is not an allowed OPP


def analyse(a: Assignment) -> tuple[list[str], dict[int, JobAlloc]]:
    """Violations of ``a`` (empty when feasible) and the per-job classification."""
    r = _analyse(a, {c: k for k in a.clusters for c in k.cpus})
    return r.reasons, r.alloc


def _analyse(a: Assignment, where: Mapping[int, GateCluster]) -> _Analysis:
    reasons: list[str] = []
    alloc: dict[int, JobAlloc] = {}
    bad_pids: set[int] = set()
    bad_clusters: set[str] = set()
    freq = a.freq_khz
    for k in a.clusters:
        f = freq.get(k.name)
        if f is not None and f not in k.freqs_khz:
            reasons.append(f"{k.name}: {f} kHz is not an allowed OPP {list(k.freqs_khz)}")
            bad_clusters.add(k.name)
    heavy: list[tuple[int, frozenset[int]]] = []
    sets: list[tuple[int, frozenset[int]]] = []
    groups: dict[tuple[str, tuple[int, ...]], list[tuple[float, float, float, int]]] = {}
    for j in a.jobs:
        pid = j.pid
        raw = a.cpus.get(pid, ())
        cpus = tuple(sorted(set(raw))) if len(raw) > 1 else tuple(raw)
        k = where.get(cpus[0]) if cpus else None
        bad = None
        if k is None:
            bad = f"pid {pid}: no cores" if not cpus else f"pid {pid}: core {cpus[0]} is not online"
        else:
            for c in cpus:
                kc = where.get(c)
                if kc is not k:
                    bad = (
                        f"pid {pid}: core {c} is not online"
                        if kc is None
                        else f"pid {pid}: cores {list(cpus)} span clusters {k.name} and {kc.name}"
                    )
                    break
            else:
                if k.name in bad_clusters or k.name not in freq:
                    bad = f"pid {pid}: cluster {k.name} has no valid frequency"
        if bad is not None:
            reasons.append(bad)
            bad_pids.add(pid)
            alloc[pid] = JobAlloc(pid, None, cpus, "invalid", 0)
            continue
        f = freq[k.name]
        kind, n, c, span = requirement(j, k, f)
        fs = frozenset(cpus)
        sets.append((pid, fs))
        if kind == HEAVY:
            if len(cpus) < n:
                reasons.append(
                    f"pid {pid}: heavy, needs {n} cores on {k.name} at {f} kHz, has {len(cpus)}"
                )
                bad_pids.add(pid)
            heavy.append((pid, fs))
            alloc[pid] = JobAlloc(pid, k.name, cpus, "heavy", n)
        elif kind == LIGHT:
            groups.setdefault((k.name, cpus), []).append((j.remaining_s, c, span, pid))
        else:
            reasons.append(
                f"pid {pid}: no core count meets D={j.remaining_s:.4g} s on {k.name} at {f} kHz"
            )
            bad_pids.add(pid)
            alloc[pid] = JobAlloc(pid, k.name, cpus, "invalid", 0)
    if heavy:
        heavy_pids = {pid for pid, _ in heavy}
        for pid, hs in heavy:
            for pid2, s2 in sets:
                if pid2 == pid or (pid2 in heavy_pids and pid2 < pid):
                    continue  # each heavy-heavy pair once
                if not hs.isdisjoint(s2):
                    reasons.append(
                        f"pid {pid}: heavy cores {sorted(hs & s2)} shared with pid {pid2}"
                    )
                    bad_pids.update((pid, pid2))
            for other in a.others:
                if not hs.isdisjoint(other):
                    reasons.append(
                        f"pid {pid}: heavy cores {sorted(hs.intersection(other))} shared with a best-effort job"
                    )
    if groups:
        keys = list(groups)
        for i, key in enumerate(keys):
            members = groups[key]
            for key2 in keys[i + 1 :]:
                if key[0] == key2[0] and not set(key[1]).isdisjoint(key2[1]):
                    reasons.append(
                        f"{key[0]}: light jobs on overlapping but different core sets {list(key[1])}, {list(key2[1])}"
                    )
                    bad_pids.update(m[3] for m in members)
                    bad_pids.update(m[3] for m in groups[key2])
            lights = sorted((d, c, span) for d, c, span, _ in members)
            pool = light_pool_size(lights, len(key[1]))
            if pool is None:
                reasons.append(
                    f"{key[0]}: light jobs {[m[3] for m in members]} may miss a deadline sharing {len(key[1])} core(s)"
                )
                bad_pids.update(m[3] for m in members)
                pool = len(key[1])
            for _, _, _, pid in members:
                alloc[pid] = JobAlloc(pid, key[0], key[1], "light", pool)
    return _Analysis(reasons, alloc, bad_pids, bad_clusters)


def violations(a: Assignment) -> list[str]:
    return analyse(a)[0]


def feasible(a: Assignment) -> bool:
    """True when every deadline job of ``a`` meets its deadline under the federated model."""
    return not analyse(a)[0]


__all__ = [
    "GateCluster",
    "GateJob",
    "JobAlloc",
    "Assignment",
    "analyse",
    "violations",
    "feasible",
    "min_cores",
    "requirement",
    "requirements",
    "edf_fits",
    "light_pool_size",
    "pool_fits",
    "Requirement",
    "light_partition",
    "jobs_from_obs",
    "clusters_from_obs",
]
