"""strassen: 7-way recursive Strassen-Winograd multiplication of n x n doubles.

A call of size s > the Strassen cutoff forms the 8 quadrant sums S1..S8 (the "pre" additions),
spawns the 7 quadrant products as tasks, waits, and combines them into C with 7 more quadrant
additions ("post"). Below the depth cutoff the recursion continues serially; at or below the
size cutoff a blocked naive product does s^3 multiply-adds.
"""

from __future__ import annotations

import numpy as np

from ._graph import Recorder, mix_beta

DESCRIPTION = (
    "7-way divide and conquer: pre-additions node -> 7 product tasks -> join with the "
    "post-additions (taskwait); tasks to the depth cutoff, serial Strassen then naive blocks"
)
#: BOTS config/classes/strassen: n; defaults -y 64 (Strassen size cutoff), -x 3 (depth cutoff).
CLASSES = {
    "test": {"n": 512, "leaf": 64, "depth": 3},
    "small": {"n": 2048, "leaf": 64, "depth": 3},
    "medium": {"n": 8192, "leaf": 64, "depth": 3},
}
VARIANTS = ("omp-tasks",)
#: Naive 64x64 blocks (3 x 32 KB) live in L1/L2: mostly compute.
BETA_MUL = 0.15
#: Quadrant additions stream 3 doubles per element from DRAM: mostly memory.
BETA_ADD = 0.7
#: One double multiply-add in the naive kernel, and one element of a quadrant addition.
FMA_S = 0.6e-9
ADD_S = 2.0e-9
PRE_ADDS, POST_ADDS = 8, 7


def adds_s(s: int, count: int) -> float:
    return count * (s // 2) ** 2 * ADD_S


def serial(s: int, leaf: int) -> tuple[float, float]:
    """(multiply seconds, addition seconds) of a serial Strassen of size ``s``."""
    if s <= leaf:
        return s**3 * FMA_S, 0.0
    mul, add = serial(s // 2, leaf)
    return 7 * mul, 7 * add + adds_s(s, PRE_ADDS + POST_ADDS)


def build(rec: Recorder, p: dict, variant: str, rng: np.random.Generator) -> dict:
    n, leaf, max_depth = p["n"], p["leaf"], p["depth"]
    if n % 16 or n & (n - 1):
        raise ValueError(f"strassen: n={n} must be a power of two and a multiple of 16")

    def node(s: int, depth: int, preds: tuple[int, ...]) -> int:
        if s <= leaf or depth >= max_depth:
            mul, add = serial(s, leaf)
            beta = mix_beta([(mul, BETA_MUL), (add, BETA_ADD)])
            return rec.add("leaf", mul + add, beta, preds)
        pre = rec.add("spawn", adds_s(s, PRE_ADDS), BETA_ADD, preds)
        kids = [node(s // 2, depth + 1, (pre,)) for _ in range(7)]
        return rec.add("join", adds_s(s, POST_ADDS), BETA_ADD, (pre, *kids))

    node(n, 0, ())
    levels = min(max_depth, max(0, (n // leaf).bit_length() - 1))
    return {"task_levels": levels, "leaf_task_size": n >> levels, "leaf_tasks": 7**levels}
