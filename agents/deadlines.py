"""Soft deadlines from a measured reference cost, and the two-point scaling the gate uses.

A job's reference cost is a :class:`~platforms.observation.JobProfile`: work C and span L in
seconds at ``ref_khz`` on the board's reference core type (capacity 1.0), the memory-bound
fraction beta, and the makespan measured at a fixed reference configuration. Its time on
another operating point follows the two-point model of reference/models.md 1.2 and 6:

    phi(f, kappa) = (1 - beta) * f_ref / (kappa * f) + beta,   C(f) = C * phi

C(f) is exact (a sum of the tasks' compute and memory parts). The span is not: a path that is
all compute slows by f_ref / (kappa f), more than phi, so L * phi under-estimates it below the
reference speed (rubikpi3 strassen small: 24 % on gold at 2.4 GHz). :func:`span_at` takes the
least of three upper bounds instead (models.md 1.2.2, "recompute L(f) under the scaled
weights"): the compute-only and memory-only longest paths of the profile (when it has them)
summed at f, the worst split of L between compute and memory (all compute below the
reference speed, as much memory as the job has above it), and the remaining work C(f). The
soft deadline is ``D = slack * ref_makespan`` with slack >= 1
(models.md 8), and must leave the critical path room at the fastest point: D >= L(f_max).

Profiles are frozen and versioned per (job name, board) in a small JSON store; the only I/O of
this module is :func:`load`, :func:`save`, :func:`update` and :func:`remove`. Beside each
profile the store may keep its provenance (when, on what and with which hidvfs it was
measured: :attr:`ProfileStore.provenance`); it is for people deciding whether to measure
again, and never reaches the :class:`~platforms.observation.JobProfile` the daemon plans with.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace

from platforms.atomicfile import kept_mode, write_text_atomic
from platforms.dag import DAG
from platforms.errors import SpecError
from platforms.observation import JobProfile
from platforms.spec import BoardSpec, ClusterSpec

STORE_FORMAT = "hidvfs-profiles"
STORE_VERSION = 1
_FIELDS = ("name", "work_s", "span_s", "beta", "ref_makespan_s", "ref_khz", "ref_cores", "version")
#: fields a stored profile may leave out (a profile measured on a board has no split span)
_OPTIONAL = ("span_cpu_s", "span_mem_s")
#: the key of a stored row's provenance (an object of strings; absent in rows stored before it
#: was recorded, which every store version 1 reader ignores, so the format version stays 1)
PROVENANCE = "provenance"


# --------------------------------------------------------------------------------------------
# Two-point scaling (pure)


def slowdown(beta: float, ref_khz: float, khz: float, capacity: float = 1.0) -> float:
    """phi: time at (khz, capacity) divided by time at (ref_khz, capacity 1.0)."""
    return (1.0 - beta) * ref_khz / (capacity * khz) + beta


def work_at(p: JobProfile, khz: float, capacity: float = 1.0, remaining: float = 1.0) -> float:
    """C(f): remaining sequential work in seconds at ``khz`` on a core of ``capacity``."""
    return remaining * p.work_s * slowdown(p.beta, p.ref_khz, khz, capacity)


def work_bound(p: JobProfile, khz: float, capacity: float = 1.0, remaining: float = 1.0) -> float:
    """C(f) of the remaining work, an upper bound: :func:`work_at` assumes the work left has
    the job's mean memory share, but the part left may be all of its compute (the slower
    case below the reference speed) or all of its memory stalls (above it, where compute
    speeds up and memory does not). On a job whose last phase is memory-bound, moved to
    tx2's Denver (capacity 1.3) at 93 % done, the plant took 4 % longer than work_at.
    Equal to work_at for the whole job."""
    w = remaining * p.work_s
    mem = p.beta * p.work_s
    r = p.ref_khz / (capacity * khz)
    if r >= 1.0:
        c = min(w, p.work_s - mem)
        return c * r + (w - c)
    m = min(w, mem)
    return (w - m) * r + m


def span_terms(p: JobProfile) -> tuple[float, float, float]:
    """(a, b, m) of :func:`span_bound`: L(v) <= a / v + b at speed v = capacity * kHz, from
    the profile's compute-only path (times f_ref) and memory-only path, (inf, 0) for a
    profile without them (one measured on a board); m = min(L, beta C), the most memory time
    a path can hold."""
    m = min(p.span_s, p.beta * p.work_s)
    if p.span_cpu_s is None or p.span_mem_s is None:
        return math.inf, 0.0, m
    return p.span_cpu_s * p.ref_khz, p.span_mem_s, m


def span_bound(
    a: float, b: float, m: float, span: float, ref_khz: float, v: float, c: float
) -> float:
    """The least of three upper bounds on a remaining span at speed ``v`` (kHz x capacity):
    ``a / v + b`` (:func:`span_terms`); the full span L split the worst way between compute
    (scaled by r = f_ref / v) and memory (not scaled), at most ``m`` of it memory:
    L r + m (1 - r) above the reference speed, L r below it; and the remaining work ``c`` =
    C(f).

    How much of the critical path is done is unknown mid-run, so the full span is kept unless
    the remaining work is smaller. Plain float arithmetic: the gate's and the shield's
    vectorised loops repeat it term for term."""
    r = ref_khz / v
    worst = span * r + (m * (1.0 - r) if r < 1.0 else 0.0)
    return min(a / v + b, worst, c)


def span_within(p: JobProfile, khz: float, capacity: float, c: float) -> float:
    """:func:`span_bound` of ``p`` at ``khz`` with ``c`` the remaining work's time: the
    agents' features and the shield's rows pass :func:`work_at`, the estimate they were
    trained on; the gate passes :func:`work_bound` (:func:`span_at`)."""
    a, b, m = span_terms(p)
    return span_bound(a, b, m, p.span_s, p.ref_khz, capacity * khz, c)


def span_at(p: JobProfile, khz: float, capacity: float = 1.0, remaining: float = 1.0) -> float:
    """L(f): an upper bound on the remaining critical path at ``khz`` (:func:`span_bound`,
    capped by :func:`work_bound`)."""
    return span_within(p, khz, capacity, work_bound(p, khz, capacity, remaining))


def greedy_bound(
    p: JobProfile, cores: Sequence[tuple[float, float]], remaining: float = 1.0
) -> float:
    """Response-time bound of the remaining work run greedily on cores of unequal speed.

    ``cores``: (khz, capacity) of each core the job has to itself. With rates
    r_i = 1 / phi_i, their sum R and the slowest r_min: at every instant either every core
    is busy (work done at rate R) or a chain of the job runs, for at most U, its span's
    bound on the slowest core (:func:`span_at`), while doing at least r_min per second of
    the work. So

        T <= W / R + U (1 - r_min / R)

    with W the remaining reference work. On equal cores it is Graham's U + (C(f) - U) / n,
    which never falls as U grows: an upper bound of the span keeps it a bound. A faster or
    added core never raises it, but an added core slower than the others can.
    """
    if not cores:
        return math.inf
    w = remaining * p.work_s
    phis = [slowdown(p.beta, p.ref_khz, khz, cap) for khz, cap in cores]
    rate = sum(1.0 / x for x in phis)
    phi_max = max(phis)
    khz, cap = min(cores, key=lambda kc: kc[0] * kc[1])
    # capped by the work left at the mean memory share, as the rates R are: capped by
    # work_bound instead, U could pass W r_min and an added core would raise the bound
    u = span_within(p, khz, cap, work_at(p, khz, cap, remaining))
    return w / rate + u * (1.0 - 1.0 / (phi_max * rate))


#: the longest job name the job registry accepts (daemon.registry checks the same)
MAX_NAME = 128


def check_name(name: object) -> str:
    """A job name a profile can be stored and looked up under (the registry's rule)."""
    if not (
        isinstance(name, str)
        and name.strip() == name  # " fib" would never be looked up as "fib"
        and name
        and len(name) <= MAX_NAME
        and name.isprintable()
    ):
        raise ValueError(
            f"job name {name!r}: must be printable, 1 to {MAX_NAME} characters, without "
            "leading or trailing spaces"
        )
    return name


def check_profile(p: JobProfile, where: str = "profile") -> JobProfile:
    """Validate a profile's values; raises ValueError naming the field and the value."""

    def bad(key: str, expected: str, got: object) -> ValueError:
        return ValueError(f"{where} {p.name!r}: '{key}' must be {expected}, got {got!r}")

    try:  # the job registry's rule: a name it would refuse could never be looked up
        check_name(p.name)
    except ValueError:
        raise bad("name", f"a printable name of 1 to {MAX_NAME} characters", p.name) from None
    for key in ("work_s", "span_s", "ref_makespan_s"):
        v = getattr(p, key)
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
            raise bad(key, "a finite number > 0 (seconds)", v)
    if p.span_s > p.work_s * (1 + 1e-9):
        raise bad("span_s", f"<= work_s ({p.work_s})", p.span_s)
    if not (isinstance(p.beta, (int, float)) and 0.0 <= p.beta <= 1.0):
        raise bad("beta", "a memory-bound fraction in [0, 1]", p.beta)
    if (p.span_cpu_s is None) != (p.span_mem_s is None):
        raise bad("span_cpu_s", "given with span_mem_s (both or neither)", p.span_cpu_s)
    if p.span_cpu_s is not None:
        for key in ("span_cpu_s", "span_mem_s"):
            v = getattr(p, key)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise bad(key, "a finite number >= 0 (seconds)", v)
        if p.span_cpu_s + p.span_mem_s < p.span_s * (1 - 1e-9):
            # every path's time is at most its compute path plus its memory path
            raise bad("span_cpu_s", f"+ span_mem_s >= span_s ({p.span_s})", p.span_cpu_s)
    for key in ("ref_khz", "ref_cores", "version"):
        v = getattr(p, key)
        if not (isinstance(v, int) and not isinstance(v, bool) and v >= 1):
            raise bad(key, "an integer >= 1", v)
    return p


def soft_deadline(p: JobProfile, slack: float, fmax_khz: float, capacity: float = 1.0) -> float:
    """``D = slack * ref_makespan``, checked against the span at the fastest point.

    ``fmax_khz`` and ``capacity`` describe the fastest cluster the job may use. Raises
    ValueError when slack < 1 or when D < L(f_max): no frequency or core count could meet it.
    """
    if not (math.isfinite(slack) and slack >= 1.0):
        raise ValueError(f"slack for job {p.name!r} must be a finite number >= 1, got {slack!r}")
    deadline = slack * p.ref_makespan_s
    l_fast = span_at(p, fmax_khz, capacity)
    if deadline < l_fast:
        raise ValueError(
            f"deadline {deadline:.6g} s for job {p.name!r} (slack {slack} x reference makespan "
            f"{p.ref_makespan_s:.6g} s) is shorter than its critical path at the fastest point, "
            f"L({fmax_khz:.0f} kHz, capacity {capacity}) = {l_fast:.6g} s"
        )
    return deadline


def profile_from_dag(
    dag: DAG,
    spec: BoardSpec,
    cluster: str | ClusterSpec,
    cores: int,
    ref_khz: int,
    measured_makespan_s: float,
    *,
    name: str | None = None,
    version: int = 1,
) -> JobProfile:
    """C, L and beta of ``dag`` at ``ref_khz`` on the reference core, with its measured makespan.

    ``cluster`` and ``cores`` name the reference configuration the makespan was measured on;
    C and L are normalised to capacity 1.0 so that the gate can rescale them to any cluster.
    """
    cl = spec.cluster(cluster) if isinstance(cluster, str) else cluster
    if ref_khz not in cl.freqs_khz:
        raise ValueError(
            f"reference frequency {ref_khz} kHz is not in the table of {spec.name}/{cl.name}: {list(cl.freqs_khz)}"
        )
    if not 1 <= cores <= len(cl.cpus):
        raise ValueError(
            f"reference core count {cores} is outside 1..{len(cl.cpus)} for {spec.name}/{cl.name}"
        )
    if not (math.isfinite(measured_makespan_s) and measured_makespan_s > 0):
        raise ValueError(
            f"measured makespan for {dag.name!r} must be > 0 s, got {measured_makespan_s!r}"
        )
    work, span = dag.work_span(ref_khz * 1e3, 1.0)
    if not work > 0:
        raise ValueError(f"DAG {dag.name!r} has no work (C = {work})")
    beta = float(dag.mem_s.sum()) / work
    span_cpu, span_mem = dag.part_spans(ref_khz * 1e3, 1.0)
    profile = JobProfile(
        name=name or dag.name,
        work_s=work,
        span_s=min(span, work),
        beta=min(max(beta, 0.0), 1.0),
        ref_makespan_s=float(measured_makespan_s),
        ref_khz=int(ref_khz),
        ref_cores=int(cores),
        version=version,
        span_cpu_s=span_cpu,
        span_mem_s=span_mem,
    )
    return check_profile(profile)


def profile_from_runs(
    name: str,
    *,
    ref_khz: int,
    low_khz: int,
    cores: int,
    capacity: float,
    t_all_s: float,
    t_one_s: float,
    t_low_s: float,
    version: int = 1,
) -> JobProfile:
    """A reference profile from three timed runs of a real program on a board's reference
    cluster (``hidvfs profile measure``): on all ``cores`` at ``ref_khz`` (``t_all_s``, the
    reference makespan), on one core at ``ref_khz`` (``t_one_s``, the work C) and on all
    cores at ``low_khz`` (``t_low_s``).

    The models are the ones the gate plans with: ``T(n) = L + (C - L)/n`` gives the span L;
    the two-point model ``T(f) = T(f_ref) ((1 - beta) f_ref/f + beta)`` gives beta from the
    slowdown at ``low_khz``; C and L are then normalised to capacity 1.0 like
    :func:`profile_from_dag`. Estimates outside their ranges (noise) are clipped.
    """
    for key, v in (("t_all_s", t_all_s), ("t_one_s", t_one_s), ("t_low_s", t_low_s)):
        if not (math.isfinite(v) and v > 0):
            raise ValueError(f"profile {name!r}: {key} must be a time > 0 s, got {v!r}")
    if not (cores >= 1 and capacity > 0 and 0 < low_khz < ref_khz):
        raise ValueError(
            f"profile {name!r}: need cores >= 1, capacity > 0 and 0 < low_khz < ref_khz, got "
            f"cores={cores}, capacity={capacity}, low_khz={low_khz}, ref_khz={ref_khz}"
        )
    # T(low)/T(ref) = ((1 - beta) r / kappa + beta) / ((1 - beta) / kappa + beta), r = f_ref/f_low
    r, slow = ref_khz / low_khz, t_low_s / t_all_s
    den = (r - slow) + capacity * (slow - 1.0)
    beta = min(max((r - slow) / den, 0.0), 1.0) if den > 0 else 0.0  # den <= 0: slow >> r
    work = max(t_one_s, t_all_s)  # one core never beats all of them
    span = work if cores == 1 else (cores * t_all_s - work) / (cores - 1)
    span = min(max(span, 0.0), work)
    scale = (1.0 - beta) / capacity + beta  # time on this core type per capacity-1.0 second
    work_1, span_1 = work / scale, span / scale
    return check_profile(
        JobProfile(
            name=name,
            work_s=work_1,
            span_s=max(span_1, 1e-9 * work_1),
            beta=beta,
            ref_makespan_s=float(t_all_s),
            ref_khz=int(ref_khz),
            ref_cores=int(cores),
            version=version,
        )
    )


# --------------------------------------------------------------------------------------------
# Versioned store


@dataclass
class ProfileStore:
    """Reference profiles keyed by (job name, board). Frozen: a change needs ``replace=True``.

    ``provenance`` holds, per (job name, board), how the stored profile was measured (string
    keys and values, e.g. ``measured_at``, ``hidvfs_version``, ``git_commit``, ``board``,
    ``kernel``: :func:`tools.profile_measure.measure` says which); a profile stored before
    provenance was recorded, or put without one, has no entry. It is kept beside the profiles,
    not in them: a :class:`JobProfile` is what the daemon plans with on every tick."""

    profiles: dict[tuple[str, str], JobProfile] = field(default_factory=dict)
    provenance: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)

    def find(self, name: str, board: str) -> JobProfile | None:
        return self.profiles.get((name, board))

    def get(self, name: str, board: str) -> JobProfile:
        p = self.profiles.get((name, board))
        if p is None:
            known = ", ".join(f"{n}@{b}" for n, b in sorted(self.profiles)) or "none"
            raise KeyError(
                f"no reference profile for job {name!r} on board {board!r} (known: {known})"
            )
        return p

    def provenance_of(self, name: str, board: str) -> dict[str, str] | None:
        """How the profile of ``name`` on ``board`` was measured; None when unknown (stored
        before provenance was recorded, or put without one)."""
        return self.provenance.get((name, board))

    def put(
        self,
        board: str,
        profile: JobProfile,
        *,
        replace_existing: bool = False,
        provenance: Mapping[str, str] | None = None,
    ) -> JobProfile:
        """Add a profile; replacing a different one bumps its version and needs consent.

        ``provenance`` (checked by :func:`check_provenance`) is recorded for the stored
        profile: a profile of the same cost as the stored one keeps the stored one (and its
        version) and takes the new provenance when given, the latest measurement that gave
        those numbers; a new profile without provenance drops the old one's."""
        check_profile(profile)
        prov = None if provenance is None else check_provenance(provenance)
        key = (profile.name, board)
        old = self.profiles.get(key)
        if old is not None and _same_cost(old, profile):
            if prov is not None:
                self.provenance[key] = prov
            return old
        if old is not None:
            if not replace_existing:
                raise ValueError(
                    f"reference profile {profile.name!r} on {board!r} is frozen at version {old.version}; "
                    "measure it again with --replace to record a new version"
                )
            profile = replace(profile, version=max(old.version + 1, profile.version))
        self.profiles[key] = profile
        if prov is None:
            self.provenance.pop(key, None)
        else:
            self.provenance[key] = prov
        return profile

    def __len__(self) -> int:
        return len(self.profiles)

    def __iter__(self) -> Iterator[tuple[str, JobProfile]]:
        """(board, profile) pairs in a stable order."""
        for (_, board), p in sorted(self.profiles.items()):
            yield board, p


