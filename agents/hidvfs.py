"""The hidvfs policy: three learned agents, then the federated gate and the conformal shield.

One tick (:meth:`HidvfsPolicy.decide`):

1. **thermal** agent: per cluster, a 2-way head "may take work" / "must cool" on the cluster's
   temperature, trend and headroom (schema v1 cluster row + global row). Its mask forces
   "must cool" within :data:`HOT_MARGIN_C` of the passive trip, and forbids it below
   :data:`COOL_FLOOR` x trip (a cold cluster has nothing to cool); at least one cluster always
   takes work (the coolest one).
2. **profiler** agent: per cluster a frequency level out of a subset of <= :data:`N_LEVELS`
   table entries and an active core count out of :data:`CORE_FRACTIONS` of the online cores.
   Its masks remove levels outside ``scaling_min/max_freq`` and, for clusters that must cool,
   every option but the lowest level (the cluster then takes no work).
3. **priority** agent: a score per running job; the descending order gives SCHED_FIFO
   priorities (90, 85, ...) and the placement order: deadline jobs, in that order, each go to
   the active cores of the taking cluster with the most speed per job assigned so far (one
   cluster per deadline job, as federated scheduling wants); best-effort jobs share every active
   core below them. A cluster that runs no job (none at all, or none placed there) is set to
   its lowest allowed level: a structural rule, not learned (nothing there to speed up).

The decision then goes through ``policy.stages``: the federated gate (:mod:`agents.gate`)
repairs it so every deadline job is feasible under the federated model, then the shield
(:class:`ShieldStage`) raises a deadline job's cluster frequency until the response-time
predictor's split-conformal bound meets the remaining deadline (else the cluster's maximum).
Both stages only add cores or raise frequencies. A last stage (:class:`SpillStage`) hands the
profiler's active cores that the gate left unused back to the running jobs, at a speed that
keeps the gate's bound valid (work conservation).

The three networks are plain callables ``x [N, in] -> y [N, out]``: numpy MLPs while training
(:mod:`agents.nn`), onnxruntime sessions on the board (:mod:`agents.runtime`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from agents.features import (
    MAX_CLUSTERS,
    N_CLUSTER,
    N_GLOBAL,
    N_JOB,
    FeatureTracker,
    job_remaining,
)
from agents.gate import FederatedGate, jobs_from_obs
from agents.nn import log_softmax, masked_logits, softmax
from agents.policy import Decision, JobSetting, Policy
from agents.shield import Candidates, Shield
from platforms.observation import JobObs, Observation
from platforms.spec import BoardSpec

N_LEVELS = 8
CORE_FRACTIONS = (0.25, 0.5, 0.75, 1.0)
N_CORES = len(CORE_FRACTIONS)
HEAD = N_LEVELS + N_CORES  # per-cluster block of the profiler's output
PROFILER_IN = MAX_CLUSTERS * N_CLUSTER + N_GLOBAL
PROFILER_OUT = MAX_CLUSTERS * HEAD
THERMAL_IN = N_CLUSTER + N_GLOBAL
PRIORITY_IN = N_JOB + N_GLOBAL
HOT_MARGIN_C = 3.0
COOL_FLOOR = 0.7
TOP_PRIORITY = 90
PRIORITY_STEP = 5
#: exploration noise of the priority scores while training
PRIORITY_SIGMA = 0.5

Net = Callable[[np.ndarray], np.ndarray]


# --------------------------------------------------------------------------------------------
# Action space


@dataclass(frozen=True)
class ActionSpace:
    """Per cluster (spec order): table indices of the selectable levels."""

    clusters: tuple[str, ...]
    levels: tuple[tuple[int, ...], ...]
    tables: tuple[tuple[int, ...], ...]

    @classmethod
    def of(cls, spec: BoardSpec, n_levels: int = N_LEVELS) -> ActionSpace:
        names, levels, tables = [], [], []
        for cl in spec.clusters[:MAX_CLUSTERS]:
            n = len(cl.freqs_khz)
            idx = sorted({int(round(x)) for x in np.linspace(0, n - 1, min(n_levels, n))})
            names.append(cl.name)
            levels.append(tuple(idx))
            tables.append(tuple(cl.freqs_khz))
        return cls(tuple(names), tuple(levels), tuple(tables))

    def khz(self, ci: int, level: int) -> int:
        idx = self.levels[ci]
        return self.tables[ci][idx[min(level, len(idx) - 1)]]

    def to_json(self) -> dict:
        return {"clusters": list(self.clusters), "levels": [list(x) for x in self.levels]}


# --------------------------------------------------------------------------------------------
# One tick's inputs, masks and choices (what training records)


@dataclass
class TickInputs:
    prof_x: np.ndarray  # [PROFILER_IN]
    therm_x: np.ndarray  # [MAX_CLUSTERS, THERMAL_IN]
    prio_x: np.ndarray  # [n_jobs, PRIORITY_IN]
    therm_mask: np.ndarray  # [MAX_CLUSTERS, 2] bool
    prof_mask_f: np.ndarray  # [MAX_CLUSTERS, N_LEVELS] bool (after the thermal choice)
    prof_mask_c: np.ndarray  # [MAX_CLUSTERS, N_CORES] bool


@dataclass
class TickChoice:
    therm: np.ndarray  # [MAX_CLUSTERS] 0 = take work, 1 = must cool
    levels: np.ndarray  # [MAX_CLUSTERS]
    cores: np.ndarray  # [MAX_CLUSTERS]
    prio: np.ndarray  # [n_jobs] (perturbed) scores
    prio_mean: np.ndarray  # [n_jobs] network scores
    logp: float = 0.0


@lru_cache(maxsize=256)
def _limit_masks(
    space: ActionSpace, ci: int, lo_khz: int | None, hi_khz: int | None, n_on: int
) -> tuple[tuple[bool, ...], tuple[bool, ...]]:
    """Level mask (inside the scaling limits) and core-count mask (distinct counts) of one
    cluster; memoised, they change only when the limits or the online set do."""
    lo = lo_khz if lo_khz is not None else 0
    hi = hi_khz if hi_khz is not None else math.inf
    mf = [False] * N_LEVELS
    for li in range(len(space.levels[ci])):
        mf[li] = lo <= space.khz(ci, li) <= hi
    if not any(mf):
        mf[0] = True
    mc, seen = [], set()
    for frac in CORE_FRACTIONS:
        n = max(1, int(round(frac * n_on)))
        mc.append(n not in seen)
        seen.add(n)
    return tuple(mf), tuple(mc)


def build_inputs(feats, obs: Observation, space: ActionSpace) -> TickInputs:
    """Network inputs and the masks that do not depend on the agents' own choices."""
    cl_rows, glob, job_rows = feats
    prof_x = np.empty(PROFILER_IN, dtype=np.float32)
    prof_x[: MAX_CLUSTERS * N_CLUSTER] = cl_rows.reshape(-1)
    prof_x[MAX_CLUSTERS * N_CLUSTER :] = glob
    therm_x = np.empty((MAX_CLUSTERS, THERMAL_IN), dtype=np.float32)
    therm_x[:, :N_CLUSTER] = cl_rows
    therm_x[:, N_CLUSTER:] = glob
    prio_x = np.empty((job_rows.shape[0], PRIORITY_IN), dtype=np.float32)
    prio_x[:, :N_JOB] = job_rows
    prio_x[:, N_JOB:] = glob
    tm = np.zeros((MAX_CLUSTERS, 2), dtype=bool)
    mf = np.zeros((MAX_CLUSTERS, N_LEVELS), dtype=bool)
    mc = np.zeros((MAX_CLUSTERS, N_CORES), dtype=bool)
    tm[:, 0] = True
    mf[:, 0] = True
    mc[:, -1] = True
    byname = {c.name: c for c in obs.clusters}
    for ci, name in enumerate(space.clusters):
        cl = byname.get(name)
        if cl is None or not cl.online:
            continue
        trip_ratio = float(cl_rows[ci, 4])
        headroom_c = float(cl_rows[ci, 6]) * 30.0
        if headroom_c <= HOT_MARGIN_C:
            tm[ci] = (False, True)
        elif trip_ratio >= COOL_FLOOR:
            tm[ci] = (True, True)
        mf[ci], mc[ci] = _limit_masks(space, ci, cl.min_khz, cl.max_khz, len(cl.online))
    return TickInputs(prof_x, therm_x, prio_x, tm, mf, mc)


