"""The 12 BOTS kernels: binary names, input classes, environment and the command line.

BOTS itself is GPL and is never vendored: the user builds it (``./configure --compiler gcc``
then a serial ``make``, plus ``make -C omp-tasks/knapsack`` and ``make -C omp-tasks/concom``,
which the top-level make leaves out) into a tree whose ``bin/`` holds binaries named
``<kernel>.<label>.[<sub>-]omp-tasks[-manual|-if_clause|-final][-tied]`` (and
``<kernel>.<label>.serial`` for the serial versions, ``make -C serial/<kernel>``) and whose
``inputs/`` holds the input files. This module only knows those names and the flags of each
input class (``config/classes/<kernel>`` of bsc-pm/bots and the HiDVFS run scripts), so the
runner can build an ``argv`` and an environment and check that the binary is there.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

DEFAULT_LABEL = "gcc"
DEFAULT_VARIANT = "omp-tasks"
#: the sequential build (``serial/<kernel>``): one thread, no cut-off, no ``for``/``single``
SERIAL_VARIANT = "serial"
#: BOTS flags every run gets: no progress chatter, abridged list output (bots.md section 8)
BASE_FLAGS = ("-v", "0", "-o", "3")

_VARIANT_RE = re.compile(r"^omp-tasks(?:-(?:manual|if_clause|final))?(?:-tied)?$")
#: the task variants _VARIANT_RE accepts, spelt out for a message
_TASK_VARIANTS = tuple(
    f"omp-tasks{cut}{tied}"
    for cut in ("", "-manual", "-if_clause", "-final")
    for tied in ("", "-tied")
)
#: a compiler label as the binaries are named with it (``./configure --compiler``)
_LABEL = r"[A-Za-z0-9_+-]+"
_BINARY_RE = re.compile(
    rf"^(?P<kernel>[a-z]+)\.(?P<label>{_LABEL}?)\."
    r"(?P<variant>(?:(?:for|single)-)?omp-tasks(?:-(?:manual|if_clause|final))?(?:-tied)?"
    r"|serial)$"
)
#: the kernels the top-level ``make`` of BOTS does not build (not in ``omp-tasks/Makefile``'s
#: DIRS, bots.md section 2): each is built in its own folder
_OWN_MAKE = ("knapsack", "concom")
#: the variables the OpenMP runtimes read (libgomp ``OMP_*``/``GOMP_*``, the LLVM and Intel
#: runtimes' ``KMP_*``): a run gets only those the campaign sets, never the caller's shell's
OPENMP_ENV_PREFIXES = ("OMP_", "GOMP_", "KMP_")


class RegistryError(ValueError):
    """Unknown kernel, class or variant, or a binary / input file that is not there."""


@dataclass(frozen=True)
class InputClass:
    """One input class of a kernel: its flags and, where it reads one, its input file.

    ``args`` may contain ``{input}``, replaced by the input file path under
    ``<inputs>/<kernel>/``. ``cutoff`` is passed as ``-x`` only to the cut-off builds
    (``-manual``, ``-if_clause``, ``-final``); the default builds reject ``-x``.
    """

    name: str
    args: tuple[str, ...]
    input_file: str | None = None
    cutoff: int | None = None
    #: OMP_STACKSIZE for the worker threads (None = libgomp default)
    stacksize: str | None = None
    #: the main thread's stack must be raised (``ulimit -s unlimited``) or the kernel segfaults
    unlimited_stack: bool = False


@dataclass(frozen=True)
class Kernel:
    name: str
    #: the exact ``Program =`` string(s) the binary prints (bots.md 5.3)
    programs: tuple[str, ...]
    classes: Mapping[str, InputClass]
    #: ``-c`` also runs the sequential version (BOTS_APP_CHECK_USES_SEQ_RESULT)
    check_runs_sequential: bool = False
    #: variant prefixes (``single``/``for``) for the kernels built in two versions
    subs: tuple[str, ...] = ()
    default_sub: str | None = None
    #: the kernel prints ``Nodes`` / ``Nodes/Sec`` (task count > 0)
    reports_nodes: bool = False
    #: the serial build's ``-c`` checks the result (the others print ``Verification = n/a``)
    serial_checks: bool = False
    notes: str = ""
    description: str = field(default="", compare=False)


def _cls(name, *args, input_file=None, cutoff=None, stacksize=None, unlimited_stack=False):
    return InputClass(name, tuple(args), input_file, cutoff, stacksize, unlimited_stack)


def _file_classes(flag: str, mapping: Mapping[str, str], stacks: Mapping[str, str] | None = None):
    stacks = stacks or {}
    return {
        c: _cls(c, flag, "{input}", input_file=f, stacksize=stacks.get(c))
        for c, f in mapping.items()
    }


_KERNELS: tuple[Kernel, ...] = (
    Kernel(
        "alignment",
        # the serial build prints no version
        (
            "Protein alignment (For version)",
            "Protein alignment (Single version)",
            "Protein alignment",
        ),
        _file_classes(
            "-f",
            {
                "smoke": "prot.20.aa",
                "test": "prot.20.aa",
                "small": "prot.20.aa",
                "medium": "prot.100.aa",
            },
        ),
        check_runs_sequential=True,
        subs=("single", "for"),
        default_sub="single",
        description="pairwise protein alignment, one untied task per pair",
    ),
    Kernel(
        "concom",
        ("Connected Components",),
        {
            "smoke": _cls("smoke", "-n", "1000"),
            # no class file upstream; sizes of the HiDVFS run script (bots.md section 9).
            # The stack sizes are generous guesses for the recursive DFS (verify on board).
            "test": _cls("test", "-n", "100000", stacksize="64M"),
            "small": _cls("small", "-n", "1000000", stacksize="512M", unlimited_stack=True),
            "medium": _cls("medium", "-n", "5000000", stacksize="1G", unlimited_stack=True),
        },
        check_runs_sequential=True,
        notes="always printf()s 'Graph N, Number of components M' in some builds",
        description="connected components by task-spawning DFS",
    ),
    Kernel(
        "fft",
        ("FFT",),
        {
            "smoke": _cls("smoke", "-n", "1048576"),
            "test": _cls("test", "-n", "8388608"),
            "small": _cls("small", "-n", "33554432"),
            "medium": _cls("medium", "-n", "134217728"),
            "large": _cls("large", "-n", "268435456"),
        },
        check_runs_sequential=True,
        description="recursive Cooley-Tukey FFT",
    ),
    Kernel(
        "fib",
        ("Fibonacci",),
        {
            "smoke": _cls("smoke", "-n", "25"),
            "test": _cls("test", "-n", "35"),
            "small": _cls("small", "-n", "10", cutoff=5),
            "t40": _cls("t40", "-n", "40", cutoff=10),
            "medium": _cls("medium", "-n", "50", cutoff=10, stacksize="16M"),
            "large": _cls("large", "-n", "53", cutoff=20, stacksize="16M"),
        },
        description="binary recursion, two tasks and a taskwait per call",
    ),
    Kernel(
        "floorplan",
        ("Floorplan",),
        _file_classes(
            "-f", {"smoke": "input.5", "test": "input.5", "small": "input.15", "medium": "input.20"}
        ),
        reports_nodes=True,
        serial_checks=True,
        description="branch and bound placement",
    ),
    Kernel(
        "health",
        ("Health",),
        _file_classes(
            "-f",
            {
                "smoke": "test.input",
                "test": "test.input",
                "small": "small.input",
                "medium": "medium.input",
                "large": "large.input",
            },
        ),
        serial_checks=True,
        description="tree of villages, a task per child at every step",
    ),
    Kernel(
        "knapsack",
        ("Knapsack",),
        _file_classes(
            "-f",
            {
                "smoke": "knapsack-016.input",
                "test": "knapsack-016.input",
                "small": "knapsack-036.input",
                "medium": "knapsack-040.input",
                "large": "knapsack-044.input",
            },
        ),
        check_runs_sequential=True,
        reports_nodes=True,
        notes="-c runs a much slower sequential search; its Speed-up is meaningless",
        description="0/1 knapsack branch-and-bound binary recursion",
    ),
    Kernel(
        "nqueens",
        ("N Queens",),
        {
            "smoke": _cls("smoke", "-n", "10"),
            "test": _cls("test", "-n", "10", cutoff=5),
            "small": _cls("small", "-n", "13"),
            "medium": _cls("medium", "-n", "14", cutoff=8),
            "large": _cls("large", "-n", "15"),
            "huge": _cls("huge", "-n", "16", stacksize="16M"),
        },
        serial_checks=True,
        description="backtracking, a task per column candidate",
    ),
    Kernel(
        "sort",
        ("Sort",),
        {
            "smoke": _cls("smoke", "-n", "1048576"),
            "test": _cls("test", "-n", "8388608"),
            "small": _cls("small", "-n", "33554432"),
            "medium": _cls("medium", "-n", "134217728"),
            "large": _cls("large", "-n", "536870912"),
        },
        serial_checks=True,
        description="cilksort: 4-way recursive split and task-parallel merges",
    ),
    Kernel(
        "sparselu",
        ("SparseLU (Single version)", "SparseLU (For version)", "SparseLU"),
        {
            "smoke": _cls("smoke", "-n", "10", "-m", "25"),
            "test": _cls("test", "-n", "25", "-m", "25"),
            "small": _cls("small", "-n", "25", "-m", "100"),
            "medium": _cls("medium", "-n", "75", "-m", "100"),
            "large": _cls("large", "-n", "100", "-m", "100"),
        },
        check_runs_sequential=True,
        subs=("single", "for"),
        default_sub="single",
        description="blocked sparse LU, a phase-barriered wavefront of tasks",
    ),
    Kernel(
        "strassen",
        ("Strassen",),
        {
            "smoke": _cls("smoke", "-n", "256"),
            "test": _cls("test", "-n", "512"),
            "small": _cls("small", "-n", "2048"),
            "medium": _cls("medium", "-n", "8192"),
        },
        check_runs_sequential=True,
        description="7-way recursive matrix multiplication",
    ),
    Kernel(
        "uts",
        ("Unbalance Tree Search",),
        _file_classes(
            "-f",
            {
                "smoke": "test.input",
                "tiny": "tiny.input",
                "test": "test.input",
                "small": "small.input",
                "medium": "medium.input",
                "large": "large.input",
                "huge": "huge.input",
            },
            # ompenv of config/classes/uts; tiny/smoke/huge extrapolated (verify on board)
            stacks={
                "smoke": "2M",
                "tiny": "2M",
                "test": "2M",
                "small": "16M",
                "medium": "55M",
                "large": "150M",
                "huge": "500M",
            },
        ),
        reports_nodes=True,
        serial_checks=True,
        notes="prints its 'completed!' without a trailing newline at -v 1",
        description="unbalanced tree search, a task per child",
    ),
)

KERNELS: dict[str, Kernel] = {k.name: k for k in _KERNELS}
KERNEL_NAMES: tuple[str, ...] = tuple(KERNELS)
#: kernels whose ``-c`` also runs the sequential version (and so inflates wall time)
CHECK_USES_SEQ_RESULT: tuple[str, ...] = tuple(k.name for k in _KERNELS if k.check_runs_sequential)
#: ``Program =`` string -> kernel name
PROGRAMS: dict[str, str] = {p: k.name for k in _KERNELS for p in k.programs}


class Command(NamedTuple):
    """What to launch: unpacks as ``argv, env``."""

    argv: list[str]
    env: dict[str, str]

    @property
    def check(self) -> bool:
        """``-c`` was given, so ``Verification`` must read ``successful``."""
        return "-c" in self.argv[1:]


def kernel(name: str) -> Kernel:
    try:
        return KERNELS[name]
    except KeyError:
        raise RegistryError(
            f"unknown BOTS kernel {name!r}; known kernels: {', '.join(KERNEL_NAMES)}"
        ) from None


def input_class(kernel_name: str, cls: str) -> InputClass:
    k = kernel(kernel_name)
    try:
        return k.classes[cls]
    except KeyError:
        raise RegistryError(
            f"kernel {kernel_name!r} has no input class {cls!r}; its classes: {', '.join(k.classes)}"
        ) from None


def kernel_for_program(program: str) -> str | None:
    """The kernel that prints ``Program = <program>``, or None for an unknown program."""
    return PROGRAMS.get(program)


def _split_variant(k: Kernel, variant: str) -> tuple[str | None, str]:
    if variant == SERIAL_VARIANT:  # serial/<kernel>: one build, without for/single
        return None, variant
    sub, rest = None, variant
    head, _, tail = variant.partition("-")
    if head in ("single", "for"):
        sub, rest = head, tail
    if not _VARIANT_RE.match(rest):
        raise RegistryError(
            f"bad BOTS variant {variant!r} for {k.name}: expected one of "
            + ", ".join(_TASK_VARIANTS)
            + (
                f" (each optionally prefixed by {' or '.join(s + '-' for s in k.subs)})"
                if k.subs
                else ""
            )
            + f", or {SERIAL_VARIANT}"
        )
    if sub is not None and not k.subs:
        raise RegistryError(f"kernel {k.name!r} has no {sub!r} version (variant {variant!r})")
    if k.subs and sub is None:
        sub = k.default_sub
    return sub, rest


def binary_name(
    kernel_name: str, variant: str = DEFAULT_VARIANT, label: str = DEFAULT_LABEL
) -> str:
    """``fib.gcc.omp-tasks``; ``sparselu.gcc.single-omp-tasks`` (default sub added);
    ``sparselu.gcc.serial``."""
    k = kernel(kernel_name)
    sub, rest = _split_variant(k, variant)
    return f"{k.name}.{label}.{sub + '-' if sub else ''}{rest}"


def check_label(label: object) -> str:
    """A compiler label :func:`find_binaries` can list a binary under: no ``.``, which would
    split the binary's name, nor ``@``, which joins it to a profile name (:func:`job_name`)."""
    if not (isinstance(label, str) and re.fullmatch(_LABEL, label)):
        raise RegistryError(
            f"bad compiler label {label!r}: expected letters, digits, _, + or - (e.g. gcc, clang)"
        )
    return label


