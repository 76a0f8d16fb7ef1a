"""knapsack: 0/1 branch and bound, one task for "skip item" and one for "take item" per call.

A call with remaining capacity c and value v ends at once when c < 0, when no item or capacity
is left, or when its bound v + c * value/weight of the current item (items sorted by ratio)
is below the best value; otherwise it spawns the skip and take calls and joins them with a
``taskwait``. Below the task cutoff the search is serial.

BOTS's input files are not redistributed; the model draws an instance of the same kind
(values 5..24, weight = 2 * value - 2..+3, capacity 84 % of the total weight, as in
knapsack-036.input) from a class-fixed seed. The best value is fixed at the optimum (exact
dynamic programme), i.e. the tree of a search that found the optimum early; BOTS's own search
improves its incumbent only as calls return and visits more nodes, which the calibration
scale absorbs.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from . import _bnb
from ._graph import TASK_BUDGET, Recorder

DESCRIPTION = (
    "binary take/skip branch and bound with a ratio bound: spawn 2 tasks + taskwait join per "
    "open call, immediate-return tasks for pruned/infeasible calls; tasks to the depth cutoff, "
    "serial search below (subtree sizes by Knuth probes) on a BOTS-like strongly correlated "
    "instance"
)
#: BOTS config classes: knapsack-0NN.input with NN items; default manual cutoff 24 (capped).
CLASSES = {
    "test": {"items": 16, "cutoff": 24},
    "small": {"items": 36, "cutoff": 24},
    "medium": {"items": 40, "cutoff": 24},
    "large": {"items": 44, "cutoff": 24},
}
VARIANTS = ("omp-tasks",)
#: Item array (< 1 KB) and the call frames stay in L1.
BETA = 0.05
#: One call: bound, two branches, max; seconds at f_ref.
CALL_S = 15e-9
#: Candidate instances per class; the one with the median tree size represents the class.
CANDIDATES = 7


def instance(items: int, k: int) -> tuple[np.ndarray, np.ndarray, int]:
    rng = np.random.default_rng([items, k, 0x4B])
    v = rng.integers(5, 25, items)
    w = 2 * v + rng.integers(-2, 4, items)
    order = np.argsort(-(v / w), kind="stable")
    return v[order], w[order], int(0.84 * w.sum())


def optimum(v: np.ndarray, w: np.ndarray, cap: int) -> int:
    best = np.zeros(cap + 1, np.int64)
    for vi, wi in zip(v.tolist(), w.tolist(), strict=True):
        if wi <= cap:
            best[wi:] = np.maximum(best[wi:], best[:-wi] + vi)
    return int(best[cap])


def space(v: np.ndarray, w: np.ndarray, cap: int, best: int) -> _bnb.Space:
    n = len(v)

    def root() -> _bnb.State:
        return {
            "i": np.zeros(1, np.int64),
            "c": np.full(1, cap, np.int64),
            "v": np.zeros(1, np.int64),
        }

    def n_children(s: _bnb.State) -> np.ndarray:
        i, c = s["i"], s["c"]
        j = np.minimum(i, n - 1)
        bound = s["v"] + np.maximum(c, 0) * v[j] // w[j]
        return np.where((c > 0) & (i < n) & (bound >= best), 2, 0)

    def child(s: _bnb.State, k: np.ndarray) -> _bnb.State:
        j = np.minimum(s["i"], n - 1)
        return {"i": s["i"] + 1, "c": s["c"] - k * w[j], "v": s["v"] + k * v[j]}

    return _bnb.Space(root, n_children, child)


@lru_cache(maxsize=8)
def representative(items: int) -> tuple[np.ndarray, np.ndarray, int, int]:
    """The candidate instance whose estimated tree size is the median (B&B sizes vary 100x)."""
    found = []
    for k in range(CANDIDATES):
        v, w, cap = instance(items, k)
        best = optimum(v, w, cap)
        sp = space(v, w, cap, best)
        est = _bnb.knuth_sizes(
            sp, sp.root(), np.random.default_rng([items, k]), frontier=4096, probes=8192
        )[0]
        found.append((est, k, v, w, cap, best))
    found.sort(key=lambda t: t[0])
    _, _, v, w, cap, best = found[len(found) // 2]
    return v, w, cap, best


def build(rec: Recorder, p: dict, variant: str, rng: np.random.Generator) -> dict:
    v, w, cap, best = representative(p["items"])
    sp = space(v, w, cap, best)
    lv = _bnb.deepest_cutoff(sp, p["cutoff"], TASK_BUDGET)
    leaves = _bnb.take(lv.states[-1], np.flatnonzero(lv.is_open[-1]))
    probe_rng = np.random.default_rng([p["items"], len(lv.states) - 1, 0x4B])
    sizes = _bnb.knuth_sizes(sp, leaves, probe_rng)
    info = _bnb.emit(rec, lv, sizes, CALL_S, CALL_S, BETA)
    info.update(effective_cutoff=info.pop("depth"), capacity=cap, best_value=best)
    return info