def _pick(z: np.ndarray, mask: np.ndarray, rng: np.random.Generator | None) -> tuple[int, float]:
    """(action, log-prob) of one masked head: argmax without ``rng``, a sample with it."""
    if rng is None:
        return int(np.argmax(np.where(mask, z, -np.inf))), 0.0
    zz = masked_logits(z, mask).astype(np.float64)
    p = softmax(zz)
    a = int(np.searchsorted(np.cumsum(p), rng.random() * p.sum(), side="right"))
    a = min(a, len(p) - 1)
    while not mask[a]:  # float edge: never return a masked action
        a -= 1
    return a, float(log_softmax(zz)[a]) if mask.sum() > 1 else 0.0


def choose(
    inp: TickInputs,
    nets: tuple[Net, Net, Net],
    rng: np.random.Generator | None,
    n_present: int,
) -> TickChoice:
    """Run the three agents (greedy when ``rng`` is None); fills the thermal-dependent masks."""
    profiler, thermal, priority = nets
    # a head with one feasible action needs no inference (same choice, log-prob 0)
    if (inp.therm_mask.sum(axis=1) <= 1).all():
        tz = np.zeros((MAX_CLUSTERS, 2), dtype=np.float32)
    else:
        tz = thermal(inp.therm_x)
    therm = np.zeros(MAX_CLUSTERS, dtype=np.int64)
    logp = 0.0
    for ci in range(MAX_CLUSTERS):
        a, lp = _pick(tz[ci], inp.therm_mask[ci], rng)
        therm[ci] = a
        logp += lp
    present = [ci for ci in range(n_present) if inp.therm_mask[ci].any()]
    if present and all(therm[ci] == 1 for ci in present):
        # someone must take work: the coolest cluster
        coolest = min(present, key=lambda ci: float(inp.therm_x[ci, 4]))
        therm[coolest] = 0
    for ci in range(MAX_CLUSTERS):
        if therm[ci] == 1:
            inp.prof_mask_f[ci] = False
            inp.prof_mask_f[ci, 0] = True
            inp.prof_mask_c[ci] = False
            inp.prof_mask_c[ci, 0] = True
    pz = profiler(inp.prof_x[None, :])[0]
    levels = np.zeros(MAX_CLUSTERS, dtype=np.int64)
    cores = np.zeros(MAX_CLUSTERS, dtype=np.int64)
    for ci in range(MAX_CLUSTERS):
        blk = pz[ci * HEAD : (ci + 1) * HEAD]
        a, lp = _pick(blk[:N_LEVELS], inp.prof_mask_f[ci], rng)
        levels[ci] = a
        logp += lp
        a, lp = _pick(blk[N_LEVELS:], inp.prof_mask_c[ci], rng)
        cores[ci] = a
        logp += lp
    n = inp.prio_x.shape[0]
    if n == 1 and rng is None:
        mean = score = np.zeros(1)  # one job: its order is fixed
    elif n:
        mean = priority(inp.prio_x)[:, 0].astype(np.float64)
        if rng is None:
            score = mean
        else:
            eps = rng.standard_normal(n)
            score = mean + PRIORITY_SIGMA * eps
            logp += float(-0.5 * (eps**2).sum())
    else:
        mean = score = np.zeros(0)
    return TickChoice(therm, levels, cores, score, mean, logp)


