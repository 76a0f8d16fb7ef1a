"""The affinity and priority each steered job had before the daemon touched it, on disk.

Why: ``restore.json`` gives the board its cpufreq settings back after a crash, but a job the
daemon pinned to one core at SCHED_FIFO would keep that for good if the daemon died (SIGKILL,
a watchdog abort): only a clean stop gives jobs their settings back. ``jobs.json`` in the
state dir holds each steered job's originals while the daemon runs, with the processes below
it that took its placement (members) and the last placement itself; the next start puts the
originals back on every job that is still the same process (same pid and start time) and
deletes the file. A member gets back only the settings it still has from that placement, as
on a clean release: one it set itself since is its own. A change of placement is on disk
before its first write, with the placement it replaces (``placed_before``) until every write
went through, so a crash halfway leaves both named. A row without a placement (version 1
files) restores its members unconditionally, as before. The actuator places a round's jobs
in at most three writes of the file, not several per job (:meth:`JobOriginals.deferred`): the new
jobs' originals, then every new placement with the one it replaces, both before the round's
first write to a process, then what the writes left (members, placements settled).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterator
from typing import Any

from daemon.actuator import still_placed
from daemon.statusfile import write_json_atomic
from platforms.procs import ProcessControl, ProcessGone

FILE_NAME = "jobs.json"
FORMAT = "hidvfs-job-originals"
#: 2: rows keep the last placement (and ``placed_before``, those a change was moving the job
#: away from); version 1 files are read too, a newer version is set aside unread
VERSION = 2


def jobs_path(state_dir: str | os.PathLike[str]) -> str:
    return os.path.join(os.fspath(state_dir), FILE_NAME)


class JobOriginals:
    """Record and drop one job's originals; every change is written atomically, at once or,
    inside :meth:`deferred`, at the next :meth:`flush`."""

    def __init__(self, state_dir: str | os.PathLike[str]):
        self.path = jobs_path(state_dir)
        self.jobs: dict[int, dict[str, Any]] = {}
        self._deferring = 0
        #: changes not on disk yet: deferred, or a write that failed (the next one has them)
        self._dirty = False

    @contextlib.contextmanager
    def deferred(self) -> Iterator[JobOriginals]:
        """Changes made in the block are kept, not written: :meth:`flush` writes them all in
        one go (a round placing N jobs rewrote the whole file N times or more: O(N^2)).
        Nothing is on disk until then; a caller that must have it there before it goes on
        (originals before the first placement) flushes first. Nothing raises OSError
        inside: the flush does."""
        self._deferring += 1
        try:
            yield self
        finally:
            self._deferring -= 1

    def flush(self) -> None:
        """Write every change not on disk yet (OSError when it cannot: they stay pending,
        and the next write tries them again)."""
        if self._dirty:
            self._write()

    def record(
        self, pid: int, start_time: float | None, cpus: tuple[int, ...], prio: tuple[int, int]
    ) -> None:
        self.jobs[pid] = {
            "pid": pid,
            "start_time": start_time,
            "cpus": list(cpus),
            "rt_priority": prio[0],
            "nice": prio[1],
        }
        self._save()

    def members(self, pid: int, members: dict[int, float]) -> None:
        """The processes below job ``pid`` that took its settings (pid -> start time)."""
        row = self.jobs.get(pid)
        if row is not None:
            row["members"] = [[child, start] for child, start in sorted(members.items())]
            self._save()

    def placed(
        self, pid: int, cpus: tuple[int, ...], rt_priority: int, nice: int, before=()
    ) -> None:
        """The placement job ``pid`` last got (or is about to get), with the earlier ones
        ``before`` its processes may still hold while a change is not through; written only
        when it changes (not on each re-apply). Not written: kept as it was, so the next call
        tries again (deferred: kept as it is, pending, so the next flush tries again)."""
        row = self.jobs.get(pid)
        if row is None:
            return
        new = {"placed": _placement_row((cpus, rt_priority, nice))}
        if before:
            new["placed_before"] = [_placement_row(p) for p in before]
        old = {key: row[key] for key in ("placed", "placed_before") if key in row}
        if old == new:
            return
        row.pop("placed_before", None)
        row.update(new)
        try:
            self._save()
        except OSError:
            row.pop("placed", None)
            row.pop("placed_before", None)
            row.update(old)
            raise

    def drop(self, pid: int) -> None:
        if self.jobs.pop(pid, None) is not None:
            self._save()

    def _save(self) -> None:
        self._dirty = True
        if not self._deferring:
            self._write()

    def _write(self) -> None:
        if not self.jobs:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
            self._dirty = False
            return
        write_json_atomic(
            self.path,
            {"format": FORMAT, "version": VERSION, "jobs": sorted(self.jobs.values(), key=str)},
            dir_mode=0o700,
        )
        self._dirty = False


def _placement_row(placed: tuple) -> dict[str, Any]:
    cpus, rt_priority, nice = placed
    return {"cpus": list(cpus), "rt_priority": rt_priority, "nice": nice}


def _read_placed(raw: Any) -> tuple | None:
    """A placement as (cpus, rt, nice); None without one (version 1) or unreadable."""
    try:
        return tuple(int(c) for c in raw["cpus"]), int(raw["rt_priority"]), int(raw["nice"])
    except (KeyError, TypeError, ValueError):
        return None


def _read_placements(row: dict[str, Any]) -> list[tuple] | None:
    """Every placement a row's processes may hold: the last one, and those a change was
    moving the job away from when the daemon died. None without a readable last one (a
    version 1 row): its members are restored unconditionally."""
    placed = _read_placed(row.get("placed"))
    if placed is None:
        return None
    before = row.get("placed_before")
    earlier = [_read_placed(p) for p in before] if isinstance(before, list) else []
    return [*(p for p in earlier if p is not None), placed]


def restore_stale_jobs(
    state_dir: str | os.PathLike[str], procs: ProcessControl, log: logging.Logger
) -> int:
    """At start: give the jobs a crashed run steered their own settings back, where they are
    still the same process. Returns how many were restored; the file is removed."""
    path = jobs_path(state_dir)
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        rows = data["jobs"] if data.get("format") == FORMAT else []
        version = data.get("version")
    except FileNotFoundError:
        return 0
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        log.error("event=job_originals_corrupt path=%s detail=%r", path, str(err))
        rows, version = [], VERSION
    if rows and not (isinstance(version, int) and 1 <= version <= VERSION):
        # written by another hidvfs (a downgrade after a crash): what its fields mean is not
        # known here, so nothing is done with them, and the file is kept for that version
        kept = f"{path}.version-{version}"
        try:
            os.replace(path, kept)
        except OSError:
            kept = path
        log.error(
            "event=job_originals_unknown_version path=%s version=%r detail=%r",
            kept,
            version,
            f"this hidvfs reads versions 1-{VERSION}; the {len(rows)} jobs it lists keep "
            "what the crashed run gave them (start the version that wrote it once, or set "
            "their affinity and priority by hand)",
        )
        return 0
    restored = 0
    for row in rows:
        try:
            pid, start = int(row["pid"]), row.get("start_time")
            cpus = tuple(int(c) for c in row["cpus"])
            rt, nice = int(row["rt_priority"]), int(row["nice"])
        except (KeyError, TypeError, ValueError):
            continue
        # (process, its whole tree?): the job's tree, then each child it left behind
        # (reparented: it kept the job's settings), its own threads, the same processes only
        targets = [] if start is not None and procs.start_time(pid) != start else [(pid, True)]
        members = row.get("members")
        for member in members if isinstance(members, list) else ():
            try:
                child, child_start = int(member[0]), float(member[1])
            except (TypeError, ValueError, IndexError):
                continue
            if procs.start_time(child) == child_start:
                targets.append((child, False))
        placed = _read_placements(row)
        for target, tree in targets:
            try:
                aff, prio = True, True
                if not tree and placed is not None:
                    aff, prio = still_placed(
                        placed, procs.get_affinity(target), procs.get_priority(target)
                    )
                aff = aff and bool(cpus)
                if not (aff or prio):
                    continue  # a member that set both itself since: they are its own
                if aff:
                    (procs.set_affinity if tree else procs.set_own_affinity)(target, cpus)
                if prio:
                    (procs.set_priority if tree else procs.set_own_priority)(target, rt, nice)
                restored += 1
            except ProcessGone:
                continue
            except (PermissionError, OSError, ValueError) as err:
                log.warning("event=job_restore_failed pid=%d detail=%r", target, str(err))
    if rows:
        log.warning(
            "event=jobs_restored count=%d detail=%r",
            restored,
            "the previous run did not stop cleanly; its jobs got their own settings back",
        )
    try:
        os.unlink(path)
    except OSError:
        pass
    return restored
