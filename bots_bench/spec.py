"""Campaign spec: which kernels, classes, policies, seeds and repetitions to run, and how.

A YAML file such as::

    kernels: [fib, sort]          # or: all
    classes: [test]               # every kernel must have each class
    policies: [schedutil, hidvfs]
    seeds: [42, 123, 456]         # or a count: 3 -> seeds 0, 1, 2
    board: tx2
    backend: sim                  # or native
    repetitions: 10
    cooldown: {start_temp_c: 45, max_wait_s: 120}   # or null to skip cooling down
    timeout_s: 600
    bots_bin: /opt/bots/bin       # required for native; relative: to this file
    threads: 4                    # optional (native); default: every online core of the board
    variant: omp-tasks            # optional; BOTS build variant (or serial)
    deadline_s: null              # optional per-run deadline

is parsed into a :class:`CampaignSpec` (errors name the key and the expected value) and
:func:`expand` turns it into the run matrix. Policies are innermost, so the runs compared
with each other are measured side by side under the same thermal and load history. A
simulated campaign runs the DAG model of its variant (``omp-tasks``, ``for-``/``single-``
``omp-tasks``, ``serial``): a variant without one (the tied and cut-off builds) is refused,
and so is ``threads``, which the simulator does not model.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from bots_bench import registry
from bots_bench.dags import CLASSES as SIM_CLASSES
from bots_bench.dags import UnknownDagModel, model_variant, modelled_builds
from bots_bench.store import RunKey
from platforms.errors import SpecError
from platforms.spec import board_names
from platforms.yamlfile import load_yaml

#: the policy names of DESIGN.md
POLICY_NAMES = (
    "hidvfs",
    "geardvfs",
    "ztt",
    "performance",
    "powersave",
    "ondemand",
    "conservative",
    "schedutil",
    "maxfreq",
)
BACKENDS = ("sim", "native")
_KEYS = (
    "name",
    "kernels",
    "classes",
    "policies",
    "seeds",
    "board",
    "backend",
    "repetitions",
    "cooldown",
    "timeout_s",
    "bots_bin",
    "threads",
    "variant",
    "label",
    "deadline_s",
    "check",
)
_REQUIRED = ("kernels", "classes", "policies", "seeds", "board", "backend")


@dataclass(frozen=True)
class Cooldown:
    """Wait before each run until the hottest zone is below ``start_temp_c``, at most
    ``max_wait_s`` seconds."""

    start_temp_c: float = 45.0
    max_wait_s: float = 120.0


@dataclass(frozen=True)
class CampaignSpec:
    kernels: tuple[str, ...]
    classes: tuple[str, ...]
    policies: tuple[str, ...]
    seeds: tuple[int, ...]
    board: str
    backend: str
    repetitions: int = 1
    cooldown: Cooldown | None = Cooldown()
    timeout_s: float = 600.0
    bots_bin: str | None = None
    threads: int | None = None
    variant: str = registry.DEFAULT_VARIANT
    label: str = registry.DEFAULT_LABEL
    deadline_s: float | None = None
    #: ``-c``: None = the registry's cheap-check default per kernel
    check: bool | None = None
    name: str = ""

    @property
    def n_runs(self) -> int:
        return (
            len(self.kernels)
            * len(self.classes)
            * len(self.policies)
            * len(self.seeds)
            * self.repetitions
        )


@dataclass(frozen=True)
class MeasuredOn:
    """Where a native run measures, beyond the spec: a fake tree or the board itself, whether
    the campaign could set CPU frequencies, and which build of the kernel ran. Part of the
    run's key (:attr:`RunConfig.spec_hash`), so a re-run on another tree, after the first
    one could not set frequencies, or with a rebuilt binary measures again instead of
    reusing runs measured otherwise. The binary is named by its content: the same build in
    another folder still resumes."""

    #: the sysfs tree the campaign drove (absolute); "/" on the board itself
    sysfs_root: str
    #: False when no cpufreq policy could be written (runs had affinity and priority only)
    frequency_control: bool
    #: SHA-256 of the kernel binary (hex); None when it is missing or unreadable
    binary_sha256: str | None


@dataclass(frozen=True)
class RunConfig:
    """One run of the matrix: everything a runner needs, plus the run key."""

    bench: str
    cls: str
    policy: str
    seed: int
    board: str
    backend: str
    rep: int
    threads: int | None = None
    variant: str = registry.DEFAULT_VARIANT
    label: str = registry.DEFAULT_LABEL
    check: bool | None = None
    deadline_s: float | None = None
    timeout_s: float = 600.0
    cooldown: Cooldown | None = Cooldown()
    bots_bin: str | None = None
    #: deadline = slack x the job's reference makespan (``--deadline-slack``); None: no slack
    deadline_slack: float | None = None
    #: native runs: the tree, frequency control and binary they measure (set by the campaign
    #: when it opens the board); None in the simulator
    measured_on: MeasuredOn | None = None

    @property
    def spec_hash(self) -> str:
        """Hash of the settings that change what is measured but are not key fields.

        Adding seeds, repetitions, kernels or policies leaves it alone (a re-run resumes);
        changing threads, variant, deadline, deadline slack, check or cool-down starts fresh
        rows. The timeout and the BOTS path do not change a measurement and are left out;
        the binary's content, the tree and frequency control do (:class:`MeasuredOn`, native
        runs). The slack and ``measured_on`` enter the hash only when set, so simulated runs
        stored before they were key fields keep their hash and still resume.
        """
        payload = {
            "threads": self.threads,
            "variant": self.variant,
            "label": self.label,
            "check": self.check,
            "deadline_s": self.deadline_s,
            "cooldown": None if self.cooldown is None else asdict(self.cooldown),
        }
        if self.deadline_slack is not None:
            payload["deadline_slack"] = self.deadline_slack
        if self.measured_on is not None:
            payload["measured_on"] = asdict(self.measured_on)
        text = json.dumps(payload, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    @property
    def key(self) -> RunKey:
        return RunKey(
            self.bench,
            self.cls,
            self.policy,
            self.seed,
            self.board,
            self.backend,
            self.rep,
            self.spec_hash,
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe configuration (``class``, not ``cls``), stored with every run."""
        d = asdict(self)
        d["class"] = d.pop("cls")
        return d

    def record_base(self) -> dict[str, Any]:
        """The key fields of the run record, the spec hash and the full config."""
        return {
            "bench": self.bench,
            "class": self.cls,
            "policy": self.policy,
            "seed": self.seed,
            "board": self.board,
            "backend": self.backend,
            "rep": self.rep,
            "spec_hash": self.spec_hash,
            "deadline_s": self.deadline_s,
            "config": self.to_dict(),
        }


