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
from functools import cached_property

import numpy as np

from agents.deadlines import greedy_bound, span_terms, span_within, work_at
from agents.features import (
    CLUSTER_FIELDS,
    MAX_CLUSTERS,
    N_CLUSTER,
    N_GLOBAL,
    N_JOB,
    FeatureTracker,
    job_remaining,
)
from agents.gate import FederatedGate
from agents.nn import log_softmax, masked_logits, softmax
from agents.policy import Decision, JobSetting, Policy
from agents.schedulability import jobs_from_obs
from agents.shield import Shield
from platforms.observation import ClusterObs, JobObs, Observation
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

    @cached_property
    def _masks(self) -> dict:
        """Memo of :func:`_limit_masks` (in the instance dict: not a field, not compared)."""
        return {}

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


def _limit_masks(
    space: ActionSpace, ci: int, lo_khz: int | None, hi_khz: int | None, n_on: int
) -> tuple[tuple[bool, ...], tuple[bool, ...]]:
    """Level mask (inside the scaling limits) and core-count mask (distinct counts) of one
    cluster; memoised per action space, they change only when the limits or the online set
    do (a dict on the space: hashing the whole space per lookup cost more than the masks)."""
    key = (ci, lo_khz, hi_khz, n_on)
    memo = space._masks
    got = memo.get(key)
    if got is not None:
        return got
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
    if len(memo) >= 256:
        memo.clear()
    got = memo[key] = (tuple(mf), tuple(mc))
    return got


_NO_COOL = (True, False)
#: the cluster row's online-core fraction (features.CLUSTER_FIELDS)
_ONLINE = CLUSTER_FIELDS.index("online_frac")
_LOWEST_LEVEL = (True,) + (False,) * (N_LEVELS - 1)
_ALL_CORES = (False,) * (N_CORES - 1) + (True,)


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
    # masks as lists, one array each at the end (a few rows: numpy per-row writes cost more)
    tm = [_NO_COOL] * MAX_CLUSTERS
    mf = [_LOWEST_LEVEL] * MAX_CLUSTERS
    mc = [_ALL_CORES] * MAX_CLUSTERS
    trip_ratios = cl_rows[:, 4].tolist()
    headrooms = cl_rows[:, 6].tolist()
    byname = {c.name: c for c in obs.clusters}
    for ci, name in enumerate(space.clusters):
        cl = byname.get(name)
        if cl is None or not cl.online:
            continue
        headroom_c = headrooms[ci] * 30.0
        if headroom_c <= HOT_MARGIN_C + 1e-4:  # float32 features: 3 C reads 3.00000004
            tm[ci] = (False, True)
        elif trip_ratios[ci] >= COOL_FLOOR:
            tm[ci] = (True, True)
        mf[ci], mc[ci] = _limit_masks(space, ci, cl.min_khz, cl.max_khz, len(cl.online))
    return TickInputs(
        prof_x,
        therm_x,
        prio_x,
        np.array(tm, dtype=bool),
        np.array(mf, dtype=bool),
        np.array(mc, dtype=bool),
    )


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


