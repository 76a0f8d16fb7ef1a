"""Save the board's original cpufreq settings before the first write, give them back on stop.

The snapshot holds, per cpufreq policy, ``scaling_governor``, ``scaling_min_freq``,
``scaling_max_freq`` (plus ``scaling_setspeed`` when the governor is ``userspace``) and every
``cpuN/online``. It is written atomically to ``<state_dir>/restore.json`` before the daemon
changes anything, and deleted only after a complete restore, so after a crash or a watchdog kill
the next start finds it and restores the true originals first (daemons.md section 10).

Restore undoes the changes in reverse order (limits and setspeed, then the governor), each
write on its own: a failure is logged and reported, and the rest still runs. CPUs that have to
come back online are onlined first, because an offline CPU has no cpufreq files
(boards.md 1.1); CPUs that were offline originally are offlined last. ``scaling_min_freq`` and
``scaling_max_freq`` are written in the order that keeps min <= max after every single write.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone

from daemon.statusfile import write_json_atomic
from platforms import paths
from platforms.atomicfile import fsync_dir
from platforms.errors import HidvfsError, SysfsUnavailable, SysfsWriteError
from platforms.spec import BoardSpec
from platforms.sysfs import SysfsBackend

FILE_NAME = "restore.json"
FORMAT = "hidvfs-restore"
VERSION = 1

_CPU_DIR = re.compile(r"^cpu(\d+)$")
_POLICY_DIR = re.compile(r"^policy(\d+)$")


class SnapshotError(HidvfsError):
    """restore.json is unreadable, corrupt or of an unknown version (names the file)."""


class SnapshotVersionError(SnapshotError):
    """restore.json was written by another hidvfs version: readable to it, not to us. It may
    hold a crashed run's originals, so it is never moved aside: the start is refused."""


@dataclass(frozen=True)
class PolicySnapshot:
    """Original values of one policy, as the kernel printed them (``None`` = unreadable)."""

    policy: int
    governor: str | None
    min_khz: str | None
    max_khz: str | None
    setspeed_khz: str | None = None  # only when the governor was ``userspace``


@dataclass(frozen=True)
class Snapshot:
    policies: tuple[PolicySnapshot, ...]
    #: cpu id -> "1"/"0" for every cpuN that has an ``online`` file
    online: dict[int, str] = field(default_factory=dict)
    taken: str = ""
    pid: int = 0
    #: the tree the settings were read from (its real path; None: not a folder, or a file
    #: written before this was recorded): they are put back on that tree only
    root: str | None = None

    def to_json(self) -> dict:
        out = {
            "format": FORMAT,
            "version": VERSION,
            "taken": self.taken,
            "pid": self.pid,
            "policies": [asdict(p) for p in self.policies],
            "online": {str(k): v for k, v in sorted(self.online.items())},
        }
        if self.root is not None:
            out["root"] = self.root
        return out

    @classmethod
    def from_json(cls, data: object, file: str = FILE_NAME) -> Snapshot:
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise SnapshotError(f"{file}: not a hidvfs restore snapshot")
        if data.get("version") != VERSION:
            raise SnapshotVersionError(
                f"{file}: unknown snapshot version {data.get('version')!r} (this hidvfs reads "
                f"{VERSION}): another hidvfs version left it and it may hold the board's original "
                "settings; start that version to give them back, or check the cpufreq settings "
                "by hand and delete the file"
            )
        try:
            policies = tuple(
                PolicySnapshot(
                    policy=int(p["policy"]),
                    governor=_opt_str(p.get("governor")),
                    min_khz=_opt_str(p.get("min_khz")),
                    max_khz=_opt_str(p.get("max_khz")),
                    setspeed_khz=_opt_str(p.get("setspeed_khz")),
                )
                for p in data["policies"]
            )
            online = {int(k): str(v) for k, v in dict(data.get("online", {})).items()}
        except (KeyError, TypeError, ValueError) as err:
            raise SnapshotError(f"{file}: malformed snapshot ({err!r})") from None
        for p in policies:  # the kernel never holds min > max: such a file is not originals
            mn, mx = _int_or_none(p.min_khz), _int_or_none(p.max_khz)
            if mn is not None and mx is not None and mn > mx:
                raise SnapshotError(
                    f"{file}: policy{p.policy} min_khz {mn} > max_khz {mx}: not a snapshot "
                    "of a board"
                )
        root = data.get("root")
        if root is not None and not isinstance(root, str):
            raise SnapshotError(f"{file}: malformed snapshot (root {root!r} is not a path)")
        return cls(policies, online, str(data.get("taken", "")), int(data.get("pid", 0) or 0), root)


