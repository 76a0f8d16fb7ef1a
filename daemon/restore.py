"""Save the board's original cpufreq settings before the first write, give them back on stop.

The snapshot holds, per cpufreq policy, ``scaling_governor``, ``scaling_min_freq``,
``scaling_max_freq`` (plus ``scaling_setspeed`` when the governor is ``userspace``) and every
``cpuN/online``. It is written atomically to ``<state_dir>/restore.json`` before the daemon
changes anything, and deleted only after a complete restore, so after a crash or a watchdog kill
the next start finds it and restores the true originals first (daemons.md section 10).

Only what hidvfs changed is given back. A running session (:class:`Session`) records, before
the first write to each file, that the file is the daemon's (``touched``), and takes a
policy's originals then if it had none: a policy whose CPUs were all offline at the start
(the TX2's Denver in its default nvpmodel mode) gets its snapshot when they come online and
before hidvfs writes it. ``cpuN/online`` is never the daemon's: an nvpmodel mode change during
a run stays as the operator made it (boards.md 5.1).

Restore undoes the changes in reverse order (limits and setspeed, then the governor), each
write on its own: a failure is logged and reported, and the rest still runs. A policy whose
CPUs are all offline when it is restored has no cpufreq files (boards.md 1.1): one of its CPUs
is brought online for the writes and taken offline again after them. ``scaling_min_freq`` and
``scaling_max_freq`` are written in the order that keeps min <= max after every single write;
an original minimum above its maximum (a broken or fake tree) is never written back, and the
report counts it as skipped.
A snapshot without ``touched`` (an earlier hidvfs's file, or one taken outside a session)
gives back every policy file it holds.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone

from daemon.statusfile import write_json_atomic
from platforms import cpufreq, paths
from platforms.atomicfile import fsync_dir
from platforms.errors import HidvfsError, SysfsUnavailable, SysfsWriteError
from platforms.liveprocs import boot_id
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
    #: the policy's CPUs (``related_cpus``) when the snapshot was taken: what to bring online
    #: to restore it when they are all offline (empty: unknown)
    cpus: tuple[int, ...] = ()
    #: the policy files hidvfs wrote (names, e.g. ``scaling_governor``): only they are given
    #: back. None: every file (a snapshot of an earlier hidvfs, or taken outside a session)
    touched: tuple[str, ...] | None = None

    @property
    def unknown(self) -> tuple[str, ...]:
        """The files hidvfs may write whose original value is not known (the setspeed only
        under a userspace governor: it is given back only then)."""
        values = {
            "scaling_governor": self.governor,
            "scaling_min_freq": self.min_khz,
            "scaling_max_freq": self.max_khz,
        }
        if self.governor == "userspace":
            values["scaling_setspeed"] = self.setspeed_khz
        return tuple(n for n, v in values.items() if v is None)

    @property
    def complete(self) -> bool:
        """Every original hidvfs may have to give back is known."""
        return not self.unknown


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
    #: the boot they were read in, on the live tree only: the kernel forgets cpufreq settings
    #: at a reboot, so after one the snapshot describes nothing on the board any more
    boot_id: str | None = None

    def to_json(self) -> dict:
        out = {
            "format": FORMAT,
            "version": VERSION,
            "taken": self.taken,
            "pid": self.pid,
            "policies": [_policy_json(p) for p in self.policies],
            "online": {str(k): v for k, v in sorted(self.online.items())},
        }
        if self.root is not None:
            out["root"] = self.root
        if self.boot_id is not None:
            out["boot_id"] = self.boot_id
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
                    cpus=tuple(int(c) for c in p.get("cpus") or ()),
                    touched=None
                    if p.get("touched") is None
                    else tuple(_touched_name(n) for n in p["touched"]),
                )
                for p in data["policies"]
            )
            online = {int(k): str(v) for k, v in dict(data.get("online", {})).items()}
        except (KeyError, TypeError, ValueError) as err:
            raise SnapshotError(f"{file}: malformed snapshot ({err!r})") from None
        for p in policies:  # the kernel never holds min > max: such a file is not originals
            if _inverted_pair(p):
                mn, mx = p.min_khz, p.max_khz
                raise SnapshotError(
                    f"{file}: policy{p.policy} min_khz {mn} > max_khz {mx}: not a snapshot "
                    "of a board"
                )
        root = data.get("root")
        if root is not None and not isinstance(root, str):
            raise SnapshotError(f"{file}: malformed snapshot (root {root!r} is not a path)")
        boot = data.get("boot_id")
        if boot is not None and not isinstance(boot, str):
            raise SnapshotError(f"{file}: malformed snapshot (boot_id {boot!r} is not a string)")
        return cls(
            policies,
            online,
            str(data.get("taken", "")),
            int(data.get("pid", 0) or 0),
            root,
            boot,
        )


def _opt_str(v: object) -> str | None:
    return None if v is None else str(v)


#: the policy files hidvfs writes (and so may give back)
POLICY_FILES = ("scaling_governor", "scaling_min_freq", "scaling_max_freq", "scaling_setspeed")


def _touched_name(name: object) -> str:
    if name not in POLICY_FILES:
        raise ValueError(f"touched file {name!r} is not one of {', '.join(POLICY_FILES)}")
    return str(name)


def _policy_json(p: PolicySnapshot) -> dict:
    out = asdict(p)
    out["cpus"] = list(p.cpus)
    if p.touched is None:
        del out["touched"]
    else:
        out["touched"] = list(p.touched)
    return out


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
    #: (path, reason) of originals no write can give back (an inverted min/max pair): not a
    #: failure, since a retry cannot do better, but never counted as unchanged either
    skipped: list[tuple[str, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failed

    def summary(self) -> str:
        skipped = f" skipped={len(self.skipped)}" if self.skipped else ""
        return (
            f"restored={len(self.restored)} unchanged={len(self.unchanged)}{skipped} "
            f"failed={len(self.failed)}"
        )


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
    """Exact reads only (:meth:`~platforms.sysfs.SysfsBackend.read_exact`): a value that did
    not decode cleanly would be given back as other bytes, so it counts as unreadable."""
    for _ in range(ORIGINAL_READS):
        try:
            return sysfs.read_exact(path)
        except SysfsUnavailable:
            pass
    return None


def _policy_cpus(
    sysfs: SysfsBackend, policy: int, spec_or_policies: BoardSpec | Iterable[int] | None = None
) -> tuple[int, ...]:
    """The policy's CPUs: ``related_cpus`` (online and offline ones), else the spec's."""
    text = sysfs.read_or(paths.policy_file(policy, "related_cpus"))
    try:
        if text:
            return tuple(sorted(int(c) for c in text.split()))
    except ValueError:
        pass
    if isinstance(spec_or_policies, BoardSpec):
        for c in spec_or_policies.clusters:
            if c.policy == policy:
                return tuple(c.cpus)
    return ()


def read_policy_originals(
    sysfs: SysfsBackend, policy: int, spec_or_policies: BoardSpec | Iterable[int] | None = None
) -> PolicySnapshot:
    """One policy's current settings (unreadable values ``None``), nothing marked touched."""
    gov = _read_original(sysfs, paths.policy_file(policy, "scaling_governor"))
    setspeed = (
        _read_original(sysfs, paths.policy_file(policy, "scaling_setspeed"))
        if gov == "userspace"
        else None
    )
    return PolicySnapshot(
        policy=policy,
        governor=gov,
        min_khz=_read_original(sysfs, paths.policy_file(policy, "scaling_min_freq")),
        max_khz=_read_original(sysfs, paths.policy_file(policy, "scaling_max_freq")),
        setspeed_khz=setspeed,
        cpus=_policy_cpus(sysfs, policy, spec_or_policies),
    )


