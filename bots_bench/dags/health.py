"""health: the Colombian health-care simulation over a tree of villages (Olden).

Villages form a complete tree: ``levels`` deep, ``cities`` children each, with
2^level * ratio patients per village. Every simulation step walks the tree recursively: a
village spawns a task per child village (while its distance from the root is below the
cutoff), meanwhile updates its own hospital lists (``pre``), waits for its children, then
takes the patients they pass up and walks its whole population (``post``). Deeper villages are
simulated serially inside their ancestor's task. Step k+1 starts when step k has finished.
"""

from __future__ import annotations

import math

import numpy as np

from ._graph import TASK_BUDGET, Recorder

DESCRIPTION = (
    "iterative x recursive: per step a village tree walk (pre -> a task per child village -> "
    "post after taskwait), serial below the depth cutoff; step k+1 after step k"
)
#: BOTS inputs/health/*.input (levels, cities per village, population ratio, steps); the
#: manual depth cutoff defaults to 2.
CLASSES = {
    "test": {"levels": 3, "cities": 18, "ratio": 10, "steps": 365, "cutoff": 2},
    "small": {"levels": 4, "cities": 18, "ratio": 10, "steps": 365, "cutoff": 2},
    "medium": {"levels": 4, "cities": 36, "ratio": 10, "steps": 365, "cutoff": 2},
    "large": {"levels": 5, "cities": 24, "ratio": 10, "steps": 365, "cutoff": 2},
}
VARIANTS = ("omp-tasks",)
#: Linked lists of malloc'ed patients (MBs, scattered): pointer chasing from DRAM.
BETA = 0.55
#: One patient visited in one step (list walk + random draw), seconds at f_ref; the hospital
#: lists walked before the taskwait are a fraction of the population.
PATIENT_S = 60e-9
PRE_FRACTION = 0.15


def subtree_patients(level: int, p: dict) -> float:
    """Patients in a village at ``level`` and all villages below it."""
    return sum(p["cities"] ** k * 2 ** (level - k) * p["ratio"] for k in range(level))


def tasks_per_step(p: dict) -> int:
    def count(level: int) -> int:
        if level <= 1 or p["levels"] - level >= p["cutoff"]:
            return 1
        return 2 + p["cities"] * count(level - 1)

    return count(p["levels"])


def build(rec: Recorder, p: dict, variant: str, rng: np.random.Generator) -> dict:
    top, cities, cutoff = p["levels"], p["cities"], p["cutoff"]
    per_step = tasks_per_step(p)
    # Over budget, k consecutive steps share one tree walk of the DAG (k x the work).
    k = max(1, math.ceil(p["steps"] * per_step / TASK_BUDGET))
    groups = [k] * (p["steps"] // k) + ([p["steps"] % k] if p["steps"] % k else [])

    def village(level: int, steps: int, preds: tuple[int, ...]) -> int:
        own = 2**level * p["ratio"] * PATIENT_S * steps
        if level <= 1 or top - level >= cutoff:
            return rec.add(
                "leaf",
                subtree_patients(level, p) * PATIENT_S * steps * (1 + PRE_FRACTION),
                BETA,
                preds,
            )
        pre = rec.add("pre", own * PRE_FRACTION, BETA, preds)
        kids = [village(level - 1, steps, (pre,)) for _ in range(cities)]
        return rec.add("post", own, BETA, (pre, *kids))

    prev: tuple[int, ...] = ()
    for steps in groups:
        prev = (village(top, steps, prev),)
    return {"steps_per_walk": k, "walks": len(groups), "tasks_per_walk": per_step}
