"""fib: binary recursion, two tasks and a ``taskwait`` per call (BOTS manual cutoff).

``fib(n, d)`` returns at once for n < 2; for depth d below the cutoff it spawns fib(n-1) and
fib(n-2) as tasks and joins them; at the cutoff it computes fib(n) serially, which costs
2 F(n+1) - 1 calls.
"""

from __future__ import annotations

from functools import cache

import numpy as np

from ._graph import TASK_BUDGET, Recorder

DESCRIPTION = (
    "binary recursion: spawn node -> fib(n-1), fib(n-2) tasks -> join (taskwait); tasks to the "
    "depth cutoff, serial fib below it"
)
#: BOTS config/classes/fib: test 35, t40 40 (x10), medium 50 (x10), large 53 (x20). BOTS's
#: current ``small`` is 10 (x5), a sub-millisecond debugging size below ``test``; the model's
#: ``small`` is BOTS's ``t40`` class, which is also what HiDVFS's 0.82 s corresponds to.
CLASSES = {
    "test": {"n": 35, "cutoff": 10},
    "small": {"n": 40, "cutoff": 10},
    "medium": {"n": 50, "cutoff": 10},
    "large": {"n": 53, "cutoff": 20},
}
VARIANTS = ("omp-tasks",)
#: Register/stack-only recursion: essentially no memory stalls.
BETA = 0.02
#: One fib call (compare, two calls, add), seconds at f_ref.
CALL_S = 2.5e-9


def calls(n: int) -> int:
    """Calls made by the serial fib(n): 2 F(n+1) - 1."""
    a, b = 0, 1
    for _ in range(n + 1):
        a, b = b, a + b
    return 2 * a - 1


@cache
def count(n: int, depth: int, cutoff: int) -> tuple[int, int]:
    """(tasks, leaves) of the task tree of fib(n) entered at ``depth``."""
    if n < 2 or depth >= cutoff:
        return 1, 1
    t1, l1 = count(n - 1, depth + 1, cutoff)
    t2, l2 = count(n - 2, depth + 1, cutoff)
    return t1 + t2 + 2, l1 + l2


def effective_cutoff(n: int, cutoff: int) -> int:
    """Deepest cutoff <= the class cutoff whose tree fits the task budget."""
    while cutoff > 1 and count(n, 0, cutoff)[0] > TASK_BUDGET:
        cutoff -= 1
    return cutoff


def build(rec: Recorder, p: dict, variant: str, rng: np.random.Generator) -> dict:
    n, cutoff = p["n"], effective_cutoff(p["n"], p["cutoff"])

    def node(m: int, depth: int, preds: tuple[int, ...]) -> int:
        """Add the subtree of fib(m); return the task that finishes it."""
        if m < 2:
            return rec.add("leaf", CALL_S, BETA, preds)
        if depth >= cutoff:
            return rec.add("leaf", calls(m) * CALL_S, BETA, preds)
        s = rec.add("spawn", CALL_S, BETA, preds)
        a = node(m - 1, depth + 1, (s,))
        b = node(m - 2, depth + 1, (s,))
        return rec.add("join", CALL_S, BETA, (s, a, b))

    node(n, 0, ())
    tasks, leaves = count(n, 0, cutoff)
    return {"effective_cutoff": cutoff, "leaves": leaves, "calls": calls(n)}
