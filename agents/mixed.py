"""Mixed criticality: cluster-aware reservation (models.md section 8).

A high-criticality job gets a whole cluster - its frequency domain included - while it runs:
its cores are exclusive, its priority is SCHED_FIFO, and the cluster never runs below the
frequency the job needs. Low-criticality jobs are confined to the other clusters and are the
first to slow down (their clusters keep the policy's choice). Reserving whole domains decouples
the HI job's DVFS from LO energy savings and removes shared-L2 interference.

Which cluster: the least capable one the job fits with a margin (the most is left to LO work),
else the fastest; the job moves down as its work shrinks. The policy's own stages (gate,
shield, spill) plan around the reservation (:class:`AroundReservation`), and
:func:`daemon_stages` builds the list the daemon runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from agents.features import job_time_at
from agents.policy import Decision, JobSetting, nearest_freq
from platforms.observation import ClusterObs, JobObs, Observation

HI_RT_PRIORITY = 50
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
    return len(c.online) * c.capacity * (c.freqs_khz[-1] if c.freqs_khz else 0)


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
    top = c.freqs_khz[-1]
    if job.profile is None or job.deadline_s is None:
        return top
    remaining = margin * (job.deadline_s - job.elapsed_s)
    # the bound only falls as f rises: the first OPP that holds, by bisection
    table = c.freqs_khz
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
    return _graham_s(job, c, c.freqs_khz[-1]) <= margin * (job.deadline_s - job.elapsed_s)


def _pick_cluster(job: JobObs, free: list[ClusterObs]) -> ClusterObs:
    """The cluster ``job`` reserves among ``free`` (fastest first): the least capable one it
    fits with :data:`HI_MARGIN`, which leaves the most to LO work, else the fastest.

    A job already holding a cluster keeps it while it fits there with :data:`STAY_MARGIN`,
    unless a less capable one now fits with :data:`HI_MARGIN`: it moves down as its work
    shrinks, and the band between the margins keeps it from moving back and forth.
    """
    ok = [c for c in free if fits(job, c)]
    here = next((c for c in free if c.online and tuple(job.cpus) == tuple(c.online)), None)
    if here is not None and fits(job, here, STAY_MARGIN):
        smaller = [c for c in ok if _speed(c) < _speed(here)]
        return min(smaller, key=_speed) if smaller else here
    return min(ok, key=_speed) if ok else free[0]


@dataclass(frozen=True)
class ReservationPlan:
    """Which cluster each HI job holds this tick, and where LO work runs.

    ``hi`` maps a reserved cluster to its HI job. ``lo_cpus`` are the online CPUs of the
    clusters nobody reserved; when every cluster is reserved (a one-cluster board) LO work
    shares the slowest one below the HI job and ``shared`` is true.
    """

    hi: dict[str, JobObs]
    lo_cpus: tuple[int, ...]
    shared: bool

    @property
    def hi_pids(self) -> frozenset[int]:
        return frozenset(j.pid for j in self.hi.values())


def plan_reservation(obs: Observation) -> ReservationPlan:
    """The reservation of ``obs``: HI jobs in deadline order each take a free cluster
    (:func:`_pick_cluster`: the least capable one they fit with a margin, else the
    fastest), and once one holds a cluster, the last free one stays for LO work. Pure: the
    stages that plan around the reservation and the stage that applies it agree."""
    his = sorted(
        (j for j in obs.jobs if j.criticality == "hi"),
        key=lambda j: j.remaining_s if j.remaining_s is not None else math.inf,
    )
    free = sorted((c for c in obs.clusters if c.online and c.freqs_khz), key=_speed, reverse=True)
    hi: dict[str, JobObs] = {}
    for j in his:
        if not free or (len(free) <= 1 and hi):
            break  # keep one cluster for LO work once a HI job holds one
        c = _pick_cluster(j, free)
        free.remove(c)
        hi[c.name] = j
    lo_cpus = tuple(sorted(cpu for c in obs.clusters if c.name not in hi for cpu in c.online))
    shared = not lo_cpus and bool(hi)
    if shared:  # every cluster reserved: LO work shares the slowest one, below HI
        lo_cpus = tuple(min((c for c in obs.clusters if c.online), key=_speed).online)
    return ReservationPlan(hi, lo_cpus, shared)


@dataclass(frozen=True)
class _Parts:
    """One tick's reservation and the parts of the board the stages plan on."""

    plan: ReservationPlan
    lo_view: Observation  # the unreserved clusters and the jobs without a cluster
    hi_views: dict[str, Observation]  # each reserved cluster with its HI job alone
    need: dict[str, int]  # each reserved cluster's frequency floor (needed_khz)

    @classmethod
    def of(cls, obs: Observation) -> _Parts:
        plan = plan_reservation(obs)
        if not plan.hi:  # the usual tick: nothing to split
            return cls(plan, obs, {}, {})
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
        return cls(plan, lo_view, hi_views, need)


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


