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
order, so a job's critical path waits only while every core runs work of its priority or above:
the group passes when R_k <= L_k + (W_k - L_k) / m <= D_k for each job k, W_k the work of the
jobs up to k (:func:`~agents.schedulability.pool_fits`; on one core, their sequential sum).
Light groups with different core sets must be disjoint, and a group of s jobs is credited with
at most s cores (:func:`~agents.schedulability.light_pool_size` stops there). The repair looks
for the fewest cores of a cluster that hold its light jobs in any way the analysis accepts: a
partition of them into groups, each on a pool of its own sized by its test
(:func:`~agents.gate_repair.light_groups`; one shared pool of all of them, and a split over
single cores whose jobs run in deadline order, are two such partitions). It is exact up to
:data:`~agents.schedulability.MAX_EXACT_LIGHTS` light jobs per cluster (every partition, a
dynamic programme over subsets); beyond, a first-fit-decreasing heuristic, sound (every group
it returns passes the test) but able to miss a grouping that fits. The tests assume
deadline-ordered execution, which :func:`order_priorities` sets.

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
   cheapest wins, fewest moves on a tie). Then the gate finds a feasible point whenever the
   analysis accepts any point (any OPPs, any core sets), provided the map search is exhaustive
   (at most :data:`~agents.gate_repair.MAX_MAPS` maps) and no cluster is asked to hold more
   than :data:`~agents.schedulability.MAX_EXACT_LIGHTS` light jobs (always so with up to that
   many deadline jobs): feasibility is monotone in f (C, L and n(f) never grow with f, and the
   pool test's bound grows with C and L), so the raise-only restriction loses none; more cores than n
   never help a heavy job, and the light jobs' groups are searched exhaustively. Beyond
   :data:`~agents.gate_repair.MAX_MAPS` maps (8 deadline jobs on three clusters) a greedy
   placement comes first and, where it finds none, a search bounded to
   :data:`~agents.gate_repair.MAX_NODES` steps for any feasible map; and past
   :data:`~agents.schedulability.MAX_EXACT_LIGHTS` light jobs on one cluster their groups are
   a heuristic's: in either case a feasible point can be missed (never an infeasible one
   admitted: every returned point is re-checked by the analysis).
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

Layout: this module is the entry point (:class:`FederatedGate`, :func:`gate_decision`,
:func:`order_priorities` and the cost model). The model and its tests
(:func:`~agents.schedulability.requirement`, :func:`~agents.schedulability.pool_fits`,
:func:`~agents.schedulability.light_pool_size`, :func:`~agents.schedulability.analyse`, ...)
are in :mod:`agents.schedulability`; the repair search (steps 2-4 above,
:func:`~agents.gate_repair.light_groups`, :data:`~agents.gate_repair.MAX_MAPS`,
:data:`~agents.gate_repair.MAX_NODES`) and :class:`GateResult` are in :mod:`agents.gate_repair`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from agents.gate_repair import GateResult, _Repair
from agents.policy import Decision, JobSetting
from agents.schedulability import (
    Assignment,
    GateCluster,
    GateJob,
    JobAlloc,
    _analyse,
    clusters_from_obs,
    jobs_from_obs,
)
from platforms.observation import Observation

#: bound of a gate's cost memo (clusters x OPPs x core counts fit many times over)
_MAX_COSTS = 4096


# --------------------------------------------------------------------------------------------
# Inputs


def default_cost(cluster: GateCluster, khz: int, ncores: int) -> float:
    """active cores * capacity * f^3 (GHz): monotone in f and cores, ~dynamic power."""
    g = khz * 1e-6
    return ncores * cluster.capacity * g * g * g


CostFn = Callable[[GateCluster, int, int], float]


# --------------------------------------------------------------------------------------------
# The gate


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


def gate_decision(obs: Observation, decision: Decision, cost: CostFn | None = None) -> GateResult:
    """Check/repair ``decision`` for the deadline jobs of ``obs`` (rebuilds the gate)."""
    return FederatedGate.from_observation(obs, cost).repair(decision, jobs_from_obs(obs))


__all__ = [
    "GateResult",
    "FederatedGate",
    "default_cost",
    "gate_decision",
    "order_priorities",
]