def active_cores(
    obs: Observation, space: ActionSpace, ch: TickChoice
) -> dict[str, tuple[int, ...]]:
    """The profiler's active cores per cluster taking work (thermal "must cool" ones: none)."""
    byname = {c.name: c for c in obs.clusters}
    out = {}
    for ci, name in enumerate(space.clusters):
        cl = byname.get(name)
        if cl is None or not cl.online or ch.therm[ci] != 0:
            continue
        online = tuple(sorted(cl.online))
        n = max(1, int(round(CORE_FRACTIONS[int(ch.cores[ci])] * len(online))))
        out[name] = online[:n]
    return out


def to_decision(
    obs: Observation, space: ActionSpace, ch: TickChoice, feats_jobs: np.ndarray
) -> Decision:
    """The agents' choices as a Decision (frequencies, core sets, SCHED_FIFO priorities)."""
    byname = {c.name: c for c in obs.clusters}
    freq: dict[str, int] = {}
    active: list[tuple[int, tuple[int, ...], float]] = []  # (ci, cpus, speed)
    for ci, name in enumerate(space.clusters):
        cl = byname.get(name)
        if cl is None:
            continue
        f = space.khz(ci, int(ch.levels[ci]))
        if cl.max_khz is not None and f > cl.max_khz:
            f = max((x for x in space.tables[ci] if x <= cl.max_khz), default=space.tables[ci][0])
        if cl.min_khz is not None and f < cl.min_khz:
            f = min((x for x in space.tables[ci] if x >= cl.min_khz), default=space.tables[ci][-1])
        freq[name] = f
        if ch.therm[ci] == 0 and cl.online:
            online = tuple(sorted(cl.online))
            n = max(1, int(round(CORE_FRACTIONS[int(ch.cores[ci])] * len(online))))
            active.append((ci, online[:n], cl.capacity * f * n))
    if not active:  # every cluster offline: leave placement to the kernel
        online = tuple(sorted(c for cl in obs.clusters for c in cl.online))
        return Decision(freq, {j.pid: JobSetting(online) for j in obs.jobs})
    for ci, name in enumerate(space.clusters):
        if name in freq and not any(a[0] == ci for a in active):
            freq[name] = (
                space.tables[ci][0]
                if byname[name].min_khz is None
                else max(space.tables[ci][0], byname[name].min_khz)
            )
    union = tuple(sorted(c for _, cpus, _ in active for c in cpus))
    order = np.argsort(-ch.prio, kind="stable") if len(ch.prio) else []
    assigned = [0] * len(active)
    jobs: dict[int, JobSetting] = {}
    for rank, k in enumerate(order):
        j = obs.jobs[int(k)]
        prio = max(1, TOP_PRIORITY - PRIORITY_STEP * rank)
        if j.deadline_s is not None:
            best = max(range(len(active)), key=lambda i: (active[i][2] / (1 + assigned[i]), -i))
            assigned[best] += 1
            jobs[j.pid] = JobSetting(active[best][1], prio)
        else:
            jobs[j.pid] = JobSetting(union, prio)
    # a cluster that runs no job has nothing to speed up: its lowest allowed level
    used = {c for s in jobs.values() for c in s.cpus}
    for ci, name in enumerate(space.clusters):
        cl = byname.get(name)
        if cl is not None and used.isdisjoint(cl.cpus):
            lo = cl.min_khz or 0
            freq[name] = min((x for x in space.tables[ci] if x >= lo), default=freq[name])
    return Decision(freq, jobs)