def _opt_str(v: object) -> str | None:
    return None if v is None else str(v)


@dataclass(frozen=True)
class Write:
    """One planned restore write."""

    path: str
    value: str


@dataclass
class RestoreReport:
    restored: list[str] = field(default_factory=list)  # paths written back
    unchanged: list[str] = field(default_factory=list)  # already at the original value
    failed: list[tuple[str, str]] = field(default_factory=list)  # (path, reason)

    @property
    def ok(self) -> bool:
        return not self.failed

    def summary(self) -> str:
        return f"restored={len(self.restored)} unchanged={len(self.unchanged)} failed={len(self.failed)}"


# --------------------------------------------------------------------------------------------
# Taking and saving


def discover_policies(sysfs: SysfsBackend) -> tuple[int, ...]:
    return tuple(
        sorted(int(m.group(1)) for n in sysfs.list(paths.CPUFREQ) if (m := _POLICY_DIR.match(n)))
    )


def discover_online_files(sysfs: SysfsBackend) -> tuple[int, ...]:
    cpus = (int(m.group(1)) for n in sysfs.list(paths.CPU) if (m := _CPU_DIR.match(n)))
    return tuple(sorted(c for c in cpus if sysfs.exists(paths.cpu_online(c))))


def _policies_of(
    sysfs: SysfsBackend, spec_or_policies: BoardSpec | Iterable[int] | None
) -> tuple[int, ...]:
    if spec_or_policies is None:
        return discover_policies(sysfs)
    if isinstance(spec_or_policies, BoardSpec):
        wanted = {c.policy for c in spec_or_policies.clusters}
    else:
        wanted = {int(p) for p in spec_or_policies}
    # a policy the tree shows but the spec lacks is still ours to give back
    return tuple(sorted(wanted | set(discover_policies(sysfs))))


#: reads of an original value before it counts as unreadable (EAGAIN and ENODATA pass)
ORIGINAL_READS = 3


def _read_original(sysfs: SysfsBackend, path: str) -> str | None:
    for _ in range(ORIGINAL_READS):
        v = sysfs.read_or(path)
        if v is not None:
            return v
    return None


def take_snapshot(
    sysfs: SysfsBackend, spec_or_policies: BoardSpec | Iterable[int] | None = None
) -> Snapshot:
    """Read the current (original) settings; unreadable values are recorded as ``None``."""
    policies = []
    for p in _policies_of(sysfs, spec_or_policies):
        gov = _read_original(sysfs, paths.policy_file(p, "scaling_governor"))
        setspeed = (
            _read_original(sysfs, paths.policy_file(p, "scaling_setspeed"))
            if gov == "userspace"
            else None
        )
        policies.append(
            PolicySnapshot(
                policy=p,
                governor=gov,
                min_khz=_read_original(sysfs, paths.policy_file(p, "scaling_min_freq")),
                max_khz=_read_original(sysfs, paths.policy_file(p, "scaling_max_freq")),
                setspeed_khz=setspeed,
            )
        )
    online = {}
    for cpu in discover_online_files(sysfs):
        v = sysfs.read_or(paths.cpu_online(cpu))
        if v in ("0", "1"):
            online[cpu] = v
    taken = datetime.now(timezone.utc).isoformat(timespec="seconds")
    return Snapshot(tuple(policies), online, taken, os.getpid(), tree_root(sysfs))


