"""sort (cilksort): 4-way recursive merge sort with recursive parallel merges.

``cilksort(size)`` sorts its four quarters as four tasks, waits, merges quarters 1+2 and 3+4 as
two tasks, waits, and merges the two halves itself. ``cilkmerge`` splits the larger run at its
middle, binary-searches the split in the other run and merges the two halves as two tasks plus
a ``taskwait``, down to the merge cutoff; below the sort cutoff a serial quicksort (insertion
sort under 20 elements) runs.
"""

from __future__ import annotations

import math
from functools import cache

import numpy as np

from ._graph import TASK_BUDGET, Recorder

DESCRIPTION = (
    "cilksort: spawn -> 4 quarter sorts -> join -> 2 merge trees -> join -> final merge tree; "
    "each merge is a binary split (binary search) -> 2 merges -> join, serial merge/quicksort "
    "leaves at the (coarsened) cutoffs"
)
#: BOTS config/classes/sort: n, -a 2048 sort cutoff, -y 2048 merge cutoff, -b 20 insertion.
#: ``test`` is the 1 Mi-element smoke size (bots.md 2.1): BOTS's 8 Mi test would take several
#: seconds at the calibrated cost, against the < 0.5 s a test class must take.
CLASSES = {
    "test": {"n": 1 << 20, "sort_cutoff": 2048, "merge_cutoff": 2048},
    "small": {"n": 1 << 25, "sort_cutoff": 2048, "merge_cutoff": 2048},
    "medium": {"n": 1 << 27, "sort_cutoff": 2048, "merge_cutoff": 2048},
    "large": {"n": 1 << 29, "sort_cutoff": 2048, "merge_cutoff": 2048},
}
VARIANTS = ("omp-tasks",)
#: Quicksort of a chunk that fits the 2 MB L2 is mostly compute; merges stream from DRAM.
BETA_QUICK_L2, BETA_QUICK_DRAM, BETA_MERGE, BETA_SPLIT = 0.15, 0.35, 0.55, 0.5
L2_ELEMS = (2 << 20) // 8  # 8-byte ELM
#: Per element and recursion level of quicksort; per element of a merge; per binary-search step.
QUICK_S, MERGE_S, SEARCH_S = 3.5e-9, 4.0e-9, 10e-9
SMALL_S = 0.2e-6  # spawn/join bookkeeping of a cilksort call


def quick_s(k: int) -> float:
    return k * max(1.0, math.log2(max(k, 2))) * QUICK_S


@cache
def merge_count(k1: int, k2: int, cut: int) -> int:
    if k1 < k2:
        k1, k2 = k2, k1
    if k2 < cut:
        return 1
    h = k1 // 2
    s = k2 // 2
    return merge_count(h, s, cut) + merge_count(k1 - h, k2 - s, cut) + 2


@cache
def sort_count(k: int, qcut: int, mcut: int) -> int:
    if k < qcut:
        return 1
    q = k // 4
    parts = (
        4 * sort_count(q, qcut, mcut)
        if k % 4 == 0
        else sum(sort_count(x, qcut, mcut) for x in (q, q, q, k - 3 * q))
    )
    merges = merge_count(q, q, mcut) + merge_count(q, k - 3 * q, mcut)
    return parts + merges + merge_count(2 * q, k - 2 * q, mcut) + 3


def coarsening(n: int, qcut: int, mcut: int) -> int:
    """Smallest power-of-two factor on both cutoffs that fits the task budget."""
    g = 1
    while sort_count(n, qcut * g, mcut * g) > TASK_BUDGET:
        g *= 2
    return g


def build(rec: Recorder, p: dict, variant: str, rng: np.random.Generator) -> dict:
    n = p["n"]
    g = coarsening(n, p["sort_cutoff"], p["merge_cutoff"])
    qcut, mcut = p["sort_cutoff"] * g, p["merge_cutoff"] * g

    def merge(k1: int, k2: int, preds: tuple[int, ...]) -> int:
        if k1 < k2:
            k1, k2 = k2, k1
        if k2 < mcut:
            return rec.add("merge_leaf", (k1 + k2) * MERGE_S, BETA_MERGE, preds)
        h, s = k1 // 2, k2 // 2
        split = rec.add("merge_split", math.log2(k2) * SEARCH_S, BETA_SPLIT, preds)
        a = merge(h, s, (split,))
        b = merge(k1 - h, k2 - s, (split,))
        return rec.add("merge_join", SMALL_S / 4, BETA_SPLIT, (split, a, b))

    def cilksort(k: int, preds: tuple[int, ...]) -> int:
        if k < qcut:
            beta = BETA_QUICK_L2 if k <= L2_ELEMS else BETA_QUICK_DRAM
            return rec.add("quick_leaf", quick_s(k), beta, preds)
        q = k // 4
        s = rec.add("spawn", SMALL_S, BETA_SPLIT, preds)
        kids = [cilksort(x, (s,)) for x in (q, q, q, k - 3 * q)]
        j1 = rec.add("join", SMALL_S / 4, BETA_SPLIT, (s, *kids))
        m1 = merge(q, q, (j1,))
        m2 = merge(q, k - 3 * q, (j1,))
        j2 = rec.add("join", SMALL_S / 4, BETA_SPLIT, (j1, m1, m2))
        return merge(2 * q, k - 2 * q, (j2,))

    cilksort(n, ())
    return {"coarsening": g, "sort_cutoff_eff": qcut, "merge_cutoff_eff": mcut}