# --------------------------------------------------------------------------------------------
# Response-time features (shield predictor and its training data)

RT_FIELDS = (
    "log_graham",  # log of L(f) + (C(f) - L(f)) / n for the job alone on its cores
    "log_graham_interf",  # log of the same plus the work of equal/higher-priority co-runners / n
    "log_phi",  # log of the two-point slowdown at (f, capacity)
    "beta",  # memory-bound fraction
    "remaining_frac",  # 1 - progress
    "log_cores",  # log of the job's core count
    "co_runners",  # jobs sharing its cores with >= priority / 4
    "log_remaining_work",  # log of the remaining reference work (s)
)
N_RT = len(RT_FIELDS)
_TINY = 1e-4


def _phi(j: JobObs, khz: float, capacity: float) -> float:
    p = j.profile
    return (1.0 - p.beta) * p.ref_khz / (capacity * khz) + p.beta


def rt_features(
    obs: Observation, decision: Decision, pid: int, khz_of: dict[str, int] | None = None
) -> np.ndarray | None:
    """RT_FIELDS of deadline job ``pid`` under ``decision`` (None without a profile/cores)."""
    jobs = {j.pid: j for j in obs.jobs}
    j = jobs.get(pid)
    s = decision.jobs.get(pid)
    if j is None or j.profile is None or s is None or not s.cpus:
        return None
    cl = next((c for c in obs.clusters if s.cpus[0] in c.cpus), None)
    if cl is None:
        return None
    freq = khz_of or decision.freq_khz
    f = freq.get(cl.name) or cl.cur_khz or cl.freqs_khz[-1]
    return rt_row(j, s, cl.capacity, f, obs, decision, freq)


def rt_row(j, s, capacity, f, obs, decision, freq) -> np.ndarray:
    p = j.profile
    rem = job_remaining(j)
    phi = _phi(j, f, capacity)
    n = max(len(s.cpus), 1)
    c = rem * p.work_s * phi
    span = min(p.span_s, rem * p.work_s) * phi
    g = span + (c - span) / n
    mine = set(s.cpus)
    interf = 0.0
    co = 0
    for o in obs.jobs:
        if o.pid == j.pid or o.profile is None:
            continue
        so = decision.jobs.get(o.pid)
        if so is None or so.rt_priority < s.rt_priority or mine.isdisjoint(so.cpus):
            continue
        co += 1
        share = len(mine.intersection(so.cpus)) / max(len(so.cpus), 1)
        interf += job_remaining(o) * o.profile.work_s * _phi(o, f, capacity) * share / n
    return np.array(
        (
            math.log(max(g, _TINY)),
            math.log(max(g + interf, _TINY)),
            math.log(phi),
            p.beta,
            rem,
            math.log(n),
            co / 4.0,
            math.log(max(rem * p.work_s, _TINY)),
        ),
        dtype=np.float32,
    )