def uses_cutoff_flag(variant: str) -> bool:
    """Only the cut-off builds accept ``-x`` (bots.md 4.2)."""
    return any(t in variant for t in ("-manual", "-if_clause", "-final"))


def find_binaries(
    bots_bin: str | os.PathLike[str], label: str | None = None
) -> dict[str, dict[str, Path]]:
    """Kernel -> {variant: path} for every executable BOTS binary in ``bots_bin``.

    Every known kernel is a key (an empty dict when none of its binaries is there), so a
    listing can show what is missing. ``label`` keeps only one compiler label (``gcc``).
    """
    out: dict[str, dict[str, Path]] = {name: {} for name in KERNEL_NAMES}
    for m, entry in _named_files(bots_bin, label):
        if os.access(entry, os.X_OK):
            _add_build(out[m["kernel"]], m, entry, label)
    return out


def find_unexecutable(
    bots_bin: str | os.PathLike[str], label: str | None = None
) -> dict[str, dict[str, Path]]:
    """Kernel -> {variant: path} for the BOTS binaries in ``bots_bin`` that are there but not
    executable (copied without their mode, say), which :func:`find_binaries` leaves out: a
    listing shows them as such, not as missing. A variant :func:`find_binaries` already
    names for another build gets its ``@LABEL`` here too."""
    found = find_binaries(bots_bin, label)
    out: dict[str, dict[str, Path]] = {name: {} for name in KERNEL_NAMES}
    for m, entry in _named_files(bots_bin, label):
        if not os.access(entry, os.X_OK):
            _add_build(out[m["kernel"]], m, entry, label, taken=found[m["kernel"]])
    return out


