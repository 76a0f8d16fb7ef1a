"""DAG models of the 12 BOTS kernels, for the simulator and for training.

``generate(kernel, cls)`` returns a ``platforms.dag.DAG`` whose tasks follow the kernel's real
OpenMP task structure (spawn -> children -> taskwait join, phase barriers, flat bags), with
compute cycles on the TX2 reference core plus frequency-independent memory time. Sizes are
capped by coarsening the leaves (what BOTS cutoffs do); the calibration against the public TX2
makespans is in ``calibration.py`` and CALIBRATION.md. The same (kernel, class, seed, variant)
always gives the same DAG.
"""

from __future__ import annotations

import importlib
from types import ModuleType

import numpy as np

from platforms.dag import DAG
from platforms.errors import HidvfsError

from . import calibration
from ._graph import F_REF_HZ, MAX_TASKS, Recorder, graham_estimate, serial_dag

KERNELS: tuple[str, ...] = (
    "alignment",
    "concom",
    "fft",
    "fib",
    "floorplan",
    "health",
    "knapsack",
    "nqueens",
    "sort",
    "sparselu",
    "strassen",
    "uts",
)
#: Variants every kernel accepts besides its own: the default task version and the serial one.
COMMON_VARIANTS = ("omp-tasks", "serial")

__all__ = [
    "CLASSES",
    "F_REF_HZ",
    "KERNELS",
    "MAX_TASKS",
    "UnknownDagModel",
    "describe",
    "estimate_makespan",
    "generate",
    "model_variant",
    "modelled_builds",
    "variants",
]


class UnknownDagModel(HidvfsError, ValueError):
    """An unknown kernel, class or variant was asked for; the message lists the known ones."""


def _load(kernel: str) -> ModuleType:
    if kernel not in KERNELS:
        raise UnknownDagModel(f"unknown kernel {kernel!r}; known: {', '.join(KERNELS)}")
    return importlib.import_module(f"{__name__}.{kernel}")


CLASSES: dict[str, tuple[str, ...]] = {k: tuple(_load(k).CLASSES) for k in KERNELS}


def class_params(kernel: str) -> dict[str, dict]:
    """The model parameters of each class of ``kernel`` (``{}`` for an unknown kernel)."""
    if kernel not in KERNELS:
        return {}
    return {cls: dict(p) for cls, p in _load(kernel).CLASSES.items()}


def variants(kernel: str) -> tuple[str, ...]:
    """Accepted variants of ``kernel``, its default first."""
    own = _load(kernel).VARIANTS
    return own + tuple(v for v in COMMON_VARIANTS if v not in own)


def modelled_builds(kernel: str) -> tuple[str, ...]:
    """The BOTS build variants (``bots_bench.registry`` names) of ``kernel`` that a model
    stands for: ``omp-tasks``, ``<sub>-omp-tasks`` for the kernels built in two versions,
    and ``serial``. The tied, cut-off (``-manual``, ``-if_clause``, ``-final``) builds have
    none: their scheduling and task counts differ from the default build's."""
    own = tuple(v for v in _load(kernel).VARIANTS if v not in COMMON_VARIANTS)
    return ("omp-tasks", *(f"{v}-omp-tasks" for v in own), "serial")


def model_variant(kernel: str, build: str) -> str | None:
    """The ``variant`` of :func:`generate` that models the BOTS build ``build`` of ``kernel``
    (``for-omp-tasks`` -> ``for``; ``omp-tasks`` -> None, the default task version); raises
    :class:`UnknownDagModel` naming :func:`modelled_builds` for a build without a model."""
    if build == "omp-tasks":
        return None
    if build == "serial":
        return "serial"
    head, _, tail = build.partition("-")
    if tail == "omp-tasks" and head in _load(kernel).VARIANTS and head not in COMMON_VARIANTS:
        return head
    raise UnknownDagModel(
        f"no DAG model of the {build!r} build of {kernel}; modelled builds: "
        f"{', '.join(modelled_builds(kernel))}"
    )


def generate(kernel: str, cls: str = "small", *, seed: int = 0, variant: str | None = None) -> DAG:
    """The task DAG of one run of ``kernel`` on input class ``cls``.

    ``seed`` drives the per-task duration noise and, for the kernels whose input is random
    (uts tree, concom graph), the input itself. ``variant``: ``None`` or ``"omp-tasks"`` for
    the kernel's default task version, ``"serial"`` for one task with all the work, or a
    kernel-specific one (alignment and sparselu: ``"single"``, ``"for"``).
    """
    mod = _load(kernel)
    if cls not in mod.CLASSES:
        raise UnknownDagModel(
            f"unknown class {cls!r} for kernel {kernel!r}; known: {', '.join(mod.CLASSES)}"
        )
    known = variants(kernel)
    if variant is not None and variant not in known:
        raise UnknownDagModel(
            f"unknown variant {variant!r} for kernel {kernel!r}; known: {', '.join(known)}"
        )
    if seed < 0:
        raise UnknownDagModel(f"seed must be a non-negative integer, got {seed}")
    chosen = variant or mod.VARIANTS[0]
    task_variant = mod.VARIANTS[0] if chosen in COMMON_VARIANTS else chosen
    struct_seq, jitter_seq = np.random.SeedSequence([seed, KERNELS.index(kernel)]).spawn(2)
    rec = Recorder(f"{kernel}.{cls}")
    params = dict(mod.CLASSES[cls])
    info = mod.build(rec, params, task_variant, np.random.default_rng(struct_seq))
    meta = {
        "kernel": kernel,
        "class": cls,
        "seed": seed,
        "variant": chosen,
        "params": params,
        "model": info,
        "scale": calibration.SCALE[kernel],
        "f_ref_hz": F_REF_HZ,
    }
    dag = rec.build(
        scale=calibration.SCALE[kernel], rng=np.random.default_rng(jitter_seq), meta=meta
    )
    return serial_dag(dag) if chosen == "serial" else dag


def estimate_makespan(
    dag: DAG, cores: int = 5, f_hz: float = F_REF_HZ, capacity: float = 1.0
) -> float:
    """Graham-like estimate ``L + (C - L) / cores`` at one operating point (seconds)."""
    return graham_estimate(dag, cores, f_hz, capacity)


def describe(kernel: str) -> str:
    """One paragraph: the modelled task structure, classes, memory fraction and target."""
    mod = _load(kernel)
    classes = "; ".join(
        f"{c}: " + ", ".join(f"{k}={v}" for k, v in p.items()) for c, p in mod.CLASSES.items()
    )
    dag = generate(kernel, "small")
    t = dag.task_time(F_REF_HZ)
    beta = float(dag.mem_s.sum() / t.sum())
    return (
        f"{kernel}: {mod.DESCRIPTION}. Classes: {classes}. Variants: {', '.join(variants(kernel))}. "
        f"Memory-bound fraction of 'small' at {F_REF_HZ / 1e6:.1f} MHz: {beta:.2f}. Target of "
        f"'small' on 5 A57 cores at f_max: {calibration.TARGET_S[kernel]:.2f} s "
        f"({calibration.TARGET_SOURCE[kernel]})."
    )
