"""Response-time features of a deadline job: the shield predictor's inputs and its training data.

:data:`RT_FIELDS` of a job on its cores at a frequency (:func:`rt_row`, :func:`rt_features`),
and the same rows for every (job, candidate frequency) of a tick in one pass
(:func:`rt_rows_many`). They stand apart from the agents (:mod:`agents.hidvfs`) because two
places use them and neither needs the agents' action space or the policy: the training data
(:mod:`agents.rtmodel` records them) and the shield stage (:class:`agents.stages.ShieldStage`
queries the predictor with them); rows built the same way in both is what the conformal bound
relies on.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from agents.deadlines import span_terms, span_within
from agents.features import job_remaining
from agents.policy import Decision, JobSetting
from platforms.observation import JobObs, Observation

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


__all__ = [
    "RT_FIELDS",
    "N_RT",
    "rt_features",
    "rt_row",
    "rt_rows_many",
]
