"""Federated schedulability gate: enough cores and frequency for every deadline job.

Model (reference/models.md 1.1-1.3, one-shot jobs with a remaining deadline D). At the
frequency f of its cluster (capacity kappa), a job needs, with upper bounds of the remaining
work C(f) and span L(f) (:func:`agents.deadlines.work_bound`, :func:`agents.deadlines.span_at`:
the two-point scaling, taken the worst way where the work left or the critical path may hold
more compute or more memory stalls than the job's mean):

* **light** when C(f) <= D: it runs as one sequential job on the cluster's shared light cores;
* **heavy** when C(f) > D and L(f) < D: n = ceil((C(f) - L(f)) / (D - L(f))) dedicated cores
  inside ONE cluster (a greedy schedule then gives R <= L + (C - L)/n <= D);
* **impossible** at that point otherwise.

Light-job test (the adaptation of the ``n_low > 2 sum u`` test to one-shot jobs released now):
light jobs that share a core set may each spread over all of it, at priorities in deadline
order, so a job's critical path waits only while every core runs work of its priority or
above: the group passes when R_k <= L_k + (W_k - L_k) / m <= D_k for each job k, W_k the work
of the jobs up to k (:func:`pool_fits`; on one core, their sequential sum). Light groups with
different core sets must be disjoint. The repair looks for the fewest cores of a cluster that
hold its light jobs: a shared pool when it fits, else a split of them over single cores, each
job pinned to one core and the jobs of a core run in deadline order (:func:`light_partition`,
a non-preemptive list schedule per core, exact up to :data:`MAX_EXACT_LIGHTS` light jobs per
cluster). The tests assume deadline-ordered execution, which :func:`order_priorities` sets.

Heavy cores are exclusive: no other job of the decision (deadline or best-effort) may use them.

Priorities (:func:`order_priorities`, applied to every decision the gate returns): the analysis
counts a light job's pool cores as its own, in deadline order. So a best-effort job that
shares a core with a deadline job runs SCHED_OTHER (a SCHED_FIFO one would starve the deadline
job: a learned priority order may rank it first), a deadline job that shares cores with one
runs SCHED_FIFO, and the deadline jobs of one light pool get their priorities in deadline
order.
Best-effort jobs need at least one core outside them: when a point leaves none, every cluster
(a kept one too) may take a higher OPP with fewer heavy cores, the cheapest such mix wins.

Repair of an infeasible proposal, cheapest change first:

1. Clusters whose own jobs are already fine are kept untouched.
2. Every other cluster with deadline jobs gets the cheapest point (f, cores) with f >= the
   proposed f: raising the frequency one or more OPPs or adding cores, whichever the cost
   model rates lower. Jobs stay on the cluster holding more than half of their proposed
   cores; a job without such a cluster (e.g. spread over all CPUs) goes where it costs least.
3. If that fails, jobs may move between clusters (every job-to-cluster map is tried, the
   cheapest wins, fewest moves on a tie), so the gate finds a feasible point whenever one
   exists: feasibility is monotone in f (C, L and n(f) never grow with f), so the raise-only
   restriction loses none. Beyond :data:`MAX_MAPS` maps (8 deadline jobs on three clusters)
   a greedy placement comes first and, where it finds none, a search bounded to
   :data:`MAX_NODES` steps for any feasible map: past that bound a feasible point can be
   missed.
4. If no point is feasible: the safest point (every cluster at its maximum, each job in
   deadline order on the largest/fastest cluster that still fits it, a job no core count
   can save last) and ``feasible=False``.

Cost model (:func:`default_cost`): sum over clusters of active_cores * capacity * f^3 (f in
GHz), a monotone stand-in for dynamic power; any ``cost(cluster, khz, ncores)`` callable that
is non-decreasing in khz and ncores, and pure (the gate memoises it per point), may replace it.

Cost of one repair (it runs on every tick with deadline jobs): requirement tables are built
per (job, cluster) in one loop and only from the proposal's OPP up, the cost model is
memoised, and a job that fits no cluster even alone sends the repair straight to the safest
point (no map can be feasible then), so no search runs for nothing.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import NamedTuple

from agents.deadlines import span_bound, span_terms, work_bound
from agents.policy import Decision, JobSetting
from platforms.observation import ClusterObs, JobObs, JobProfile, Observation

LIGHT, HEAVY, IMPOSSIBLE = 0, 1, 2
_KIND = {LIGHT: "light", HEAVY: "heavy"}
#: ceil() tolerance so that 2.0000000001 cores (float noise) is 2, not 3
_EPS = 1e-9
#: above this many job-to-cluster maps the move stage assigns jobs greedily (deadline order)
MAX_MAPS = 4096
#: steps of the branch and bound after a greedy placement that found no feasible map
MAX_NODES = 20000
#: bound of a gate's cost memo (clusters x OPPs x core counts fit many times over)
_MAX_COSTS = 4096


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


def default_cost(cluster: GateCluster, khz: int, ncores: int) -> float:
    """active cores * capacity * f^3 (GHz): monotone in f and cores, ~dynamic power."""
    g = khz * 1e-6
    return ncores * cluster.capacity * g * g * g


CostFn = Callable[[GateCluster, int, int], float]


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


# --------------------------------------------------------------------------------------------
# The gate


@dataclass
class GateResult:
    decision: Decision
    feasible: bool
    events: list[str] = field(default_factory=list)
    alloc: dict[int, JobAlloc] = field(default_factory=dict)
    cost: float = 0.0  # estimated power of the deadline jobs' cores (cost model units)

    @property
    def changed(self) -> bool:
        return bool(self.events)


@dataclass
class _Point:
    cost: float
    fi: int  # index in the cluster's table
    heavy: int  # dedicated cores
    pool: int  # shared light cores
    #: None: the light jobs share the pool (its EDF list fits); else the light jobs (indices
    #: into the repair's jobs) of each pool core, when only a split of them fits
    parts: tuple[tuple[int, ...], ...] | None = None


class FederatedGate:
    """Checks and repairs decisions for one set of clusters (rebuild when the limits change)."""

    def __init__(self, clusters: Sequence[GateCluster], cost: CostFn | None = None):
        self.clusters = tuple(clusters)
        self.cost = cost
        self._where = {c: i for i, k in enumerate(self.clusters) for c in k.cpus}
        self._kwhere = {c: k for k in self.clusters for c in k.cpus}
        self._online = tuple(c for k in self.clusters for c in k.cpus)
        #: capacity * f per OPP and cluster (the denominators of every requirement)
        self._speeds = tuple(tuple(k.capacity * f for f in k.freqs_khz) for k in self.clusters)
        #: memo of the (pure) cost model per (cluster index, kHz, cores); bounded
        self._costs: dict[tuple[int, int, int], float] = {}
        self._costs_of: CostFn | None = None
        # "largest/fastest" first: throughput of the whole cluster, then per-core speed
        self._ranking = sorted(
            (i for i, k in enumerate(self.clusters) if k.cpus and k.freqs_khz),
            key=lambda i: (
                -self.clusters[i].capacity * self.clusters[i].fmax_khz * len(self.clusters[i].cpus),
                -self.clusters[i].capacity * self.clusters[i].fmax_khz,
                i,
            ),
        )

    @classmethod
    def from_observation(cls, obs: Observation, cost: CostFn | None = None) -> FederatedGate:
        return cls(clusters_from_obs(obs), cost)

    # -- public

    def check(
        self, decision: Decision, jobs: Sequence[GateJob]
    ) -> tuple[list[str], dict[int, JobAlloc]]:
        """Violations of ``decision`` (empty when feasible) and the per-job classification."""
        r = _analyse(self._assignment(decision, self._order(jobs)), self._kwhere)
        return r.reasons, r.alloc

    def repair(self, decision: Decision, jobs: Sequence[GateJob]) -> GateResult:
        """The proposal itself when feasible, else the cheapest feasible repair, else safest;
        with the priorities the analysis assumes (:func:`order_priorities`)."""
        jobs = self._order(jobs)
        r = _analyse(self._assignment(decision, jobs), self._kwhere)
        if not r.reasons:
            res = GateResult(decision, True, [], r.alloc, self._cost_of(r.alloc, decision.freq_khz))
        else:
            res = _Repair(self, decision, jobs, r).run()
        res.decision, moved = order_priorities(res.decision, jobs)
        res.events.extend(moved)
        return res

    # -- helpers

    @staticmethod
    def _order(jobs: Sequence[GateJob]) -> tuple[GateJob, ...]:
        return tuple(sorted(jobs, key=lambda j: (j.remaining_s, j.pid)))

    def _assignment(self, decision: Decision, jobs: tuple[GateJob, ...]) -> Assignment:
        gated = {j.pid for j in jobs}
        cpus = {j.pid: decision.jobs[j.pid].cpus for j in jobs if j.pid in decision.jobs}
        others = tuple(s.cpus for pid, s in decision.jobs.items() if pid not in gated)
        return Assignment(self.clusters, jobs, decision.freq_khz, cpus, others)

    def _costfn(self) -> CostFn:
        return self.cost or default_cost

    def _cost(self, ki: int, khz: int, ncores: int) -> float:
        """The cost model at one point, memoised (the search asks for the same points often)."""
        fn = self._costfn()
        if fn is not self._costs_of:  # ``cost`` was replaced: forget the old model's values
            self._costs.clear()
            self._costs_of = fn
        key = (ki, khz, ncores)
        v = self._costs.get(key)
        if v is None:
            if len(self._costs) >= _MAX_COSTS:
                self._costs.clear()
            v = self._costs[key] = fn(self.clusters[ki], khz, ncores)
        return v

    def _cost_of(self, alloc: Mapping[int, JobAlloc], freq: Mapping[str, int]) -> float:
        used: dict[str, set[int]] = {}
        for al in alloc.values():
            if al.cluster is not None:
                used.setdefault(al.cluster, set()).update(al.cpus)
        total = 0.0
        for ki, k in enumerate(self.clusters):
            if k.name in used and k.name in freq:
                total += self._cost(ki, freq[k.name], len(used[k.name]))
        return total


class _Repair:
    """One repair: the search state of :meth:`FederatedGate.repair` (not reused)."""

    def __init__(
        self,
        gate: FederatedGate,
        decision: Decision,
        jobs: tuple[GateJob, ...],
        proposal: _Analysis,
    ):
        self.g = gate
        self.d = decision
        self.jobs = jobs
        self.proposal = proposal
        self.reasons = proposal.reasons
        self.K = gate.clusters
        gated = {j.pid for j in jobs}
        self.others = {pid: s.cpus for pid, s in decision.jobs.items() if pid not in gated}
        self._req: dict[tuple[int, int], list[Requirement | None]] = {}
        self._best: dict[tuple[int, int, bool], _Point | None] = {}
        self.base = [self._ceil_index(k, decision.freq_khz.get(k.name)) for k in self.K]

    # -- precomputation (home, home_mask, keep: only the searches need them, computed once)

    @cached_property
    def home(self) -> list[int | None]:
        return [self._home(j) for j in self.jobs]

    @cached_property
    def home_mask(self) -> list[int]:
        masks = [0] * len(self.K)
        for ji, h in enumerate(self.home):
            if h is not None:
                masks[h] |= 1 << ji
        return masks

    @cached_property
    def keep(self) -> list[tuple[float, int] | None]:
        return [self._keepable(ki) for ki in range(len(self.K))]

    @staticmethod
    def _ceil_index(k: GateCluster, f: int | None) -> int:
        if f is None or not k.freqs_khz:
            return 0
        for i, x in enumerate(k.freqs_khz):
            if x >= f:
                return i
        return len(k.freqs_khz) - 1

    def _home(self, job: GateJob) -> int | None:
        s = self.d.jobs.get(job.pid)
        if s is None:
            return None
        count: dict[int, int] = {}
        for c in s.cpus:
            ki = self.g._where.get(c)
            if ki is not None:
                count[ki] = count.get(ki, 0) + 1
        if not count:
            return None
        ki = max(count, key=lambda i: (count[i], -i))
        # a home is a cluster holding most of the proposed cores; an even spread has none
        return ki if 2 * count[ki] > len(s.cpus) else None

    def _keepable(self, ki: int) -> tuple[float, int] | None:
        """(cost, heavy cores) of cluster ``ki`` as proposed, when its own jobs are fine there."""
        mask = self.home_mask[ki]
        k = self.K[ki]
        an = self.proposal
        if not mask or k.name in an.bad_clusters or k.name not in self.d.freq_khz:
            return None
        used: set[int] = set()
        heavy = 0
        for ji in _bits(mask):
            pid = self.jobs[ji].pid
            al = an.alloc.get(pid)
            if pid in an.bad_pids or al is None or al.cluster != k.name:
                return None
            used.update(al.cpus)
            if al.kind == "heavy":
                heavy += len(al.cpus)
        return self.g._cost(ki, self.d.freq_khz[k.name], len(used)), heavy

    def req(self, ji: int, ki: int) -> list[Requirement | None]:
        """:func:`requirement` of job ``ji`` at every OPP of cluster ``ki`` from ``base`` up.

        The repair only raises frequencies, so the OPPs below the proposal's (``None``
        here) are never looked at; the proposal often sits near the top of the table.
        """
        key = (ji, ki)
        r = self._req.get(key)
        if r is None:
            b = self.base[ki]
            r = [None] * b + requirements(self.jobs[ji], self.K[ki], self.g._speeds[ki][b:])
            self._req[key] = r
        return r

    def best(self, ki: int, mask: int, at: int | None = None) -> _Point | None:
        """Cheapest (f >= base, cores) for the jobs in ``mask`` on cluster ``ki``; with ``at``,
        the cheapest at that OPP index only (the best-effort fallback of :meth:`evaluate`)."""
        key = (ki, mask, at)
        if key in self._best:
            return self._best[key]
        k = self.K[ki]
        table = k.freqs_khz
        m_k = len(k.cpus)
        reqs = [(self.jobs[ji].remaining_s, self.req(ji, ki), ji) for ji in _bits(mask)]
        n_f = len(table)
        cost = self.g._cost
        out: _Point | None = None
        if m_k and n_f:
            for fi in [at] if at is not None else range(self.base[ki], n_f):
                if out is not None and cost(ki, table[fi], 1) >= out.cost:
                    break  # monotone cost: no higher OPP can be cheaper
                heavy = 0
                lights: list[tuple[float, float, int, float]] = []
                for d, r, ji in reqs:
                    kind, n, c, span = r[fi]
                    if kind == HEAVY:
                        heavy += n
                    elif kind == LIGHT:
                        lights.append((d, c, ji, span))
                    else:
                        break
                else:
                    if heavy > m_k:
                        continue
                    parts = None
                    if len(lights) > 1:
                        lights.sort()
                        dc = [(d, c) for d, c, _, _ in lights]
                        dcl = [(d, c, span) for d, c, _, span in lights]
                        pool = light_pool_size(dcl, m_k - heavy)
                        if pool is None or pool > 1:
                            # fewer cores may hold a split the list misses (its ties)
                            # (one core runs them in deadline order either way: from 2 up)
                            for m in range(2, (pool or m_k - heavy + 1)):
                                split = light_partition(dc, m)
                                if split is not None:
                                    pool = m
                                    parts = tuple(
                                        tuple(lights[i][2] for i in part) for part in split
                                    )
                                    break
                            if pool is None:
                                continue
                    else:
                        pool = len(lights)
                        if heavy + pool > m_k:
                            continue
                    cst = cost(ki, table[fi], heavy + pool)
                    if out is None or cst < out.cost:
                        out = _Point(cst, fi, heavy, pool, parts)
        self._best[key] = out
        return out

    # -- search

    def evaluate(self, assign: Sequence[int]):
        masks = [0] * len(self.K)
        for ji, ki in enumerate(assign):
            masks[ki] |= 1 << ji
        plan: list[object] = []
        total = 0.0
        heavy = 0
        for ki, m in enumerate(masks):
            if not m:
                plan.append(None)
            elif m == self.home_mask[ki] and self.keep[ki] is not None:
                plan.append("keep")
                total += self.keep[ki][0]
                heavy += self.keep[ki][1]
            else:
                p = self.best(ki, m)
                if p is None:
                    return None
                plan.append(p)
                total += p.cost
                heavy += p.heavy
        if self.others and heavy >= len(self.g._online):
            r = self._with_room(masks, plan)
            if r is None:
                return None
            total, plan = r
        moves = sum(
            1 for ji, ki in enumerate(assign) if self.home[ji] is not None and self.home[ji] != ki
        )
        return total, moves, tuple(assign), masks, plan

    def _with_room(self, masks: list[int], plan: list[object]):
        """Cheapest per-cluster points with fewer heavy cores than online CPUs, or None.

        Best-effort jobs need one core outside the heavy reservations. Every cluster may take
        any OPP from ``base`` up (or stay as proposed): heavy counts only shrink with f, so
        this finds a point whenever the map allows one. Exact: a small knapsack over clusters
        on the total of heavy cores.
        """
        online = len(self.g._online)
        states: dict[int, tuple[float, list[object]]] = {0: (0.0, [])}
        for ki, m in enumerate(masks):
            if not m:
                states = {h: (c, ch + [None]) for h, (c, ch) in states.items()}
                continue
            opts: list[tuple[float, int, object]] = []
            if plan[ki] == "keep":
                opts.append((self.keep[ki][0], self.keep[ki][1], "keep"))
            for fi in range(self.base[ki], len(self.K[ki].freqs_khz)):
                p = self.best(ki, m, at=fi)
                if p is not None:
                    opts.append((p.cost, p.heavy, p))
            nxt: dict[int, tuple[float, list[object]]] = {}
            for h, (c, ch) in states.items():
                for oc, oh, o in opts:
                    h2 = h + oh
                    if h2 >= online:
                        continue
                    old = nxt.get(h2)
                    if old is None or c + oc < old[0]:
                        nxt[h2] = (c + oc, ch + [o])
            if not nxt:
                return None
            states = nxt
        total, chosen = min(states.values(), key=lambda v: v[0])
        return total, chosen

    def search(self, choices: list[list[int]]):
        """Cheapest feasible job-to-cluster map (fewest moves on a tie), or None.

        Branch and bound over jobs in deadline order: the cheapest point of a cluster can only
        grow when a job joins it (monotone cost), so the partial sum bounds every completion.
        Beyond :data:`MAX_MAPS` maps the greedy placement comes first; where it dead-ends the
        branch and bound still looks for any feasible map, within :data:`MAX_NODES` steps.
        """
        n_maps = 1
        for c in choices:
            n_maps *= len(c)
        budget = None
        if n_maps > MAX_MAPS:
            found = self.greedy(choices)
            if found is not None:
                return found
            budget = [MAX_NODES]
        n_j = len(self.jobs)
        # cheapest cluster first per job: a good bound early prunes more
        inf = float("inf")
        choices = [
            sorted(
                c,
                key=lambda ki, ji=ji: (
                    p.cost if (p := self.best(ki, 1 << ji)) is not None else inf,
                    ki,
                ),
            )
            for ji, c in enumerate(choices)
        ]
        masks = [0] * len(self.K)
        assign: list[int] = []
        found: list = [None]

        def rec(ji: int, partial: float) -> None:
            if budget is not None:
                if budget[0] <= 0 or found[0] is not None:
                    return  # past the greedy: the first feasible map will do
                budget[0] -= 1
            if ji == n_j:
                r = self.evaluate(assign)
                if r is not None and (found[0] is None or r[:3] < found[0][:3]):
                    found[0] = r
                return
            for ki in choices[ji]:
                old = masks[ki]
                p = self.best(ki, old | (1 << ji))
                if p is None:
                    continue
                bound = partial + p.cost - (self.best(ki, old).cost if old else 0.0)
                if found[0] is not None and bound > found[0][0] * (1 + 1e-12):
                    continue
                masks[ki] = old | (1 << ji)
                assign.append(ki)
                rec(ji + 1, bound)
                assign.pop()
                masks[ki] = old

        rec(0, 0.0)
        return found[0]

    def greedy(self, choices: list[list[int]]):
        """Large instances: jobs in deadline order, each where it adds the least cost."""
        assign: list[int] = []
        for ji in range(len(self.jobs)):
            best = None
            for ki in choices[ji]:
                r = self._partial(assign + [ki])
                if r is not None and (best is None or r < best[0]):
                    best = (r, ki)
            if best is None:
                return None
            assign.append(best[1])
        return self.evaluate(assign)

    def _partial(self, assign: list[int]) -> float | None:
        masks = [0] * len(self.K)
        for ji, ki in enumerate(assign):
            masks[ki] |= 1 << ji
        total = 0.0
        for ki, m in enumerate(masks):
            if m:
                p = self.best(ki, m)
                if p is None:
                    return None
                total += p.cost
        return total

    def homeless(self) -> bool:
        """True when some job fits no cluster even alone: then no job-to-cluster map is
        feasible (a cluster's cheapest point for a set of jobs exists only if it exists for
        each of them alone), and both searches can be skipped.

        Alone on cluster k a job fits at some OPP from ``base`` up iff it is light there (one
        core of at least one) or heavy with n <= |k|: :meth:`best` of the single job without
        its costs.
        """
        for ji in range(len(self.jobs)):
            for ki, k in enumerate(self.K):
                m_k = len(k.cpus)
                if (
                    m_k
                    and k.freqs_khz
                    and any(
                        r is not None and (r[0] == LIGHT or (r[0] == HEAVY and r[1] <= m_k))
                        for r in self.req(ji, ki)
                    )
                ):
                    break
            else:
                return True
        return False

    def run(self) -> GateResult:
        if self.homeless():
            return self.safest()
        all_k = list(range(len(self.K)))
        stay = [[h] if h is not None else all_k for h in self.home]
        found = self.search(stay)
        if found is None and any(h is not None for h in self.home) and len(self.K) > 1:
            found = self.search([all_k for _ in self.jobs])
        if found is None:
            return self.safest()
        _, moves, _, masks, plan = found
        events = [f"gate: proposal infeasible ({'; '.join(self.reasons[:3])})"]
        if moves:
            events.append(f"gate: {moves} job(s) moved to another cluster")
        freq = dict(self.d.freq_khz)
        jobs = dict(self.d.jobs)
        governor = dict(self.d.governor)
        heavy_cpus: set[int] = set()
        reserved: set[int] = set()
        for ki, p in enumerate(plan):
            if p is None:
                continue
            k = self.K[ki]
            members = list(_bits(masks[ki]))
            if p == "keep":
                for ji in members:
                    al = self.proposal.alloc[self.jobs[ji].pid]
                    reserved.update(al.cpus)
                    if al.kind == "heavy":
                        heavy_cpus.update(al.cpus)
                continue
            f = k.freqs_khz[p.fi]
            if freq.get(k.name) != f:
                events.append(f"gate: {k.name} {freq.get(k.name)} -> {f} kHz")
                freq[k.name] = f
                gov = governor.get(k.name)
                if gov is not None and gov != "userspace":
                    del governor[k.name]
                    events.append(
                        f"gate: {k.name} leaves governor {gov!r} for userspace at {f} kHz"
                    )
            free = [c for c in k.cpus]
            lights: list[int] = []
            for ji in members:
                kind, n, _, _ = self.req(ji, ki)[p.fi]
                if kind == HEAVY:
                    cpus = self._take(free, self.jobs[ji].pid, n)
                    heavy_cpus.update(cpus)
                    reserved.update(cpus)
                    self._set(
                        jobs, events, self.jobs[ji].pid, cpus, f"heavy, {n} cores on {k.name}"
                    )
                else:
                    lights.append(ji)
            if lights and p.parts is not None:
                for part in p.parts:  # only a split fits: one core per part
                    core = self._take(free, [self.jobs[ji].pid for ji in part], 1)
                    reserved.update(core)
                    for ji in part:
                        self._set(
                            jobs,
                            events,
                            self.jobs[ji].pid,
                            core,
                            f"light, {len(part)} in deadline order on one core of {k.name}",
                        )
            elif lights:
                pool = self._take(free, [self.jobs[ji].pid for ji in lights], p.pool)
                reserved.update(pool)
                for ji in lights:
                    self._set(
                        jobs,
                        events,
                        self.jobs[ji].pid,
                        pool,
                        f"light, pool of {p.pool} on {k.name}",
                    )
        self._snap_idle_clusters(freq, masks, events)
        self._place_others(jobs, events, heavy_cpus, reserved)
        return self._finish(freq, jobs, governor, events)

    def safest(self) -> GateResult:
        """Every cluster at its top OPP; jobs in deadline order on the largest cluster that fits.

        A job no core count can save (past its deadline, or L(f) >= D on every cluster) comes
        last, whatever its deadline: cores it took first could not help it and would starve
        the jobs that can still make theirs. A job short of cores takes every free core of
        its best cluster, and the first such job then also the cores left free on the other
        clusters, before any best-effort job is placed.
        """
        freq = dict(self.d.freq_khz)
        governor = dict(self.d.governor)
        for k in self.K:
            if k.freqs_khz:
                freq[k.name] = k.fmax_khz
                if governor.get(k.name) not in (None, "userspace"):
                    del governor[k.name]
        jobs = dict(self.d.jobs)
        events = [
            f"gate: no feasible assignment ({'; '.join(self.reasons[:3])}); "
            "safest point: every cluster at its maximum, jobs on the largest/fastest clusters"
        ]
        free = {ki: list(self.K[ki].cpus) for ki in self.g._ranking}
        heavy_cpus: set[int] = set()
        reserved: set[int] = set()
        lost = [
            all(self.req(ji, ki)[-1][0] == IMPOSSIBLE for ki in self.g._ranking)
            for ji in range(len(self.jobs))
        ]
        order = sorted(range(len(self.jobs)), key=lambda ji: lost[ji])  # stable: deadline order
        short: list[int] = []  # jobs given fewer cores than their deadline needs, in order
        for ji in order:
            j = self.jobs[ji]
            chosen = None
            for ki in self.g._ranking:
                kind, n, _, _ = self.req(ji, ki)[-1]
                if kind != IMPOSSIBLE and n <= len(free[ki]):
                    chosen = (ki, n)
                    break
            if chosen is None:
                with_free = [ki for ki in self.g._ranking if free[ki]]
                if with_free:
                    ki = max(
                        with_free,
                        key=lambda i: len(free[i]) * self.K[i].capacity * self.K[i].fmax_khz,
                    )
                    chosen = (ki, len(free[ki]))
                    short.append(j.pid)
                    events.append(
                        f"gate: pid {j.pid} cannot meet its deadline; gets all {chosen[1]} free cores of {self.K[ki].name}"
                    )
            if chosen is not None:
                ki, n = chosen
                cpus = self._take(free[ki], j.pid, n)
                heavy_cpus.update(cpus)
                reserved.update(cpus)
                self._set(jobs, events, j.pid, cpus, f"safest, {n} cores on {self.K[ki].name}")
            elif self.g._ranking:
                k = self.K[self.g._ranking[0]]
                self._set(jobs, events, j.pid, k.cpus, f"no free core left; shares {k.name}")
        spare = [c for ki in self.g._ranking for c in free[ki]]
        if short and spare:
            # the cores no deadline job holds go to the first job short of cores, whatever
            # their cluster: it is late on its own cluster, and a best-effort job placed there
            # alone would take the fastest cores left (a prime core). Best-effort jobs with
            # nowhere else to go share these (below it), not the cores of jobs still on time
            pid = short[0]
            reserved.update(spare)
            self._set(
                jobs,
                events,
                pid,
                tuple(jobs[pid].cpus) + tuple(spare),
                f"short of cores; also the {len(spare)} free cores of other clusters",
            )
        self._place_others(jobs, events, heavy_cpus, reserved)
        res = self._finish(freq, jobs, governor, events)
        res.feasible = False
        return res

    # -- building the decision

    def _take(self, free: list[int], pids: int | list[int], n: int) -> tuple[int, ...]:
        """``n`` cores from ``free`` (removed), the jobs' proposed cores first."""
        pids = [pids] if isinstance(pids, int) else pids
        prefer: list[int] = []
        for pid in pids:
            s = self.d.jobs.get(pid)
            if s is not None:
                prefer.extend(c for c in s.cpus if c in free and c not in prefer)
        chosen = prefer[:n]
        for c in free:
            if len(chosen) >= n:
                break
            if c not in chosen:
                chosen.append(c)
        for c in chosen:
            free.remove(c)
        return tuple(sorted(chosen))

    def _set(
        self,
        jobs: dict[int, JobSetting],
        events: list[str],
        pid: int,
        cpus: tuple[int, ...],
        why: str,
    ) -> None:
        old = jobs.get(pid)
        cpus = tuple(sorted(cpus))
        if old is not None and tuple(sorted(old.cpus)) == cpus:
            return
        jobs[pid] = (
            JobSetting(cpus, old.rt_priority, old.nice) if old is not None else JobSetting(cpus)
        )
        events.append(
            f"gate: pid {pid} cores {list(old.cpus) if old else []} -> {list(cpus)} ({why})"
        )

    def _snap_idle_clusters(
        self, freq: dict[str, int], masks: list[int], events: list[str]
    ) -> None:
        for ki, k in enumerate(self.K):
            f = freq.get(k.name)
            if masks[ki] or f is None or not k.freqs_khz or f in k.freqs_khz:
                continue
            g = k.freqs_khz[self._ceil_index(k, f)]
            events.append(f"gate: {k.name} {f} -> {g} kHz (not an allowed OPP)")
            freq[k.name] = g

    def _place_others(
        self, jobs: dict[int, JobSetting], events: list[str], heavy: set[int], reserved: set[int]
    ) -> None:
        online = self.g._online
        for pid, cpus in self.others.items():
            if not heavy.intersection(cpus):
                continue
            new = (
                [c for c in cpus if c not in reserved]
                or [c for c in cpus if c not in heavy]
                or [c for c in online if c not in reserved]
                or [c for c in online if c not in heavy]
            )
            if new:
                self._set(jobs, events, pid, tuple(new), "best effort, off the heavy cores")
            else:
                events.append(
                    f"gate: best-effort pid {pid} has no core outside the heavy reservations"
                )

    def _finish(
        self,
        freq: dict[str, int],
        jobs: dict[int, JobSetting],
        governor: dict[str, str],
        events: list[str],
    ) -> GateResult:
        d = Decision(freq, jobs, governor, dict(self.d.cap_khz), list(self.d.events) + events)
        # self.jobs are in deadline order already: analyse without check()'s re-sort
        reasons, alloc = _analyse(self.g._assignment(d, self.jobs), self.g._kwhere)[:2]
        if reasons and not events[0].startswith("gate: no feasible"):
            events.append(f"gate: repaired point still violates: {'; '.join(reasons[:3])}")
            d.events.append(events[-1])
        return GateResult(d, not reasons, events, alloc, self.g._cost_of(alloc, freq))