def _greedy(z: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Row-wise :func:`_pick` without ``rng`` in one call (first maximum, 0 when none allowed)."""
    return np.argmax(np.where(mask, z, -np.inf), axis=1)


def _must_cool(inp: TickInputs, therm: np.ndarray, n_present: int) -> None:
    """Someone must take work (the coolest cluster); "must cool" leaves only the lowest option.

    Plain lists: three clusters, where numpy's per-call cost would dominate.
    """
    rows = inp.therm_mask.tolist()
    th = therm.tolist()
    # clusters with an online core: an offline one (the TX2's Denver in its default power
    # mode) cannot take the work, so it must not stop the coolest online one from taking it
    present = [ci for ci in range(n_present) if any(rows[ci]) and inp.therm_x[ci, _ONLINE] > 0]
    if present and all(th[ci] == 1 for ci in present):
        coolest = min(present, key=lambda ci: float(inp.therm_x[ci, 4]))
        therm[coolest] = 0
        th[coolest] = 0
    for ci, t in enumerate(th):
        if t == 1:
            inp.prof_mask_f[ci] = False
            inp.prof_mask_f[ci, 0] = True
            inp.prof_mask_c[ci] = False
            inp.prof_mask_c[ci, 0] = True


def choose(
    inp: TickInputs,
    nets: tuple[Net, Net, Net],
    rng: np.random.Generator | None,
    n_present: int,
) -> TickChoice:
    """Run the three agents (greedy when ``rng`` is None); fills the thermal-dependent masks.

    The greedy path takes every head's argmax in one numpy call per agent; the exploring path
    samples head by head in a fixed order (thermal, then level/cores per cluster) so a seed
    gives the same episode.
    """
    profiler, thermal, priority = nets
    tm = inp.therm_mask
    rows = tm.tolist()
    # a head with one feasible action needs no inference (same choice, log-prob 0)
    if any(a and b for a, b in rows):
        tz = thermal(inp.therm_x)
    else:
        tz = None
    logp = 0.0
    if rng is None:
        if tz is None:  # every head has <= 1 allowed action: the first allowed, else 0
            therm = np.array([int(b and not a) for a, b in rows], dtype=np.int64)
        else:
            therm = _greedy(tz, tm)
    else:
        if tz is None:
            tz = np.zeros((MAX_CLUSTERS, 2), dtype=np.float32)
        therm = np.zeros(MAX_CLUSTERS, dtype=np.int64)
        for ci in range(MAX_CLUSTERS):
            a, lp = _pick(tz[ci], tm[ci], rng)
            therm[ci] = a
            logp += lp
    _must_cool(inp, therm, n_present)
    pz = profiler(inp.prof_x[None, :])[0]
    if rng is None:
        # both heads of every cluster masked in one np.where, then one argmax per head kind
        mask = np.concatenate((inp.prof_mask_f, inp.prof_mask_c), axis=1)
        z = np.where(mask, pz[:PROFILER_OUT].reshape(MAX_CLUSTERS, HEAD), -np.inf)
        levels = z[:, :N_LEVELS].argmax(axis=1)
        cores = z[:, N_LEVELS:].argmax(axis=1)
    else:
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
    therm, cores = ch.therm.tolist(), ch.cores.tolist()
    out = {}
    for ci, name in enumerate(space.clusters):
        cl = byname.get(name)
        if cl is None or not cl.online or therm[ci] != 0:
            continue
        online = tuple(sorted(cl.online))
        n = max(1, int(round(CORE_FRACTIONS[cores[ci]] * len(online))))
        out[name] = online[:n]
    return out


def to_decision(
    obs: Observation, space: ActionSpace, ch: TickChoice, feats_jobs: np.ndarray
) -> Decision:
    """The agents' choices as a Decision (frequencies, core sets, SCHED_FIFO priorities)."""
    byname = {c.name: c for c in obs.clusters}
    levels, cores, therm = ch.levels.tolist(), ch.cores.tolist(), ch.therm.tolist()
    freq: dict[str, int] = {}
    active: list[tuple[int, tuple[int, ...], float]] = []  # (ci, cpus, speed)
    for ci, name in enumerate(space.clusters):
        cl = byname.get(name)
        if cl is None:
            continue
        f = space.khz(ci, levels[ci])
        if cl.max_khz is not None and f > cl.max_khz:
            f = max((x for x in space.tables[ci] if x <= cl.max_khz), default=space.tables[ci][0])
        if cl.min_khz is not None and f < cl.min_khz:
            f = min((x for x in space.tables[ci] if x >= cl.min_khz), default=space.tables[ci][-1])
        freq[name] = f
        if therm[ci] == 0 and cl.online:
            online = tuple(sorted(cl.online))
            n = max(1, int(round(CORE_FRACTIONS[cores[ci]] * len(online))))
            active.append((ci, online[:n], cl.capacity * f * n))
    if not active:  # every cluster offline: leave placement to the kernel
        online = tuple(sorted(c for cl in obs.clusters for c in cl.online))
        return Decision(freq, {j.pid: JobSetting(online) for j in obs.jobs})
    taking = {a[0] for a in active}
    for ci, name in enumerate(space.clusters):
        if name in freq and ci not in taking:
            freq[name] = (
                space.tables[ci][0]
                if byname[name].min_khz is None
                else max(space.tables[ci][0], byname[name].min_khz)
            )
    union = tuple(sorted(c for _, cpus, _ in active for c in cpus))
    order = np.argsort(-ch.prio, kind="stable").tolist() if len(ch.prio) else []
    assigned = [0] * len(active)
    jobs: dict[int, JobSetting] = {}
    for rank, k in enumerate(order):
        j = obs.jobs[k]
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
    return rt_row(j, s, cl.capacity, f, obs, decision)


def rt_row(
    j: JobObs, s: JobSetting, capacity: float, f: float, obs: Observation, decision: Decision
) -> np.ndarray:
    """RT_FIELDS of job ``j`` on its cores ``s`` at ``f`` kHz: the predictor's training rows."""
    p = j.profile
    rem = job_remaining(j)
    phi = _phi(j, f, capacity)
    n = max(len(s.cpus), 1)
    c = rem * p.work_s * phi
    span = span_within(p, f, capacity, c)
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


#: below this many (job, candidate) rows, plain floats beat numpy's per-call overhead
_ROWS_NUMPY = 24


def _row_terms(items, obs: Observation, decision: Decision):
    """Per job of ``items``: its constants as in :func:`rt_row` and its co-runner terms."""
    # (a, beta, w, sa, sb, sm, span, ref, n, capacity, rem): phi = a / (capacity f) + beta,
    # and sa, sb, sm, span, ref the terms of agents.deadlines.span_bound
    per_job = []
    slots: list[list[tuple[float, float, float, float]]] = []  # (a_o, beta_o, w_o, share)
    for j, s, capacity, _ in items:
        p = j.profile
        rem = job_remaining(j)
        mine = set(s.cpus)
        co = []
        for o in obs.jobs:
            if o.pid == j.pid or o.profile is None:
                continue
            so = decision.jobs.get(o.pid)
            if so is None or so.rt_priority < s.rt_priority or mine.isdisjoint(so.cpus):
                continue
            share = len(mine.intersection(so.cpus)) / max(len(so.cpus), 1)
            q = o.profile
            co.append(((1.0 - q.beta) * q.ref_khz, q.beta, job_remaining(o) * q.work_s, share))
        w = rem * p.work_s
        n = max(len(s.cpus), 1)
        sa, sb, sm = span_terms(p)
        per_job.append(
            (
                (1.0 - p.beta) * p.ref_khz,
                p.beta,
                w,
                sa,
                sb,
                sm,
                p.span_s,
                p.ref_khz,
                n,
                capacity,
                rem,
            )
        )
        slots.append(co)
    return per_job, slots


def _rows_floats(items, per_job, slots) -> tuple[np.ndarray, np.ndarray]:
    """(pre-log columns 0-2 flattened, the other columns) row by row with plain floats."""
    pre: list[float] = []
    rest: list[tuple[float, ...]] = []
    for (_, _, _, freqs), row, co in zip(items, per_job, slots):
        a, beta, w, sa, sb, sm, full, ref, n, cap, rem = row
        tail = (beta, rem, math.log(n), len(co) / 4.0, math.log(max(w, _TINY)))
        for f in freqs:
            capf = cap * f
            phi = a / capf + beta
            c = w * phi
            r = ref / capf  # agents.deadlines.span_bound, term for term
            span = min(sa / capf + sb, full * r + (sm * (1.0 - r) if r < 1.0 else 0.0), c)
            g = span + (c - span) / n
            interf = 0.0
            for a_o, beta_o, w_o, share in co:
                interf += w_o * (a_o / capf + beta_o) * share / n
            pre += (max(g, _TINY), max(g + interf, _TINY), phi)
            rest.append(tail)
    return np.array(pre, dtype=np.float64), np.array(rest, dtype=np.float64)


def _rows_numpy(items, per_job, slots) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_rows_floats` as whole-batch numpy operations (for many rows)."""
    counts = [len(fs) for _, _, _, fs in items]
    f = np.fromiter((x for _, _, _, fs in items for x in fs), dtype=np.float64, count=sum(counts))
    a, beta, w, sa, sb, sm, full, ref, n, cap, rem = np.repeat(np.array(per_job), counts, axis=0).T
    capf = cap * f
    phi = a / capf + beta
    c = w * phi
    r = ref / capf
    worst = full * r + np.where(r < 1.0, sm * (1.0 - r), 0.0)
    span = np.minimum(np.minimum(sa / capf + sb, worst), c)
    g = span + (c - span) / n
    interf = np.zeros_like(f)
    for k in range(max(len(co) for co in slots)):
        # rows whose job has no k-th co-runner add 0.0 * 1.0 * 1.0 / n = 0.0 (sums keep order)
        terms = [co[k] if k < len(co) else (0.0, 1.0, 0.0, 1.0) for co in slots]
        a_o, beta_o, w_o, share = np.repeat(np.array(terms), counts, axis=0).T
        interf += w_o * (a_o / capf + beta_o) * share / n
    pre = np.stack((np.maximum(g, _TINY), np.maximum(g + interf, _TINY), phi), axis=1)
    tail = [
        (b, r, math.log(nn), len(co) / 4.0, math.log(max(ww, _TINY)))
        for (_, b, ww, _, _, _, _, _, nn, _, r), co in zip(per_job, slots)
    ]
    return pre.reshape(-1), np.repeat(np.array(tail), counts, axis=0)


def rt_rows_many(
    items: Sequence[tuple[JobObs, JobSetting, float, Sequence[int]]],
    obs: Observation,
    decision: Decision,
) -> np.ndarray:
    """:func:`rt_row` of several ``(job, setting, capacity, freqs)``, one row per frequency.

    The shield needs every (job, candidate) row of a tick in one predictor call; building them
    in one pass (plain floats for a few rows, whole-batch numpy for many) instead of one numpy
    pass per job is what makes the stage cheap. The arithmetic is :func:`rt_row`'s (the rows
    the predictor was trained on), operation for operation: bit-identical rows.
    """
    per_job, slots = _row_terms(items, obs, decision)
    n_rows = sum(len(fs) for _, _, _, fs in items)
    if not n_rows:
        return np.empty((0, N_RT), dtype=np.float32)
    build = _rows_floats if n_rows < _ROWS_NUMPY else _rows_numpy
    pre, rest = build(items, per_job, slots)
    out = np.empty((n_rows, N_RT), dtype=np.float64)
    out[:, :3] = np.log(pre).reshape(n_rows, 3)
    out[:, 3:] = rest
    return out.astype(np.float32)


#: bounds of one job kept for the adaptive update: a job of hours at 100 ms would otherwise
#: keep tens of thousands and stall the loop when it ends (it is one update, whatever its count)
MAX_MARKS_PER_JOB = 64


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
        #: with an adaptive calibrator (``update_job``): pid -> [(t, predicted log remaining s,
        #: q issued)] of the chosen actions, scored against the real response when the job ends
        self.pending: dict[int, list[tuple[float, float, float]]] = {}
        self.learns = hasattr(shield.calibrator, "update_job")

    def forget(self, pid: int) -> None:
        """The job left without an outcome (unregistered alive): its bounds cannot be scored."""
        self.pending.pop(pid, None)

    def job_done(self, pid: int, finish_t: float) -> int:
        """The job ended at ``finish_t``: score the bounds issued for it, each against the q it
        was issued with, in ONE Gibbs-Candes update (one err: did any miss; one score: the
        largest residual), the unit of the per-job calibration pool
        (:meth:`agents.shield.AdaptiveConformal.update_job`). Returns how many bounds were
        scored (0: none issued, no update)."""
        marks = self.pending.pop(pid, [])
        if marks:
            self.shield.calibrator.update_job(
                [math.log(max(finish_t - t, 1e-6)) for t, _, _ in marks],
                [pred for _, pred, _ in marks],
                [q for _, _, q in marks],
            )
        return len(marks)

    def calibration(self) -> dict | None:
        """The adaptive calibrator's state for the daemon's status (None when static)."""
        cal = self.shield.calibrator
        if not self.learns:
            return None
        return {
            "alpha": cal.alpha,
            "alpha_t": round(cal.alpha_now, 6),
            "updates": cal.t_,
            "miss_rate": None if not cal.t_ else round(cal.miss_rate, 6),
        }

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
        home: dict[int, ClusterObs] = {}  # first cluster listing each CPU
        for cl in obs.clusters:
            for c in cl.cpus:
                home.setdefault(c, cl)
        plan = []
        for j in sorted(dl, key=lambda x: x.remaining_s):
            st = out.jobs.get(j.pid)
            if st is None or not st.cpus:
                continue
            cl = home.get(st.cpus[0])
            if cl is None:
                continue
            hi = cl.max_khz if cl.max_khz is not None else cl.freqs_khz[-1]
            cur = out.freq_khz.get(cl.name, hi)
            cands = [f for f in cl.freqs_khz if cur <= f <= hi] or [cur]
            plan.append((j, st, cl, cands))
        if not plan:
            return decision
        X = rt_rows_many([(j, st, cl.capacity, cands) for j, st, cl, cands in plan], obs, out)
        pred = np.asarray(self.predictor(X), dtype=np.float64).reshape(-1).tolist()
        # the q(alpha_t) every bound of this tick is issued with (select's q0), kept with the
        # marks: alpha_t moves before the job ends, and err_t is for the set issued at t. A
        # Bonferroni fallback's bound (at alpha_t / K) is above it: a miss of it is one here.
        q_issue = self.shield.calibrator.q() if self.learns else math.nan
        start = 0
        for j, _, cl, cands in plan:
            cur = out.freq_khz.get(cl.name, cands[-1])
            k0 = next((k for k, f in enumerate(cands) if f >= cur), len(cands) - 1)
            sub = cands[k0:]
            rem = j.remaining_s
            if rem <= 0:
                res_f, ev = sub[-1], f"shield: pid {j.pid} past its deadline; maximum frequency"
                self.last_bounds[j.pid] = math.inf
            else:
                p_sub = pred[start + k0 : start + len(cands)]
                r = self.shield.select(sub, p_sub, math.log(rem), sub, 0, len(sub) - 1)
                res_f, ev = r.action, (r.event if r.intervened else "")
                self.last_bounds[j.pid] = (
                    math.exp(r.upper_s) if math.isfinite(r.upper_s) else math.inf
                )
                if self.learns and math.isfinite(p_sub[r.index]):
                    marks = self.pending.setdefault(j.pid, [])
                    marks.append((obs.t, p_sub[r.index], q_issue))
                    if len(marks) > MAX_MARKS_PER_JOB:  # a long job: keep every other bound,
                        del marks[1::2]  # spread over its whole life
            start += len(cands)
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
      cluster that cannot match that speed lends its cores to a deadline job (at its top)
      only while the job holds its own cores alone and its bound for a greedy run on all of
      them, the slower ones included (:func:`agents.deadlines.greedy_bound`), still meets its
      deadline: slower cores shorten the work term and lengthen the span term.

    Before both: when a deadline job is late on the cores it has (the Graham bound of its
    remaining work there passes its remaining deadline), every free active core goes to the
    late job with the earliest deadline, whatever its cluster, and a cluster that runs no job
    then runs at its top OPP. A job already late loses nothing to slower borrowed cores, and
    every core it gets is one a best-effort job would otherwise have taken. With the gate on,
    its safest point already hands the free cores to the job short of cores, so this acts
    when the gate is off (the ablation).
    """

    def __init__(self, active: Callable[[], dict[str, tuple[int, ...]]] | None = None):
        self.active = active

    @staticmethod
    def _to_the_late(out: Decision, obs: Observation, act, where, jobs) -> bool:
        """Lend every free active core to the late deadline job with the earliest deadline
        (see the class docstring); False when no core is free or no job is late."""
        used = {c for st in out.jobs.values() for c in st.cpus}
        free = [
            (cl, c)
            for cl in obs.clusters
            for c in act.get(cl.name, ())
            if c in cl.online and c not in used
        ]
        if not free:
            return False
        late = []
        for pid, j in jobs.items():
            if j.deadline_s is None or j.profile is None or not j.remaining_s > 0:
                continue
            cpus = out.jobs[pid].cpus
            cl = where.get(cpus[0]) if cpus else None
            if cl is None:
                continue
            f = out.freq_khz.get(cl.name) or cl.cur_khz or cl.freqs_khz[-1]
            rem = job_remaining(j)
            c = work_at(j.profile, f, cl.capacity, rem)
            span = span_within(j.profile, f, cl.capacity, c)
            if span + (c - span) / len(cpus) > j.remaining_s:
                late.append((j.remaining_s, pid))
        if not late:
            return False
        pid = min(late)[1]
        for cl in {id(cl): cl for cl, _ in free}.values():
            if used.isdisjoint(cl.cpus):  # runs no job: at its top for the late one
                top = cl.max_khz if cl.max_khz is not None else cl.freqs_khz[-1]
                out.freq_khz[cl.name] = top
        st = out.jobs[pid]
        out.jobs[pid] = JobSetting(
            tuple(sorted(set(st.cpus) | {c for _, c in free})), st.rt_priority, st.nice
        )
        return True

    def __call__(self, decision: Decision, obs: Observation) -> Decision:
        if not obs.jobs or not decision.jobs:
            return decision
        act = self.active() if self.active is not None else None
        if act is None:
            act = {c.name: tuple(sorted(c.online)) for c in obs.clusters}
        out = decision.copy()
        where = {c: cl for cl in obs.clusters for c in cl.cpus}
        jobs = {j.pid: j for j in obs.jobs if j.pid in out.jobs}
        if self._to_the_late(out, obs, act, where, jobs):
            return out

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

        # before any lending: a core lent first must not stand for the borrower's home
        need = max(home_speed(pid) for pid in borrowers)
        for cl, free in idle_clusters:
            hi = cl.max_khz if cl.max_khz is not None else cl.freqs_khz[-1]
            lo = cl.min_khz if cl.min_khz is not None else 0
            allowed = [f for f in cl.freqs_khz if lo <= f <= hi] or [hi]
            ok = [f for f in allowed if cl.capacity * f >= need - 1e-6]
            if not ok and not best_effort:
                # slower than the deadline job's home: lent only while the bound of a greedy
                # run on all of its cores, the slower ones included, still meets its deadline
                pid = borrowers[0]
                if not self._slower_fit(out, jobs[pid], where, cl, allowed[-1], free):
                    continue
            out.freq_khz[cl.name] = ok[0] if ok else allowed[-1]
            lend(borrowers, free)
        return out

    @staticmethod
    def _slower_fit(out: Decision, j: JobObs, where, cl: ClusterObs, khz: int, free) -> bool:
        """Whether deadline job ``j`` still meets its deadline by :func:`greedy_bound` with
        ``free`` cores of ``cl`` at ``khz`` added to its own, which it must hold alone (a
        shared core's time is not the job's)."""
        if j.profile is None or not j.remaining_s > 0:
            return False
        mine = out.jobs[j.pid].cpus
        if not mine or any(
            pid != j.pid and not set(st.cpus).isdisjoint(mine) for pid, st in out.jobs.items()
        ):
            return False
        cores = []
        for c in mine:
            home = where.get(c)
            if home is None:
                return False
            f = out.freq_khz.get(home.name) or home.cur_khz or home.freqs_khz[-1]
            cores.append((f, home.capacity))
        cores += [(khz, cl.capacity)] * len(free)
        return greedy_bound(j.profile, cores, job_remaining(j)) <= j.remaining_s


class GateStage:
    """The federated gate as a decision stage (rebuilt when the scaling limits change).

    A few gates are kept, one per set of clusters seen: the mixed-criticality reservation
    runs the stage on its parts of the board every tick (:mod:`agents.mixed`)."""

    MAX_GATES = 8

    def __init__(self):
        self._gates: dict[tuple, FederatedGate] = {}
        self.last = None

    def __call__(self, decision: Decision, obs: Observation) -> Decision:
        key = tuple((c.name, c.online, c.min_khz, c.max_khz) for c in obs.clusters)
        gate = self._gates.get(key)
        if gate is None:
            if len(self._gates) >= self.MAX_GATES:
                self._gates.clear()
            gate = self._gates[key] = FederatedGate.from_observation(obs)
        jobs = jobs_from_obs(obs)
        if not jobs:
            return decision
        self.last = gate.repair(decision, jobs)
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
    "rt_rows_many",
    "ShieldStage",
    "GateStage",
    "SpillStage",
    "Recorder",
    "HidvfsPolicy",
]