def take_snapshot(
    sysfs: SysfsBackend, spec_or_policies: BoardSpec | Iterable[int] | None = None
) -> Snapshot:
    """Read the current (original) settings; unreadable values are recorded as ``None``.
    Nothing is marked touched: every file is given back until a :class:`Session` narrows it."""
    policies = [
        read_policy_originals(sysfs, p, spec_or_policies)
        for p in _policies_of(sysfs, spec_or_policies)
    ]
    online = {}
    for cpu in discover_online_files(sysfs):
        v = sysfs.read_or(paths.cpu_online(cpu))
        if v in ("0", "1"):
            online[cpu] = v
    taken = datetime.now(timezone.utc).isoformat(timespec="seconds")
    root = tree_root(sysfs)
    boot = boot_id() if root == LIVE_ROOT else None
    return Snapshot(tuple(policies), online, taken, os.getpid(), root, boot)


#: the real path of the board's own tree (a fake tree's settings outlive a reboot)
LIVE_ROOT = "/"


def tree_root(sysfs: SysfsBackend) -> str | None:
    """The real path of the folder ``sysfs`` reads (None for a backend without one)."""
    root = getattr(sysfs, "root", None)
    return os.path.realpath(root) if isinstance(root, str) else None


def _inactive(p: PolicySnapshot, online: frozenset[int]) -> bool:
    """Every CPU of the policy is offline (``online``: the online CPUs, read once per call
    of the caller): the daemon does not write it, and its folder may stay visible with
    unreadable files (boards.md 1.1)."""
    return bool(p.cpus) and not online.intersection(p.cpus)


