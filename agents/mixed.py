"""Mixed criticality: cluster-aware reservation (models.md section 8).

A high-criticality job gets a whole cluster - its frequency domain included - while it runs:
its cores are exclusive, its priority is SCHED_FIFO, and the cluster never runs below the
frequency the job needs. Low-criticality jobs are confined to the other clusters and are the
first to slow down (their clusters keep the policy's choice). Reserving whole domains decouples
the HI job's DVFS from LO energy savings and removes shared-L2 interference.

Which cluster: the least capable one the job fits with a margin (the most is left to LO work),
else the fastest; the job moves down as its work shrinks. A job that fits no free cluster
alone but fits them together (a greedy run on cores of unequal speed) takes them all, and LO
work shares the slowest below it, as on a one-cluster board. One cluster stays for LO work, so a
HI job that finds no cluster of its own (two overlapping on a two-cluster board) *shares* one
with LO work: planned there before the LO work, SCHED_FIFO above every LO job on its cores,
and the cluster's frequency at least its need. The policy's own stages (gate, shield, spill)
plan around the reservation (:class:`AroundReservation`), and :func:`daemon_stages` builds
the list the daemon runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from agents.deadlines import greedy_bound
from agents.features import job_remaining, job_time_at
from agents.policy import Decision, JobSetting, nearest_freq
from platforms.observation import ClusterObs, JobObs, Observation

HI_RT_PRIORITY = 50
#: a HI job sharing a LO cluster runs at this SCHED_FIFO priority (the next ones in deadline
#: order one below each), above any LO job there: the LO jobs' own priorities are capped
#: below it (a policy's priorities reach 90, the gate's a little higher)
SHARED_HI_RT_PRIORITY = 99
#: how many HI jobs may share one cluster above its LO work (each below the one before)
MAX_SHARERS = 8
#: a HI job takes a cluster other than the fastest only if its Graham bound there at the top
#: frequency is at most this share of its remaining time (the model's error stays on the
#: safe side: the bound is thin at a DAG's tail)
HI_MARGIN = 0.8
#: a HI job keeps the cluster it holds while its bound there at the top frequency is within
#: this share of its remaining time (between the two margins it neither moves up nor back)
STAY_MARGIN = 0.9
#: the reserved cluster's frequency floor: the Graham bound at most this share of the time
#: left (recomputed every tick, so the job stays ahead of its deadline)
NEED_MARGIN = 0.9


def _speed(c: ClusterObs) -> float:
    top = c.allowed_khz
    return len(c.online) * c.capacity * (top[-1] if top else 0)


def _graham_s(job: JobObs, c: ClusterObs, khz: int) -> float:
    """Graham bound of ``job``'s remaining work on all of ``c`` at ``khz``
    (:func:`agents.features.job_time_at`: the remaining critical path is the whole span, at
    most the remaining work, as the gate takes it; a DAG's tail is often its critical path)."""
    return job_time_at(job, khz, c.capacity, len(c.online))


def needed_khz(job: JobObs, c: ClusterObs, margin: float = 1.0) -> int:
    """Lowest table frequency at which ``job`` still meets its deadline on all of ``c``,
    with its Graham bound at most ``margin`` of the time it has left.

    Uses the Graham bound of the remaining work with the two-point model; the top frequency
    when the job has no deadline or no profile.
    """
    table = c.allowed_khz  # within the cluster's limits: what the reservation can get
    top = table[-1]
    if job.profile is None or job.deadline_s is None:
        return top
    remaining = margin * (job.deadline_s - job.elapsed_s)
    # the bound only falls as f rises: the first OPP that holds, by bisection
    lo, hi = 0, len(table)
    while lo < hi:
        mid = (lo + hi) // 2
        if _graham_s(job, c, table[mid]) <= remaining:
            hi = mid
        else:
            lo = mid + 1
    return table[lo] if lo < len(table) else top


def fits(job: JobObs, c: ClusterObs, margin: float = HI_MARGIN) -> bool:
    """``job``'s Graham bound on all of ``c`` at its top frequency is at most ``margin`` of
    the time it has left (False without a deadline or a profile: nothing to tell)."""
    if job.profile is None or job.deadline_s is None or not c.freqs_khz:
        return False
    top = c.allowed_khz[-1]  # the top the limits allow, not the table's
    return _graham_s(job, c, top) <= margin * (job.deadline_s - job.elapsed_s)


def _fitting_cluster(job: JobObs, free: list[ClusterObs]) -> ClusterObs | None:
    """The cluster ``job`` fits among ``free``: the least capable one it fits with
    :data:`HI_MARGIN`, which leaves the most to LO work; None when it fits none.

    A job already holding a cluster keeps it while it fits there with :data:`STAY_MARGIN`,
    unless a less capable one now fits with :data:`HI_MARGIN`: it moves down as its work
    shrinks, and the band between the margins keeps it from moving back and forth.
    """
    ok = [c for c in free if fits(job, c)]
    here = next((c for c in free if c.online and tuple(job.cpus) == tuple(c.online)), None)
    if here is not None and fits(job, here, STAY_MARGIN):
        smaller = [c for c in ok if _speed(c) < _speed(here)]
        return min(smaller, key=_speed) if smaller else here
    return min(ok, key=_speed) if ok else None


def _pick_cluster(job: JobObs, free: list[ClusterObs]) -> ClusterObs:
    """The cluster ``job`` reserves among ``free`` (fastest first): the one it fits
    (:func:`_fitting_cluster`), else the fastest."""
    return _fitting_cluster(job, free) or free[0]


@dataclass(frozen=True)
class ReservationPlan:
    """Which cluster each HI job holds this tick, and where LO work runs.

    ``hi`` maps a reserved cluster to its HI job. ``lo_cpus`` are the online CPUs of the
    clusters nobody reserved; when every cluster is reserved (a one-cluster board) LO work
    shares the slowest one below the HI job and ``shared`` is true. ``shares`` maps a cluster
    LO work runs on to the HI jobs that found no cluster of their own and run there above
    the LO work (deadline order; below the HI job holding it, on a one-cluster board).
    """

    hi: dict[str, JobObs]
    lo_cpus: tuple[int, ...]
    shared: bool
    shares: dict[str, tuple[JobObs, ...]] = field(default_factory=dict)

    @property
    def hi_pids(self) -> frozenset[int]:
        return frozenset(j.pid for j in self.hi.values())

    @property
    def sharer_pids(self) -> frozenset[int]:
        return frozenset(j.pid for js in self.shares.values() for j in js)

    def sharer_priorities(self) -> dict[int, int]:
        """SCHED_FIFO priority of each sharing HI job: from :data:`SHARED_HI_RT_PRIORITY`
        down in deadline order on a LO cluster, from just below the holder's on a held one."""
        out = {}
        for name, jobs in self.shares.items():
            top = HI_RT_PRIORITY - 1 if name in self.hi else SHARED_HI_RT_PRIORITY
            for rank, j in enumerate(jobs):
                out[j.pid] = max(top - rank, 1)
        return out


def fits_together(job: JobObs, clusters: Sequence[ClusterObs], margin: float = HI_MARGIN) -> bool:
    """``job``'s bound for a greedy run on every core of ``clusters`` at their top
    frequencies (:func:`agents.deadlines.greedy_bound`: cores of unequal speed) is at most
    ``margin`` of the time it has left (False without a deadline or a profile)."""
    if job.profile is None or job.deadline_s is None:
        return False
    cores = [(c.allowed_khz[-1], c.capacity) for c in clusters if c.freqs_khz for _ in c.online]
    bound = greedy_bound(job.profile, cores, job_remaining(job))
    return bound <= margin * (job.deadline_s - job.elapsed_s)


def plan_reservation(obs: Observation) -> ReservationPlan:
    """The reservation of ``obs``: HI jobs in deadline order each take a free cluster
    (:func:`_pick_cluster`: the least capable one they fit with a margin, else the
    fastest), and once one holds a cluster, the last free one stays for LO work. A HI job
    that fits no free cluster alone but fits them together (:func:`fits_together`) takes
    them all, and LO work shares the slowest below it, as on a one-cluster board. Pure:
    the stages that plan around the reservation and the stage that applies it agree."""
    his = sorted(
        (j for j in obs.jobs if j.criticality == "hi"),
        key=lambda j: j.remaining_s if j.remaining_s is not None else math.inf,
    )
    usable = sorted((c for c in obs.clusters if c.online and c.freqs_khz), key=_speed, reverse=True)
    free = list(usable)
    hi: dict[str, JobObs] = {}
    left: list[JobObs] = []  # HI jobs without a cluster of their own, deadline order
    for j in his:
        if not free or (len(free) <= 1 and hi):
            left.append(j)  # keep one cluster for LO work once a HI job holds one
            continue
        c = _fitting_cluster(j, free)
        if c is None and len(free) > 1 and fits_together(j, free):
            for c in free:
                hi[c.name] = j
            free = []
            continue
        c = c or free[0]
        free.remove(c)
        hi[c.name] = j
    lo_cpus = tuple(sorted(cpu for c in obs.clusters if c.name not in hi for cpu in c.online))
    shared = not lo_cpus and bool(hi)
    if shared:  # every cluster reserved: LO work shares the slowest one, below HI
        lo_cpus = tuple(min((c for c in obs.clusters if c.online), key=_speed).online)
    shares: dict[str, list[JobObs]] = {}  # (the stage takes the cores; here the cluster)
    lo_set = set(lo_cpus)
    hosts = [c for c in usable if lo_set.issuperset(c.online)]
    for j in left:  # each shares the cluster it would have reserved among LO work's
        open_ = [c for c in hosts if len(shares.get(c.name, ())) < MAX_SHARERS]
        if not open_:
            break
        shares.setdefault(_pick_cluster(j, open_).name, []).append(j)
    return ReservationPlan(hi, lo_cpus, shared, {k: tuple(v) for k, v in shares.items()})


@dataclass(frozen=True)
class _Parts:
    """One tick's reservation and the parts of the board the stages plan on."""

    plan: ReservationPlan
    lo_view: Observation  # the unreserved clusters and the jobs without a cluster
    hi_views: dict[str, Observation]  # each reserved cluster with its HI job alone
    need: dict[str, int]  # each reserved cluster's frequency floor (needed_khz)
    share_need: dict[str, int]  # each shared cluster's floor: its sharers' highest need
    share_views: dict[str, Observation] = field(default_factory=dict)  # ... with them alone

    @classmethod
    def of(cls, obs: Observation) -> _Parts:
        plan = plan_reservation(obs)
        share_need = {
            name: max(needed_khz(j, obs.cluster(name), NEED_MARGIN) for j in jobs)
            for name, jobs in plan.shares.items()
        }
        if not plan.hi:  # the usual tick: nothing to split
            return cls(plan, obs, {}, {}, share_need)
        hi_pids = plan.hi_pids
        lo_view = replace(
            obs,
            clusters=tuple(c for c in obs.clusters if c.name not in plan.hi),
            jobs=tuple(j for j in obs.jobs if j.pid not in hi_pids),
        )
        hi_views = {
            name: replace(obs, clusters=(obs.cluster(name),), jobs=(j,), zones=(), rails=())
            for name, j in plan.hi.items()
        }
        need = {name: needed_khz(j, obs.cluster(name), NEED_MARGIN) for name, j in plan.hi.items()}
        share_views = {
            name: replace(obs, clusters=(obs.cluster(name),), jobs=jobs, zones=(), rails=())
            for name, jobs in plan.shares.items()
        }
        return cls(plan, lo_view, hi_views, need, share_need, share_views)


class ReservationPlanner:
    """The reservation of the observation being decided, worked out once for every stage
    of the decision that asks (they are all handed the same Observation object)."""

    def __init__(self):
        self._obs: Observation | None = None
        self._parts: _Parts | None = None

    def __call__(self, obs: Observation) -> _Parts:
        if obs is not self._obs or self._parts is None:
            self._parts = _Parts.of(obs)
            self._obs = obs
        return self._parts


def _cores_within(st: JobSetting | None, allowed: tuple[int, ...]) -> tuple[int, ...]:
    """A job's cores among ``allowed`` (a LO job's outside the reserved clusters, a sharing
    HI job's on its cluster), else all of ``allowed``."""
    return tuple(c for c in (st.cpus if st else allowed) if c in allowed) or allowed


@dataclass
class ClusterReservation:
    """Decision stage: reserve one cluster per HI job; LO jobs go to the rest."""

    enabled: bool = True
    planner: ReservationPlanner = field(default_factory=ReservationPlanner, compare=False)
    #: the reservation of the last decision: cluster -> HI job's pid (the daemon's status)
    held: dict[str, int] = field(default_factory=dict, init=False, compare=False)
    #: cluster -> pids of the HI jobs sharing it above its LO work, in priority order
    sharing: dict[str, list[int]] = field(default_factory=dict, init=False, compare=False)

    def reservations(self) -> dict[str, int] | None:
        """Which HI job holds which cluster now; None when the reservation is off."""
        return dict(self.held) if self.enabled else None

    def shared_clusters(self) -> dict[str, list[int]] | None:
        """Which HI jobs share which cluster above its LO work now; None when off."""
        return {k: list(v) for k, v in self.sharing.items()} if self.enabled else None

    def __call__(self, decision: Decision, obs: Observation) -> Decision:
        if not self.enabled:
            return decision
        parts = self.planner(obs)
        plan = parts.plan
        self.held = {name: j.pid for name, j in plan.hi.items()}
        self.sharing = {name: [j.pid for j in js] for name, js in plan.shares.items()}
        if not plan.hi:
            return decision
        out = decision.copy()
        held: dict[int, list[int]] = {}  # per HI job, the cores of every cluster it holds
        for name, j in plan.hi.items():
            c = obs.cluster(name)
            _raise_floor(out, c, parts.need[name])
            held.setdefault(j.pid, []).extend(c.online)
            out.events.append(f"reserve cluster={name} pid={j.pid} need_khz={parts.need[name]}")
        for pid, cpus in held.items():  # all of them, at HI_RT_PRIORITY (as _reserve gives one)
            out.jobs[pid] = JobSetting(tuple(sorted(cpus)), rt_priority=HI_RT_PRIORITY)
        sharer_rt = plan.sharer_priorities()
        ceiling: dict[int, int] = {}  # per CPU: the lowest sharer priority running there
        for name, jobs in plan.shares.items():
            c = obs.cluster(name)
            _raise_floor(out, c, parts.share_need[name])
            for j in jobs:
                # the cores its policy gave it there (its stages plan it first), else all
                cpus = _cores_within(out.jobs.get(j.pid), tuple(c.online))
                rt = sharer_rt[j.pid]
                out.jobs[j.pid] = JobSetting(cpus, rt_priority=rt)
                out.events.append(
                    f"share cluster={name} pid={j.pid} rt={rt} need_khz={parts.share_need[name]}"
                )
                for cpu in cpus:
                    ceiling[cpu] = min(ceiling.get(cpu, rt), rt)
        # LO jobs keep the priorities the policy (and its gate) gave them on their own
        # clusters: a HI job's cores are exclusive, so they cannot reach it there; where a HI
        # job shares their cores they stay below it
        skip = plan.hi_pids | sharer_rt.keys()
        for j in obs.jobs:
            if j.pid in skip:
                continue
            prev = out.jobs.get(j.pid)
            rt = prev.rt_priority if prev is not None and not plan.shared else 0
            cpus = _cores_within(prev, plan.lo_cpus)
            cap = min((ceiling[c] for c in cpus if c in ceiling), default=None)
            if cap is not None:
                rt = min(rt, cap - 1)
            out.jobs[j.pid] = JobSetting(cpus, rt_priority=rt, nice=prev.nice if prev else 0)
        return out


def _reserve(decision: Decision, c: ClusterObs, job: JobObs, need: int) -> None:
    """Give ``job`` all of cluster ``c`` in ``decision`` (in place), at SCHED_FIFO
    :data:`HI_RT_PRIORITY` and at least ``need`` kHz (:func:`needed_khz`)."""
    decision.jobs[job.pid] = JobSetting(tuple(c.online), rt_priority=HI_RT_PRIORITY)
    _raise_floor(decision, c, need)


def _raise_floor(decision: Decision, c: ClusterObs, need: int) -> None:
    """Cluster ``c`` at ``need`` kHz or above in ``decision`` (in place), in userspace."""
    want = max(decision.freq_khz.get(c.name, need), need)
    decision.freq_khz[c.name] = nearest_freq(c.allowed_khz, want, "ceil")
    if decision.governor.get(c.name) not in (None, "userspace"):
        del decision.governor[c.name]  # a kernel governor there would ignore the floor


class AroundReservation:
    """Runs a decision stage (the gate, the shield, the spill) on the board as
    :class:`ClusterReservation` will leave it, one part at a time:

    * LO work: the clusters no HI job reserves, the other jobs on their cores there. Planned
      on the whole board, the gate placed some LO deadline jobs on a cluster the reservation
      then took from them;
    * each HI job alone on its reserved cluster, at the frequency the reservation sets: the
      gate and the shield raise it when the job needs more than the Graham bound the
      reservation uses (the bound is thin at the tail of a DAG, where the span dominates);
    * the HI jobs sharing a LO cluster first, alone on it at their floor: the cores they
      get there are theirs, and LO work is planned on what is left (on all of it, below
      them, when they take every core). Planned with the LO work, the gate's safest point
      handed the cores out in deadline order, and a HI job could get one core of four.

    The parts' decisions are merged (a shared cluster at the higher of the two frequencies:
    each part's bound only improves with f); the reservation stage then stamps the HI jobs'
    settings again. Other attributes (``job_done``, ``calibration``, ...) are the wrapped
    stage's.
    """

    def __init__(
        self,
        stage: Callable[[Decision, Observation], Decision],
        planner: ReservationPlanner | None = None,
    ):
        self.stage = stage
        self.planner = planner or ReservationPlanner()

    def __getattr__(self, name: str):
        stage = self.__dict__.get("stage")  # absent while copy/pickle rebuilds the object
        if stage is None:
            raise AttributeError(name)
        return getattr(stage, name)

    def __call__(self, decision: Decision, obs: Observation) -> Decision:
        parts = self.planner(obs)
        plan = parts.plan
        if not plan.hi or plan.shared:  # nothing reserved, or LO work keeps every core
            return self.stage(decision, obs)
        not_lo = plan.hi_pids | plan.sharer_pids  # jobs the LO part leaves out
        # HI jobs sharing a LO cluster first; LO work on the cores they left, where any
        shared_parts = {name: self._sharers(decision, obs, parts, name) for name in plan.shares}
        taken = {
            c
            for name, part in shared_parts.items()
            for j in plan.shares[name]
            if j.pid in part.jobs
            for c in part.jobs[j.pid].cpus
        }
        lo_view, lo_cpus = parts.lo_view, plan.lo_cpus
        if shared_parts:
            clusters, kept = [], []
            for c in lo_view.clusters:
                rest = tuple(x for x in c.online if x not in taken)
                online = rest or c.online
                clusters.append(c if online == c.online else replace(c, online=online))
                kept.extend(online)
            lo_view = replace(
                lo_view,
                clusters=tuple(clusters),
                jobs=tuple(j for j in lo_view.jobs if j.pid not in not_lo),
            )
            lo_cpus = tuple(sorted(kept))
        lo = decision.copy()
        for pid, st in decision.jobs.items():
            if pid in not_lo:
                del lo.jobs[pid]
            else:
                lo.jobs[pid] = JobSetting(_cores_within(st, lo_cpus), st.rt_priority, st.nice)
        for name, floor in parts.share_need.items():  # LO work runs under the sharers' floor
            _raise_floor(lo, obs.cluster(name), floor)
        out = self.stage(lo, lo_view).copy()
        for name, part in shared_parts.items():
            for j in plan.shares[name]:
                if j.pid in part.jobs:
                    out.jobs[j.pid] = part.jobs[j.pid]
            f = max(out.freq_khz.get(name, 0), part.freq_khz.get(name, 0))
            if f:
                out.freq_khz[name] = f
            out.events.extend(part.events)
        for name, job in plan.hi.items():
            view = parts.hi_views[name]
            freq = {name: decision.freq_khz[name]} if name in decision.freq_khz else {}
            part = Decision(freq, {}, dict(decision.governor))
            _reserve(part, view.clusters[0], job, parts.need[name])
            part = self.stage(part, view)
            if name in part.freq_khz:
                out.freq_khz[name] = part.freq_khz[name]
            if name in part.governor:
                out.governor[name] = part.governor[name]
            else:
                out.governor.pop(name, None)
            out.jobs[job.pid] = part.jobs.get(job.pid, decision.jobs.get(job.pid))
            out.events.extend(part.events)
        return out

    def _sharers(self, decision: Decision, obs: Observation, parts: _Parts, name: str):
        """The stage on shared cluster ``name`` with its HI jobs alone, at their floor, each
        on the cores its proposal gave it there (all of them if none)."""
        c = obs.cluster(name)
        freq = {name: decision.freq_khz[name]} if name in decision.freq_khz else {}
        part = Decision(freq, {}, dict(decision.governor))
        for j in parts.plan.shares[name]:
            st = decision.jobs.get(j.pid)
            part.jobs[j.pid] = JobSetting(
                _cores_within(st, tuple(c.online)), st.rt_priority if st else 0
            )
        _raise_floor(part, c, parts.share_need[name])
        return self.stage(part, parts.share_views[name])


def daemon_stages(
    stages: Sequence[Callable[[Decision, Observation], Decision]], reserve: bool = True
) -> list[Callable[[Decision, Observation], Decision]]:
    """The stages the daemon runs after its policy: the policy's own, then the reservation.

    With ``reserve`` the policy's stages plan around the reservation (:class:`AroundReservation`);
    without it they run as given and the reservation stage is a no-op.
    """
    if not reserve:
        return [*stages, ClusterReservation(False)]
    planner = ReservationPlanner()  # one reservation per decision, shared by its stages
    return [*(AroundReservation(s, planner) for s in stages), ClusterReservation(True, planner)]
