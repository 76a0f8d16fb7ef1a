"""The least energy any policy can spend on a simulated episode, from the plant's power model.

Why: a target such as "15 % less energy than maxfreq" can be out of every policy's reach, and
the best fixed operating point only shows what *those* points reach. This floor holds for every
policy the daemon can run on the plant (frequencies, core sets, placement, shares), because it
relaxes only constraints, never costs (:meth:`platforms.sim.plant.Plant._flush` books them):

* The episode lasts T >= ``t_min_s``: no job ends before its critical path at the fastest core
  after its release, and the task time still to come after any release must fit on all cores.
  Over T the board pays its always-on loads (CPU uncore, every rail's ``base_w``) and every
  online core at least its cluster's idle floor: activity ``idle_activity`` plus leakage at the
  cheapest OPP, or, where the cluster's cores power-gate when idle (``gate_after_s``), the
  gated share of that leakage from the first second on (the floor forgets the wait before
  gating). The daemon never takes a core offline, so a core that does not work still leaks.
* A core of cluster k at OPP i runs ``capacity x f_i`` reference cycles per second at
  ``coef_w[i] + leak[i]`` plus the per-busy-core rail loads (``busy_core_w``); mixing OPPs
  and idle over time gives at best the lower convex hull of those points and the idle point,
  so the cheapest way to run C cycles in t seconds is to fill the hull segments of all cores
  in order of their cost per cycle (exact for separable convex piecewise-linear costs). That
  cost is convex in the machine's cycle rate.
* Each job's cycles run between its release and its deadline (or T). For a convex cost of
  the rate the cheapest rate profile is the Yao-Demers-Shenker schedule (:func:`yds_groups`):
  each of its stretches is charged the cheapest fill above.
* Relaxed, so they only lower the floor: each core may pick its own OPP mix (the plant shares
  one per cluster), the whole machine counts as one processor of the summed rate, and nothing
  waits on task dependencies beyond each job's critical path in ``t_min_s``.
* Memory stalls cost at least the cheapest stalled core's power over its idle floor
  (activity ``mem_activity``) plus the per-busy loads; their core time is not charged.
* Leakage is taken at the ambient, the coldest a die can be.

The floor is the minimum over T >= ``t_min_s`` of that sum (convex in T: a linear term plus
the perspective of a convex function), for the whole board and, separately, for the CPU rail.
Inputs are the DAGs as executed (after the plant's per-task jitter) and their releases.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from platforms.bounds import lower_hull_points
from platforms.dag import DAG
from platforms.sim.params import SimParams, parse_sim
from platforms.sim.power import ClusterPowerTable
from platforms.spec import BoardSpec

_GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0
#: relative difference under which two densities count as equal in :func:`yds_groups`
_TIE = 1e-12


@dataclass(frozen=True)
class FloorJob:
    """One job of the episode: its release, its DAG as executed, its absolute deadline if any."""

    release_t: float
    dag: DAG
    deadline_t: float | None = None


@dataclass(frozen=True)
class EnergyFloor:
    """Floors of one episode: no policy (meeting the deadlines, see ``deadlines``) spends less
    than ``total_j`` (``cpu_j`` on the CPU rail)."""

    t_min_s: float  # the episode cannot end earlier
    t_board_s: float  # the episode length at which the board's floor is reached
    total_j: float
    cpu_j: float
    #: the floor assumes every deadline met (False: none given, or one no schedule can meet,
    #: and then it holds for every policy)
    deadlines: bool = False

    def saving_ceiling(self, energy_j: float, cpu_energy_j: float) -> tuple[float, float]:
        """The largest fraction of (board, CPU-rail) energy any policy can save against a run
        that spent ``energy_j`` and ``cpu_energy_j`` on the same episode."""
        return (
            1.0 - self.total_j / energy_j if energy_j > 0 else 0.0,
            1.0 - self.cpu_j / cpu_energy_j if cpu_energy_j > 0 else 0.0,
        )


@dataclass(frozen=True)
class _Cores:
    """One cluster's online cores: their idle floor and the hull of (cycles/s, W) above it."""

    n: int
    idle_w: float
    segments: tuple[tuple[float, float], ...]  # (J per reference cycle, cycles/s of one core)


