"""Fixtures of the bots_bench tests: a BOTS-like tree built from the project's own test kernels.

``bots_tree`` compiles ``tests/bots_bench/kernels/*.c`` (hidvfs code, not BOTS) once per session
with ``gcc -fopenmp -O2`` into ``<tmp>/bots/bin`` under BOTS binary names, and writes the uts
input files into ``<tmp>/bots/inputs/uts``. It skips when gcc (or its OpenMP runtime) is absent.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

KERNELS_DIR = Path(__file__).with_name("kernels")

#: binary name -> (source, extra compiler flags)
BUILDS = {
    "fib.gcc.omp-tasks": ("fib.c", ()),
    "fib.gcc.omp-tasks-manual": ("fib.c", ("-DMANUAL_CUTOFF",)),
    "sort.gcc.omp-tasks": ("sort.c", ()),
    "sparselu.gcc.single-omp-tasks": ("sparselu.c", ()),
    "sparselu.gcc.for-omp-tasks": ("sparselu.c", ("-DFOR_VERSION",)),
    "concom.gcc.omp-tasks": ("concom.c", ()),
    "uts.gcc.omp-tasks": ("uts.c", ()),
}
BUILD_DATE = "2024/05/01;12:00"
#: uts tree of the test class: b0 root children, m children with probability q
UTS_TEST = {"b0": 2000, "m": 4, "q": 0.24, "seed": 11}


@dataclass(frozen=True)
class BotsTree:
    root: Path
    bin: Path
    inputs: Path
    uts_test_nodes: int

    def binary(self, name: str) -> Path:
        return self.bin / name


def _compile_all(bin_dir: Path) -> None:
    procs = []
    for name, (src, flags) in BUILDS.items():
        argv = [
            "gcc",
            "-fopenmp",
            "-O2",
            f'-DBUILD_DATE="{BUILD_DATE}"',
            *flags,
            "-o",
            str(bin_dir / name),
            str(KERNELS_DIR / src),
            "-lm",
        ]
        procs.append((name, subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)))
    errors = []
    for name, p in procs:
        _, err = p.communicate(timeout=120)
        if p.returncode != 0:
            errors.append(f"{name}: {err.strip()}")
    if errors:
        raise RuntimeError("building the test kernels failed:\n" + "\n".join(errors))


def _openmp_works(tmp: Path) -> bool:
    src = tmp / "probe.c"
    src.write_text("#include <omp.h>\nint main(void){return omp_get_max_threads() > 0 ? 0 : 1;}\n")
    r = subprocess.run(
        ["gcc", "-fopenmp", "-o", str(tmp / "probe"), str(src)], capture_output=True, timeout=60
    )
    return r.returncode == 0


@pytest.fixture(scope="session")
def bots_tree(tmp_path_factory) -> BotsTree:
    if shutil.which("gcc") is None:
        pytest.skip("gcc not found: the BOTS test kernels cannot be built")
    root = tmp_path_factory.mktemp("bots")
    if not _openmp_works(root):
        pytest.skip("gcc cannot build OpenMP programs (libgomp missing?)")
    bin_dir = root / "bin"
    bin_dir.mkdir()
    _compile_all(bin_dir)
    uts_dir = root / "inputs" / "uts"
    uts_dir.mkdir(parents=True)
    params = "".join(f"{k} {v}\n" for k, v in UTS_TEST.items())
    (uts_dir / "tiny.input").write_text(params)  # no expected size: -c prints n/a
    # the tree is a pure function of the seed: count it once with one thread, then every
    # multi-threaded run with -c must find the same size
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.run(
        [
            str(bin_dir / "uts.gcc.omp-tasks"),
            "-f",
            str(uts_dir / "tiny.input"),
            "-v",
            "0",
            "-o",
            "4",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=True,
    ).stdout
    nodes = int(float(out.strip().split(";")[9]))
    (uts_dir / "test.input").write_text(params + f"nodes {nodes}\n")
    return BotsTree(root=root, bin=bin_dir, inputs=root / "inputs", uts_test_nodes=nodes)


@pytest.fixture
def board(tmp_path):
    """A native campaign's board on a fake TX2 tree (its snapshot given back at the end)."""
    from bots_bench.native import open_board
    from platforms.faketree import write_fake_tree
    from platforms.spec import load_board

    root = tmp_path / "tree"
    write_fake_tree(load_board("tx2"), root)
    nb = open_board(str(root), None, str(tmp_path / "state"), say=lambda m: None)
    yield nb
    nb.close()
