"""concom: connected components by a task-parallel DFS on a random graph.

The graph is built like BOTS builds it: L times, two random end nodes are drawn and linked
unless they are the same node, are already neighbours, or one of them has the maximum number
of neighbours. A driver loop then walks the nodes in order; at each unvisited node it starts a
component with a task and waits for it. The task marks its node visited and spawns one task per
neighbour, then waits; a neighbour task whose node is already visited returns at once. So each
component is a tree of visit tasks (plus immediate-return tasks on the other edges), and the
components run one after another.

The model keeps the mean degree and the generation rule on a graph of at most MODEL_NODES
nodes and lets every model task stand for n / n_model real ones. Who visits a node first is a
race in BOTS; the model explores each component breadth first (the task queue runs tasks
roughly in creation order).
"""

from __future__ import annotations

import numpy as np

from ._graph import Recorder

DESCRIPTION = (
    "serial driver over components; per component a BFS-ordered tree of visit tasks, one task "
    "per neighbour (immediate return if visited), taskwait joins; random graph per seed"
)
#: BOTS has no class file for concom: ``test`` is the smoke size (bots.md 2.1), ``small`` the
#: default (-n 100000 -l 100000 -m 20), medium/large the sizes HiDVFS's runner accepts.
CLASSES = {
    "test": {"nodes": 1_000, "links": 1_000, "max_neighbours": 20},
    "small": {"nodes": 100_000, "links": 100_000, "max_neighbours": 20},
    "medium": {"nodes": 1_000_000, "links": 1_000_000, "max_neighbours": 20},
    "large": {"nodes": 5_000_000, "links": 5_000_000, "max_neighbours": 20},
}
VARIANTS = ("omp-tasks",)
#: Neighbour arrays are malloc'ed per node and visited in random order; every visit takes a
#: critical section on shared counters: latency-bound.
BETA = 0.45
#: Real costs at f_ref: a visit (critical section + neighbour loop + task creation), an
#: immediate-return neighbour task, one driver-loop step over a node.
VISIT_S, SEEN_S, SCAN_S = 0.6e-6, 0.3e-6, 5e-9
MODEL_NODES = 2500


def random_graph(n: int, links: int, max_deg: int, rng: np.random.Generator) -> list[list[int]]:
    nbrs: list[list[int]] = [[] for _ in range(n)]
    sets: list[set[int]] = [set() for _ in range(n)]
    ends = (rng.random((links, 2)) * (n - 1)).astype(np.int64)
    for a, b in ends.tolist():
        if a == b or len(nbrs[a]) >= max_deg or len(nbrs[b]) >= max_deg or b in sets[a]:
            continue
        nbrs[a].append(b)
        nbrs[b].append(a)
        sets[a].add(b)
        sets[b].add(a)
    return nbrs


def build(rec: Recorder, p: dict, variant: str, rng: np.random.Generator) -> dict:
    n = min(p["nodes"], MODEL_NODES)
    k = p["nodes"] / n  # real tasks per model task
    links = round(p["links"] * n / p["nodes"])
    nbrs = random_graph(n, links, p["max_neighbours"], rng)
    visited = np.zeros(n, bool)
    prev: tuple[int, ...] = ()
    last = -1
    components = 0
    for start in range(n):
        if visited[start]:
            continue
        drv = rec.add("driver", (start - last) * SCAN_S * k, BETA, prev)
        last = start
        components += 1
        # breadth-first tree of visit tasks; remember each visit's children to add joins
        visited[start] = True
        ids = {start: rec.add("visit", VISIT_S * k, BETA, (drv,))}
        order = [start]
        kids: dict[int, list[int]] = {}
        for v in order:  # grows while iterating: BFS
            ends = []
            for w in nbrs[v]:
                if visited[w]:
                    ends.append(rec.add("seen", SEEN_S * k, BETA, (ids[v],)))
                else:
                    visited[w] = True
                    ids[w] = rec.add("visit", VISIT_S * k, BETA, (ids[v],))
                    order.append(w)
                    ends.append(-1 - w)  # placeholder: the child's end task
            kids[v] = ends
        end: dict[int, int] = {}
        for v in reversed(order):
            if not kids[v]:
                end[v] = ids[v]
                continue
            preds = [e if e >= 0 else end[-1 - e] for e in kids[v]]
            end[v] = rec.add("join", SEEN_S * k / 4, BETA, (ids[v], *preds))
        prev = (end[start],)
    rec.add("driver", (n - 1 - last) * SCAN_S * k, BETA, prev)
    return {
        "model_nodes": n,
        "real_per_model_task": k,
        "links": links,
        "edges": sum(len(a) for a in nbrs) // 2,
        "components": components,
    }