def _cores(
    spec: BoardSpec, params: SimParams, ambient_c: float, busy_w: float, online: set[int]
) -> tuple[list[_Cores], float]:
    """Per cluster the cores that stay online and their hull segments when a busy core also
    costs ``busy_w`` of rail loads; and the cheapest extra power of a stalled core."""
    out, stall = [], math.inf
    for cs in spec.clusters:
        cp = params.cluster(cs.name)
        table = ClusterPowerTable.build(cs, cp)
        leak = [table.leak_w(k, ambient_c) for k in range(len(cs.freqs_khz))]
        idle = min(c * params.idle_activity + lk for c, lk in zip(table.coef_w, leak))
        if math.isfinite(cp.gate_after_s):
            idle = min(idle, cp.gated_leak * min(leak))
        speeds = [0.0] + [cs.capacity * khz * 1e3 for khz in cs.freqs_khz]
        power = [idle] + [c + lk + busy_w for c, lk in zip(table.coef_w, leak)]
        hull = lower_hull_points(speeds, power)
        segs = tuple(
            ((power[b] - power[a]) / (speeds[b] - speeds[a]), speeds[b] - speeds[a])
            for a, b in zip(hull, hull[1:])
        )
        n = len(online.intersection(cs.cpus))
        out.append(_Cores(n, idle, segs))
        for c, lk in zip(table.coef_w, leak):
            stall = min(stall, c * params.mem_activity + lk + busy_w - idle)
    return out, max(stall, 0.0)


def _core_energy(cores: list[_Cores], cycles: float, t: float) -> float:
    """Least energy of the cores over ``t`` seconds that run ``cycles`` reference cycles."""
    e = sum(c.n * c.idle_w for c in cores) * t
    left = cycles
    for slope, width in sorted((s, c.n * w * t) for c in cores for s, w in c.segments):
        take = min(left, width)
        e += slope * take
        left -= take
        if left <= 0.0:
            return e
    return math.inf if left > 1e-9 * max(cycles, 1.0) else e


def yds_groups(jobs: Sequence[tuple[float, float, float]]) -> list[tuple[float, float]]:
    """``(seconds, cycles)`` of each stretch of the cheapest rate profile for jobs of
    ``(release_t, deadline_t, cycles)``, for any convex cost of the rate (Yao, Demers and
    Shenker 1995): the densest interval between a release and a deadline runs the jobs inside
    it at its density, is cut out of the timeline, and the rest is solved again."""
    left = [(r, max(d, r), c) for r, d, c in jobs if c > 0.0]
    out: list[tuple[float, float]] = []
    while left:
        best = (-1.0, 0.0, 0.0, 0)
        for a in {r for r, _, _ in left}:
            for b in {d for _, d, _ in left}:
                if b <= a:
                    continue
                inside = [c for r, d, c in left if r >= a and d <= b]
                dens = sum(inside) / (b - a)
                # a tie (to rounding) goes to the interval holding more jobs: cutting the
                # smaller one first would squeeze a job it overlaps into a sliver, denser later
                if dens > best[0] * (1 + _TIE) or (
                    dens >= best[0] * (1 - _TIE) and len(inside) > best[3]
                ):
                    best = (dens, a, b, len(inside))
        dens, a, b, _ = best
        if dens < 0.0:  # only zero-length windows left: they cannot be met, charge no time
            break
        inside = [j for j in left if j[0] >= a and j[1] <= b]
        out.append((b - a, sum(c for _, _, c in inside)))
        left = [(_cut(r, a, b), _cut(d, a, b), c) for r, d, c in left if (r, d, c) not in inside]
    return out


def _cut(t: float, a: float, b: float) -> float:
    """Where time ``t`` lands once [a, b] is cut out of the timeline."""
    return t if t <= a else (a if t < b else t - (b - a))