def check_provenance(provenance: object, where: str = "provenance") -> dict[str, str]:
    """A profile's provenance as stored: a mapping of non-empty string keys to string values
    (a copy); ValueError otherwise."""
    if not isinstance(provenance, Mapping):
        raise ValueError(f"{where} must be a mapping of strings, got {provenance!r}")
    out: dict[str, str] = {}
    for k, v in provenance.items():
        if not isinstance(k, str) or not k or not isinstance(v, str):
            raise ValueError(f"{where} must map names to strings, got {k!r}: {v!r}")
        out[k] = v
    return out


def _same_cost(a: JobProfile, b: JobProfile) -> bool:
    return all(getattr(a, k) == getattr(b, k) for k in (*_FIELDS, *_OPTIONAL) if k != "version")


def load(path: str | os.PathLike[str], *, missing_ok: bool = False) -> ProfileStore:
    """Read a store; an absent file is an empty store only with ``missing_ok``, a zero-byte
    one always (``touch``, or a file made before its first save): any other content that is
    not a store is refused."""
    path = os.fspath(path)
    data = _read(path, missing_ok)
    return ProfileStore() if data is None else _parse(data, path)


def _read(path: str, missing_ok: bool) -> object:
    """The JSON held at ``path``; None for an empty store (a zero-byte file, or an absent one
    with ``missing_ok``)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        return json.loads(text) if text else None
    except FileNotFoundError:
        if missing_ok:
            return None
        raise SpecError(path, "<file>", "an existing profile store (file not found)") from None
    except OSError as err:
        raise SpecError(path, "<file>", f"a readable profile store ({err.strerror})") from None
    except json.JSONDecodeError as err:
        raise SpecError(path, "<file>", f"valid JSON ({err.msg} at line {err.lineno})") from None
    except UnicodeDecodeError as err:
        raise SpecError(path, "<file>", f"UTF-8 text ({err.reason} at byte {err.start})") from None
    except RecursionError:
        raise SpecError(path, "<file>", "a profile store (JSON nested too deeply)") from None


def _parse(data: object, path: str) -> ProfileStore:
    if not isinstance(data, dict) or data.get("format") != STORE_FORMAT:
        raise SpecError(
            path,
            "format",
            f"{STORE_FORMAT!r}",
            data.get("format") if isinstance(data, dict) else data,
        )
    if data.get("version") != STORE_VERSION:
        raise SpecError(
            path,
            "version",
            f"store version {STORE_VERSION} (this hidvfs cannot read others)",
            data.get("version"),
        )
    rows = data.get("profiles")
    if not isinstance(rows, list):
        raise SpecError(path, "profiles", "a list of profiles", rows)
    store = ProfileStore()
    for i, row in enumerate(rows):
        where = f"profiles[{i}]"
        if not isinstance(row, dict):
            raise SpecError(path, where, "a mapping", row)
        missing = [k for k in ("board", *_FIELDS) if k not in row]
        if missing:
            raise SpecError(path, f"{where}.{missing[0]}", "a value (missing)")
        try:
            fields = {k: row[k] for k in (*_FIELDS, *_OPTIONAL) if k in row}
            p = check_profile(JobProfile(**fields), where)
        except (TypeError, ValueError) as err:
            raise SpecError(path, where, f"a valid profile ({err})") from None
        board = row["board"]
        if not isinstance(board, str) or not board:
            raise SpecError(path, f"{where}.board", "a board name", board)
        if (p.name, board) in store.profiles:
            raise SpecError(
                path, where, f"one profile per (job, board); {p.name!r}@{board!r} repeats"
            )
        store.profiles[(p.name, board)] = p
        # absent in a row stored before provenance was recorded; null (as `profile show
        # --json` prints an unknown one) is as absent
        if row.get(PROVENANCE) is not None:
            try:
                prov = check_provenance(row[PROVENANCE], f"{where}.{PROVENANCE}")
            except ValueError:
                raise SpecError(
                    path, f"{where}.{PROVENANCE}", "a mapping of names to strings", row[PROVENANCE]
                ) from None
            store.provenance[(p.name, board)] = prov
    return store


def _open_lock(path: str):
    """``STORE.lock``, made if missing (0644), opened without following a symlink: with the
    store in a folder another user can write, a link planted as the lock file made root
    create (or open) any file it named. Raises ValueError naming the store for a link."""
    lock = path + ".lock"
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(lock, flags, 0o644)
    except OSError:
        if os.path.islink(lock):  # ELOOP
            raise ValueError(
                f"{path}: its lock file {lock} is a symbolic link; hidvfs does not follow it "
                "(it could point anywhere): remove it, or keep the store in a folder only "
                "you can write"
            ) from None
        raise
    return os.fdopen(fd, "w")


def update(
    path: str | os.PathLike[str],
    board: str,
    profile: JobProfile,
    *,
    replace_existing: bool = False,
    provenance: Mapping[str, str] | None = None,
) -> JobProfile:
    """Add one profile, with its ``provenance`` when given (see :meth:`ProfileStore.put`), to
    the store on disk under an exclusive lock (load, put, save), so two measurements that end
    together both land (each used to save its own stale copy)."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    with _open_lock(path) as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        store = load(path, missing_ok=True)
        out = store.put(board, profile, replace_existing=replace_existing, provenance=provenance)
        save(store, path)
    return out


