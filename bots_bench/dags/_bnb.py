"""Branch-and-bound / backtracking trees: nqueens and knapsack (and floorplan's task part).

A search space is a vectorised state machine: a state is a dict of equally long numpy arrays,
``n_children(s)`` says how many child calls every state spawns (0 for a terminal state), and
``child(s, k)`` builds the ``k``-th child of every state. BOTS spawns one task per child call
down to its depth cutoff (also for calls that are pruned at once); below the cutoff a task
runs the rest of the search serially. The part above the cutoff is enumerated exactly; the
size of every serial subtree is estimated with Knuth's random-probe estimator (Knuth 1975,
"Estimating the efficiency of backtrack programs"): along a random root-to-leaf path with
branching degrees d1, d2, ... the unbiased estimate of the node count is 1 + d1 + d1*d2 + ....
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

State = dict[str, np.ndarray]


@dataclass(frozen=True)
class Space:
    root: Callable[[], State]
    n_children: Callable[[State], np.ndarray]
    child: Callable[[State, np.ndarray], State]
    #: work of each state in node units (default 1): what the serial search spends on it
    cost: Callable[[State], np.ndarray] | None = None

    def work(self, s: State) -> np.ndarray:
        return np.ones(size(s)) if self.cost is None else self.cost(s).astype(np.float64)


def take(s: State, idx: np.ndarray) -> State:
    return {k: v[idx] for k, v in s.items()}


def size(s: State) -> int:
    return len(next(iter(s.values())))


def expand_all(space: Space, s: State) -> tuple[np.ndarray, State, np.ndarray]:
    """All children of all states: (parent index, child states, n_children of each parent)."""
    counts = space.n_children(s)
    parent = np.repeat(np.arange(size(s)), counts)
    first = np.cumsum(counts) - counts
    k = np.arange(parent.size) - first[parent]
    return parent, space.child(take(s, parent), k), counts


@dataclass
class Levels:
    """The exact tree above the cutoff, level by level."""

    states: list[State]  # states[d]: every call at depth d
    parent: list[np.ndarray]  # parent[d][i]: index at depth d-1 (empty for the root)
    is_open: list[np.ndarray]  # the call spawns children


def extend(space: Space, lv: Levels) -> Levels:
    """``lv`` with one more level: the children of every open call of its last level."""
    open_idx = np.flatnonzero(lv.is_open[-1])
    par, kids, _ = expand_all(space, take(lv.states[-1], open_idx))
    return Levels(
        [*lv.states, kids], [*lv.parent, open_idx[par]], [*lv.is_open, space.n_children(kids) > 0]
    )


def top_tree(space: Space, depth: int) -> Levels:
    root = space.root()
    lv = Levels([root], [np.zeros(0, np.int64)], [space.n_children(root) > 0])
    for _ in range(depth):
        lv = extend(space, lv)
    return lv


def task_count(lv: Levels) -> int:
    """Tasks of the DAG built from ``lv``: root, every child call, one join per inner call."""
    inner = sum(int(o.sum()) for o in lv.is_open[:-1])
    return 1 + sum(size(s) for s in lv.states[1:]) + inner


def deepest_cutoff(space: Space, cutoff: int, budget: int) -> Levels:
    """Exact tree for the largest depth <= ``cutoff`` whose DAG stays within ``budget`` tasks.

    This is how the model coarsens: a shallower task cutoff lumps more of the search into the
    serial leaves, exactly what BOTS's ``-x`` cutoff does.
    """
    lv = top_tree(space, 0)
    for _ in range(cutoff):
        nxt = extend(space, lv)
        if task_count(nxt) > budget:
            break
        lv = nxt
        if not lv.is_open[-1].any():
            break
    return lv


def knuth_sizes(
    space: Space, s: State, rng: np.random.Generator, frontier: int = 20_000, probes: int = 1 << 15
) -> np.ndarray:
    """Estimated total ``space.work`` of the subtree below every state in ``s`` (itself included).

    Levels are enumerated exactly while the frontier stays below ``frontier`` states; the
    frontier states are then probed (about ``probes`` random paths in all). Exact levels cut
    the estimator's variance, which is otherwise large for subtrees many levels deep.
    """
    n = size(s)
    exact = space.work(s)
    owner = np.arange(n)
    cur = s
    while True:
        counts = space.n_children(cur)
        total = int(counts.sum())
        if total == 0 or total > frontier:
            break
        par, cur, _ = expand_all(space, cur)
        owner = owner[par]
        exact += np.bincount(owner, space.work(cur), minlength=n)
    m = size(cur)
    if m == 0 or not (space.n_children(cur) > 0).any():
        return exact
    k = int(np.clip(probes // m, 2, 64))
    below = _probe(space, cur, k, rng) - space.work(cur)
    return exact + np.bincount(owner, below, minlength=n)


def _probe(space: Space, s: State, k: int, rng: np.random.Generator) -> np.ndarray:
    """Knuth's estimate for every state in ``s``, averaged over ``k`` random paths each."""
    n = size(s)
    cur = take(s, np.repeat(np.arange(n), k))
    est = space.work(cur)
    weight = np.ones(n * k)
    live = np.arange(n * k)
    while live.size:
        counts = space.n_children(cur)
        go = counts > 0
        live, counts = live[go], counts[go]
        if not live.size:
            break
        cur = take(cur, np.flatnonzero(go))
        weight[live] *= counts
        pick = np.minimum((rng.random(live.size) * counts).astype(np.int64), counts - 1)
        cur = space.child(cur, pick)
        est[live] += weight[live] * space.work(cur)
    return est.reshape(n, k).mean(axis=1)


def emit(
    rec, lv: Levels, leaf_nodes: np.ndarray, node_s: float, join_s: float, beta: float
) -> dict:
    """Append the task tree of ``lv`` to ``rec`` (spawn -> child calls -> join per open call).

    ``leaf_nodes[i]`` is the work (in node units) of the serial search run by the i-th open call
    of the last level. Returns counts per role for the DAG's meta.
    """
    depth = len(lv.states) - 1
    ids: list[np.ndarray] = []
    for d in range(depth + 1):
        n = size(lv.states[d])
        opn = lv.is_open[d]
        out = np.empty(n, np.int64)
        leaf_i = 0
        for i in range(n):
            preds = (int(ids[d - 1][lv.parent[d][i]]),) if d else ()
            if opn[i] and d < depth:
                out[i] = rec.add("spawn", node_s, beta, preds)
            elif opn[i]:
                out[i] = rec.add("leaf", float(leaf_nodes[leaf_i]) * node_s, beta, preds)
                leaf_i += 1
            else:
                out[i] = rec.add("pruned", node_s, beta, preds)
        ids.append(out)
    end = [a.copy() for a in ids]  # the task that finishes each call (its join if it has one)
    for d in range(depth - 1, -1, -1):
        kids_of = _group(lv.parent[d + 1], size(lv.states[d]))
        for i in np.flatnonzero(lv.is_open[d]):
            preds = (int(ids[d][i]), *(int(end[d + 1][c]) for c in kids_of[i]))
            end[d][i] = rec.add("join", join_s, beta, preds)
    return {
        "depth": depth,
        "calls_per_level": [size(s) for s in lv.states],
        "leaves": int(lv.is_open[depth].sum()),
        "serial_nodes": float(np.sum(leaf_nodes)),
    }


def _group(parent: np.ndarray, n: int) -> list[np.ndarray]:
    order = np.argsort(parent, kind="stable")
    bounds = np.searchsorted(parent[order], np.arange(n + 1))
    return [order[bounds[i] : bounds[i + 1]] for i in range(n)]