def _named_files(bots_bin: str | os.PathLike[str], label: str | None):
    """(name match, path) of each file in ``bots_bin`` named as a known kernel's binary (of
    compiler ``label`` when given), by name."""
    root = Path(bots_bin)
    if not root.is_dir():
        return
    for entry in sorted(root.iterdir()):
        m = _BINARY_RE.match(entry.name)
        if not m or m["kernel"] not in KERNELS:
            continue
        if label is not None and m["label"] != label:
            continue
        if entry.is_file():
            yield m, entry


def _add_build(builds: dict, m: re.Match, entry: Path, label: str | None, taken=()) -> None:
    """``builds[variant] = entry``; a second compiler's build of a variant (every label
    listed) is ``VARIANT@LABEL``."""
    variant = m["variant"]
    if label is None and (variant in builds or variant in taken):
        variant = f"{variant}@{m['label']}"
    builds[variant] = entry


def binary_path(
    kernel_name: str,
    bots_bin: str | os.PathLike[str],
    variant: str = DEFAULT_VARIANT,
    label: str = DEFAULT_LABEL,
) -> Path:
    """The binary's path; raises :class:`RegistryError` if it is missing or not executable."""
    name = binary_name(kernel_name, variant, label)
    path = Path(bots_bin) / name
    if not path.is_file():
        raise RegistryError(
            f"binary {name} not found under {bots_bin}; {build_hint(kernel_name, variant)}"
        )
    if not os.access(path, os.X_OK):
        raise RegistryError(f"binary {path} is not executable (chmod +x, or rebuild BOTS)")
    return path


