"""Task DAGs: the execution model shared by the simulator, the BOTS models and the gate.

A task has CPU work in cycles on the board's reference core (capacity 1.0) and a
frequency-independent memory time in seconds (the two-point model
``t(f) = cycles / (capacity * f) + mem_s``). Edges are stored as CSR successor lists.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True, eq=False)
class DAG:
    name: str
    cycles: np.ndarray  # float64 [n], compute cycles on the reference core
    mem_s: np.ndarray  # float64 [n], frequency-independent seconds
    succ_ptr: np.ndarray  # int64 [n+1]
    succ_idx: np.ndarray  # int64 [edges]
    npred: np.ndarray  # int64 [n], number of predecessors
    meta: dict = field(default_factory=dict)

    @property
    def n(self) -> int:
        return int(self.cycles.shape[0])

    @property
    def n_edges(self) -> int:
        return int(self.succ_idx.shape[0])

    def successors(self, i: int) -> np.ndarray:
        return self.succ_idx[self.succ_ptr[i] : self.succ_ptr[i + 1]]

    def task_time(self, f_hz: float, capacity: float = 1.0) -> np.ndarray:
        """Per-task duration at frequency ``f_hz`` on a core of relative ``capacity``."""
        return self.cycles / (capacity * f_hz) + self.mem_s

    def topo_order(self) -> np.ndarray:
        """Kahn order; raises ValueError if the graph has a cycle."""
        n = self.n
        indeg = self.npred.copy()
        order = np.empty(n, dtype=np.int64)
        stack = list(np.flatnonzero(indeg == 0))
        k = 0
        ptr, idx = self.succ_ptr, self.succ_idx
        while stack:
            v = stack.pop()
            order[k] = v
            k += 1
            for s in idx[ptr[v] : ptr[v + 1]]:
                indeg[s] -= 1
                if indeg[s] == 0:
                    stack.append(int(s))
        if k != n:
            raise ValueError(f"DAG {self.name!r} has a cycle ({n - k} tasks unreachable)")
        return order

    def span(self, weights: np.ndarray) -> float:
        """Longest path length under per-task ``weights`` (critical path)."""
        order = self.topo_order()
        finish = np.zeros(self.n)
        start = np.zeros(self.n)
        ptr, idx = self.succ_ptr, self.succ_idx
        for v in order:
            finish[v] = start[v] + weights[v]
            s = idx[ptr[v] : ptr[v + 1]]
            if s.size:
                np.maximum.at(start, s, finish[v])
        return float(finish.max()) if self.n else 0.0

    def work_span(self, f_hz: float, capacity: float = 1.0) -> tuple[float, float]:
        """(C, L) in seconds at one operating point: total work and critical path."""
        w = self.task_time(f_hz, capacity)
        return float(w.sum()), self.span(w)

    def part_spans(self, f_hz: float, capacity: float = 1.0) -> tuple[float, float]:
        """Longest paths of the compute parts alone and of the memory parts alone (s).

        Every path's time at any speed is at most the first scaled by the speed plus the
        second, so the pair bounds the span at every operating point, where one span scaled
        by the mean memory share does not (a path may be all compute)."""
        return self.span(self.cycles / (capacity * f_hz)), self.span(self.mem_s)

    @property
    def beta(self) -> float:
        """Memory-bound fraction at 1 GHz on the reference core (a summary for features)."""
        t = self.task_time(1e9)
        tot = float(t.sum())
        return float(self.mem_s.sum()) / tot if tot > 0 else 0.0


class DagBuilder:
    """Incremental builder: ``add(cycles, mem_s, preds)`` returns the new task id."""

    def __init__(self, name: str):
        self.name = name
        self._cycles: list[float] = []
        self._mem: list[float] = []
        self._edges_src: list[int] = []
        self._edges_dst: list[int] = []

    def add(
        self, cycles: float, mem_s: float = 0.0, preds: tuple[int, ...] | list[int] = ()
    ) -> int:
        tid = len(self._cycles)
        self._cycles.append(float(cycles))
        self._mem.append(float(mem_s))
        for p in preds:
            if not 0 <= p < tid:
                raise ValueError(f"predecessor {p} of task {tid} does not exist yet")
            self._edges_src.append(p)
            self._edges_dst.append(tid)
        return tid

    def edge(self, src: int, dst: int) -> None:
        self._edges_src.append(src)
        self._edges_dst.append(dst)

    def __len__(self) -> int:
        return len(self._cycles)

    def build(self, **meta) -> DAG:
        return make_dag(
            self.name, self._cycles, self._mem, self._edges_src, self._edges_dst, **meta
        )


def make_dag(name, cycles, mem_s, src, dst, **meta) -> DAG:
    cycles = np.asarray(cycles, dtype=np.float64)
    mem_s = np.asarray(mem_s, dtype=np.float64)
    n = cycles.shape[0]
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    if src.size and (src.min() < 0 or dst.min() < 0 or src.max() >= n or dst.max() >= n):
        raise ValueError(f"DAG {name!r}: edge endpoint out of range")
    order = np.argsort(src, kind="stable")
    src, dst = src[order], dst[order]
    counts = np.bincount(src, minlength=n) if n else np.zeros(0, dtype=np.int64)
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=ptr[1:])
    npred = np.bincount(dst, minlength=n).astype(np.int64) if n else np.zeros(0, dtype=np.int64)
    return DAG(name, cycles, mem_s, ptr, dst, npred, dict(meta))