def save(store: ProfileStore, path: str | os.PathLike[str]) -> None:
    """Write atomically (temporary file + rename) so a crash never leaves half a store. A
    profile's provenance, when known, is its row's last key; a row without one is written as
    before provenance was recorded."""
    rows = [_row(store, board, p) for board, p in store]
    data = {"format": STORE_FORMAT, "version": STORE_VERSION, "profiles": rows}
    # readable by everyone, as the daemon's other state (`hidvfs profile list` without root);
    # profiles hold timings, no secret. A store that exists keeps its mode (as `remove`
    # does): an administrator's 0600 is not undone by the next measurement.
    path = os.fspath(path)
    write_text_atomic(path, _dump(data), mode=kept_mode(path))


def _row(store: ProfileStore, board: str, p: JobProfile) -> dict:
    row = {"board": board, **asdict(p)}
    prov = store.provenance_of(p.name, board)
    if prov is not None:
        row[PROVENANCE] = dict(prov)
    return row


def _dump(data: dict) -> str:
    return json.dumps(data, indent=1) + "\n"


class ProfileNotFound(LookupError):
    """No stored profile of that name (on that board); the message names the ones there."""


def lookup(
    store: ProfileStore, name: str, board: str | None = None, *, where: str = "the store"
) -> list[tuple[str, JobProfile]]:
    """The (board, profile) pairs stored under job ``name``, on ``board`` only when given,
    in board order; raises :class:`ProfileNotFound` for none, saying which names ``where``
    (the store's path) holds or that it is empty."""
    found = [(b, p) for b, p in store if p.name == name and board in (None, b)]
    if found:
        return found
    if not len(store):
        raise ProfileNotFound(f"no profile {name!r} in {where}: the store is empty")
    boards = sorted(b for n, b in store.profiles if n == name)
    if boards:  # a board was given, and the name is stored for others
        raise ProfileNotFound(
            f"no profile {name!r} for board {board!r} in {where} (it has one for: "
            f"{', '.join(boards)})"
        )
    names = sorted({n for n, b in store.profiles if board in (None, b)})
    if not names:
        raise ProfileNotFound(
            f"no profile {name!r} for board {board!r} in {where} (profiles there are for: "
            f"{', '.join(sorted({b for _, b in store.profiles}))})"
        )
    on = "" if board is None else f" for board {board!r}"
    raise ProfileNotFound(f"no profile {name!r}{on} in {where} (known: {', '.join(names)})")