def order_priorities(decision: Decision, jobs: Sequence[GateJob]) -> tuple[Decision, list[str]]:
    """``decision`` with the priorities the federated analysis assumes on shared cores, and
    an event per change (the decision itself when nothing changes).

    * A best-effort job sharing a core with a deadline job runs SCHED_OTHER (rt 0, its nice
      kept): rt 0 stays below any SCHED_FIFO priority however the actuator scales them.
    * Deadline jobs on the same core set (a light pool) run in deadline order: each below
      the earlier ones.
    * A deadline job whose cores strictly contain another's (the safest point's job that
      shares a cluster when no core is free) runs below it: it fills what the job holding
      the cores leaves, it does not take them.
    * Every deadline job that shares a core runs SCHED_FIFO (rt >= 1): when the two rules
      above push one below 1, all of them are lifted alike, which keeps their order.

    A job is only ever lowered below the jobs it must yield to (its own priority otherwise
    stands), so the order the priority agent chose survives wherever cores are not shared.
    ``jobs`` are the deadline jobs in deadline order (as :meth:`FederatedGate.repair` sorts
    them); a job without a setting in the decision is left alone.
    """
    settings = decision.jobs
    due = [j.pid for j in jobs if j.pid in settings]
    if not due:
        return decision, []
    rank = {pid: i for i, pid in enumerate(due)}
    cpus = {pid: frozenset(st.cpus) for pid, st in settings.items()}
    rt = {pid: st.rt_priority for pid, st in settings.items()}
    why: dict[int, str] = {}
    shared: set[int] = set()
    for pid in settings:
        if pid in rank:
            continue
        over = [d for d in due if not cpus[d].isdisjoint(cpus[pid])]
        if over:
            shared.update(over)
            rt[pid] = 0
            why[pid] = f"best effort on the cores of deadline pid {over[0]}"
    # smaller core sets first, then deadline order: every job comes after those above it
    for pid in sorted(due, key=lambda p: (len(cpus[p]), rank[p])):
        above = [
            b
            for b in due
            if cpus[b] and (cpus[b] < cpus[pid] or (cpus[b] == cpus[pid] and rank[b] < rank[pid]))
        ]
        if not above:
            continue
        shared.add(pid)
        shared.update(above)
        top = min(rt[b] for b in above) - 1
        if rt[pid] > top:
            rt[pid] = top
            b = min(above, key=lambda x: rt[x])
            why[pid] = (
                f"deadline order on the cores of pid {b}"
                if cpus[b] == cpus[pid]
                else f"below deadline pid {b} whose cores it shares"
            )
    low = min((rt[d] for d in shared), default=1)
    if low < 1:
        lift = 1 - low
        if max(rt[d] for d in shared) + lift > 99:
            # lifting would push the top past 99: rank them 1, 2, ... instead (same order;
            # a cap at 99 made the top ones equal)
            rank_of = {v: i + 1 for i, v in enumerate(sorted({rt[d] for d in shared}))}
            lifted = {d: min(rank_of[rt[d]], 99) for d in shared}
        else:
            lifted = {d: rt[d] + lift for d in shared}
        for d in shared:
            rt[d] = lifted[d]
            why.setdefault(d, "SCHED_FIFO for a deadline job on shared cores")
    events: list[str] = []
    new = dict(settings)
    for pid, st in settings.items():
        if rt[pid] != st.rt_priority:
            new[pid] = JobSetting(st.cpus, rt[pid], st.nice)
            # the old value is left out: the text then stays the same while the change holds
            # tick after tick, and the loop logs it once (daemon.loop)
            events.append(f"gate: pid {pid} rt priority {rt[pid]} ({why.get(pid, 'order')})")
    if not events:
        return decision, []
    out = decision.copy()
    out.jobs = new
    out.events.extend(events)
    return out, events


def _bits(mask: int):
    i = 0
    while mask:
        if mask & 1:
            yield i
        mask >>= 1
        i += 1


def gate_decision(obs: Observation, decision: Decision, cost: CostFn | None = None) -> GateResult:
    """Check/repair ``decision`` for the deadline jobs of ``obs`` (rebuilds the gate)."""
    return FederatedGate.from_observation(obs, cost).repair(decision, jobs_from_obs(obs))


__all__ = [
    "GateCluster",
    "GateJob",
    "GateResult",
    "JobAlloc",
    "Assignment",
    "FederatedGate",
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
    "default_cost",
    "jobs_from_obs",
    "clusters_from_obs",
    "gate_decision",
    "order_priorities",
]
