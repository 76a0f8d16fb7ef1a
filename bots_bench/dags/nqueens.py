"""nqueens: backtracking with one task per column candidate of every row (BOTS manual cutoff).

A call at row j with a valid partial placement spawns n tasks, one per column; each task checks
the placement (``ok``) and, if valid, recurses on row j+1; a ``taskwait`` then sums the
per-column solution counts. Calls at the depth cutoff run the rest of the search serially.
Queens are bitmasks (columns and both diagonals), so a whole level expands in numpy.
"""

from __future__ import annotations

import numpy as np

from . import _bnb
from ._graph import TASK_BUDGET, Recorder

DESCRIPTION = (
    "backtracking over rows: spawn n column tasks per valid partial placement (invalid ones end "
    "after the check), taskwait join; tasks to the depth cutoff, serial search below it "
    "(subtree sizes by Knuth probes)"
)
#: BOTS config/classes/nqueens (n, manual cutoff; the default cutoff is 3).
CLASSES = {
    "test": {"n": 10, "cutoff": 5},
    "small": {"n": 13, "cutoff": 3},
    "medium": {"n": 14, "cutoff": 8},
    "large": {"n": 15, "cutoff": 3},
    "huge": {"n": 16, "cutoff": 3},
}
VARIANTS = ("omp-tasks",)
#: Board and diagonals live in registers/L1; a few bytes copied per task.
BETA = 0.03
#: One candidate check (``ok`` scans the placed queens) plus the call, seconds at f_ref.
CHECK_S = 12e-9


def space(n: int) -> _bnb.Space:
    """Task-level calls: every column candidate is a call (invalid ones end after the check)."""
    full = (1 << n) - 1

    def root() -> _bnb.State:
        z = np.zeros(1, np.int64)
        return {"cols": z, "d1": z.copy(), "d2": z.copy(), "row": z.copy(), "ok": np.ones(1, bool)}

    def n_children(s: _bnb.State) -> np.ndarray:
        return np.where(s["ok"] & (s["row"] < n), n, 0)

    def child(s: _bnb.State, k: np.ndarray) -> _bnb.State:
        bit = np.left_shift(1, k)
        free = ~(s["cols"] | s["d1"] | s["d2"]) & full
        return {
            "cols": s["cols"] | bit,
            "d1": ((s["d1"] | bit) << 1) & full,
            "d2": (s["d2"] | bit) >> 1,
            "row": s["row"] + 1,
            "ok": (free & bit) != 0,
        }

    return _bnb.Space(root, n_children, child)


def valid_space(n: int) -> _bnb.Space:
    """The serial search's valid placements; a node's work is its n candidate checks."""
    full = (1 << n) - 1
    base = space(n)

    def free(s: _bnb.State) -> np.ndarray:
        return ~(s["cols"] | s["d1"] | s["d2"]) & full

    def n_children(s: _bnb.State) -> np.ndarray:
        return np.where(s["row"] < n, _popcount(free(s)), 0)

    def child(s: _bnb.State, k: np.ndarray) -> _bnb.State:
        f = free(s)
        seen = np.zeros_like(k)
        col = np.zeros_like(k)
        for b in range(n):
            has = (f >> b) & 1
            col = np.where((has == 1) & (seen == k), b, col)
            seen += has
        return base.child(s, col)

    def cost(s: _bnb.State) -> np.ndarray:
        return np.where(s["row"] < n, n, 1)

    return _bnb.Space(base.root, n_children, child, cost)


def _popcount(x: np.ndarray) -> np.ndarray:
    x = x - ((x >> 1) & 0x5555)
    x = (x & 0x3333) + ((x >> 2) & 0x3333)
    x = (x + (x >> 4)) & 0x0F0F
    return (x + (x >> 8)) & 0x1F


def build(rec: Recorder, p: dict, variant: str, rng: np.random.Generator) -> dict:
    n = p["n"]
    sp = space(n)
    lv = _bnb.deepest_cutoff(sp, p["cutoff"], TASK_BUDGET)
    leaves = _bnb.take(lv.states[-1], np.flatnonzero(lv.is_open[-1]))
    # The input is fixed, so the probes use a class-fixed stream, not the run seed.
    probe_rng = np.random.default_rng([n, len(lv.states) - 1, 0x51])
    sizes = _bnb.knuth_sizes(valid_space(n), leaves, probe_rng)
    info = _bnb.emit(rec, lv, sizes, CHECK_S, CHECK_S, BETA)
    info["effective_cutoff"] = info.pop("depth")
    return info
