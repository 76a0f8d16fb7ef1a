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
(:class:`agents.stages.ShieldStage`) raises a deadline job's cluster frequency until the
response-time predictor's split-conformal bound meets the remaining deadline (else the
cluster's maximum). Both stages only add cores or raise frequencies. A last stage
(:class:`agents.stages.SpillStage`) hands the profiler's active cores that the gate left unused
back to the running jobs, at a speed that keeps the gate's bound valid (work conservation).

The three networks are plain callables ``x [N, in] -> y [N, out]``: numpy MLPs while training
(:mod:`agents.nn`), onnxruntime sessions on the board (:mod:`agents.runtime`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from agents.features import (
    CLUSTER_FIELDS,
    MAX_CLUSTERS,
    N_CLUSTER,
    N_GLOBAL,
    N_JOB,
    FeatureTracker,
)
from agents.nn import log_softmax, masked_logits, softmax
from agents.policy import Decision, JobSetting, Policy
from agents.stages import GateStage, ShieldStage, SpillStage
from platforms.observation import Observation
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
    "ActionSpace",
    "TickInputs",
    "TickChoice",
    "build_inputs",
    "choose",
    "to_decision",
    "Recorder",
    "HidvfsPolicy",
]
