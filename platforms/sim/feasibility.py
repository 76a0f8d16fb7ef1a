"""Can any policy meet every deadline of a simulated episode? A necessary condition.

Why: "misses no deadline" is only a fair target on an episode where some schedule meets them
all. Random job mixes are sometimes overloaded, and a miss there says nothing about a policy.
This check finds the episodes where meeting every deadline is impossible for every policy the
daemon can run on the plant (frequencies, core sets, placement, priorities), so an evaluation
can count the misses it could have avoided apart from the ones nothing could.

Two conditions, each necessary (the plant books every task on a core for
``cycles / (capacity x f) + mem_s``, memory stalls included):

* **span**: a job cannot end before its release plus its critical path with every task on the
  fastest core at its top OPP.
* **demand**: in every window [a, b] from a release to a deadline, the jobs released at or
  after ``a`` and due by ``b`` must fit in the cores' time of the window. Each core runs at
  most ``capacity x f_max`` reference cycles a second, and a second of memory stall takes a
  second of some core whatever its speed; the most a window can hold is therefore reached
  with the stalls on the slowest cores and the cycles on the rest (moving a stall second to a
  faster core only costs cycles), which is what :func:`window_load` computes.

The check relaxes task dependencies inside the window, a job's work done before ``a`` (only
jobs released inside count) and each cluster's single frequency, so it never calls a feasible
episode infeasible; passing it does not prove an episode feasible.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from platforms.sim.energy_floor import FloorJob
from platforms.spec import BoardSpec

#: relative slack on the comparisons: float noise never flags a window that just fits
_TOL = 1e-9


@dataclass(frozen=True)
class Overload:
    """The window that needs the most of the cores, and why no policy meets every deadline
    when ``infeasible``."""

    start_t: float
    end_t: float
    #: demand over the most the window can hold (> 1: no schedule fits; inf: a span too long)
    load: float
    jobs: tuple[int, ...]  # indices into the checked jobs
    reason: str

    @property
    def infeasible(self) -> bool:
        return self.load > 1.0 + _TOL


@dataclass(frozen=True)
class _Cluster:
    n: int
    speed: float  # reference cycles per second of one core at its top OPP


def _clusters(spec: BoardSpec, online: Sequence[int] | None) -> list[_Cluster]:
    """Online cores per cluster, slowest first (where the stalls go)."""
    stay = set(spec.cpus if online is None else online)
    out = [
        _Cluster(len(stay.intersection(cs.cpus)), cs.capacity * cs.fmax_khz * 1e3)
        for cs in spec.clusters
    ]
    out = [c for c in out if c.n]
    if not out:
        raise ValueError(f"{spec.name}: no online core among {sorted(stay)}")
    return sorted(out, key=lambda c: c.speed)


def window_load(cycles: float, stall_s: float, seconds: float, clusters: Sequence) -> float:
    """``cycles`` and ``stall_s`` of work over the most a window of ``seconds`` can hold.

    ``clusters`` are (cores, cycles/s per core), slowest first. 1.0 means the work exactly
    fills the window; above it no schedule fits it.
    """
    if seconds <= 0.0:
        return 0.0 if cycles <= 0.0 and stall_s <= 0.0 else float("inf")
    left = stall_s
    room = 0.0
    for c in clusters:
        core_s = c.n * seconds
        take = min(left, core_s)
        left -= take
        room += (core_s - take) * c.speed
    if left > _TOL * seconds:
        # the stalls alone need more core time than the window has
        total_s = sum(c.n for c in clusters) * seconds
        return stall_s / total_s
    if cycles <= 0.0:
        return stall_s / (sum(c.n for c in clusters) * seconds)
    return cycles / room if room > 0.0 else float("inf")


def worst_window(
    spec: BoardSpec, jobs: Sequence[FloorJob], online: Sequence[int] | None = None
) -> Overload | None:
    """The densest window of ``jobs`` on ``spec`` (see the module docstring), or None when no
    job has a deadline. ``infeasible`` on the result means no policy meets every deadline.

    ``jobs`` carry their DAGs as executed and absolute deadlines (:class:`FloorJob`, as the
    energy floor takes them); ``online``: the cores the episode runs on (default all).
    """
    clusters = _clusters(spec, online)
    fastest = clusters[-1].speed
    due = [(i, j) for i, j in enumerate(jobs) if j.deadline_t is not None]
    if not due:
        return None
    for i, j in due:
        tau = j.dag.cycles / fastest + j.dag.mem_s
        span = float(j.dag.span(tau)) if j.dag.n else 0.0
        if j.release_t + span > j.deadline_t * (1 + _TOL) + _TOL:
            return Overload(
                j.release_t,
                j.deadline_t,
                float("inf"),
                (i,),
                f"job {i}: critical path {span:.4g} s at the fastest core is longer than its "
                f"deadline {j.deadline_t - j.release_t:.4g} s",
            )
    work = [(float(j.dag.cycles.sum()), float(j.dag.mem_s.sum())) for j in jobs]
    worst: Overload | None = None
    starts = sorted({j.release_t for j in jobs})
    ends = sorted({j.deadline_t for _, j in due})
    for a in starts:
        for b in ends:
            if b <= a:
                continue
            inside = tuple(i for i, j in due if j.release_t >= a and j.deadline_t <= b)
            if not inside:
                continue
            cyc = sum(work[i][0] for i in inside)
            mem = sum(work[i][1] for i in inside)
            load = window_load(cyc, mem, b - a, clusters)
            if worst is None or load > worst.load:
                worst = Overload(
                    a,
                    b,
                    load,
                    inside,
                    f"jobs {list(inside)} need {load:.3f} x the cores' time of "
                    f"[{a:.4g}, {b:.4g}] s at every core's top OPP",
                )
    return worst


__all__ = ["Overload", "window_load", "worst_window"]
