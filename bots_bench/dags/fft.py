"""fft: recursive Cooley-Tukey (Cilk-style) over n complex doubles.

First the twiddle table W is filled by a binary split of [0, n/2] into tasks (its parallel
region ends with a barrier). ``fft_aux(n)`` then picks a radix r (BOTS's rule: 8 for
n in {64..4096 listed}, else 16 if 16 | n, then 8, 4, 2, else the smallest prime), runs the
*unshuffle* stage as a binary split of [0, n/r) into tasks, waits, spawns the r sub-FFTs of
size n/r, waits, and runs the *twiddle* stage (r-point butterflies) as another binary split,
and waits. Sizes <= 32 are hard-coded base cases. BOTS's stage ``taskwait`` only waits for the
stage's first task; the model joins the whole stage, which is what the result requires.
"""

from __future__ import annotations

import math
from functools import cache

import numpy as np

from ._graph import TASK_BUDGET, Recorder, mix_beta

DESCRIPTION = (
    "twiddle-table split tree + barrier, then recursive radix-r (16/8) DFT: unshuffle split tree "
    "-> join -> r sub-FFT tasks -> join -> twiddle split tree -> join; serial sub-FFTs and stage "
    "chunks at the (coarsened) granularity"
)
#: BOTS config/classes/fft: n. ``test`` is the 1 Mi-point smoke size (bots.md 2.1): BOTS's
#: 8 Mi test would take ~1 s at the calibrated cost, against the < 0.5 s a test must take.
CLASSES = {
    "test": {"n": 1 << 20},
    "small": {"n": 33_554_432},
    "medium": {"n": 134_217_728},
    "large": {"n": 268_435_456},
}
VARIANTS = ("omp-tasks",)
BETA_W = 0.05  # cos/sin per entry: compute
BETA_UNSHUFFLE = 0.7  # strided copy of 16-byte complexes: memory
BETA_TWIDDLE = 0.45  # butterflies over elements m apart: strided loads
BETA_LEAF_CACHED = 0.25  # a sub-FFT that fits the 2 MB L2
L2_POINTS = (2 << 20) // 16
#: Seconds at f_ref: one W entry (cos + sin), one element copied, one element-level of butterfly.
W_S, UNSHUFFLE_S, BUTTERFLY_S = 60e-9, 3.0e-9, 2.5e-9
BASE_CASE = 32
SPLIT_S = 0.1e-6


def factor(n: int) -> int:
    if n < 2:
        return 1
    if n in (64, 128, 256, 1024, 2048, 4096):
        return 8
    for r in (16, 8, 4, 2):
        if n % r == 0:
            return r
    r = 3
    while r * r <= n and n % r:
        r += 2
    return r if n % r == 0 else n


@cache
def serial_parts(n: int) -> tuple[float, float]:
    """(unshuffle seconds, butterfly seconds) of a serial fft_aux of size n."""
    if n <= BASE_CASE:
        return 0.0, n * math.log2(max(n, 2)) * BUTTERFLY_S
    r = factor(n)
    if r == n:  # prime size: O(n^2) generic twiddle
        return 0.0, n * n * BUTTERFLY_S
    m = n // r
    ush, bfly = serial_parts(m)
    return n * UNSHUFFLE_S + r * ush, r * bfly + n * math.log2(r) * BUTTERFLY_S


def leaf_beta(n: int) -> float:
    ush, bfly = serial_parts(n)
    if n <= L2_POINTS:
        return BETA_LEAF_CACHED
    return mix_beta([(ush, BETA_UNSHUFFLE), (bfly, BETA_TWIDDLE)])


def split_tasks(items: int, chunk: int) -> int:
    leaves = max(1, math.ceil(items / chunk))
    return 2 * leaves - 1


@cache
def aux_count(n: int, grain: int) -> int:
    if n <= max(grain, BASE_CASE):
        return 1
    r = factor(n)
    m = n // r
    return 1 + 2 * (split_tasks(m, grain // r or 1) + 1) + 1 + r * aux_count(m, grain)


def count(n: int, grain: int) -> int:
    return split_tasks(n // 2, grain) + 1 + aux_count(n, grain)


def granularity(n: int) -> int:
    """Smallest power-of-two grain (>= 128 points, BOTS's chunk) that fits the task budget."""
    g = 128
    while count(n, g) > TASK_BUDGET:
        g *= 2
    return g


def build(rec: Recorder, p: dict, variant: str, rng: np.random.Generator) -> dict:
    n = p["n"]
    grain = granularity(n)

    def split(
        lo: int,
        hi: int,
        chunk: int,
        per_item_s: float,
        beta: float,
        role: str,
        preds: tuple[int, ...],
        leaves: list[int],
    ) -> None:
        """Binary task split of [lo, hi) down to ``chunk`` items; leaves go to ``leaves``."""
        if hi - lo <= chunk:
            leaves.append(rec.add(role, (hi - lo) * per_item_s, beta, preds))
            return
        s = rec.add("split", SPLIT_S, beta, preds)
        mid = (lo + hi) // 2
        split(lo, mid, chunk, per_item_s, beta, role, (s,), leaves)
        split(mid, hi, chunk, per_item_s, beta, role, (s,), leaves)

    def stage(
        items: int, chunk: int, per_item_s: float, beta: float, role: str, preds: tuple[int, ...]
    ) -> int:
        leaves: list[int] = []
        split(0, items, max(chunk, 1), per_item_s, beta, role, preds, leaves)
        return rec.add("join", SPLIT_S, beta, (*preds, *leaves))

    def aux(m: int, preds: tuple[int, ...]) -> int:
        if m <= max(grain, BASE_CASE):
            return rec.add("fft_leaf", sum(serial_parts(m)), leaf_beta(m), preds)
        r = factor(m)
        sub = m // r
        a = rec.add("spawn", SPLIT_S, BETA_TWIDDLE, preds)
        # unshuffle moves r elements per index of [0, sub); twiddle does r-point butterflies
        u = stage(sub, grain // r, r * UNSHUFFLE_S, BETA_UNSHUFFLE, "unshuffle", (a,))
        kids = [aux(sub, (u,)) for _ in range(r)]
        k = rec.add("join", SPLIT_S, BETA_TWIDDLE, (u, *kids))
        return stage(sub, grain // r, r * math.log2(r) * BUTTERFLY_S, BETA_TWIDDLE, "twiddle", (k,))

    w = stage(n // 2, grain, W_S, BETA_W, "w_coeff", ())
    aux(n, (w,))
    return {"grain_points": grain, "radix": factor(n)}
