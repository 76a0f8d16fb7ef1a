"""alignment: all-pairs protein alignment, one independent task per pair (i < j).

Each task aligns two sequences with the linear-space dynamic programme (forward pass, reverse
pass and the divide-and-conquer trace), about three sweeps over an l_i x l_j matrix; there
are no edges between pair tasks. The sequence lengths are drawn once per class from a
log-normal fitted to the BOTS protein files (median ~450 residues, 60..2500), not read from
them (the inputs are not redistributed).
"""

from __future__ import annotations

import numpy as np

from ._graph import Recorder

DESCRIPTION = (
    "flat bag of n(n-1)/2 independent pair-alignment tasks (work ~ l_i * l_j) between a "
    "generator root and a sink"
)
#: BOTS config/classes/alignment: test/small prot.20.aa (20 sequences), medium prot.100.aa.
#: The model's ``small`` is the 100-sequence input: HiDVFS's 3.31 s matches 4950 pairs at a
#: bare-metal cell cost, and ``test`` must stay well below ``small``.
CLASSES = {
    "test": {"sequences": 20},
    "small": {"sequences": 100},
}
#: ``single``: one task creates every pair task; ``for``: a dynamic worksharing loop over i,
#: each iteration creating the tasks of its row.
VARIANTS = ("single", "for")
#: Two DP rows per sweep live in L1: compute-bound.
BETA = 0.08
#: One DP cell update (affine gaps) of one sweep, seconds at f_ref; sweeps per pair.
CELL_S, SWEEPS = 4.0e-9, 3
CREATE_S = 0.3e-6


def lengths(count: int) -> np.ndarray:
    rng = np.random.default_rng([count, 0xA1])
    return np.clip(np.round(rng.lognormal(np.log(450.0), 0.55, count)), 60, 2500)


def build(rec: Recorder, p: dict, variant: str, rng: np.random.Generator) -> dict:
    n = p["sequences"]
    ln = lengths(n)
    pairs = n * (n - 1) // 2
    root = rec.add("root", CREATE_S * (pairs if variant == "single" else n), 0.0)
    tasks = []
    for i in range(n):
        src = root
        if variant == "for" and i < n - 1:
            src = rec.add("gen", CREATE_S * (n - 1 - i), 0.0, (root,))
        for j in range(i + 1, n):
            tasks.append(rec.add("pair", SWEEPS * ln[i] * ln[j] * CELL_S, BETA, (src,)))
    rec.add("sink", 0.1e-6, 0.0, tuple(tasks))
    return {"pairs": pairs, "mean_length": float(ln.mean())}
