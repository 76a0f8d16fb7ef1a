"""Placement heuristics for DAG jobs on heterogeneous nodes.

- ``fifo``: earliest job first, then the earliest ready task; fastest node that fits.
- ``sjf``: shortest task (work) first; fastest node that fits.
- ``cp``: critical path first (largest rank_u: work of the longest path to an exit);
  fastest node that fits.
- ``heft``: rank_u order (Topcuoglu et al. 2002; with one speed per node the mean-cost rank is
  proportional to the work rank), each task to the node of earliest finish time
  EFT = EST + w / speed, over busy nodes too (EST from the expected releases of running
  tasks). A task whose best node is busy is held and the node reserved for it in this round.
- ``tetris``: multi-resource packing (Grandl et al. 2014): the pair with the largest
  alignment dot(demand/capacity, free/capacity), scaled by the node's relative speed, plus
  epsilon x "less remaining job work first", epsilon = mean alignment / mean remaining score.
- ``random``: a uniformly random ready task on a uniformly random node that fits.

"Fastest node that fits" breaks ties by best fit (fewest cores left), then node index. No
communication cost is modelled, so every policy places tasks only by compute and capacity.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from platforms.cluster.simcluster import ClusterView, NodeSpec, Workload

_EPS = 1e-9
_CHUNK = 128


def fit_matrix(
    cpu: np.ndarray, mem: np.ndarray, free_cpu: np.ndarray, free_mem: np.ndarray
) -> np.ndarray:
    """``[R, N]`` True where a task's demand fits a node's free capacity."""
    return (cpu[:, None] <= free_cpu[None, :] + _EPS) & (mem[:, None] <= free_mem[None, :] + _EPS)


def fastest_fit_scores(
    view: ClusterView, cpu: float, free_cpu: np.ndarray, free_mem: np.ndarray, mem: float
) -> np.ndarray:
    """Node scores for "fastest node that fits, then best fit"; -inf where it does not fit."""
    fits = (free_cpu >= cpu - _EPS) & (free_mem >= mem - _EPS)
    left = (free_cpu - cpu) / view.cap_cpu
    return np.where(fits, view.speed - 1e-3 * left, -np.inf)


class OrderedPlacer:
    """Base of the list policies: order the ready tasks, then each to the fastest node that fits."""

    name = "ordered"
    #: what :meth:`node_scores` measures, for a scale that keeps its meaning across nodes
    #: (the extender's 1..10): "ratio", a positive score where twice the score is twice as
    #: good; "cost", minus a positive cost (a finish time); "logit", log-odds of the choice
    score_kind = "ratio"

    def reset(self, workload: Workload, nodes: Sequence[NodeSpec], seed: int) -> None:
        self.w = workload
        self.rng = np.random.default_rng(seed)

    def order(self, view: ClusterView) -> np.ndarray:
        raise NotImplementedError

    def node_scores(self, view: ClusterView, task: int) -> np.ndarray:
        return fastest_fit_scores(
            view, view.cpu[task], view.free_cpu, view.free_mem, view.mem[task]
        )

    def choose_node(
        self,
        view: ClusterView,
        fit_row: np.ndarray,
        task: int,
        free_cpu: np.ndarray,
        free_mem: np.ndarray,
    ) -> int:
        left = (free_cpu - view.cpu[task]) / view.cap_cpu
        return int(np.argmax(np.where(fit_row, view.speed - 1e-3 * left, -np.inf)))

    def place(self, view: ClusterView) -> list[tuple[int, int]]:
        if not view.n_nodes:
            return []
        order = self.order(view)
        c, m = view.cpu[order], view.mem[order]
        # suffix minimum of demands: stop once nothing left in the order can fit anywhere
        rest_c = np.minimum.accumulate(c[::-1])[::-1]
        rest_m = np.minimum.accumulate(m[::-1])[::-1]
        free_cpu, free_mem = view.free_cpu.copy(), view.free_mem.copy()
        out: list[tuple[int, int]] = []
        for lo in range(0, order.size, _CHUNK):
            if rest_c[lo] > free_cpu.max() + _EPS or rest_m[lo] > free_mem.max() + _EPS:
                break
            hi = min(lo + _CHUNK, order.size)
            fit = fit_matrix(c[lo:hi], m[lo:hi], free_cpu, free_mem)
            for i in np.flatnonzero(fit.any(axis=1)).tolist():
                row = fit[i]
                if not row.any():
                    continue
                task = int(order[lo + i])
                k = self.choose_node(view, row, task, free_cpu, free_mem)
                out.append((task, k))
                free_cpu[k] -= c[lo + i]
                free_mem[k] -= m[lo + i]
                fit[:, k] = (c[lo:hi] <= free_cpu[k] + _EPS) & (m[lo:hi] <= free_mem[k] + _EPS)
        return out


class FifoPlacer(OrderedPlacer):
    name = "fifo"

    def order(self, view: ClusterView) -> np.ndarray:
        r = view.ready
        return r[np.lexsort((r, view.ready_t[r], self.w.task_job[r]))]


class SjfPlacer(OrderedPlacer):
    name = "sjf"

    def order(self, view: ClusterView) -> np.ndarray:
        r = view.ready
        return r[np.lexsort((r, view.ready_t[r], self.w.work[r]))]


class CpPlacer(OrderedPlacer):
    name = "cp"

    def order(self, view: ClusterView) -> np.ndarray:
        r = view.ready
        return r[np.lexsort((r, view.ready_t[r], -self.w.rank_u[r]))]


class RandomPlacer(OrderedPlacer):
    name = "random"

    def order(self, view: ClusterView) -> np.ndarray:
        return self.rng.permutation(view.ready)

    def choose_node(self, view, fit_row, task, free_cpu, free_mem) -> int:
        return int(self.rng.choice(np.flatnonzero(fit_row)))

    def node_scores(self, view: ClusterView, task: int) -> np.ndarray:
        fits = (view.free_cpu >= view.cpu[task] - _EPS) & (view.free_mem >= view.mem[task] - _EPS)
        return np.where(fits, self.rng.random(view.n_nodes), -np.inf)


class HeftPlacer(OrderedPlacer):
    """HEFT in rank_u order with earliest-finish node choice over free and busy nodes.

    A task whose earliest finish is on a busy node holds that node (``hold``) until its start:
    a lower-ranked task may still run there if it fits now and ends by then (an insertion
    gap, as HEFT's EST allows), and the tasks placed earlier in the round count as released
    at their expected finish in every later EST."""

    name = "heft"
    score_kind = "cost"  # minus the earliest finish time

    def __init__(self, hold: bool = True):
        self.hold = hold

    def order(self, view: ClusterView) -> np.ndarray:
        r = view.ready
        return r[np.lexsort((r, view.ready_t[r], -self.w.rank_u[r]))]

    def _eft(
        self, view: ClusterView, task: int, free_cpu: np.ndarray, free_mem: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        c, m = view.cpu[task], view.mem[task]
        fits_now = (free_cpu >= c - _EPS) & (free_mem >= m - _EPS)
        est = view.earliest_start(c, m, free_cpu, free_mem)
        return est + self.w.work[task] / view.speed, fits_now

    def node_scores(self, view: ClusterView, task: int) -> np.ndarray:
        eft, _ = self._eft(view, task, view.free_cpu, view.free_mem)
        return -eft

    def place(self, view: ClusterView) -> list[tuple[int, int]]:
        order = self.order(view)
        free_cpu, free_mem = view.free_cpu.copy(), view.free_mem.copy()
        held_from = np.full(view.n_nodes, np.inf)  # a held node's start time for its task
        reserved = np.zeros(view.n_nodes, dtype=bool)
        rest_c = np.minimum.accumulate(view.cpu[order][::-1])[::-1]
        commits: list[tuple[int, float, float, float]] = []
        out: list[tuple[int, int]] = []
        for i, task in enumerate(order.tolist()):
            if rest_c[i] > free_cpu.max(initial=0.0) + _EPS:
                break
            c, m = view.cpu[task], view.mem[task]
            fits_now = (free_cpu >= c - _EPS) & (free_mem >= m - _EPS)
            run = self.w.work[task] / view.speed
            eft = view.earliest_start(c, m, free_cpu, free_mem, commits) + run
            # a held node takes a task only in the gap before its held task starts
            eft = np.where(reserved & ~(fits_now & (eft <= held_from + 1e-9)), np.inf, eft)
            if not self.hold:
                eft = np.where(fits_now, eft, np.inf)
            if not np.isfinite(eft).any():
                continue
            # among equal finish times prefer a node that is free now
            k = int(np.argmin(eft - 1e-9 * fits_now))
            if fits_now[k]:
                out.append((task, k))
                free_cpu[k] -= c
                free_mem[k] -= m
                commits.append((k, float(eft[k]), float(c), float(m)))
            else:
                reserved[k] = True
                held_from[k] = float(eft[k] - run[k])
        return out


class TetrisPlacer(OrderedPlacer):
    name = "tetris"

    @staticmethod
    def _align(
        view: ClusterView, c: np.ndarray, m: np.ndarray, free_cpu: np.ndarray, free_mem: np.ndarray
    ) -> np.ndarray:
        a = np.multiply.outer(c, free_cpu / view.cap_cpu**2) + np.multiply.outer(
            m, free_mem / view.cap_mem**2
        )
        return a * (view.speed / view.speed.max(initial=_EPS))  # initial: no nodes

    def _priority(self, view: ClusterView, tasks: np.ndarray, align: np.ndarray) -> np.ndarray:
        rem = view.job_unstarted_work[self.w.task_job[tasks]]
        srpt = 1.0 - rem / max(float(rem.max()), _EPS)
        return float(align.mean()) / max(float(srpt.mean()), _EPS) * srpt

    def node_scores(self, view: ClusterView, task: int) -> np.ndarray:
        t = np.array([task])
        c, m = view.cpu[t], view.mem[t]
        align = self._align(view, c, m, view.free_cpu, view.free_mem)
        fit = fit_matrix(c, m, view.free_cpu, view.free_mem)
        return np.where(fit, align, -np.inf)[0]

    def place(self, view: ClusterView) -> list[tuple[int, int]]:
        if not view.n_nodes:
            return []
        tasks = view.ready
        c, m = view.cpu[tasks], view.mem[tasks]
        free_cpu, free_mem = view.free_cpu.copy(), view.free_mem.copy()
        align = self._align(view, c, m, free_cpu, free_mem)
        pri = self._priority(view, tasks, align)
        score = np.where(fit_matrix(c, m, free_cpu, free_mem), align + pri[:, None], -np.inf)
        placed = np.zeros(tasks.size, dtype=bool)
        out: list[tuple[int, int]] = []
        while tasks.size:
            i, k = divmod(int(np.argmax(score)), view.n_nodes)
            if not np.isfinite(score[i, k]):
                break
            out.append((int(tasks[i]), k))
            placed[i] = True
            free_cpu[k] -= c[i]
            free_mem[k] -= m[i]
            fit_k = (c <= free_cpu[k] + _EPS) & (m <= free_mem[k] + _EPS) & ~placed
            a_k = (
                c * free_cpu[k] / view.cap_cpu[k] ** 2 + m * free_mem[k] / view.cap_mem[k] ** 2
            ) * (view.speed[k] / view.speed.max())
            score[:, k] = np.where(fit_k, a_k + pri, -np.inf)
            score[i, :] = -np.inf
        return out


HEURISTICS = {
    "fifo": FifoPlacer,
    "sjf": SjfPlacer,
    "cp": CpPlacer,
    "heft": HeftPlacer,
    "tetris": TetrisPlacer,
    "random": RandomPlacer,
}


def make_heuristic(name: str) -> OrderedPlacer:
    try:
        return HEURISTICS[name]()
    except KeyError:
        raise ValueError(
            f"unknown placement policy {name!r}; known: {', '.join(sorted(HEURISTICS))}"
        ) from None