def remove(
    path: str | os.PathLike[str], name: str, board: str | None = None
) -> list[tuple[str, JobProfile]]:
    """Delete the profile of job ``name`` from the store on disk (the one on ``board``; without
    one, the name must be stored for a single board) and return the (board, profile) removed.

    Under :func:`update`'s lock, written atomically with the file's mode kept. Only that row
    goes: the others are written back as the file held them (their order, their numbers, any
    key this hidvfs does not read). Raises :class:`ProfileNotFound` (with an absent store
    too), ValueError for a name the store could not hold or one stored for several boards
    without ``board``, SpecError for a file that is not a store."""
    check_name(name)
    path = os.fspath(path)
    if not os.path.exists(path):  # nothing to remove, and no lock file to make
        raise ProfileNotFound(f"no profile {name!r} in {path}: the store is empty")
    with _open_lock(path) as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        data = _read(path, missing_ok=True)
        store = ProfileStore() if data is None else _parse(data, path)
        gone = lookup(store, name, board, where=path)
        if len(gone) > 1:
            raise ValueError(
                f"{name!r} has profiles for the boards {', '.join(b for b, _ in gone)} in "
                f"{path}; give --board to say which to remove"
            )
        assert isinstance(data, dict)  # _parse accepted it and found the profile in it
        data["profiles"] = [
            r for r in data["profiles"] if (r["name"], r["board"]) != (name, gone[0][0])
        ]
        try:
            write_text_atomic(path, _dump(data), mode=kept_mode(path))
        except OSError as err:  # an immutable file, a read-only mount: the store is as it was
            raise ValueError(
                f"{path}: cannot rewrite it ({err.strerror or err}); nothing was removed"
            ) from None
    return gone


