"""Makespan and energy bounds of a DAG at an operating point (models.md sections 1.3 and 7).

Pure functions. Times are seconds, frequencies Hz, work in cycles of the board's reference core
(a core of relative ``capacity`` runs ``capacity`` reference cycles per Hz).

- Makespan on m identical cores: every schedule takes at least ``max(L, C/m)``; every
  work-conserving list schedule at most ``L + (C − L)/m`` (Graham).
- Energy (continuous speeds by time-mixing the OPPs, idle cores power-gated): with the per-core
  busy power P(f) replaced by its lower convex hull over the OPPs, the energy per cycle
  e(s) = P(s)/s is minimised at the critical speed f*, and
  ``E ≥ max(W·e(max(f*, W/(mD))), L·e(max(f*, L/D)) + (W − L)·e(f*))``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from platforms.dag import DAG

# --------------------------------------------------------------------------------------------
# makespan


@dataclass(frozen=True)
class MakespanBounds:
    work_s: float  # C: total work at the operating point
    span_s: float  # L: critical path at the operating point
    m: int
    lower_s: float  # max(L, C/m)
    graham_s: float  # L + (C − L)/m


def work_span_bounds(work_s: float, span_s: float, m: int) -> MakespanBounds:
    """Bounds from C and L directly (e.g. from a job profile)."""
    if m < 1:
        raise ValueError(f"core count must be >= 1, got {m}")
    if span_s > work_s + 1e-12 * max(1.0, work_s) or span_s < 0:
        raise ValueError(f"need 0 <= L <= C, got L={span_s}, C={work_s}")
    return MakespanBounds(
        work_s, span_s, m, max(span_s, work_s / m), span_s + (work_s - span_s) / m
    )


def makespan_bounds(dag: DAG, f_hz: float, capacity: float = 1.0, m: int = 1) -> MakespanBounds:
    """Lower and Graham bounds of ``dag`` alone on ``m`` cores of ``capacity`` at ``f_hz``."""
    if f_hz <= 0 or capacity <= 0:
        raise ValueError(f"frequency and capacity must be > 0, got f={f_hz}, capacity={capacity}")
    c, length = dag.work_span(f_hz, capacity)
    return work_span_bounds(c, min(length, c), m)


def lower_bound(dag: DAG, f_hz: float, capacity: float = 1.0, m: int = 1) -> float:
    return makespan_bounds(dag, f_hz, capacity, m).lower_s


def graham_bound(dag: DAG, f_hz: float, capacity: float = 1.0, m: int = 1) -> float:
    return makespan_bounds(dag, f_hz, capacity, m).graham_s


# --------------------------------------------------------------------------------------------
# energy


@dataclass(frozen=True)
class PowerCurve:
    """Busy power of one core of a core type at each OPP (increasing frequencies)."""

    freqs_hz: tuple[float, ...]
    power_w: tuple[float, ...]
    capacity: float = 1.0

    def __post_init__(self):
        f = self.freqs_hz
        if (
            not f
            or len(f) != len(self.power_w)
            or any(b <= a for a, b in zip(f, f[1:]))
            or f[0] <= 0
        ):
            raise ValueError("PowerCurve needs matching, strictly increasing positive frequencies")


def lower_hull_points(x: Sequence[float], y: Sequence[float]) -> tuple[int, ...]:
    """Indices of the points on the lower convex hull of {(x_k, y_k)}, x strictly increasing."""
    hull: list[int] = []
    for k in range(len(x)):
        while len(hull) >= 2:
            i, j = hull[-2], hull[-1]
            # drop j if it lies on or above the segment i -> k
            if (y[j] - y[i]) * (x[k] - x[i]) >= (y[k] - y[i]) * (x[j] - x[i]):
                hull.pop()
            else:
                break
        hull.append(k)
    return tuple(hull)


def lower_hull(curve: PowerCurve) -> tuple[int, ...]:
    """Indices of the OPPs on the lower convex hull of {(f_k, P_k)} (Ishihara & Yasuura)."""
    return lower_hull_points(curve.freqs_hz, curve.power_w)


def hull_power(curve: PowerCurve, s_hz: float) -> float:
    """Power of the best mix of OPPs with average speed ``s_hz`` (lower hull interpolation)."""
    f, p = curve.freqs_hz, curve.power_w
    if s_hz < f[0] or s_hz > f[-1] * (1 + 1e-12):
        raise ValueError(f"speed {s_hz} Hz outside the OPP range [{f[0]}, {f[-1]}]")
    h = lower_hull(curve)
    for a, b in zip(h, h[1:]):
        if s_hz <= f[b]:
            w = (s_hz - f[a]) / (f[b] - f[a])
            return p[a] + w * (p[b] - p[a])
    return p[h[-1]]


def energy_per_cycle(curve: PowerCurve, s_hz: float) -> float:
    """J per core cycle at average speed ``s_hz``; below the lowest OPP, run at it and idle."""
    s = max(s_hz, curve.freqs_hz[0])
    return hull_power(curve, s) / s


def critical_speed(curve: PowerCurve) -> float:
    """The speed minimising energy per cycle (a hull vertex: P/s is monotone on each segment)."""
    f = curve.freqs_hz
    return min((f[k] for k in lower_hull(curve)), key=lambda fk: hull_power(curve, fk) / fk)


def critical_speed_continuous(p_ind_w: float, c_e: float, alpha: float) -> float:
    """f* = (P_ind / ((α − 1)·C_e))^(1/α) for P(f) = P_s + P_ind + C_e·f^α (models.md 7)."""
    if alpha <= 1 or c_e <= 0 or p_ind_w < 0:
        raise ValueError("need alpha > 1, c_e > 0, p_ind >= 0")
    return (p_ind_w / ((alpha - 1.0) * c_e)) ** (1.0 / alpha)


@dataclass(frozen=True)
class EnergyBound:
    work_j: float  # work bound
    path_j: float  # critical-path bound
    lower_j: float  # max of the two (inf when the deadline is infeasible)
    f_crit_hz: float
    feasible: bool


def energy_lower_bound(
    work_cycles: float,
    span_cycles: float,
    m: int,
    deadline_s: float,
    curve: PowerCurve,
    *,
    work_mem_s: float = 0.0,
    span_mem_s: float = 0.0,
) -> EnergyBound:
    """Energy lower bound (J) of W core cycles with a span of L cycles on m cores within D.

    ``work_mem_s``/``span_mem_s`` are the frequency-independent seconds of all tasks / of the
    span path: they take time out of the deadline (the cores stall, they do not compute).
    """
    if m < 1 or deadline_s <= 0:
        raise ValueError(f"need m >= 1 and deadline > 0, got m={m}, D={deadline_s}")
    fc = critical_speed(curve)
    fmax = curve.freqs_hz[-1]
    e_crit = energy_per_cycle(curve, fc)
    core_time = m * deadline_s - work_mem_s
    path_time = deadline_s - span_mem_s
    s_work = work_cycles / core_time if core_time > 0 else math.inf
    s_path = span_cycles / path_time if path_time > 0 else math.inf
    feasible = (work_cycles == 0 or s_work <= fmax * (1 + 1e-9)) and (
        span_cycles == 0 or s_path <= fmax * (1 + 1e-9)
    )
    if not feasible:
        return EnergyBound(math.inf, math.inf, math.inf, fc, False)
    work_j = work_cycles * energy_per_cycle(curve, min(max(fc, s_work), fmax))
    path_j = (
        span_cycles * energy_per_cycle(curve, min(max(fc, s_path), fmax))
        + (work_cycles - span_cycles) * e_crit
    )
    return EnergyBound(work_j, path_j, max(work_j, path_j), fc, True)


def _longest_compute_path(dag: DAG) -> tuple[float, float]:
    """(cycles, mem_s) of the path with the most compute cycles."""
    order = dag.topo_order()
    n = dag.n
    best = np.zeros(n)  # cycles of the best path ending at v (inclusive)
    mem = np.zeros(n)
    start_c = np.zeros(n)
    start_m = np.zeros(n)
    ptr, idx = dag.succ_ptr, dag.succ_idx
    cyc, ms = dag.cycles, dag.mem_s
    for v in order:
        best[v] = start_c[v] + cyc[v]
        mem[v] = start_m[v] + ms[v]
        for s in idx[ptr[v] : ptr[v + 1]]:
            if best[v] > start_c[s]:
                start_c[s] = best[v]
                start_m[s] = mem[v]
    if n == 0:
        return 0.0, 0.0
    k = int(np.argmax(best))
    return float(best[k]), float(mem[k])


def dag_energy_lower_bound(dag: DAG, curve: PowerCurve, m: int, deadline_s: float) -> EnergyBound:
    """Energy lower bound of ``dag`` on ``m`` cores of the curve's core type within ``deadline_s``."""
    cap = curve.capacity
    span_c, span_m = _longest_compute_path(dag)
    return energy_lower_bound(
        float(dag.cycles.sum()) / cap,
        span_c / cap,
        m,
        deadline_s,
        curve,
        work_mem_s=float(dag.mem_s.sum()),
        span_mem_s=span_m,
    )


def hetero_energy_lower_bound(work_ref_cycles: float, curves: list[PowerCurve]) -> float:
    """E ≥ W·min_k min_f P_k(f)/(κ_k f): the cheapest reference cycle on any core type."""
    return work_ref_cycles * min(
        energy_per_cycle(c, critical_speed(c)) / c.capacity for c in curves
    )