def unrestorable(sysfs: SysfsBackend, snapshot: Snapshot) -> list[str]:
    """Files the daemon may write whose original value the snapshot lacks: a policy that is
    there (its folder exists) with an unreadable governor, minimum or maximum, or a userspace
    governor without a readable setspeed. Writing one of them would leave a setting nobody
    can give back. A policy the tree does not show, or whose CPUs are all offline, is not
    listed: nothing writes it now, and a :class:`Session` reads its originals when its CPUs
    come online, before the first write."""
    out = []
    online = frozenset(cpufreq.online_cpus(sysfs))
    for p in snapshot.policies:
        if not sysfs.exists(paths.policy_dir(p.policy)) or _inactive(p, online):
            continue
        out += [paths.policy_file(p.policy, n) for n in p.unknown]
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


def _inverted_pair(p: PolicySnapshot) -> bool:
    """Whether ``p`` holds a minimum above its maximum (only a broken or fake tree shows one)."""
    mn, mx = _int_or_none(p.min_khz), _int_or_none(p.max_khz)
    return mn is not None and mx is not None and mn > mx


def _inverted_min(p: PolicySnapshot) -> str | None:
    """The path of an original minimum above its maximum that hidvfs wrote over: only a
    broken or fake tree shows such a pair and kernels refuse to write one, so the restore
    gives back the maximum alone (None when there is no such file)."""
    if not _inverted_pair(p):
        return None
    if p.touched is not None and "scaling_min_freq" not in p.touched:
        return None
    return paths.policy_file(p.policy, "scaling_min_freq")


def _policy_writes(sysfs: SysfsBackend, p: PolicySnapshot) -> list[Write]:
    """Last changed first: setspeed/limits, then the governor, then the original setspeed
    (only writable under userspace, so after the governor); only the files hidvfs wrote."""
    writes = _limit_writes(sysfs, p)
    if p.governor is not None:
        writes.append(Write(paths.policy_file(p.policy, "scaling_governor"), p.governor))
    if p.governor == "userspace" and p.setspeed_khz is not None:
        writes.append(Write(paths.policy_file(p.policy, "scaling_setspeed"), p.setspeed_khz))
    if p.touched is not None:
        mine = {paths.policy_file(p.policy, n) for n in p.touched}
        writes = [w for w in writes if w.path in mine]
    return writes