def rt_rows(j, s, capacity: float, freqs, obs: Observation, decision: Decision) -> np.ndarray:
    """:func:`rt_row` for many candidate frequencies at once ([K, N_RT], float32)."""
    p = j.profile
    f = np.asarray(freqs, dtype=np.float64)
    rem = job_remaining(j)
    phi = (1.0 - p.beta) * p.ref_khz / (capacity * f) + p.beta
    n = max(len(s.cpus), 1)
    c = rem * p.work_s * phi
    span = min(p.span_s, rem * p.work_s) * phi
    g = span + (c - span) / n
    mine = set(s.cpus)
    interf = np.zeros_like(f)
    co = 0
    for o in obs.jobs:
        if o.pid == j.pid or o.profile is None:
            continue
        so = decision.jobs.get(o.pid)
        if so is None or so.rt_priority < s.rt_priority or mine.isdisjoint(so.cpus):
            continue
        co += 1
        share = len(mine.intersection(so.cpus)) / max(len(so.cpus), 1)
        q = o.profile
        phi_o = (1.0 - q.beta) * q.ref_khz / (capacity * f) + q.beta
        interf += job_remaining(o) * q.work_s * phi_o * share / n
    out = np.empty((len(f), N_RT), dtype=np.float64)
    out[:, 0] = np.log(np.maximum(g, _TINY))
    out[:, 1] = np.log(np.maximum(g + interf, _TINY))
    out[:, 2] = np.log(phi)
    out[:, 3] = p.beta
    out[:, 4] = rem
    out[:, 5] = math.log(n)
    out[:, 6] = co / 4.0
    out[:, 7] = math.log(max(rem * p.work_s, _TINY))
    return out.astype(np.float32)


class ShieldStage:
    """Post-posed conformal shield over each deadline job's cluster frequency.

    Candidates for a job are the allowed table entries of its cluster at or above the decided
    frequency (cost: the frequency); the predictor gives log response time, compared with the
    log of the remaining deadline (a monotone transform, so the conformal guarantee holds on
    the original scale). The cluster ends at the highest frequency any of its jobs needs.
    """

    def __init__(self, predictor: Net, shield: Shield):
        self.predictor = predictor
        self.shield = shield
        self.last_bounds: dict[int, float] = {}

    def __call__(self, decision: Decision, obs: Observation) -> Decision:
        self.last_bounds = {}
        dl = [j for j in obs.jobs if j.deadline_s is not None and j.profile is not None]
        if not dl:
            return decision
        out = decision.copy()
        # every (job, candidate) row in ONE predictor call: a row depends only on the job, its
        # cores and the candidate frequency (co-runners are scaled at the same frequency), and
        # the shield changes frequencies only, so raising one job's cluster leaves the other
        # rows exact; each job then sees the candidates at or above its cluster's current f
        plan = []
        rows = []
        for j in sorted(dl, key=lambda x: x.remaining_s):
            st = out.jobs.get(j.pid)
            if st is None or not st.cpus:
                continue
            cl = next((c for c in obs.clusters if st.cpus[0] in c.cpus), None)
            if cl is None:
                continue
            hi = cl.max_khz if cl.max_khz is not None else cl.freqs_khz[-1]
            cur = out.freq_khz.get(cl.name, hi)
            cands = [f for f in cl.freqs_khz if cur <= f <= hi] or [cur]
            plan.append((j, cl, cands, sum(len(r) for r in rows)))
            rows.append(rt_rows(j, st, cl.capacity, cands, obs, out))
        if not plan:
            return decision
        X = np.concatenate(rows)
        pred = np.asarray(self.predictor(X), dtype=np.float64).reshape(-1)
        cal, corr = self.shield.calibrator, self.shield.correct_selection
        for j, cl, cands, start in plan:
            cur = out.freq_khz.get(cl.name, cands[-1])
            k0 = next((k for k, f in enumerate(cands) if f >= cur), len(cands) - 1)
            sub = cands[k0:]
            p_sub = pred[start + k0 : start + len(cands)]
            rem = j.remaining_s
            if rem <= 0:
                res_f, ev = sub[-1], f"shield: pid {j.pid} past its deadline; maximum frequency"
                self.last_bounds[j.pid] = math.inf
            else:
                sh = Shield(lambda _x, p=p_sub: p, cal, corr)
                feats = X[start + k0 : start + len(cands)]
                r = sh.filter(Candidates(sub, feats, 0, len(sub) - 1), math.log(rem), sub)
                res_f, ev = r.action, (r.event if r.intervened else "")
                self.last_bounds[j.pid] = (
                    math.exp(r.upper_s) if math.isfinite(r.upper_s) else math.inf
                )
            if res_f != cur:
                out.freq_khz[cl.name] = res_f
                out.events.append(f"pid {j.pid} on {cl.name}: {ev} -> {res_f} kHz")
        return out


