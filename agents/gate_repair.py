"""Repair search of the federated gate: the cheapest feasible change to an infeasible proposal.

:meth:`agents.gate.FederatedGate.repair` hands a proposal that fails the analysis of
:mod:`agents.schedulability` to one :class:`_Repair`: it keeps the clusters whose jobs are
fine, searches points and job-to-cluster maps for the cheapest feasible one (bounded by
:data:`MAX_MAPS` and :data:`MAX_NODES`; a cluster's light jobs in the fewest cores of any
grouping into pools, :func:`light_groups`), else falls back to the safest point, and builds the
repaired decision (:class:`GateResult`). The steps and their guarantees are set out in
:mod:`agents.gate`'s docstring. It is a module of its own because it is most of the gate's code
and its only search: :mod:`agents.gate` stays a short entry point, and this module needs the
gate only for a type annotation (no import cycle at run time).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

from agents.policy import Decision, JobSetting
from agents.schedulability import (
    HEAVY,
    IMPOSSIBLE,
    LIGHT,
    MAX_EXACT_LIGHTS,
    GateCluster,
    GateJob,
    JobAlloc,
    Requirement,
    _analyse,
    _Analysis,
    edf_list_split,
    light_pool_size,
    pool_fits,
    requirements,
)

if TYPE_CHECKING:
    from agents.gate import FederatedGate

#: above this many job-to-cluster maps the move stage assigns jobs greedily (deadline order)
MAX_MAPS = 4096
#: steps of the branch and bound after a greedy placement that found no feasible map
MAX_NODES = 20000


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
    pool: int  # light cores, all groups together
    #: None: the light jobs share one pool of ``pool`` cores; else their groups, each
    #: (light jobs as indices into the repair's jobs, cores of the group's own pool)
    parts: tuple[tuple[tuple[int, ...], int], ...] | None = None


class _Repair:
    """One repair: the search state of :meth:`agents.gate.FederatedGate.repair` (not reused)."""

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
        self._best: dict[tuple[int, int, int | None], _Point | None] = {}
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
        """:func:`~agents.schedulability.requirement` of job ``ji`` at every OPP of cluster
        ``ki`` from ``base`` up.

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
                lights: list[tuple[float, float, float, int]] = []
                for d, r, ji in reqs:
                    kind, n, c, span = r[fi]
                    if kind == HEAVY:
                        heavy += n
                    elif kind == LIGHT:
                        lights.append((d, c, span, ji))
                    else:
                        break
                else:
                    if heavy > m_k:
                        continue
                    parts = None
                    if len(lights) > 1:
                        room = m_k - heavy
                        if out is not None and len(lights) > 2:
                            # groups need a search: only as many cores as could still be
                            # cheaper than the best point so far
                            while room > 0 and cost(ki, table[fi], heavy + room) >= out.cost:
                                room -= 1
                        lights.sort()
                        got = light_groups([x[:3] for x in lights], room)
                        if got is None:
                            continue
                        pool, groups = got
                        if groups is not None:
                            parts = tuple((tuple(lights[i][3] for i in g), n) for g, n in groups)
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
                for part, n in p.parts:  # only groups fit: a pool of its own per group
                    pool = self._take(free, [self.jobs[ji].pid for ji in part], n)
                    reserved.update(pool)
                    why = (
                        f"light, {len(part)} in deadline order on one core of {k.name}"
                        if n == 1 and len(part) > 1
                        else f"light, pool of {n} on {k.name} (one of {len(p.parts)} groups)"
                    )
                    for ji in part:
                        self._set(jobs, events, self.jobs[ji].pid, pool, why)
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


#: Groups of light jobs: (indices into the sorted light jobs, cores of the group's pool)
Groups = tuple[tuple[tuple[int, ...], int], ...]


def _cores_lower_bound(lights: Sequence[tuple[float, float, float]]) -> int:
    """Fewest cores light jobs ``(deadline, C, L)``, sorted by deadline, can pass on: the
    jobs due by d hold work W(d) <= m * d on m cores, so m >= max W(d) / d (and 1)."""
    lower, work = 1, 0.0
    for d, c, _ in lights:
        work += c
        lower = max(lower, math.ceil(work / d - 1e-6))
    return lower


