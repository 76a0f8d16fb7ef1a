"""floorplan: branch and bound placing N cells (each with 1-4 alternative shapes) on a 64x64 grid.

``add_cell(id)`` creates one task per candidate placement of cell ``id``: per shape, the
positions adjacent to the cell it must sit right of and/or below (BOTS's ``starts``). The task
lays the cell down (ends if it overlaps), computes the bounding footprint and, if its area is
still below the best, recurses on the next cell; a ``taskwait`` closes the call. Below the task
cutoff the search runs serially.

BOTS's input files are not redistributed; the model draws a BOTS-like instance per class (the
same cell count; shapes are the factorisations of an area of 9..66, as in input.15; each cell
hangs right of or below one of the three previous cells, or in the corner right of the previous cell and below its upper neighbour) from a class-fixed seed. The best
area is fixed at the best footprint that random complete placements reach, i.e. the search
after its incumbent has settled.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from . import _bnb
from ._graph import TASK_BUDGET, Recorder

DESCRIPTION = (
    "branch and bound: a task per candidate placement (shape x adjacent position) of the next "
    "cell, overlap and area pruning, taskwait join; tasks to the depth cutoff, serial search "
    "below it (subtree sizes by Knuth probes) on a BOTS-like instance"
)
#: BOTS config classes: input.N (N cells); manual cutoff default 5.
CLASSES = {
    "test": {"cells": 5, "cutoff": 5},
    "small": {"cells": 15, "cutoff": 5},
    "medium": {"cells": 20, "cutoff": 5},
}
VARIANTS = ("omp-tasks",)
#: Every task copies the 4 KB board and the cell table (memcpy through L1/L2).
BETA = 0.10
#: One candidate: board copy, lay-down, footprint, seconds at f_ref.
CANDIDATE_S = 0.4e-6
GRID = 64


@lru_cache(maxsize=8)
def instance(cells: int) -> dict[str, np.ndarray]:
    """Shapes (rows, cols; padded with 0), and the left/above neighbour of every cell."""
    rng = np.random.default_rng([cells, 0xF1])
    shapes = np.zeros((cells + 1, 4, 2), np.int64)
    left = np.full(cells + 1, -1)
    above = np.full(cells + 1, -1)
    for c in range(1, cells + 1):
        while True:
            area = int(rng.integers(9, 67))
            pairs = [(h, area // h) for h in range(2, 23) if area % h == 0 and 2 <= area // h <= 22]
            if pairs:
                break
        pick = rng.permutation(len(pairs))[: min(4, len(pairs))]
        shapes[c, : len(pick)] = [pairs[i] for i in pick]
        if c == 1:
            left[c] = 0  # the dummy cell 0 pins cell 1 to the origin
            continue
        prev = int(rng.integers(max(1, c - 3), c))
        kind = rng.random()
        if kind < 0.2 and above[c - 1] >= 1:
            # right of the previous cell and below the cell that one hangs from
            left[c], above[c] = c - 1, above[c - 1]
        elif kind < 0.65:
            above[c] = prev
        else:
            left[c] = prev
    return {"shapes": shapes, "left": left, "above": above}


def _positions(inst, s: _bnb.State) -> np.ndarray:
    """Candidate count per (state, shape) for the cell placed next: int [states, 4]."""
    nxt = s["cell"] + 1
    rect = s["rect"]
    idx = np.arange(len(nxt))
    rows = inst["shapes"][nxt, :, 0]
    cols = inst["shapes"][nxt, :, 1]
    lf = inst["left"][nxt]
    ab = inst["above"][nxt]
    L = rect[idx, np.maximum(lf, 0)]  # top, bot, lhs, rhs of the left neighbour
    A = rect[idx, np.maximum(ab, 0)]
    both = (lf >= 0) & (ab >= 0)
    top_b = A[:, 1, None] + 1
    lhs_b = L[:, 3, None] + 1
    touch = (
        (top_b <= L[:, 1, None])
        & (top_b + rows >= L[:, 0, None])
        & (lhs_b <= A[:, 3, None])
        & (lhs_b + cols >= A[:, 2, None])
    )
    n_left = np.minimum(L[:, 1, None], GRID) - np.maximum(L[:, 0, None] - rows + 1, 0) + 1
    n_above = np.minimum(A[:, 3, None], GRID) - np.maximum(A[:, 2, None] - cols + 1, 0) + 1
    n = np.where(both[:, None], touch.astype(np.int64), np.where((lf >= 0)[:, None], n_left, n_above))
    return np.where(rows > 0, np.maximum(n, 0), 0)


def space(cells: int, best: int) -> _bnb.Space:
    inst = instance(cells)

    def root() -> _bnb.State:
        rect = np.zeros((1, cells + 1, 4), np.int64)
        rect[:, :, 2:] = -1  # unplaced: empty column span
        rect[:, :, 1] = -1
        rect[:, 0] = (0, 0, -1, -1)  # dummy cell 0
        return {"cell": np.zeros(1, np.int64), "rect": rect, "fp": np.zeros((1, 2), np.int64),
                "ok": np.ones(1, bool)}

    def n_children(s: _bnb.State) -> np.ndarray:
        live = s["ok"] & (s["cell"] < cells)
        counts = np.zeros(len(live), np.int64)
        if live.any():
            sub = _bnb.take(s, np.flatnonzero(live))
            counts[live] = _positions(inst, sub).sum(axis=1)
        return counts

    def child(s: _bnb.State, k: np.ndarray) -> _bnb.State:
        per = _positions(inst, s)
        cum = np.cumsum(per, axis=1)
        shape = (k[:, None] >= cum).sum(axis=1)
        j = k - np.take_along_axis(cum - per, shape[:, None], axis=1)[:, 0]
        c = s["cell"] + 1
        idx = np.arange(len(c))
        rows = inst["shapes"][c, shape, 0]
        cols = inst["shapes"][c, shape, 1]
        lf, ab = inst["left"][c], inst["above"][c]
        L = s["rect"][idx, np.maximum(lf, 0)]
        A = s["rect"][idx, np.maximum(ab, 0)]
        both = (lf >= 0) & (ab >= 0)
        top = np.where(both, A[:, 1] + 1, np.where(lf >= 0, np.maximum(L[:, 0] - rows + 1, 0) + j, A[:, 1] + 1))
        lhs = np.where(both, L[:, 3] + 1, np.where(lf >= 0, L[:, 3] + 1, np.maximum(A[:, 2] - cols + 1, 0) + j))
        bot, rhs = top + rows - 1, lhs + cols - 1
        r = s["rect"]
        overlap = (
            (r[:, 1:, 0] <= bot[:, None]) & (r[:, 1:, 1] >= top[:, None])
            & (r[:, 1:, 2] <= rhs[:, None]) & (r[:, 1:, 3] >= lhs[:, None])
        ).any(axis=1)
        fp = np.stack([np.maximum(s["fp"][:, 0], bot + 1), np.maximum(s["fp"][:, 1], rhs + 1)], 1)
        fits = ~overlap & (bot < GRID) & (rhs < GRID)
        rect = r.copy()
        rect[idx, c] = np.stack([top, bot, lhs, rhs], 1)
        return {"cell": c, "rect": rect, "fp": fp, "ok": fits & (fp[:, 0] * fp[:, 1] < best)}

    return _bnb.Space(root, n_children, child)


@lru_cache(maxsize=8)
def best_area(cells: int, beam: int = 512) -> int:
    """Incumbent area: a beam search keeping the ``beam`` smallest footprints per cell.

    BOTS's search tightens its best area quickly; a fixed near-optimal incumbent stands for
    that settled state.
    """
    sp = space(cells, GRID * GRID + 1)
    s = sp.root()
    best = GRID * GRID
    while _bnb.size(s):
        done = s["ok"] & (s["cell"] == cells)
        if done.any():
            best = min(best, int((s["fp"][done, 0] * s["fp"][done, 1]).min()))
        live = np.flatnonzero(sp.n_children(s) > 0)
        if not live.size:
            break
        _, s, _ = _bnb.expand_all(sp, _bnb.take(s, live))
        s = _bnb.take(s, np.flatnonzero(s["ok"]))
        area = s["fp"][:, 0] * s["fp"][:, 1]
        s = _bnb.take(s, np.argsort(area, kind="stable")[:beam])
    return best


def build(rec: Recorder, p: dict, variant: str, rng: np.random.Generator) -> dict:
    cells = p["cells"]
    best = best_area(cells)
    sp = space(cells, best)
    lv = _bnb.deepest_cutoff(sp, p["cutoff"], TASK_BUDGET)
    leaves = _bnb.take(lv.states[-1], np.flatnonzero(lv.is_open[-1]))
    probe_rng = np.random.default_rng([cells, len(lv.states) - 1, 0xF1])
    sizes = _bnb.knuth_sizes(sp, leaves, probe_rng)
    info = _bnb.emit(rec, lv, sizes, CANDIDATE_S, CANDIDATE_S / 4, BETA)
    info.update(effective_cutoff=info.pop("depth"), best_area=best)
    return info
