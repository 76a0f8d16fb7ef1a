"""Observation schema v1: an :class:`Observation` as fixed-size, normalised float32 vectors.

The learned agents (hidvfs, and the GearDVFS / zTT ports) only see these vectors, so the schema
is versioned: a model exported under one version refuses to load under another
(:mod:`agents.runtime`). Every field is documented in :data:`CLUSTER_FIELDS`,
:data:`GLOBAL_FIELDS` and :data:`JOB_FIELDS`; every value is clipped to [-1, 4] so that an odd
reading can never blow up a network. Unavailable readings (``None``) map to a neutral value and
are never read as zero power or zero temperature where that would look "safe"; a cluster
temperature that stops reading keeps its last reading (as the thermal guard keeps its cap), so
a failing sensor on a hot cluster does not make it the coolest one.

Three vectors per tick:

* ``clusters`` [MAX_CLUSTERS, len(CLUSTER_FIELDS)]: one row per cpufreq cluster in spec order,
  zero rows (``present`` = 0) for padding;
* ``glob`` [len(GLOBAL_FIELDS)]: board-wide load, power and deadline pressure;
* ``jobs`` [n_jobs, len(JOB_FIELDS)]: one row per running job (priority agent, shield).

Temperature trends need the previous ticks, so :class:`FeatureTracker` is stateful (one per
run; ``reset`` between runs).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np

from agents.deadlines import span_within, work_at
from platforms.observation import JobObs, Observation
from platforms.spec import BoardSpec

SCHEMA_VERSION = 1
MAX_CLUSTERS = 3

CLUSTER_FIELDS = (
    "present",  # 1 for a real cluster, 0 for padding
    "util_mean",  # mean busy fraction of the online CPUs since the last tick (0..1)
    "util_max",  # max busy fraction of the online CPUs
    "freq_level",  # index of the current frequency / (n_levels - 1)
    "temp_ratio",  # cluster temperature (hottest zone) / passive trip, both in C
    "temp_trend",  # (T now - T ~1 s ago) / 10 C  (clipped to [-1, 1])
    "headroom",  # (trip - T) / 30 C  (clipped to [-1, 1]; < 0 is over the trip)
    "online_frac",  # online CPUs / CPUs of the cluster
    "capacity",  # online cores * capacity * f_max / the same over the board
    "speed",  # capacity * f_cur / (max capacity * f_max of the board)
)
GLOBAL_FIELDS = (
    "power",  # total board power / power scale of the board (W)
    "n_jobs",  # running jobs / 8
    "min_deadline_ratio",  # min over deadline jobs of remaining deadline / deadline (1 if none)
    "remaining_work",  # remaining reference work of all jobs / (board speed at f_max) / 10 s
    "pressure_max",  # Graham bound at f_max of the board's work / min remaining deadline / 4
    "pressure_cur",  # the same at the current frequencies / 4
    "deadline_frac",  # fraction of running jobs with a deadline
    "max_temp_ratio",  # hottest CPU zone / its passive trip
)
JOB_FIELDS = (
    "hi",  # 1 for a high-criticality job
    "has_deadline",  # 1 when the job has a deadline
    "slack",  # remaining deadline / (remaining work time at f_max on its best cluster) / 4
    "remaining_frac",  # 1 - progress (1 when unknown)
    "remaining_work",  # remaining reference work (s) / 10
    "cores",  # cores held / online CPUs
    "elapsed_ratio",  # elapsed / deadline (elapsed / (2 x reference) without a deadline)
)
N_CLUSTER = len(CLUSTER_FIELDS)
N_GLOBAL = len(GLOBAL_FIELDS)
N_JOB = len(JOB_FIELDS)
LO, HI = -1.0, 4.0
#: temperature trend horizon (seconds of history)
TREND_S = 1.0
DEFAULT_TRIP_C = 85.0


def schema() -> dict:
    """The schema as stored in model metadata and checked on load."""
    return {
        "version": SCHEMA_VERSION,
        "max_clusters": MAX_CLUSTERS,
        "cluster": list(CLUSTER_FIELDS),
        "global": list(GLOBAL_FIELDS),
        "job": list(JOB_FIELDS),
    }


@dataclass(frozen=True)
class BoardScale:
    """Per-board normalisers derived from the spec (not learned, so identical at run time)."""

    power_w: float  # scale of total power
    fmax_speed: float  # max over clusters of capacity * f_max (kHz)
    capacity_total: float  # sum over clusters of ncores * capacity * f_max
    trips_c: tuple[float, ...]  # passive trip per cluster (spec order)
    ncpus: int

    @classmethod
    def of(cls, spec: BoardSpec) -> BoardScale:
        trips = []
        for cl in spec.clusters:
            t = [
                z.passive_trip_mc / 1000.0
                for z in spec.zones
                if cl.name in z.clusters and z.passive_trip_mc is not None
            ]
            trips.append(min(t) if t else DEFAULT_TRIP_C)
        power = 2.0 + 1.0 * spec.ncpus
        return cls(
            power_w=power,
            fmax_speed=max(c.capacity * c.fmax_khz for c in spec.clusters),
            capacity_total=sum(len(c.cpus) * c.capacity * c.fmax_khz for c in spec.clusters),
            trips_c=tuple(trips),
            ncpus=spec.ncpus,
        )


def _clip(x: float) -> float:
    if x != x:  # NaN
        return 0.0
    return LO if x < LO else (HI if x > HI else x)


def job_remaining(job: JobObs) -> float:
    """Remaining work fraction (1 when the backend cannot tell)."""
    if job.progress is None:
        return 1.0
    return min(max(1.0 - job.progress, 0.0), 1.0)


def job_time_at(job: JobObs, khz: float, capacity: float, ncores: int) -> float:
    """Graham-style bound of the job's remaining time at ``khz`` on ``ncores`` cores (s).

    L(f) + (C(f) - L(f)) / n with the two-point scaling of the work left (the estimate,
    :func:`agents.deadlines.work_at`) and the span's bound capped by it
    (:func:`agents.deadlines.span_within`); 0 without a profile.
    """
    p = job.profile
    if p is None:
        return 0.0
    rem = job_remaining(job)
    c = work_at(p, khz, capacity, rem)
    span = span_within(p, khz, capacity, c)
    return span + (c - span) / max(ncores, 1)


_ZERO_ROW = (0.0,) * N_CLUSTER


def _cluster_temps(obs: Observation, names: tuple[str, ...]) -> tuple[float | None, ...]:
    """``obs.cluster_temp_c(name)`` for every name in one pass over the zones (same maxima)."""
    hot: dict[str, float] = {}
    for z in obs.zones:
        t = z.temp_c
        if t is None:
            continue
        for name in z.clusters:
            old = hot.get(name)
            if old is None or t > old:
                hot[name] = t
    return tuple(hot.get(n) for n in names)


def _util_mean_max(cl) -> tuple[float | None, float | None]:
    """(``cl.mean_util``, ``cl.max_util``) from one pass over the online CPUs."""
    online = cl.online
    vals = [u for c, u in zip(cl.cpus, cl.util) if u is not None and c in online]
    if not vals:
        return None, None
    return sum(vals) / len(vals), max(vals)


class FeatureTracker:
    """Turns observations into schema-v1 vectors; keeps the temperature history for trends."""

    def __init__(self, spec: BoardSpec):
        self.spec = spec
        self.scale = BoardScale.of(spec)
        self.names = tuple(c.name for c in spec.clusters)[:MAX_CLUSTERS]
        self._hist: deque[tuple[float, tuple[float | None, ...]]] = deque()
        #: each cluster's last temperature read, kept while its zones read nothing
        self._last_temps: tuple[float | None, ...] = (None,) * len(self.names)
        #: ``ClusterObs.level`` per (table, current kHz): a scan of the table per cluster and
        #: tick otherwise; bounded (a board has a few tables and OPPs)
        self._levels: dict[tuple[tuple[int, ...], int | None], int | None] = {}

    def _level(self, cl) -> int | None:
        key = (cl.freqs_khz, cl.cur_khz)
        memo = self._levels
        if key not in memo:
            if len(memo) >= 1024:
                memo.clear()
            memo[key] = cl.level
        return memo[key]

    def reset(self) -> None:
        self._hist.clear()
        self._last_temps = (None,) * len(self.names)

    def _trend(self, t: float, temps: tuple[float | None, ...]) -> tuple[float, ...]:
        h = self._hist
        h.append((t, temps))
        while len(h) > 2 and t - h[1][0] >= TREND_S:
            h.popleft()
        t0, old = h[0]
        dt = t - t0
        out = []
        for a, b in zip(temps, old):
            if a is None or b is None or dt <= 0:
                out.append(0.0)
            else:
                out.append((a - b) * min(TREND_S / dt, 10.0) / 10.0)
        return tuple(out)

    def __call__(self, obs: Observation) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(clusters [3, N_CLUSTER], glob [N_GLOBAL], jobs [n_jobs, N_JOB]) as float32."""
        sc = self.scale
        byname = {c.name: c for c in obs.clusters}
        temps = _cluster_temps(obs, self.names)
        if None in temps:
            temps = tuple(t if t is not None else k for t, k in zip(temps, self._last_temps))
        self._last_temps = temps
        trends = self._trend(obs.t, temps)
        rows = [_ZERO_ROW] * MAX_CLUSTERS
        cap_online = 0.0
        speeds: list[tuple[float, int]] = []  # (per-core speed vs reference, online cores)
        best_speed = 0.0
        for i, name in enumerate(self.names):
            cl = byname.get(name)
            if cl is None:
                continue
            n_on = len(cl.online)
            table = cl.freqs_khz or (cl.cur_khz or 1,)
            cur = cl.cur_khz or table[-1]
            lvl = self._level(cl)
            nlev = max(len(table) - 1, 1)
            trip = sc.trips_c[i]
            temp = temps[i]
            um, ux = _util_mean_max(cl)
            cap = n_on * cl.capacity * table[-1] / sc.capacity_total
            cap_online += cap
            speed = cl.capacity * cur / sc.fmax_speed
            speeds.append((cl.capacity * cur, n_on))
            best_speed = max(best_speed, cl.capacity * table[-1] if n_on else 0.0)
            rows[i] = (
                1.0,
                _clip(um if um is not None else 0.5),
                _clip(ux if ux is not None else 0.5),
                _clip((lvl if lvl is not None else nlev) / nlev),
                _clip(temp / trip) if temp is not None else 0.6,
                max(-1.0, min(1.0, trends[i])),
                max(-1.0, min(1.0, (trip - temp) / 30.0)) if temp is not None else 0.5,
                _clip(n_on / max(len(cl.cpus), 1)),
                _clip(cap),
                _clip(speed),
            )
        cl_rows = np.array(rows, dtype=np.float32)
        jobs = obs.jobs
        n_online = sum(n for _, n in speeds) or 1
        # board speed (reference-seconds of work per second) at current and maximum frequency
        ref_khz = None
        rem_total = 0.0
        span_max_ref = 0.0
        min_ratio = 1.0
        min_rem_d = math.inf
        n_dl = 0
        jrows = []
        for j in jobs:
            p = j.profile
            rem = job_remaining(j)
            rem_work = rem * p.work_s if p is not None else 0.0
            if p is not None:
                ref_khz = p.ref_khz
                rem_total += rem_work
                span_max_ref = max(span_max_ref, min(p.span_s, rem_work))
            fast_time = 0.0
            if p is not None and best_speed > 0:
                fast_time = job_time_at(j, best_speed, 1.0, max(n_online, 1))
            if j.deadline_s is not None and j.deadline_s > 0:
                n_dl += 1
                r = j.remaining_s
                min_ratio = min(min_ratio, r / j.deadline_s)
                min_rem_d = min(min_rem_d, r)
                slack = r / fast_time if fast_time > 0 else 4.0 * 4
                elapsed_ratio = j.elapsed_s / j.deadline_s
            else:
                slack = 4.0 * 4
                ref = p.ref_makespan_s if p is not None else 1.0
                elapsed_ratio = j.elapsed_s / (2.0 * ref)
            jrows.append(
                (
                    1.0 if j.criticality == "hi" else 0.0,
                    1.0 if j.deadline_s is not None else 0.0,
                    _clip(slack / 4.0),
                    rem,
                    _clip(rem_work / 10.0),
                    _clip(len(j.cpus) / n_online),
                    _clip(elapsed_ratio),
                )
            )
        job_rows = np.array(jrows, dtype=np.float32).reshape(len(jobs), N_JOB)
        ref_khz = ref_khz or sc.fmax_speed
        cur_thr = sum(s * n for s, n in speeds) / ref_khz  # reference-core equivalents
        max_thr = (
            sum(
                byname[n].capacity * (byname[n].freqs_khz or (1,))[-1] * len(byname[n].online)
                for n in self.names
                if n in byname
            )
            / ref_khz
        )
        fast_core = max((s for s, n in speeds if n), default=ref_khz) / ref_khz
        g_max = span_max_ref / max(best_speed / ref_khz, 1e-9) + rem_total / max(max_thr, 1e-9)
        g_cur = span_max_ref / max(fast_core, 1e-9) + rem_total / max(cur_thr, 1e-9)
        if math.isfinite(min_rem_d) and min_rem_d > 0:
            p_max, p_cur = g_max / min_rem_d, g_cur / min_rem_d
        elif math.isfinite(min_rem_d):
            p_max = p_cur = 4.0 * 4
        else:
            p_max = p_cur = 0.0
        cpu_temps = [
            (z.temp_c, z.passive_trip_c or DEFAULT_TRIP_C)
            for z in obs.zones
            if z.role == "cpu" and z.temp_c is not None
        ]
        max_tr = max((t / tr for t, tr in cpu_temps), default=0.6)
        power = obs.total_power_w
        glob = np.array(
            (
                _clip(power / sc.power_w) if power is not None else 0.5,
                _clip(len(jobs) / 8.0),
                _clip(min_ratio),
                _clip(rem_total / max(max_thr, 1e-9) / 10.0),
                _clip(p_max / 4.0),
                _clip(p_cur / 4.0),
                (n_dl / len(jobs)) if jobs else 0.0,
                _clip(max_tr),
            ),
            dtype=np.float32,
        )
        return cl_rows, glob, job_rows


