"""sparselu: blocked sparse LU factorisation, a phase-barriered wavefront.

For every diagonal step kk the generator factors the diagonal block (``lu0``), spawns a
``fwd`` task for every present block right of it in row kk and a ``bdiv`` task for every
present block below it in column kk, waits, then spawns a ``bmod`` task for every pair
(present (ii,kk), present (kk,jj)), creating block (ii,jj) if it was empty (fill-in), and
waits again.

Initial sparsity, as BOTS generates it: the diagonal and the two blocks next to it are always
present. Any other block is absent when its row or its column index is odd; of the remaining
even-even blocks, one above the diagonal is present only when its row index is a multiple of
3, and one below the diagonal only when its column index is a multiple of 3. So the matrix is
a tridiagonal band plus a sparse lattice of even rows/columns every sixth index, which fills in
as the factorisation proceeds.
"""

from __future__ import annotations

import numpy as np

from ._graph import TASK_BUDGET, Recorder

DESCRIPTION = (
    "per diagonal step: lu0 -> fwd (row) + bdiv (column) tasks -> barrier -> bmod tasks on the "
    "trailing sub-matrix (with fill-in) -> barrier; BOTS's banded-lattice sparsity"
)
#: BOTS config classes (``-n`` blocks per dimension, ``-m`` block size).
CLASSES = {
    "test": {"blocks": 25, "bs": 25},
    "small": {"blocks": 25, "bs": 100},
    "medium": {"blocks": 75, "bs": 100},
    "large": {"blocks": 100, "bs": 100},
}
#: ``single``: one generator task creates every task; ``for``: rows are generated in a
#: worksharing loop, so task creation is spread over row-generator tasks.
VARIANTS = ("single", "for")
#: Float blocks of bs^2 (40 KB at bs=100) are walked with a column stride: L2-bound loops.
BETA = {"lu0": 0.2, "fwd": 0.35, "bdiv": 0.3, "bmod": 0.35, "alloc": 0.8}
#: One multiply-add of the naive block kernels, seconds at f_ref; zeroing a float.
FMA_S, ZERO_S = 0.6e-9, 0.5e-9
#: Multiply-adds per block operation, in units of bs^3.
FLOPS = {"lu0": 1 / 3, "fwd": 1 / 2, "bdiv": 1 / 2, "bmod": 1.0}
BARRIER_S = 0.5e-6
CREATE_S = 0.3e-6  # creating one task (in the generator)


def initial_pattern(nb: int) -> np.ndarray:
    """Present blocks of the generated matrix (True = allocated)."""
    i = np.arange(nb)[:, None]
    j = np.arange(nb)[None, :]
    absent = ((i < j) & (i % 3 != 0)) | ((i > j) & (j % 3 != 0)) | (i % 2 == 1) | (j % 2 == 1)
    band = np.abs(i - j) <= 1
    return band | ~absent


def phases(nb: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per step kk: (rows ii > kk with block (ii,kk), columns jj > kk with block (kk,jj))."""
    present = initial_pattern(nb)
    out = []
    for kk in range(nb):
        rows = kk + 1 + np.flatnonzero(present[kk + 1 :, kk])
        cols = kk + 1 + np.flatnonzero(present[kk, kk + 1 :])
        out.append((rows, cols))
        present[np.ix_(rows, cols)] = True
    return out


def build(rec: Recorder, p: dict, variant: str, rng: np.random.Generator) -> dict:
    nb, bs = p["blocks"], p["bs"]
    op_s = {k: f * bs**3 * FMA_S for k, f in FLOPS.items()}
    steps = phases(nb)
    tasks = sum(1 + len(r) + len(c) + len(r) * len(c) + 2 for r, c in steps)
    # Over budget, the bmods of one row are lumped into one task (a block costs ~0.6 ms, a
    # task's overhead ~1 us, so lumping changes the work by < 0.2 %).
    lump = tasks > TASK_BUDGET
    present = initial_pattern(nb)
    prev: tuple[int, ...] = ()
    bmod_tasks = 0
    for rows, cols in steps:
        fb = len(rows) + len(cols)
        gen = CREATE_S * fb if variant == "single" else 0.0
        lu = rec.add("lu0", op_s["lu0"] + gen, BETA["lu0"], prev)
        first = [rec.add("fwd", op_s["fwd"], BETA["fwd"], (lu,)) for _ in cols]
        first += [rec.add("bdiv", op_s["bdiv"], BETA["bdiv"], (lu,)) for _ in rows]
        b1 = rec.add("barrier", BARRIER_S, 0.0, (lu, *first))
        mods = []
        for ii in rows.tolist():
            fill = int((~present[ii, cols]).sum())
            alloc_s = fill * bs * bs * ZERO_S
            src = b1
            if variant == "for":
                src = rec.add("gen", CREATE_S * len(cols), 0.0, (b1,))
            if lump:
                secs = len(cols) * op_s["bmod"] + alloc_s
                beta = (len(cols) * op_s["bmod"] * BETA["bmod"] + alloc_s * BETA["alloc"]) / secs
                mods.append(rec.add("bmod", secs, beta, (src,)))
                bmod_tasks += 1
            else:
                for jj in cols.tolist():
                    new = not present[ii, jj]
                    secs = op_s["bmod"] + (bs * bs * ZERO_S if new else 0.0)
                    mods.append(rec.add("bmod", secs, BETA["bmod"], (src,)))
                    bmod_tasks += 1
            present[ii, cols] = True
        gen2 = CREATE_S * len(rows) * len(cols) if variant == "single" else 0.0
        prev = (rec.add("barrier", BARRIER_S + gen2, 0.0, (b1, *mods)),)
    return {
        "bmod_per_step": [len(r) * len(c) for r, c in steps],
        "bmod_lumped_by_row": lump,
        "bmod_tasks": bmod_tasks,
        "initial_blocks": int(initial_pattern(nb).sum()),
    }