__all__ = [
    "ProfileStore",
    "load",
    "save",
    "slowdown",
    "work_at",
    "work_bound",
    "span_at",
    "span_within",
    "span_bound",
    "span_terms",
    "soft_deadline",
    "check_profile",
    "check_name",
    "check_provenance",
    "update",
    "remove",
    "lookup",
    "ProfileNotFound",
    "profile_from_dag",
]


#: an estimated progress never claims more than this: a job still running past its modelled
#: time keeps at least this share of its work on the books (the gate stays cautious)
PROGRESS_CAP = 0.9


@dataclass
class ProgressEstimate:
    """Progress of jobs a backend cannot report on (a real board), from their profiles: a
    lower bound on the work a greedy schedule has done on cores of its own, so the remaining
    work is not underestimated (the safe side for a deadline). Jobs that share cores (the
    gate's light pools) are credited their fair share of them (``cores`` below the pool's
    size, :func:`daemon.loop.core_shares`): an approximation, since a job below the others
    in real-time priority may get less. Without it every job would count as
    untouched until it ends and the gate would push its cluster to the top as its deadline
    nears.

    On n cores, each instant of a greedy schedule is either *complete* (all n cores busy:
    work fraction n dt / C(f)) or *incomplete* (every ready task runs, so the critical path
    shrinks: span fraction dt / L(f), and at least one core works: dt / C(f)); the
    incomplete instants add up to at most the whole span. The least work consistent with
    the history is a fractional knapsack: count as incomplete, up to that span, the
    intervals that lose the most work per unit of span, (n - 1) L(f) / C(f) first. (Adding
    dt / T per interval with T the Graham bound L + (C - L) / n, as before, ran ahead of a
    job in its serial phase, e.g. 68 % credited at 54 % done, and the gate then kept too few
    cores for its deadline.)"""

    #: pid -> {(cores, kHz, capacity): seconds run at that point}; cores may be a share
    #: (jobs on a shared pool: daemon.loop.core_shares), below one a part of one core
    runs: dict[int, dict[tuple[float, float, float], float]] = field(default_factory=dict)
    done: dict[int, float] = field(default_factory=dict)
    last_t: dict[int, float] = field(default_factory=dict)

    def advance(
        self, pid: int, profile: JobProfile, t: float, khz: float, capacity: float, cores: float
    ) -> float:
        prev = self.last_t.get(pid)
        self.last_t[pid] = t
        if prev is not None and t > prev and khz > 0 and cores > 0:
            history = self.runs.setdefault(pid, {})
            key = (round(float(cores), 6), float(khz), float(capacity))
            history[key] = history.get(key, 0.0) + (t - prev)
            frac = min(work_done_lower_bound(profile, history), PROGRESS_CAP)
            self.done[pid] = max(self.done.get(pid, 0.0), frac)
        return self.done.setdefault(pid, 0.0)

    def forget(self, pid: int) -> None:
        self.done.pop(pid, None)
        self.last_t.pop(pid, None)
        self.runs.pop(pid, None)


def work_done_lower_bound(
    profile: JobProfile, history: dict[tuple[float, float, float], float]
) -> float:
    """The least fraction of ``profile``'s work a greedy schedule has done after running
    ``history`` ({(cores, kHz, capacity): seconds}) (:class:`ProgressEstimate`)."""
    full, options = 0.0, []
    for (cores, khz, capacity), secs in history.items():
        c, span = work_at(profile, khz, capacity), span_at(profile, khz, capacity)
        if not (c > 0 and secs > 0):
            continue
        full += cores * secs / c
        if cores > 1 and span > 0:
            # incomplete there: span fraction secs / span, work lost (cores - 1) secs / c
            options.append(((cores - 1) * span / c, secs / span, (cores - 1) * secs / c))
    budget = 1.0  # the whole critical path, as a fraction
    for _ratio, span_frac, lost in sorted(options, reverse=True):
        if budget <= 0:
            break
        share = min(1.0, budget / span_frac)
        full -= share * lost
        budget -= share * span_frac
    return max(full, 0.0)