class SpillStage:
    """Work conservation after the gate and the shield: unused active cores are lent out.

    The gate hands each deadline job the fewest cores its federated analysis needs, inside one
    cluster, which can leave cores the profiler activated (or a whole cluster) without work.
    ``active()`` gives the profiler's active cores per cluster of this tick (clusters the
    thermal agent sent to cool have none, so they never receive work here). Those that no job
    uses go back to the jobs, cores only added, never removed:

    * inside a cluster that runs jobs: to its best-effort jobs if it has any, else to the
      deadline job of that cluster with the most remaining work (same cores, same frequency,
      so the gate's bound R <= L + (C - L)/n only improves with n' >= n; heavy cores stay
      exclusive because lent cores were unused);
    * a cluster that runs no job: to every best-effort job, else to the deadline job with the
      most remaining work, at the lowest table entry whose per-core speed (capacity x f) is at
      least the borrowers' home speed, so no task can run slower than on its home cores; a
      cluster that cannot match that speed lends nothing to a deadline job.
    """

    def __init__(self, active: Callable[[], dict[str, tuple[int, ...]]] | None = None):
        self.active = active

    def __call__(self, decision: Decision, obs: Observation) -> Decision:
        if not obs.jobs or not decision.jobs:
            return decision
        act = self.active() if self.active is not None else None
        if act is None:
            act = {c.name: tuple(sorted(c.online)) for c in obs.clusters}
        out = decision.copy()
        where = {c: cl for cl in obs.clusters for c in cl.cpus}
        jobs = {j.pid: j for j in obs.jobs if j.pid in out.jobs}

        def rem_work(j: JobObs) -> float:
            return job_remaining(j) * j.profile.work_s if j.profile is not None else 0.0

        def lend(pids, cores) -> None:
            for pid in pids:
                st = out.jobs[pid]
                out.jobs[pid] = JobSetting(
                    tuple(sorted(set(st.cpus) | set(cores))), st.rt_priority, st.nice
                )

        idle_clusters = []
        for cl in obs.clusters:
            mine = [c for c in act.get(cl.name, ()) if c in cl.online]
            if not mine:
                continue
            used = {c for st in out.jobs.values() for c in st.cpus}
            free = [c for c in mine if c not in used]
            if not free:
                continue
            here = [pid for pid, st in out.jobs.items() if set(st.cpus) & set(cl.cpus)]
            if not here:
                idle_clusters.append((cl, free))
                continue
            be = [pid for pid in here if jobs.get(pid) is not None and jobs[pid].deadline_s is None]
            if be:
                lend(be, free)
            else:
                dl = [pid for pid in here if pid in jobs and jobs[pid].profile is not None]
                if dl:
                    lend([max(dl, key=lambda p: (rem_work(jobs[p]), -p))], free)
        if not idle_clusters:
            return out
        best_effort = [pid for pid, j in jobs.items() if j.deadline_s is None]
        if best_effort:
            borrowers = best_effort
        else:
            dl = [pid for pid, j in jobs.items() if j.profile is not None]
            if not dl:
                return out
            borrowers = [max(dl, key=lambda p: (rem_work(jobs[p]), -p))]

        def home_speed(pid: int) -> float:
            st = out.jobs[pid]
            cl = where.get(st.cpus[0]) if st.cpus else None
            if cl is None:
                return 0.0
            f = out.freq_khz.get(cl.name) or cl.cur_khz or cl.freqs_khz[-1]
            return cl.capacity * f

        for cl, free in idle_clusters:
            hi = cl.max_khz if cl.max_khz is not None else cl.freqs_khz[-1]
            lo = cl.min_khz if cl.min_khz is not None else 0
            allowed = [f for f in cl.freqs_khz if lo <= f <= hi] or [hi]
            need = max(home_speed(pid) for pid in borrowers)
            ok = [f for f in allowed if cl.capacity * f >= need - 1e-6]
            if not ok and not best_effort:
                continue
            out.freq_khz[cl.name] = ok[0] if ok else allowed[-1]
            lend(borrowers, free)
        return out