def episode_min_time(jobs: Sequence[FloorJob], fastest_hz: float, n_cores: int) -> float:
    """The earliest an episode can end on ``n_cores`` cores whose fastest runs ``fastest_hz``
    reference cycles per second."""
    if not jobs:
        return 0.0
    path = 0.0
    releases, times = [], []
    for j in jobs:
        tau = j.dag.cycles / fastest_hz + j.dag.mem_s
        path = max(path, j.release_t + j.dag.span(tau))
        releases.append(j.release_t)
        times.append(float(tau.sum()))
    order = np.argsort(releases, kind="stable")
    rel = np.asarray(releases)[order]
    # task time arriving at or after each release, over every core
    after = np.cumsum(np.asarray(times)[order][::-1])[::-1]
    return max(path, float(np.max(rel + after / n_cores)))


def _minimise(f: Callable[[float], float], lo: float, iters: int = 100) -> tuple[float, float]:
    """(argmin, min) of a convex ``f`` on [lo, inf): bracket by doubling, then golden section."""
    hi = max(lo, 1e-6) * 2.0
    while f(hi) < f(hi / 2.0) and hi < lo * 1e6 + 1e6:
        hi *= 2.0
    a, b = lo, hi
    for _ in range(iters):
        c, d = b - _GOLDEN * (b - a), a + _GOLDEN * (b - a)
        if f(c) <= f(d):
            b = d
        else:
            a = c
    t = 0.5 * (a + b)
    return min(((t, f(t)), (lo, f(lo))), key=lambda p: p[1])


def episode_energy_floor(
    spec: BoardSpec,
    jobs: Sequence[FloorJob],
    params: SimParams | None = None,
    ambient_c: float | None = None,
    online: Sequence[int] | None = None,
) -> EnergyFloor:
    """The floor under the energy that any policy meeting every deadline of ``jobs`` spends
    on the simulated ``spec`` (module docstring), from t = 0 as the plant meters it.
    ``online``: the cores the episode runs on, online all along (default every core, as
    :func:`daemon.simrun.run_sim` starts the plant and the daemon leaves them). A deadline
    no schedule can meet drops all deadlines (the floor then holds for every policy)."""
    params = params or parse_sim(spec)
    amb = params.ambient_c if ambient_c is None else ambient_c
    stay = set(spec.cpus if online is None else online)
    live = [cs for cs in spec.clusters if stay.intersection(cs.cpus)]
    if not live:
        raise ValueError(f"{spec.name}: no online core among {sorted(stay)}")
    fastest = max(cs.capacity * cs.fmax_khz * 1e3 for cs in live)
    t_min = episode_min_time(jobs, fastest, len(stay.intersection(spec.cpus)))
    cycles = [float(j.dag.cycles.sum()) for j in jobs]
    stall_s = sum(float(j.dag.mem_s.sum()) for j in jobs)
    cpu_rail = spec.cpu_rail.name if spec.cpu_rail else None
    cpu_loads = [r for r in params.rails if r.name == cpu_rail]

    def floor(loads, deadlines: bool) -> tuple[float, float]:
        fixed_w = params.cpu_uncore_w + sum(r.base_w for r in loads)
        cores, stall_w = _cores(spec, params, amb, sum(r.busy_core_w for r in loads), stay)

        def due(j: FloorJob, t: float) -> float:
            return t if j.deadline_t is None or not deadlines else min(j.deadline_t, t)

        def energy(t: float) -> float:
            groups = yds_groups([(j.release_t, due(j, t), c) for j, c in zip(jobs, cycles)])
            busy = sum(g for g, _ in groups)
            e = _core_energy(cores, 0.0, max(t - busy, 0.0))
            e += sum(_core_energy(cores, c, g) for g, c in groups)
            return fixed_w * t + e + stall_w * stall_s

        return _minimise(energy, t_min)

    t_board, total = floor(params.rails, True)
    _, cpu = floor(cpu_loads, True)
    with_deadlines = math.isfinite(total) and math.isfinite(cpu)
    if not with_deadlines:  # some deadline no schedule can meet: the floor of every policy
        t_board, total = floor(params.rails, False)
        _, cpu = floor(cpu_loads, False)
    return EnergyFloor(
        t_min_s=t_min,
        t_board_s=t_board,
        total_j=total,
        cpu_j=cpu,
        deadlines=with_deadlines and any(j.deadline_t is not None for j in jobs),
    )