def tree_root(sysfs: SysfsBackend) -> str | None:
    """The real path of the folder ``sysfs`` reads (None for a backend without one)."""
    root = getattr(sysfs, "root", None)
    return os.path.realpath(root) if isinstance(root, str) else None


def unrestorable(sysfs: SysfsBackend, snapshot: Snapshot) -> list[str]:
    """Files the daemon may write whose original value the snapshot lacks: a policy that is
    there (its folder exists) with an unreadable governor, minimum or maximum, or a userspace
    governor without a readable setspeed. Writing one of them would leave a setting nobody
    can give back. A policy the tree does not show is not listed: nothing writes it."""
    out = []
    for p in snapshot.policies:
        if not sysfs.exists(paths.policy_dir(p.policy)):
            continue
        values = {
            "scaling_governor": p.governor,
            "scaling_min_freq": p.min_khz,
            "scaling_max_freq": p.max_khz,
        }
        if p.governor == "userspace":
            values["scaling_setspeed"] = p.setspeed_khz
        out += [paths.policy_file(p.policy, n) for n, v in values.items() if v is None]
    return out


def snapshot_path(state_dir: str | os.PathLike[str]) -> str:
    return os.path.join(os.fspath(state_dir), FILE_NAME)


def save_snapshot(snapshot: Snapshot, state_dir: str | os.PathLike[str]) -> str:
    """Write ``restore.json`` atomically (temp file + fsync + rename + fsync of the folder)."""
    return write_json_atomic(
        snapshot_path(state_dir), snapshot.to_json(), dir_mode=0o700, durable_dir=True
    )


def load_snapshot(state_dir: str | os.PathLike[str]) -> Snapshot | None:
    """The saved snapshot, ``None`` when there is none; SnapshotError when it is corrupt."""
    path = snapshot_path(state_dir)
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        raise SnapshotError(f"{path}: unreadable snapshot ({err})") from None
    return Snapshot.from_json(data, path)


def discard_snapshot(state_dir: str | os.PathLike[str]) -> None:
    try:
        os.unlink(snapshot_path(state_dir))
    except FileNotFoundError:
        pass
    fsync_dir(os.fspath(state_dir))


# --------------------------------------------------------------------------------------------
# Ordered writes


def ordered_limits(
    cur_min: int | None, cur_max: int | None, new_min: int, new_max: int
) -> list[str]:
    """Which of ``scaling_min_freq``/``scaling_max_freq`` to write first so min <= max holds
    after every write: raising the range writes max first, lowering it writes min first.

    With an unknown current range the old cpufreq guide's order (max, then min) is used.
    """
    if new_min > new_max:
        raise ValueError(f"min {new_min} kHz > max {new_max} kHz")
    if cur_max is None or cur_min is None:
        return ["scaling_max_freq", "scaling_min_freq"]
    if new_min > cur_max:
        return ["scaling_max_freq", "scaling_min_freq"]
    return ["scaling_min_freq", "scaling_max_freq"]


def _int_or_none(text: str | None) -> int | None:
    try:
        return int(text.split()[0]) if text else None
    except (ValueError, IndexError):
        return None


def _limit_writes(sysfs: SysfsBackend, p: PolicySnapshot) -> list[Write]:
    mn, mx = _int_or_none(p.min_khz), _int_or_none(p.max_khz)
    targets = {"scaling_min_freq": p.min_khz, "scaling_max_freq": p.max_khz}
    if mn is not None and mx is not None and mn <= mx:
        cur_min = _int_or_none(sysfs.read_or(paths.policy_file(p.policy, "scaling_min_freq")))
        cur_max = _int_or_none(sysfs.read_or(paths.policy_file(p.policy, "scaling_max_freq")))
        order = ordered_limits(cur_min, cur_max, mn, mx)
    elif mn is not None and mx is not None:  # min > max: never write an inverted pair
        order = ["scaling_max_freq"]
    else:
        order = ["scaling_max_freq", "scaling_min_freq"]
    return [
        Write(paths.policy_file(p.policy, n), targets[n]) for n in order if targets[n] is not None
    ]


