"""uts: Unbalanced Tree Search on a binomial tree, one task per child plus a ``taskwait``.

In a binomial UTS tree the root has b0 children and every other node has m children with
probability q (else none); BOTS's classes sit at q*m ~ 1, giving 4 M to 10 G nodes thousands of
levels deep. The model keeps m, halves b0 and lowers q so that q*m = RHO, which gives a tree of
about 1 + b0/2 / (1 - RHO) nodes drawn from the run's seed, and spreads the class's true node
count (listed in its input file) evenly over the model's nodes: every model node stands for a
chunk of UTS nodes.
"""

from __future__ import annotations

import numpy as np

from ._graph import TASK_BUDGET, Recorder

DESCRIPTION = (
    "binomial tree from a seeded RNG (m kept, b0 and q scaled): spawn node -> a task per child "
    "-> join (taskwait); the class's real node count is spread over the model nodes"
)
#: BOTS inputs/uts/*.input: root branching b0, non-leaf probability q, children m, tree size.
CLASSES = {
    "test": {"b0": 2000, "q": 0.124875, "m": 8, "nodes": 4_112_897},  # T3
    "small": {"b0": 2000, "q": 0.200014, "m": 5, "nodes": 111_345_631},  # T3L
    "medium": {"b0": 2000, "q": 0.333344, "m": 3, "nodes": 1_606_963_542},
    "large": {"b0": 2000, "q": 0.499999995, "m": 2, "nodes": 10_612_052_303},
}
VARIANTS = ("omp-tasks",)
#: SHA-1 of the child state on the stack; task descriptors come from the allocator.
BETA = 0.05
#: One UTS node: SHA-1 child state, child count draw, task create/dispatch, seconds at f_ref.
NODE_S = 0.45e-6
JOIN_S = 20e-9
#: q*m of the scaled tree (subcritical, so its size concentrates around its mean).
RHO = 0.75
#: Model nodes never exceed this; the tree is cut (frontier becomes leaves) if it would.
MAX_NODES = TASK_BUDGET * 2 // 3


def binomial_tree(
    b0: int, q: float, m: int, rng: np.random.Generator
) -> tuple[list[np.ndarray], bool]:
    """Child counts level by level (``levels[d][i]``: children of node i at depth d), and
    whether the tree was cut at ``MAX_NODES``."""
    levels = [np.array([b0])]
    total = 1 + b0
    width = b0
    while width:
        kids = np.where(rng.random(width) < q, m, 0)
        if total + int(kids.sum()) > MAX_NODES:
            levels.append(np.zeros(width, np.int64))  # the frontier stays leaves
            return levels, True
        levels.append(kids)
        total += int(kids.sum())
        width = int(kids.sum())
    return levels, False


def build(rec: Recorder, p: dict, variant: str, rng: np.random.Generator) -> dict:
    m = p["m"]
    levels, cut = binomial_tree(p["b0"] // 2, RHO / m, m, rng)
    n_model = int(sum(lv.size for lv in levels))
    chunk = p["nodes"] / n_model
    node_s = chunk * NODE_S
    ids: list[np.ndarray] = []
    for d, kids in enumerate(levels):
        out = np.empty(kids.size, np.int64)
        parents = np.repeat(ids[-1], levels[d - 1]) if d else np.zeros(0, np.int64)
        for i, k in enumerate(kids.tolist()):
            preds = (int(parents[i]),) if d else ()
            out[i] = rec.add("spawn" if k else "leaf", node_s, BETA, preds)
        ids.append(out)
    end = [a.copy() for a in ids]
    for d in range(len(levels) - 2, -1, -1):
        first = np.cumsum(levels[d]) - levels[d]
        for i in np.flatnonzero(levels[d]):
            kids = end[d + 1][first[i] : first[i] + levels[d][i]]
            end[d][i] = rec.add("join", JOIN_S, BETA, (int(ids[d][i]), *kids.tolist()))
    return {
        "model_nodes": n_model,
        "uts_nodes_per_model_node": chunk,
        "depth": len(levels) - 1,
        "cut": cut,
    }