class GateStage:
    """The federated gate as a decision stage (rebuilt when the scaling limits change)."""

    def __init__(self):
        self._key = None
        self._gate: FederatedGate | None = None
        self.last = None

    def __call__(self, decision: Decision, obs: Observation) -> Decision:
        key = tuple((c.name, c.online, c.min_khz, c.max_khz) for c in obs.clusters)
        if key != self._key:
            self._gate = FederatedGate.from_observation(obs)
            self._key = key
        jobs = jobs_from_obs(obs)
        if not jobs:
            return decision
        self.last = self._gate.repair(decision, jobs)
        return self.last.decision


# --------------------------------------------------------------------------------------------
# The policy


@dataclass
class Recorder:
    """What an exploring policy keeps per tick (for the learner)."""

    inputs: list[TickInputs] = field(default_factory=list)
    choices: list[TickChoice] = field(default_factory=list)
    obs: list[Observation] = field(default_factory=list)

    def clear(self) -> None:
        self.inputs.clear()
        self.choices.clear()
        self.obs.clear()


class HidvfsPolicy(Policy):
    """profiler + thermal + priority agents; ``stages`` = [gate, shield] (either may be off)."""

    name = "hidvfs"

    def __init__(
        self,
        spec: BoardSpec,
        profiler: Net,
        thermal: Net,
        priority: Net,
        *,
        gate: bool = True,
        shield: ShieldStage | None = None,
        period_s: float = 0.05,
        explore_seed: int | None = None,
        recorder: Recorder | None = None,
        extra_stages: Sequence[Callable[[Decision, Observation], Decision]] = (),
    ):
        self.spec = spec
        self.space = ActionSpace.of(spec)
        self.tracker = FeatureTracker(spec)
        self.nets = (profiler, thermal, priority)
        self.period_s = period_s
        self.explore_seed = explore_seed
        self.rng = None if explore_seed is None else np.random.default_rng(explore_seed)
        self.recorder = recorder
        self.gate_stage = GateStage() if gate else None
        self.shield_stage = shield
        # gate -> shield -> (recorders) -> spill: the shield and the recorders see the
        # federated placement the gate certified; the spill only adds cores afterwards
        self.stages = [s for s in (self.gate_stage, self.shield_stage) if s is not None]
        self.stages += list(extra_stages)
        self.last_active: dict[str, tuple[int, ...]] = {}
        self.stages.append(SpillStage(lambda: self.last_active))
        self.n_present = len(self.space.clusters)

    def reset(self, seed: int | None = None) -> None:
        self.tracker.reset()
        if self.explore_seed is not None:
            self.rng = np.random.default_rng([self.explore_seed, 0 if seed is None else int(seed)])
        if self.recorder is not None:
            self.recorder.clear()

    def decide(self, obs: Observation) -> Decision:
        feats = self.tracker(obs)
        inp = build_inputs(feats, obs, self.space)
        ch = choose(inp, self.nets, self.rng, self.n_present)
        if self.recorder is not None:
            self.recorder.inputs.append(inp)
            self.recorder.choices.append(ch)
            self.recorder.obs.append(obs)
        d = to_decision(obs, self.space, ch, feats[2])
        self.last_active = active_cores(obs, self.space, ch)
        return d


__all__ = [
    "N_LEVELS",
    "CORE_FRACTIONS",
    "PROFILER_IN",
    "PROFILER_OUT",
    "THERMAL_IN",
    "PRIORITY_IN",
    "RT_FIELDS",
    "N_RT",
    "ActionSpace",
    "TickInputs",
    "TickChoice",
    "build_inputs",
    "choose",
    "to_decision",
    "rt_features",
    "rt_row",
    "rt_rows",
    "ShieldStage",
    "GateStage",
    "SpillStage",
    "Recorder",
    "HidvfsPolicy",
]