def restore_plan(sysfs: SysfsBackend, snapshot: Snapshot) -> list[Write]:
    """The writes that bring the tree back to ``snapshot``, in the order they must happen.

    The order is computed against the current values, so call it right before restoring.
    ``cpuN/online`` is written only around a policy whose CPUs are all offline now: one of
    them comes online before its writes and goes offline again after them.
    """
    plan: list[Write] = []
    woken: list[int] = []
    online = frozenset(cpufreq.online_cpus(sysfs))
    for p in sorted(snapshot.policies, key=lambda x: x.policy, reverse=True):
        writes = _policy_writes(sysfs, p)
        if writes and _inactive(p, online):
            cpu = next((c for c in p.cpus if c != 0), None)
            if cpu is not None:
                plan.append(Write(paths.cpu_online(cpu), "1"))
                woken.append(cpu)
        plan.extend(writes)
    plan.extend(Write(paths.cpu_online(cpu), "0") for cpu in woken)
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
    for p in snapshot.policies:  # after the writes: what each such minimum is left at
        path = _inverted_min(p)
        if path is None:
            continue
        now = sysfs.read_or(path)
        if _same(now, p.min_khz):
            report.unchanged.append(path)
            continue
        why = f"original min {p.min_khz} > max {p.max_khz} kHz: kernels refuse that pair"
        report.skipped.append((path, why))
        log.warning(
            "event=restore_skipped policy=%d min_khz=%s max_khz=%s now=%s detail=%r",
            p.policy,
            p.min_khz,
            p.max_khz,
            now,
            f"scaling_min_freq not restored: {why}",
        )
    level = logging.ERROR if not report.ok else logging.WARNING if report.skipped else logging.INFO
    log.log(level, "event=restore_done %s", report.summary())
    if state_dir is not None and report.ok:
        try:
            discard_snapshot(state_dir)
        except OSError as err:  # a read-only state dir: the board is back all the same
            log.warning(
                "event=restore_file_kept path=%s error=%r detail=%r",
                snapshot_path(state_dir),
                err.strerror,
                "restored, but the file could not be deleted; the next start restores it again "
                "(no change then)",
            )
    return report


_BOOT_ID_RE = re.compile(rb'"boot_id"\s*:\s*"([0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12})"')


def _before_this_boot(path: str) -> bool:
    """Was the damaged snapshot ``path`` written before the machine booted? Its ``boot_id``
    when the damage left that field readable, else its mtime against psutil's boot time. The
    clocks alone can be wrong: a board without a battery-backed clock writes the file at a
    time from before NTP stepped the clock forward, and the file then looks older than the
    boot it was written in (and would be moved aside, its originals unrestored)."""
    import psutil

    try:
        with open(path, "rb") as f:
            found = _BOOT_ID_RE.search(f.read(1 << 20))
    except OSError:
        found = None
    now = boot_id()
    if found is not None and now is not None:
        return found.group(1).decode("ascii") != now
    try:
        return os.stat(path).st_mtime < psutil.boot_time()
    except (OSError, RuntimeError):
        return False