def restore_plan(sysfs: SysfsBackend, snapshot: Snapshot) -> list[Write]:
    """The writes that bring the tree back to ``snapshot``, in the order they must happen.

    The order is computed against the current values, so call it right before restoring.
    """
    plan: list[Write] = []
    current_online = {c: sysfs.read_or(paths.cpu_online(c)) for c in snapshot.online}
    # 1. CPUs that must come back online first: their cpufreq files exist only while online.
    for cpu, value in sorted(snapshot.online.items()):
        if value == "1" and current_online.get(cpu) != "1":
            plan.append(Write(paths.cpu_online(cpu), "1"))
    # 2. Per policy, last changed first: setspeed/limits, then the governor, then the
    #    original setspeed (only writable under userspace, so after the governor).
    for p in sorted(snapshot.policies, key=lambda x: x.policy, reverse=True):
        plan.extend(_limit_writes(sysfs, p))
        if p.governor is not None:
            plan.append(Write(paths.policy_file(p.policy, "scaling_governor"), p.governor))
        if p.governor == "userspace" and p.setspeed_khz is not None:
            plan.append(Write(paths.policy_file(p.policy, "scaling_setspeed"), p.setspeed_khz))
    # 3. CPUs that were offline originally go offline last.
    for cpu, value in sorted(snapshot.online.items(), reverse=True):
        if value == "0" and current_online.get(cpu) != "0":
            plan.append(Write(paths.cpu_online(cpu), "0"))
    return plan


def _same(current: str | None, target: str) -> bool:
    """Equal as sysfs values: numbers compare as numbers (``0960000`` == ``960000``)."""
    if current is None:
        return False
    a, b = current.strip(), target.strip()
    if a.isdigit() and b.isdigit():
        return int(a) == int(b)
    return a == b


def restore_snapshot(
    sysfs: SysfsBackend,
    snapshot: Snapshot,
    log: logging.Logger,
    state_dir: str | os.PathLike[str] | None = None,
) -> RestoreReport:
    """Write every original value back, each on its own; with ``state_dir``, delete
    ``restore.json`` once everything is restored (kept otherwise, for the next attempt)."""
    report = RestoreReport()
    for w in restore_plan(sysfs, snapshot):
        try:
            if _same(sysfs.read_or(w.path), w.value):
                report.unchanged.append(w.path)
                continue
            sysfs.write(w.path, w.value)
            report.restored.append(w.path)
            log.debug("event=restore_write path=%s value=%s", w.path, w.value)
        except (SysfsWriteError, SysfsUnavailable, OSError) as err:
            report.failed.append((w.path, str(err)))
            log.error("event=restore_failed path=%s value=%s error=%r", w.path, w.value, str(err))
        except Exception as err:  # noqa: BLE001 - one broken item must not stop the rest
            report.failed.append((w.path, f"{type(err).__name__}: {err}"))
            log.exception("event=restore_failed path=%s value=%s", w.path, w.value)
    level = logging.INFO if report.ok else logging.ERROR
    log.log(level, "event=restore_done %s", report.summary())
    if state_dir is not None and report.ok:
        discard_snapshot(state_dir)
    return report