def build_hint(kernel_name: str, variant: str = DEFAULT_VARIANT) -> str:
    """How to build a missing binary: the top-level ``make`` of BOTS builds neither the serial
    versions nor knapsack and concom (bots.md section 2)."""
    if variant == SERIAL_VARIANT:
        return f"build it in the BOTS tree with make -C serial/{kernel_name} (see README)"
    if kernel_name in _OWN_MAKE:
        return (
            f"the top-level make of BOTS does not build {kernel_name}: build it in the BOTS "
            f"tree with make -C omp-tasks/{kernel_name} (see README)"
        )
    return "build BOTS there (see README)"


def default_check(kernel_name: str, variant: str = DEFAULT_VARIANT) -> bool:
    """Ask for ``-c`` only where the check is cheap and the build can check.

    For the kernels in :data:`CHECK_USES_SEQ_RESULT` ``-c`` also runs the sequential version
    inside the same process, which would inflate the externally measured makespan; their
    verification is left to an explicit ``check=True`` run. A serial build gets ``-c`` only
    where its check is real (most print ``Verification = n/a``, which ``-c`` makes a failure).
    """
    k = kernel(kernel_name)
    if variant == SERIAL_VARIANT:
        return k.serial_checks
    return not k.check_runs_sequential


def needs_separate_check(kernel_name: str, variant: str = DEFAULT_VARIANT) -> bool:
    """Whether a run timed without ``-c`` by default is verified by a separate ``-c`` run:
    the omp-tasks builds of :data:`CHECK_USES_SEQ_RESULT` (a serial build is the sequential
    version, and those kernels' serial builds cannot check)."""
    return variant != SERIAL_VARIANT and kernel(kernel_name).check_runs_sequential