def recover_stale(
    sysfs: SysfsBackend, state_dir: str | os.PathLike[str], log: logging.Logger
) -> RestoreReport | None:
    """At start: if ``restore.json`` survived the last run (crash, watchdog kill), restore it
    and delete it. Returns ``None`` when there was nothing to recover.

    A corrupt file (it is written atomically, so only a damaged disk or a hand edit makes
    one) held the originals of a run that did not give them back, so the board may still
    hold that run's settings: the start is refused, the file left where it is, and the
    message says how to go on; a snapshot taken now would record those settings as the
    originals and "restore" them at the end. Only on the live tree, when the file predates
    this boot (the reboot reset what it described), is it moved aside
    (``restore.json.corrupt``) and the start goes on. A file of another version is refused
    (SnapshotVersionError): that version can still read it.
    A partial restore keeps the file: it still holds the true originals. A live tree's
    snapshot from an earlier boot is dropped unrestored: the reboot reset what it describes.
    """
    try:
        snap = load_snapshot(state_dir)
    except SnapshotVersionError:
        raise
    except SnapshotError as err:
        path = snapshot_path(state_dir)
        if not (tree_root(sysfs) == LIVE_ROOT and _before_this_boot(path)):
            log.error("event=restore_corrupt error=%r path=%s", str(err), path)
            raise SnapshotError(
                f"{err}. It held the original cpufreq settings of a run that did not give "
                "them back, so the board may still hold that run's settings (governors "
                "'userspace', pinned limits). Set them back by hand (the board's defaults: "
                "`hidvfs boards`) or reboot, then move the file away "
                f"(mv {path} {path}.corrupt) and start again"
            ) from err
        aside = path + ".corrupt"
        try:
            os.replace(path, aside)
        except OSError as move_err:
            aside = f"not moved ({move_err.strerror})"
        log.warning(
            "event=restore_corrupt_other_boot error=%r moved_to=%r detail=%r",
            str(err),
            aside,
            "written before this boot, whose settings the reboot reset",
        )
        return None
    if snap is None:
        return None
    here = tree_root(sysfs)
    now_boot = boot_id() if here == LIVE_ROOT else None
    if snap.boot_id is not None and now_boot is not None and snap.boot_id != now_boot:
        # the reboot reset every cpufreq setting, and the boot's own services (nvpmodel)
        # have set theirs since: writing the last boot's values would undo them
        log.warning(
            "event=restore_stale_other_boot taken=%s pid=%d detail=%r",
            snap.taken or "?",
            snap.pid,
            "the snapshot is from an earlier boot, whose settings the reboot reset; dropped",
        )
        try:
            discard_snapshot(state_dir)
        except OSError as err:  # a read-only state dir: the start is refused when it saves
            log.warning(
                "event=restore_file_kept path=%s error=%r", snapshot_path(state_dir), err.strerror
            )
        return None
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
    inverted = [p for p in snap.policies if _inverted_pair(p)]
    if inverted:  # a snapshot the restart after a crash would refuse; and not restorable
        p = inverted[0]
        raise SnapshotError(
            f"policy{p.policy} shows scaling_min_freq {p.min_khz} > scaling_max_freq "
            f"{p.max_khz} kHz, a pair no kernel holds or accepts: hidvfs takes control only of "
            "settings it can give back; fix the tree (a fake one?) and start again"
        )
    try:
        save_snapshot(snap, state_dir)
    except OSError as err:  # a full or read-only disk: refused before any write
        raise SnapshotError(
            f"cannot save the original settings to {snapshot_path(state_dir)} "
            f"({err.strerror or err}): hidvfs takes no control it could not give back after a "
            "crash; free the disk or give a writable --state-dir"
        ) from None
    log.info(
        "event=snapshot_saved policies=%d cpus_online_files=%d path=%s",
        len(snap.policies),
        len(snap.online),
        snapshot_path(state_dir),
    )
    return snap