def recover_stale(
    sysfs: SysfsBackend, state_dir: str | os.PathLike[str], log: logging.Logger
) -> RestoreReport | None:
    """At start: if ``restore.json`` survived the last run (crash, watchdog kill), restore it
    and delete it. Returns ``None`` when there was nothing to recover.

    A corrupt file is moved aside (``restore.json.corrupt``) so it cannot block every start
    (it is written atomically, so only a damaged disk or a hand edit makes one). A file of
    another version is refused (SnapshotVersionError): that version can still read it.
    A partial restore keeps the file: it still holds the true originals.
    """
    try:
        snap = load_snapshot(state_dir)
    except SnapshotVersionError:
        raise
    except SnapshotError as err:
        aside = snapshot_path(state_dir) + ".corrupt"
        try:
            os.replace(snapshot_path(state_dir), aside)
        except OSError as move_err:
            aside = f"not moved ({move_err.strerror})"
        log.error("event=restore_corrupt error=%r moved_to=%r", str(err), aside)
        return None
    if snap is None:
        return None
    here = tree_root(sysfs)
    if snap.root is not None and here is not None and snap.root != here:
        # another tree's originals (a fake tree's, say) must never land on this one; the
        # file stays for a start on its own tree
        raise SnapshotError(
            f"{snapshot_path(state_dir)} holds the original settings of the tree {snap.root}, "
            f"not of {here}: start once with --sysfs-root {snap.root} to give them back there, "
            "or use another state dir"
        )
    log.warning(
        "event=restore_stale taken=%s pid=%d detail=%r",
        snap.taken or "?",
        snap.pid,
        "the previous run did not restore; restoring its snapshot first",
    )
    return restore_snapshot(sysfs, snap, log, state_dir=state_dir)


def begin_session(
    sysfs: SysfsBackend,
    spec_or_policies: BoardSpec | Iterable[int] | None,
    state_dir: str | os.PathLike[str],
    log: logging.Logger,
) -> Snapshot:
    """Everything the daemon does before its first write, in one call: recover a stale
    snapshot, then take and save the originals (SnapshotError, before any write, when a file
    it may write has no readable original: :func:`unrestorable`).

    If the stale snapshot could not be fully restored, it is adopted as this run's snapshot
    (the tree now holds our own leftovers, not the originals), so a crash loop never overwrites
    the true originals.
    """
    stale = recover_stale(sysfs, state_dir, log)
    if stale is not None and not stale.ok:
        adopted = load_snapshot(state_dir)
        if adopted is not None:
            log.warning(
                "event=restore_adopted detail=%r",
                "keeping the previous originals for the next restore",
            )
            return adopted
    snap = take_snapshot(sysfs, spec_or_policies)
    missing = unrestorable(sysfs, snap)
    if missing:
        raise SnapshotError(
            f"cannot read the original value of {', '.join(missing)} "
            f"({ORIGINAL_READS} tries): hidvfs takes control only of settings it can give back; "
            "check that the file is readable (cat it) and start again"
        )
    save_snapshot(snap, state_dir)
    log.info(
        "event=snapshot_saved policies=%d cpus_online_files=%d path=%s",
        len(snap.policies),
        len(snap.online),
        snapshot_path(state_dir),
    )
    return snap


# --------------------------------------------------------------------------------------------
# Drift


def detect_drift(sysfs: SysfsBackend, expected: dict[str, str]) -> list[str]:
    """Files whose value is no longer what we last wrote (nvpmodel, jetson_clocks, another
    tool changed them behind our back). One message per file, naming both values."""
    out = []
    for path, want in sorted(expected.items()):
        try:
            got = sysfs.read(path)
        except SysfsUnavailable as err:
            out.append(f"{path}: expected {want!r}, now unavailable ({err.reason})")
            continue
        if not _same(got, want):
            out.append(f"{path}: expected {want!r}, found {got!r} (changed by another tool?)")
    return out


def expected_from_snapshot(snapshot: Snapshot) -> dict[str, str]:
    """The snapshot as a path -> value map (to check nothing moved before we start)."""
    out: dict[str, str] = {}
    for p in snapshot.policies:
        for name, v in (
            ("scaling_governor", p.governor),
            ("scaling_min_freq", p.min_khz),
            ("scaling_max_freq", p.max_khz),
            ("scaling_setspeed", p.setspeed_khz),
        ):
            if v is not None:
                out[paths.policy_file(p.policy, name)] = v
    for cpu, v in snapshot.online.items():
        out[paths.cpu_online(cpu)] = v
    return out