def _lo_cpus_of(st: JobSetting | None, lo_cpus: tuple[int, ...]) -> tuple[int, ...]:
    """A LO job's cores under the reservation: its own outside the reserved clusters, else
    every LO core."""
    return tuple(c for c in (st.cpus if st else lo_cpus) if c in lo_cpus) or lo_cpus


@dataclass
class ClusterReservation:
    """Decision stage: reserve one cluster per HI job; LO jobs go to the rest."""

    enabled: bool = True
    planner: ReservationPlanner = field(default_factory=ReservationPlanner, compare=False)
    #: the reservation of the last decision: cluster -> HI job's pid (the daemon's status)
    held: dict[str, int] = field(default_factory=dict, init=False, compare=False)

    def reservations(self) -> dict[str, int] | None:
        """Which HI job holds which cluster now; None when the reservation is off."""
        return dict(self.held) if self.enabled else None

    def __call__(self, decision: Decision, obs: Observation) -> Decision:
        if not self.enabled:
            return decision
        parts = self.planner(obs)
        plan = parts.plan
        self.held = {name: j.pid for name, j in plan.hi.items()}
        if not plan.hi:
            return decision
        out = decision.copy()
        for name, j in plan.hi.items():
            _reserve(out, obs.cluster(name), j, parts.need[name])
            out.events.append(f"reserve cluster={name} pid={j.pid} need_khz={parts.need[name]}")
        # LO jobs keep the priorities the policy (and its gate) gave them on their own
        # clusters: a HI job's cores are exclusive, so they cannot reach it there
        hi_pids = plan.hi_pids
        for j in obs.jobs:
            if j.pid in hi_pids:
                continue
            prev = out.jobs.get(j.pid)
            rt = prev.rt_priority if prev is not None and not plan.shared else 0
            out.jobs[j.pid] = JobSetting(
                _lo_cpus_of(prev, plan.lo_cpus), rt_priority=rt, nice=prev.nice if prev else 0
            )
        return out


def _reserve(decision: Decision, c: ClusterObs, job: JobObs, need: int) -> None:
    """Give ``job`` all of cluster ``c`` in ``decision`` (in place), at SCHED_FIFO
    :data:`HI_RT_PRIORITY` and at least ``need`` kHz (:func:`needed_khz`)."""
    decision.jobs[job.pid] = JobSetting(tuple(c.online), rt_priority=HI_RT_PRIORITY)
    want = max(decision.freq_khz.get(c.name, need), need)
    decision.freq_khz[c.name] = nearest_freq(c.freqs_khz, want, "ceil")
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
      reservation uses (the bound is thin at the tail of a DAG, where the span dominates).

    The parts' decisions are merged; the reservation stage then stamps the HI jobs' settings
    again. Other attributes (``job_done``, ``calibration``, ...) are the wrapped stage's.
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
        hi_pids = plan.hi_pids
        lo = decision.copy()
        for pid, st in decision.jobs.items():
            if pid in hi_pids:
                del lo.jobs[pid]
            else:
                lo.jobs[pid] = JobSetting(_lo_cpus_of(st, plan.lo_cpus), st.rt_priority, st.nice)
        out = self.stage(lo, parts.lo_view).copy()
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