def _err(source: str, key: str, expected: str, got: object = None) -> SpecError:
    return SpecError(source, key, expected, got)


def _reason(source: str, key: str, reason: str) -> SpecError:
    """``FILE: key 'KEY': REASON``, for a reason that is a whole sentence, not a value (the
    registry's already says what was expected)."""
    return SpecError(source, key, reason, message=f"{source}: key '{key}': {reason}")


#: how the top of a spec that is not a mapping is named (YAML's types, not Python's)
_YAML_KINDS = {
    list: "a list",
    str: "a string",
    int: "a number",
    float: "a number",
    bool: "true/false",
}


def _str_list(source: str, key: str, v: Any) -> tuple[str, ...]:
    if isinstance(v, str):
        v = [s.strip() for s in v.split(",") if s.strip()]
    if not isinstance(v, list) or not v or not all(isinstance(s, str) and s for s in v):
        raise _err(source, key, "a non-empty list of names (or a comma-separated string)", v)
    if len(set(v)) != len(v):
        raise _err(source, key, "names without duplicates", v)
    return tuple(v)


def _number(source: str, key: str, v: Any, *, minimum: float, strict: bool) -> float:
    """A finite number above ``minimum``: YAML's .inf/.nan would pass the comparison (or
    slip past it) and only fail after the first run, in the runner or the store."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise _err(source, key, "a number", v)
    if not math.isfinite(v):
        raise _err(source, key, "a finite number", v)
    if v < minimum or (strict and v == minimum):
        raise _err(source, key, f"a number {'>' if strict else '>='} {minimum:g}", v)
    return float(v)


def _positive_int(source: str, key: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise _err(source, key, "a positive integer", v)
    return v


#: the largest seed: the results store keeps seeds in a SQLite INTEGER (signed 64-bit)
MAX_SEED = 2**63 - 1


def _seeds(source: str, v: Any) -> tuple[int, ...]:
    """Seeds 0 .. MAX_SEED: a larger one failed only after simulating (SQLite overflow), a
    negative one only at run time (the simulator's RNG), each as a stored failed row."""
    if isinstance(v, int) and not isinstance(v, bool):
        if v < 1:
            raise _err(source, "seeds", "a positive count or a list of integers", v)
        if v > MAX_SEED + 1:
            raise _err(source, "seeds", f"a count of at most {MAX_SEED + 1}", v)
        return tuple(range(v))
    if (
        not isinstance(v, list)
        or not v
        or not all(isinstance(s, int) and not isinstance(s, bool) for s in v)
    ):
        raise _err(source, "seeds", "a positive count or a non-empty list of integers", v)
    bad = [s for s in v if not 0 <= s <= MAX_SEED]
    if bad:
        raise _err(source, "seeds", f"integers from 0 to {MAX_SEED}", bad[0])
    if len(set(v)) != len(v):
        raise _err(source, "seeds", "seeds without duplicates", v)
    return tuple(v)


def _cooldown(source: str, v: Any) -> Cooldown | None:
    if v is None or v is False:
        return None
    if not isinstance(v, Mapping):
        raise _err(source, "cooldown", "a mapping {start_temp_c, max_wait_s} or null", v)
    unknown = sorted(set(v) - {"start_temp_c", "max_wait_s"})
    if unknown:
        raise _err(
            source, f"cooldown.{unknown[0]}", "one of start_temp_c, max_wait_s", v[unknown[0]]
        )
    start = v.get("start_temp_c", Cooldown.start_temp_c)
    wait = v.get("max_wait_s", Cooldown.max_wait_s)
    start = _number(source, "cooldown.start_temp_c", start, minimum=0, strict=True)
    if start >= 150:
        raise _err(source, "cooldown.start_temp_c", "a temperature in degC below 150", start)
    wait = _number(source, "cooldown.max_wait_s", wait, minimum=0, strict=False)
    return Cooldown(start, wait)


#: the ``hidvfs bots run`` flags whose spec key is spelt otherwise (difflib finds no match
#: between them): a user writing a spec from the command line types these
_FLAG_KEYS = {
    "bench": "kernels",
    "benches": "kernels",
    "kernel": "kernels",
    "class": "classes",
    "cls": "classes",
    "policy": "policies",
    "seed": "seeds",
    "repeat": "repetitions",
    "reps": "repetitions",
    "timeout": "timeout_s",
    "deadline": "deadline_s",
}
#: command-line settings that are not spec keys, and where they go instead
_FLAG_ONLY = {
    "deadline_slack": "--deadline-slack",
    "db": "--db",
    "profiles": "--profiles",
    "sysfs_root": "--sysfs-root",
}


def _unknown_key(key: str) -> str:
    """What an unknown campaign key should have been: a "did you mean" (the way the daemon
    config loader suggests, with difflib) when a key is close or is the name of the
    matching ``bots run`` flag, and the list of the campaign keys."""
    keys = ", ".join(_KEYS)
    norm = key.strip().lower().replace("-", "_")
    if norm.lstrip("_") in _FLAG_ONLY:
        flag = _FLAG_ONLY[norm.lstrip("_")]
        return f"a campaign key ({key!r} is not one: pass {flag} on the command line); campaign keys: {keys}"
    hint = _FLAG_KEYS.get(norm) or (norm if norm in _KEYS else "")
    if not hint:
        close = difflib.get_close_matches(norm, _KEYS, n=1, cutoff=0.6)
        hint = close[0] if close else ""
    return (
        "a campaign key"
        + (f" (did you mean '{hint}'?)" if hint else "")
        + f"; campaign keys: {keys}"
    )


def parse_spec(
    data: Any,
    source: str = "<spec>",
    *,
    known_policies: tuple[str, ...] = POLICY_NAMES,
    base_dir: str | os.PathLike[str] | None = None,
) -> CampaignSpec:
    """Validate a parsed YAML mapping into a :class:`CampaignSpec`. A relative ``bots_bin``
    is taken relative to ``base_dir`` (the spec file's folder, so a campaign kept beside its
    build runs from anywhere), or to the working directory without one."""
    if data is None:  # an empty file (or only comments): YAML's null, not a wrong type
        raise SpecError(
            source,
            "<top>",
            "a mapping of campaign settings",
            message=f"{source} is empty: a campaign spec is a mapping of settings "
            "(see `hidvfs bots run --help`)",
        )
    if not isinstance(data, Mapping):
        kind = _YAML_KINDS.get(type(data), type(data).__name__)
        raise _reason(source, "<top>", f"expected a mapping of campaign settings, got {kind}")
    data = dict(data)
    if "cool-down" in data:  # the spelling of the issue text
        data.setdefault("cooldown", data.pop("cool-down"))
    unknown = sorted(str(k) for k in data if k not in _KEYS)
    if unknown:
        raise _err(source, unknown[0], _unknown_key(unknown[0]))
    missing = [k for k in _REQUIRED if k not in data]
    if missing:
        raise _err(source, missing[0], "a value (required key is missing)")

    kernels_v = data["kernels"]
    if kernels_v == "all" or kernels_v == ["all"]:
        kernels = registry.KERNEL_NAMES
    else:
        kernels = _str_list(source, "kernels", kernels_v)
        bad = [k for k in kernels if k not in registry.KERNELS]
        if bad:
            raise _err(
                source, "kernels", f"'all' or names from {', '.join(registry.KERNEL_NAMES)}", bad[0]
            )

    classes = _str_list(source, "classes", data["classes"])
    # the simulator runs DAG models of a subset of the binaries' input classes: check the
    # classes against what the chosen backend can run, so a bad one fails here, not per run
    sim = data.get("backend") == "sim"
    classes_of = {k: tuple(SIM_CLASSES[k] if sim else registry.KERNELS[k].classes) for k in kernels}
    for c in classes:
        lacking = [k for k in kernels if c not in classes_of[k]]
        if lacking:
            have = ", ".join(classes_of[lacking[0]])
            raise _err(
                source, "classes", f"a class every selected kernel has ({lacking[0]} has {have})", c
            )

    policies = _str_list(source, "policies", data["policies"])
    bad = [p for p in policies if p not in known_policies]
    if bad:
        raise _err(source, "policies", f"names from {', '.join(known_policies)}", bad[0])

    seeds = _seeds(source, data["seeds"])

    backend = data["backend"]
    if backend not in BACKENDS:
        raise _err(source, "backend", f"one of {', '.join(BACKENDS)}", backend)

    board = data["board"]
    boards = board_names()
    if not isinstance(board, str) or board not in boards:
        raise _err(source, "board", f"one of {', '.join(boards)}", board)

    repetitions = _positive_int(source, "repetitions", data.get("repetitions", 1))
    cooldown = _cooldown(source, data.get("cooldown", {}))
    timeout_s = _number(source, "timeout_s", data.get("timeout_s", 600.0), minimum=0, strict=True)

    bots_bin = data.get("bots_bin")
    if bots_bin is not None and (not isinstance(bots_bin, str) or not bots_bin):
        raise _err(source, "bots_bin", "a directory path", bots_bin)
    if backend == "native" and bots_bin is None:
        raise _err(source, "bots_bin", "the BOTS bin/ directory (required for backend native)")
    if bots_bin is not None:
        bots_bin = os.path.expanduser(bots_bin)
        if base_dir is not None and not os.path.isabs(bots_bin):
            bots_bin = os.path.normpath(os.path.join(base_dir, bots_bin))

    threads = data.get("threads")
    if threads is not None:
        threads = _positive_int(source, "threads", threads)
        if backend == "sim":
            # a simulated job runs a worker on every core its policy gives it: a thread count
            # would be stored with the runs (and in their spec hash) but not simulated
            raise _reason(
                source,
                "threads",
                "not with backend sim (the simulator runs a job on every core its policy gives "
                "it and does not model OMP_NUM_THREADS); leave threads out, or use backend "
                "native",
            )

    variant = data.get("variant", registry.DEFAULT_VARIANT)
    label = data.get("label", registry.DEFAULT_LABEL)
    try:  # the registry's rule: a label it cannot name a binary or a profile with is refused
        registry.check_label(label)
    except registry.RegistryError:
        raise _err(
            source, "label", "a compiler label: letters, digits, _, + or - (e.g. gcc)", label
        ) from None
    if not isinstance(variant, str):
        raise _err(source, "variant", "a BOTS variant such as omp-tasks or omp-tasks-tied", variant)
    for k in kernels:
        try:
            registry.binary_name(k, variant, label)
        except registry.RegistryError as err:  # names the variant and what was expected
            raise _reason(source, "variant", str(err)) from None
        if backend == "sim":  # the run must be the model of the build it is stored as
            try:
                model_variant(k, variant)
            except UnknownDagModel:
                raise _err(
                    source,
                    "variant",
                    f"a variant the simulator has a DAG model of for every selected kernel "
                    f"({k}: {', '.join(modelled_builds(k))}; tied and cut-off builds are "
                    "native only)",
                    variant,
                ) from None

    deadline_s = data.get("deadline_s")
    if deadline_s is not None:
        deadline_s = _number(source, "deadline_s", deadline_s, minimum=0, strict=True)

    check = data.get("check")
    if check is not None and not isinstance(check, bool):
        raise _err(source, "check", "true, false or null (per-kernel default)", check)

    name = data.get("name", "")
    if not isinstance(name, str):
        raise _err(source, "name", "a string", name)

    return CampaignSpec(
        kernels=tuple(kernels),
        classes=classes,
        policies=policies,
        seeds=seeds,
        board=board,
        backend=backend,
        repetitions=repetitions,
        cooldown=cooldown,
        timeout_s=timeout_s,
        bots_bin=bots_bin,
        threads=threads,
        variant=variant,
        label=label,
        deadline_s=deadline_s,
        check=check,
        name=name,
    )


def load_spec(path: str | os.PathLike[str], **kw) -> CampaignSpec:
    """Read and validate a campaign YAML file."""
    path = os.fspath(path)
    data = load_yaml(path)
    kw.setdefault("base_dir", os.path.dirname(os.path.abspath(path)))
    return parse_spec(data, path, **kw)


def expand(spec: CampaignSpec) -> list[RunConfig]:
    """The run matrix: kernel > class > seed > repetition > policy (policies side by side)."""
    return [
        RunConfig(
            bench=k,
            cls=c,
            policy=p,
            seed=s,
            board=spec.board,
            backend=spec.backend,
            rep=r,
            threads=spec.threads,
            variant=spec.variant,
            label=spec.label,
            check=spec.check,
            deadline_s=spec.deadline_s,
            timeout_s=spec.timeout_s,
            cooldown=spec.cooldown,
            bots_bin=spec.bots_bin,
        )
        for k in spec.kernels
        for c in spec.classes
        for s in spec.seeds
        for r in range(spec.repetitions)
        for p in spec.policies
    ]