class Session:
    """A running daemon's snapshot, kept on disk as the daemon writes (module docstring).

    :meth:`attach` routes an :class:`~daemon.actuator.Actuator`'s cpufreq writes through
    :meth:`cover` first. Until something is attached the snapshot gives back every file it
    holds, as a snapshot of an earlier hidvfs does, so a caller that forgets to attach loses
    nothing. An adopted snapshot (a crashed run's, whose restore failed: its ``pid`` is not
    ours) keeps what it records: its files are given back whatever this run writes.
    """

    def __init__(
        self,
        sysfs: SysfsBackend,
        snapshot: Snapshot,
        state_dir: str | os.PathLike[str],
        log: logging.Logger,
        spec: BoardSpec | Iterable[int] | None = None,
    ):
        self.sysfs = sysfs
        self.state_dir = state_dir
        self.log = log
        self.spec = spec
        self._snapshot = snapshot
        self._entries = {p.policy: p for p in snapshot.policies}
        #: policy -> the file names already covered (None: every file is given back anyway)
        self._covered: dict[int, frozenset[str] | None] = {}

    @property
    def snapshot(self) -> Snapshot:
        return self._snapshot

    def attach(self, actuator) -> None:
        """From now on only what ``actuator`` writes is given back (recorded before each
        first write); a fresh snapshot is saved marking nothing written yet."""
        actuator.before_write = self.cover
        actuator.outside_limits = self.adopt
        if self._snapshot.pid != os.getpid() or all(
            p.touched is not None for p in self._snapshot.policies
        ):
            return
        self._save(
            {
                k: p if p.touched is not None else replace(p, touched=())
                for k, p in self._entries.items()
            }
        )

    def cover(self, policy: int, names: Iterable[str]) -> None:
        """Call before writing ``names`` of ``policy``: marks them as hidvfs's and, when the
        snapshot lacks the policy's originals (its CPUs were offline at the start), reads
        them now; both are on disk before this returns. Raises :class:`SysfsUnavailable`
        (the write must not happen) when an original cannot be read or the file cannot be
        saved."""
        names = frozenset(names)
        done = self._covered.get(policy, frozenset())
        if done is None or names <= done:
            return
        entry = self._entries.get(policy)
        fresh = entry is None or not entry.complete
        if fresh:
            read = read_policy_originals(self.sysfs, policy, self.spec)
            missing = read.unknown
            if missing:
                raise SysfsUnavailable(
                    paths.policy_file(policy, missing[0]),
                    f"its original value cannot be read ({ORIGINAL_READS} tries), so hidvfs "
                    "does not write this policy: it could not give it back",
                )
            if _inverted_pair(read):  # as begin_session refuses it for the policies at start
                raise SysfsUnavailable(
                    paths.policy_file(policy, "scaling_min_freq"),
                    f"policy{policy} shows scaling_min_freq {read.min_khz} > scaling_max_freq "
                    f"{read.max_khz} kHz, a pair no kernel holds or accepts, so hidvfs does not "
                    "write this policy: it could not give it back (nor, saved, restore the rest "
                    "after a crash)",
                )
            entry = replace(read, touched=() if entry is None else entry.touched)
        if entry.touched is None:  # every file is given back anyway: nothing to mark
            covered = None
        else:
            covered = names | frozenset(entry.touched)
            entry = replace(entry, touched=tuple(sorted(covered)))
        if fresh or covered is not None:
            try:
                self._save({**self._entries, policy: entry})
            except OSError as err:  # a full disk: not on disk, so not written either
                raise SysfsUnavailable(
                    snapshot_path(self.state_dir),
                    f"cannot record policy{policy} in it ({err.strerror or err}), so hidvfs "
                    "does not write it: a crash could not give it back",
                ) from None
        self._covered[policy] = covered
        if fresh:
            self.log.info(
                "event=snapshot_extended policy=%d governor=%s min_khz=%s max_khz=%s",
                policy,
                entry.governor,
                entry.min_khz,
                entry.max_khz,
            )

    def adopt(self, policy: int, values: dict[str, str]) -> None:
        """Limits another tool set during the run (nvpmodel lowering a ceiling under a policy
        hidvfs pins min = max, with no userspace governor) replace the originals of those
        files: the stop gives back what the board is set to now, not what it was at the start.
        A snapshot that cannot be saved keeps the old originals (logged)."""
        entry = self._entries.get(policy)
        fields = {"scaling_min_freq": "min_khz", "scaling_max_freq": "max_khz"}
        if entry is None or not values:
            return
        adopted = replace(entry, **{fields[n]: v for n, v in values.items()})
        try:
            self._save({**self._entries, policy: adopted})
        except OSError as err:
            self.log.warning(
                "event=snapshot_not_adopted policy=%d detail=%s", policy, err.strerror or err
            )
            return
        self.log.info(
            "event=snapshot_adopted policy=%d %s",
            policy,
            " ".join(f"{n}={v}" for n, v in sorted(values.items())),
        )

    def _save(self, entries: dict[int, PolicySnapshot]) -> None:
        """``entries`` on disk, then in memory and :attr:`snapshot`: a save that fails (an
        OSError, raised) changes neither, so nothing needs rolling back."""
        snap = replace(self._snapshot, policies=tuple(entries[k] for k in sorted(entries)))
        save_snapshot(snap, self.state_dir)
        self._entries, self._snapshot = entries, snap


# --------------------------------------------------------------------------------------------
# Drift


def detect_drift(sysfs: SysfsBackend, expected: dict[str, str]) -> list[tuple[str, str]]:
    """Files whose value is no longer what we last wrote (nvpmodel, jetson_clocks, another
    tool changed them behind our back), in path order: (path, a message naming both
    values)."""
    out = []
    for path, want in sorted(expected.items()):
        try:
            got = sysfs.read(path)
        except SysfsUnavailable as err:
            out.append((path, f"{path}: expected {want!r}, now unavailable ({err.reason})"))
            continue
        if not _same(got, want):
            out.append(
                (path, f"{path}: expected {want!r}, found {got!r} (changed by another tool?)")
            )
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
