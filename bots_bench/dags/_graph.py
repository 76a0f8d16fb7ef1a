"""Shared machinery of the BOTS DAG models: a task recorder and the conversion to ``DAG``.

Generators describe each task by its *role* (spawn, join, leaf, ...), its duration in seconds on
the TX2 reference core (Cortex-A57, capacity 1.0) at ``F_REF_HZ``, and its memory-bound fraction
``beta`` at that frequency. ``Recorder.build`` applies the per-kernel calibration scale, the
per-task runtime overhead and a small seeded jitter, then splits every duration into
frequency-dependent cycles and frequency-independent memory seconds (two-point model,
models.md section 6): ``cycles = (1 - beta) * t * F_REF_HZ`` and ``mem_s = beta * t``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from platforms.dag import DAG, DagBuilder

#: TX2 A57 maximum OPP (2035.2 MHz): durations and beta are specified at this point.
F_REF_HZ = 2_035_200_000.0
#: Hard cap on tasks per DAG (the simulator runs all kernels x policies in seconds).
MAX_TASKS = 20_000
#: Soft budget the coarsening aims at (leaves room for seed-dependent kernels).
TASK_BUDGET = 10_000
#: Create + dispatch cost of one OpenMP task in libgomp on an A57 near 2 GHz (compute only).
TASK_OVERHEAD_S = 1.0e-6
#: Log-normal sigma of the per-task duration noise (mean-preserving).
JITTER_SIGMA = 0.05


class TaskBudgetExceeded(RuntimeError):
    """A generator produced more tasks than ``MAX_TASKS`` (a coarsening bug, never user input)."""


class Recorder:
    """Collects tasks in creation order; predecessors must already exist."""

    def __init__(self, name: str):
        self.name = name
        self.secs: list[float] = []
        self.beta: list[float] = []
        self.role: list[str] = []
        self.preds: list[Sequence[int]] = []

    def __len__(self) -> int:
        return len(self.secs)

    def add(self, role: str, secs: float, beta: float, preds: Sequence[int] = ()) -> int:
        tid = len(self.secs)
        if tid >= MAX_TASKS:
            raise TaskBudgetExceeded(f"{self.name}: more than {MAX_TASKS} tasks")
        self.secs.append(secs)
        self.beta.append(beta)
        self.role.append(role)
        self.preds.append(preds)
        return tid

    def build(self, *, scale: float, rng: np.random.Generator, meta: dict) -> DAG:
        """Scale, add overhead and jitter, and emit the ``DAG`` (roles go to ``meta['role']``)."""
        n = len(self.secs)
        secs = np.asarray(self.secs, dtype=np.float64) * scale
        if JITTER_SIGMA > 0 and n:
            secs *= rng.lognormal(-0.5 * JITTER_SIGMA**2, JITTER_SIGMA, n)
        mem = secs * np.asarray(self.beta, dtype=np.float64)
        cycles = (secs - mem + TASK_OVERHEAD_S) * F_REF_HZ
        b = DagBuilder(self.name)
        for i in range(n):
            b.add(cycles[i], mem[i], self.preds[i])
        return b.build(role=np.asarray(self.role), **meta)


def serial_dag(dag: DAG) -> DAG:
    """The ``serial`` variant: one task with the whole work and no per-task overhead."""
    overhead = TASK_OVERHEAD_S * F_REF_HZ * dag.n
    b = DagBuilder(dag.name + ".serial")
    b.add(max(float(dag.cycles.sum()) - overhead, 0.0), float(dag.mem_s.sum()))
    meta = {k: v for k, v in dag.meta.items() if k != "role"}
    return b.build(role=np.asarray(["serial"]), **meta)


def graham_estimate(
    dag: DAG, cores: int = 5, f_hz: float = F_REF_HZ, capacity: float = 1.0
) -> float:
    """Graham-like makespan estimate ``L + (C - L) / m`` (models.md section 1.3)."""
    work, span = dag.work_span(f_hz, capacity)
    return span + (work - span) / cores


def mix_beta(parts: Sequence[tuple[float, float]]) -> float:
    """Time-weighted beta of a lumped task made of ``(seconds, beta)`` parts."""
    tot = sum(s for s, _ in parts)
    return sum(s * b for s, b in parts) / tot if tot > 0 else 0.0