def is_openmp_var(name: str) -> bool:
    """An environment variable an OpenMP runtime reads (:data:`OPENMP_ENV_PREFIXES`)."""
    return name.startswith(OPENMP_ENV_PREFIXES)


def openmp_env(env: Mapping[str, str]) -> dict[str, str]:
    """The OpenMP runtime variables of ``env``, sorted by name (what a run record stores)."""
    return {k: env[k] for k in sorted(env) if is_openmp_var(k)}


def omp_env(kernel_name: str, cls: str, threads: int) -> dict[str, str]:
    """The ``OMP_*`` variables of a run (what the run record stores)."""
    if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
        raise RegistryError(f"threads must be a positive integer, got {threads!r}")
    ic = input_class(kernel_name, cls)
    env = {"OMP_NUM_THREADS": str(threads)}
    if ic.stacksize:
        env["OMP_STACKSIZE"] = ic.stacksize
    return env


def job_name(
    kernel_name: str, cls: str, variant: str = DEFAULT_VARIANT, label: str = DEFAULT_LABEL
) -> str:
    """The name a BOTS run registers under, and its reference profile is stored as:
    ``KERNEL.CLASS`` for the default build (``fib.small``), ``KERNEL.CLASS.VARIANT`` for any
    other variant (``fib.small.omp-tasks-manual``, ``fib.small.serial``), with ``@LABEL`` for
    a compiler label other than the default (``fib.small@clang``): another build is another
    binary, with another cost, so its deadline is planned from its own profile. A variant
    naming the kernel's default version (sparselu's ``single-omp-tasks``) is the default
    build, and ``single-`` is left out of the others' names (``omp-tasks-tied``)."""
    at = "" if check_label(label) == DEFAULT_LABEL else f"@{label}"
    name = f"{kernel_name}.{cls}"
    if variant == DEFAULT_VARIANT:
        return name + at
    k = kernel(kernel_name)
    sub, rest = _split_variant(k, variant)
    if sub is not None and sub != k.default_sub:
        rest = f"{sub}-{rest}"
    return (name if rest == DEFAULT_VARIANT else f"{name}.{rest}") + at