def remaining_bound_s(obs: Observation) -> float:
    """Graham-style bound (s) of all visible remaining work at the current frequencies.

    max_j L_j(fastest core) + sum_j C_j(mean core) / m, with the two-point scaling per job and
    m the online cores: the potential of the reward shaping (agents.train), monotone in f.
    """
    speeds = []
    for cl in obs.clusters:
        if cl.online:
            f = cl.cur_khz or (cl.freqs_khz[-1] if cl.freqs_khz else 0)
            speeds.append((cl.capacity * f, len(cl.online)))
    m = sum(n for _, n in speeds)
    if not m or not obs.jobs:
        return 0.0
    mean_speed = sum(s * n for s, n in speeds) / m
    fast = max(s for s, _ in speeds)
    span = 0.0
    work = 0.0
    for j in obs.jobs:
        p = j.profile
        if p is None:
            continue
        rem = job_remaining(j)
        work += rem * p.work_s * ((1.0 - p.beta) * p.ref_khz / mean_speed + p.beta)
        span = max(span, span_within(p, fast, 1.0, work_at(p, fast, 1.0, rem)))
    return span + work / m


__all__ = [
    "SCHEMA_VERSION",
    "MAX_CLUSTERS",
    "CLUSTER_FIELDS",
    "GLOBAL_FIELDS",
    "JOB_FIELDS",
    "N_CLUSTER",
    "N_GLOBAL",
    "N_JOB",
    "BoardScale",
    "FeatureTracker",
    "schema",
    "job_remaining",
    "job_time_at",
    "remaining_bound_s",
]
