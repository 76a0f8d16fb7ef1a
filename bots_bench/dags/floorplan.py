"""floorplan: branch and bound placing N cells, one task per candidate placement.

``add_cell(l)`` creates a task per candidate placement of cell l (each of its 1-4 shapes at
each position adjacent to the cell it must touch); the task lays the cell down, and if it fits
and the footprint area is still below the best, recurses on the next cell; a ``taskwait``
closes the call. Below the task cutoff the search is serial.

Whether a placement fits depends on geometry the model does not replay (BOTS's input files
are not redistributed, and re-running the search in Python is far too slow). The model is a
branch-and-bound tree with the real fan-out and an explicit pruning law:

* candidates per call K_l = shapes_l * positions_l, drawn once per class (shapes 1..4;
  positions 1 when the cell sits in a corner (15 %), else 4..16: the rows or columns of the
  neighbour it slides along, as in BOTS's inputs);
* each candidate survives (fits, and its footprint stays below the best area) with
  probability p_l = P_FIRST * exp(-(l - 1) / TAU), falling as the board fills: the tree widens
  over the first cells and the bound cuts it over the last ones;
* the first cell always fits; in the task part of the tree each level keeps its expected
  number of survivors (rounded), placed at random among its candidates;
* a serial subtree below the cutoff costs its expected size times log-normal noise
  (sigma 1, B&B subtrees are heavy-tailed).
"""

from __future__ import annotations

import numpy as np

from . import _bnb
from ._graph import TASK_BUDGET, Recorder

DESCRIPTION = (
    "branch and bound: a task per candidate placement (shapes x adjacent positions) of the next "
    "cell, a surviving candidate recurses, taskwait join; tasks to the depth cutoff, serial "
    "subtrees below it; fan-out and pruning law parametric (see CALIBRATION.md)"
)
#: BOTS config classes: input.N (N cells). The default (omp-tasks) build has no cutoff, so the
#: task part goes as deep as the task budget allows (the manual build's -x default is 5).
CLASSES = {
    "test": {"cells": 5, "cutoff": 5},
    "small": {"cells": 15, "cutoff": 15},
    "medium": {"cells": 20, "cutoff": 20},
}
VARIANTS = ("omp-tasks",)
#: Every task copies the 4 KB board and the cell table (memcpy through L1/L2).
BETA = 0.10
#: One candidate: board copy, lay-down, footprint, seconds at f_ref.
CANDIDATE_S = 0.4e-6
#: Survival probability of a candidate of the first cell, and its decay length in cells.
P_FIRST, TAU = 0.6, 5.0
LEAF_SIGMA = 1.0


def candidates(cells: int) -> np.ndarray:
    """K_l for l = 1..cells (index 0 unused), fixed per class like an input file."""
    rng = np.random.default_rng([cells, 0xF1])
    shapes = rng.choice([1, 2, 3, 4], size=cells + 1, p=[0.3, 0.3, 0.25, 0.15])
    corner = rng.random(cells + 1) < 0.15
    positions = np.where(corner, 1, rng.integers(4, 17, cells + 1))
    k = shapes * positions
    k[:2] = (0, 1)  # cell 1 is pinned to the origin
    return k


def survival(cells: int) -> np.ndarray:
    """p_l = P_FIRST * exp(-(l - 1) / TAU): each placed cell makes overlaps and a footprint
    above the best more likely."""
    level = np.arange(cells + 1)
    p = np.where(level >= 1, P_FIRST * np.exp(-(level - 1) / TAU), 0.0)
    p[1] = 1.0  # the first cell goes onto an empty board
    return p


def expected_subtree(cells: int) -> np.ndarray:
    """W[l]: expected candidate tasks below an open call that has placed cells 1..l."""
    k, p = candidates(cells), survival(cells)
    w = np.zeros(cells + 1)
    for level in range(cells - 1, -1, -1):
        nxt = level + 1
        below = w[nxt] if nxt < cells else 0.0
        w[level] = k[nxt] * (1.0 + p[nxt] * below)
    return w


def top_tree(cells: int, cutoff: int, budget: int, rng: np.random.Generator) -> _bnb.Levels:
    """Sampled tree of calls down to the deepest cutoff that fits the budget."""
    k, p = candidates(cells), survival(cells)
    root = {"level": np.zeros(1, np.int64)}
    lv = _bnb.Levels([root], [np.zeros(0, np.int64)], [np.ones(1, bool)])
    for depth in range(1, min(cutoff, cells) + 1):
        open_idx = np.flatnonzero(lv.is_open[-1])
        parent = np.repeat(open_idx, k[depth])
        # survivors of a level at their expected count, placed at random among the candidates
        alive = np.zeros(parent.size, bool)
        if depth < cells:
            alive[rng.permutation(parent.size)[: int(round(parent.size * p[depth]))]] = True
        nxt = _bnb.Levels(
            [*lv.states, {"level": np.full(parent.size, depth)}],
            [*lv.parent, parent],
            [*lv.is_open, alive],
        )
        if _bnb.task_count(nxt) > budget:
            break
        lv = nxt
        if not alive.any():
            break
    return lv


def build(rec: Recorder, p: dict, variant: str, rng: np.random.Generator) -> dict:
    cells = p["cells"]
    inst_rng = np.random.default_rng([cells, p["cutoff"], 0xF2])  # fixed input: fixed tree
    lv = top_tree(cells, p["cutoff"], TASK_BUDGET, inst_rng)
    depth = len(lv.states) - 1
    n_leaves = int(lv.is_open[-1].sum())
    noise = inst_rng.lognormal(-0.5 * LEAF_SIGMA**2, LEAF_SIGMA, n_leaves)
    sizes = 1.0 + expected_subtree(cells)[depth] * noise
    info = _bnb.emit(rec, lv, sizes, CANDIDATE_S, CANDIDATE_S / 4, BETA)
    info.update(effective_cutoff=info.pop("depth"), candidates=candidates(cells)[1:].tolist())
    return info