def light_groups(
    lights: Sequence[tuple[float, float, float]], limit: int
) -> tuple[int, Groups | None] | None:
    """Fewest cores (at most ``limit``) that hold light jobs ``(deadline, C, L)`` of one
    cluster, sorted, as the analysis accepts them: groups of jobs, each on a pool of its own
    (pools disjoint), each pool passing :func:`~agents.schedulability.light_pool_size` on its
    cores. ``(cores, None)`` when one shared pool of them all is among the fewest, else
    ``(cores, groups)``; None when no grouping fits ``limit`` cores.

    Exact up to :data:`~agents.schedulability.MAX_EXACT_LIGHTS` light jobs: every partition
    of the jobs into groups, each group on the fewest cores of its own test (a set-partition
    dynamic programme over subsets, 3^(n-1) steps). Beyond, a first-fit-decreasing heuristic
    (jobs by decreasing C, each into the first group it joins without a core more, else into
    the group it costs one core, else a group of its own) against the one pool and the EDF
    list's split over single cores: sound (every group it returns passes the analysis's own
    test), but it can miss a grouping that fits.
    """
    n = len(lights)
    if n == 0:
        return 0, None
    if limit < 1:
        return None
    pool = light_pool_size(lights, limit)
    if pool == 1:
        return 1, None
    if n == 2:  # one pool of both, else one core each
        if pool is not None:
            return pool, None
        return (2, (((0,), 1), ((1,), 1))) if limit > 1 else None
    # in any grouping, the jobs due by d of one group of m cores hold work W <= m * d (the
    # test of the last of them), so the jobs due by d need W(d) / d cores in all: a pool
    # that few is the fewest
    lower = _cores_lower_bound(lights)
    if pool is not None and pool <= lower:
        return pool, None
    if lower > limit:
        return None
    full = (1 << n) - 1
    need: dict[int, int | None] = {full: pool}

    def need_of(mask: int) -> int | None:
        """Fewest cores of the group ``mask`` alone (None: more than ``limit`` or never):
        :func:`~agents.schedulability.light_pool_size`, from the group's own lower bound up
        (below it the pool test fails, and it only ever passes from some core count up)."""
        v = need.get(mask, -1)
        if v == -1:
            group = [lights[i] for i in _bits(mask)]
            v = None
            for m in range(_cores_lower_bound(group), min(len(group), limit) + 1):
                if pool_fits(group, m):
                    v = m
                    break
            need[mask] = v
        return v

    if n <= MAX_EXACT_LIGHTS:
        memo: dict[int, tuple[int, tuple[int, ...]] | None] = {0: (0, ())}

        def fewest(rest: int) -> tuple[int, tuple[int, ...]] | None:
            """Fewest cores of a grouping of ``rest`` and its groups (as masks)."""
            if rest in memo:
                return memo[rest]
            low = rest & -rest  # the group of rest's first job, over every subset holding it
            others = rest ^ low
            best: tuple[int, tuple[int, ...]] | None = None
            sub = others
            while True:
                g = sub | low
                m = need_of(g)
                if m is not None and (best is None or m + (g != rest) < best[0]):
                    tail = fewest(rest ^ g)
                    if tail is not None and m + tail[0] <= limit:
                        if best is None or m + tail[0] < best[0]:
                            best = (m + tail[0], (g,) + tail[1])
                if sub == 0:
                    break
                sub = (sub - 1) & others
            memo[rest] = best
            return best

        got = fewest(full)
        if got is None:
            return None
        if pool is not None and pool <= got[0]:
            return pool, None
        groups = [g for g in got[1]]
    else:
        groups = _first_fit_groups(lights, need_of)
        split = _list_split(lights, need_of, limit)
        if split is not None and (groups is None or len(split) < sum(map(need_of, groups))):
            groups = split
        if groups is None:
            return (pool, None) if pool is not None else None
        total = sum(need_of(g) for g in groups)
        if total > limit or (pool is not None and pool <= total):
            return (pool, None) if pool is not None else None
    return sum(need_of(g) for g in groups), tuple(
        (tuple(_bits(g)), need_of(g)) for g in sorted(groups, key=lambda g: g & -g)
    )


def _first_fit_groups(lights, need_of) -> list[int] | None:
    """First fit decreasing (beyond the exact search): each job, by decreasing C, joins the
    first group it does not add a core to, else the first it adds one core to (a group of
    its own costs one too; joining keeps room for later jobs), else starts a group."""
    groups: list[int] = []
    for i in sorted(range(len(lights)), key=lambda i: (-lights[i][1], lights[i][0], i)):
        bit = 1 << i
        plus_one = None
        for gi, g in enumerate(groups):
            m = need_of(g | bit)
            if m is None:
                continue
            if m == need_of(g):
                groups[gi] = g | bit
                break
            if m == need_of(g) + 1 and plus_one is None:
                plus_one = gi
        else:
            if plus_one is not None:
                groups[plus_one] |= bit
            elif need_of(bit) is not None:
                groups.append(bit)
            else:
                return None
    return groups


def _list_split(lights, need_of, limit: int) -> list[int] | None:
    """The EDF list schedule's split over the fewest single cores that it fits, as groups of
    one core each (checked with the pool test on one core), or None."""
    dc = [(d, c) for d, c, _ in lights]
    for m in range(2, min(len(lights), limit) + 1):
        split = edf_list_split(dc, m)
        if split is not None:
            groups = [sum(1 << i for i in part) for part in split]
            if all(need_of(g) == 1 for g in groups):
                return groups
    return None


def _bits(mask: int):
    i = 0
    while mask:
        if mask & 1:
            yield i
        mask >>= 1
        i += 1


__all__ = ["GateResult", "light_groups"]