def command_for(
    kernel_name: str,
    cls: str,
    bots_bin: str | os.PathLike[str],
    threads: int,
    *,
    variant: str = DEFAULT_VARIANT,
    label: str = DEFAULT_LABEL,
    check: bool | None = None,
    inputs_dir: str | os.PathLike[str] | None = None,
    base_env: Mapping[str, str] | None = None,
    extra_args: tuple[str, ...] = (),
) -> Command:
    """``(argv, env)`` to run one kernel on one input class with ``threads`` OpenMP threads.

    ``argv`` ends with ``-v 0 -o 3`` (plus ``-c`` when ``check``; ``None`` means
    :func:`default_check`). Input files are looked up in ``inputs_dir`` (default: the
    ``inputs/`` folder beside ``bots_bin``), under ``<kernel>/``. ``env`` is ``base_env``
    (default ``os.environ``) without its OpenMP variables (``OMP_*``, ``GOMP_*``, ``KMP_*``:
    an ``OMP_THREAD_LIMIT`` or ``GOMP_SPINCOUNT`` left in the caller's shell would change
    the run unrecorded) and with those of :func:`omp_env` set, so
    ``openmp_env(env) == omp_env(...)``. A serial build ignores ``OMP_NUM_THREADS``.
    """
    ic = input_class(kernel_name, cls)
    omp = omp_env(kernel_name, cls, threads)
    binary = binary_path(kernel_name, bots_bin, variant, label)
    args: list[str] = []
    for a in ic.args:
        if "{input}" in a:
            base = Path(inputs_dir) if inputs_dir is not None else Path(bots_bin).parent / "inputs"
            path = base / kernel_name / (ic.input_file or "")
            if not path.is_file():
                raise RegistryError(
                    f"input file {ic.input_file} of {kernel_name}/{cls} not found at {path}; "
                    "it ships with the BOTS tree (inputs/)"
                )
            a = a.replace("{input}", str(path))
        args.append(a)
    if ic.cutoff is not None and uses_cutoff_flag(variant):
        args += ["-x", str(ic.cutoff)]
    args += list(extra_args)
    args += list(BASE_FLAGS)
    if default_check(kernel_name, variant) if check is None else check:
        args.append("-c")
    base = os.environ if base_env is None else base_env
    env = {k: v for k, v in base.items() if not is_openmp_var(k)}
    env.update(omp)
    return Command([str(binary), *args], env)
