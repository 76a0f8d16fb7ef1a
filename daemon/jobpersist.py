"""The registered jobs, on disk, so that a restarted daemon takes them up again.

Why: the job table lives in the daemon's memory. A restart (an upgrade's ``service install``,
``systemctl restart``, a crash and systemd's ``Restart=on-failure``) used to drop every
registration: the jobs ran on unmanaged, a HI job lost its cluster and every deadline went
unplanned, while ``hidvfs run`` waited on, unaware. ``registrations.json`` in the state dir
lists each registered job (pid, its start time, name, deadline, criticality, who registered
it, when, and its adopter); it is rewritten atomically whenever a job registers or leaves.
The next start takes up every listed job that is still the same process (same boot, same
pid and start time) with its deadline counted from its first registration: the daemon's
clock is ``CLOCK_MONOTONIC``, one clock for the whole boot. The reference profile is looked
up again by name.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

from daemon.jobs import JobEntry
from daemon.statusfile import write_json_atomic

FILE_NAME = "registrations.json"
#: the longest a registration waits for its row to be on disk (a stuck disk must not hang
#: the registry: past it the job is steered all the same, only a crash would lose it)
REGISTRATION_WAIT_S = 2.0
FORMAT = "hidvfs-registrations"
VERSION = 1


def registrations_path(state_dir: str | os.PathLike[str]) -> str:
    return os.path.join(os.fspath(state_dir), FILE_NAME)


def to_row(e: JobEntry) -> dict[str, Any]:
    """A job as stored (its profile is not: the next start looks it up by name again)."""
    return {
        "pid": e.pid,
        "start_time": e.start_time,
        "name": e.name,
        "release_t": e.release_t,
        "deadline_s": e.deadline_s,
        "criticality": e.criticality,
        "registrant_uid": e.registrant_uid,
        "adopter": None if e.adopter is None else list(e.adopter),
    }


def _rows(jobs: Iterable[JobEntry]) -> list[dict[str, Any]]:
    return sorted((to_row(e) for e in jobs), key=lambda r: r["pid"])


def from_row(row: Any) -> JobEntry | None:
    """The job a stored row describes; None for a row this version cannot read whole (a job
    is taken up with everything it registered with, or not at all)."""
    try:
        pid, start, name = int(row["pid"]), row["start_time"], str(row["name"])
        release_t = float(row["release_t"])
        deadline = row["deadline_s"]
        deadline = None if deadline is None else float(deadline)
        crit, uid, adopter = str(row["criticality"]), row["registrant_uid"], row["adopter"]
        if start is None or pid <= 0 or not math.isfinite(release_t):
            return None  # no start time: a reused pid could not be told from the job
        if crit not in ("hi", "lo") or (deadline is not None and not deadline > 0):
            return None
        if adopter is not None:
            a_pid, a_start = adopter
            adopter = (int(a_pid), None if a_start is None else float(a_start))
        return JobEntry(
            pid=pid,
            name=name,
            release_t=release_t,
            deadline_s=deadline,
            criticality=crit,
            registrant_uid=None if uid is None else int(uid),
            start_time=float(start),
            adopter=adopter,
        )
    except (KeyError, TypeError, ValueError):
        return None


class RegistrationsFile:
    """Keeps ``registrations.json`` equal to the job table (:meth:`save` from its change
    hook). A writer thread writes the newest table it was given. A departure is only handed
    to it: it happens on the control loop's thread (a job ends), which must not wait for a
    disk (an fsync on an SD card takes tenths of a second), and a departure lost in a crash
    costs nothing (the next start finds the process gone). A registration waits until it is
    on disk, on the registry's thread, so that no job acknowledged to its client is lost in
    a crash. :meth:`close` writes what is pending. A write that fails is said once until
    one works again."""

    def __init__(
        self,
        state_dir: str | os.PathLike[str],
        boot: str | None,
        log: logging.Logger,
        tree: str | None = None,
    ):
        self.path = registrations_path(state_dir)
        self.boot = boot
        self.tree = tree
        self.log = log
        self._cond = threading.Condition()
        self._pending: list[dict[str, Any]] | None = None
        self._busy = False
        self._closed = False
        self._thread: threading.Thread | None = None
        self._failed = False

    def save(self, jobs: Iterable[JobEntry], registered: bool = False):
        """Hand the table to the writer. For a ``registered`` change, returns the wait until
        it is written (at most :data:`REGISTRATION_WAIT_S`), for the caller to run once it
        holds no lock a departure needs (:attr:`daemon.jobs.JobTable.on_change`)."""
        self._hand(jobs)
        return (lambda: self.flush(REGISTRATION_WAIT_S)) if registered else None

    def _hand(self, jobs: Iterable[JobEntry]) -> None:
        rows = _rows(jobs)
        with self._cond:
            if self._closed:
                return
            self._pending = rows
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="hidvfs-registrations", daemon=True
                )
                self._thread.start()
            self._cond.notify_all()

    def flush(self, timeout: float | None = 10.0) -> bool:
        """Wait until every table handed to :meth:`save` is on disk (False: timed out)."""
        with self._cond:
            return self._cond.wait_for(lambda: self._pending is None and not self._busy, timeout)

    def close(self) -> None:
        """Write what is pending and stop the writer."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout=10.0)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending is not None or self._closed)
                if self._pending is None:
                    return  # closed, nothing left
                rows, self._pending, self._busy = self._pending, None, True
            try:
                self._write(rows)
            except Exception:  # noqa: BLE001 - a dead writer would make every registration wait
                if not self._failed:  # with its traceback once, until a write works again
                    self._failed = True
                    self.log.exception("event=registrations_write_failed path=%s", self.path)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def write_now(self, jobs: Iterable[JobEntry]) -> None:
        """Write the table on this thread (at start, before anything runs)."""
        self._write(_rows(jobs))

    def _write(self, rows: list[dict[str, Any]]) -> None:
        try:
            if rows:
                data = {"format": FORMAT, "version": VERSION, "boot_id": self.boot, "jobs": rows}
                if self.tree is not None:
                    data["tree"] = self.tree
                write_json_atomic(self.path, data, dir_mode=0o700)
            else:
                try:
                    os.unlink(self.path)
                except FileNotFoundError:
                    pass
            if self._failed:
                self._failed = False
                self.log.info("event=registrations_saved path=%s jobs=%d", self.path, len(rows))
        except OSError as err:
            # the jobs are still steered; only a restart would not take them up. Said once
            # until a write works again (a full disk would say it at every change)
            if not self._failed:
                self._failed = True
                self.log.warning(
                    "event=registrations_unsaved path=%s detail=%r",
                    self.path,
                    f"{err.strerror or err}: a restart would not take up the jobs",
                )


def take_up(
    state_dir: str | os.PathLike[str],
    boot: str | None,
    start_time: Callable[[int], float | None],
    log: logging.Logger,
    *,
    tree: str | None = None,
    refuse: Callable[[JobEntry], str | None] | None = None,
) -> list[JobEntry]:
    """At start: the jobs an earlier run of this boot had registered that are still the same
    processes. A file of another boot or of another tree (a test daemon on a fake tree must
    not steer the live daemon's jobs), or one that does not read, is set aside (logged);
    nothing in it is taken up. ``refuse(entry)`` gives why a job may no longer be steered
    for its registrant (a registration now would be refused: another owner, a setuid
    program since), and that job is left out, logged."""
    path = registrations_path(state_dir)
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError("not a registrations file")
        version, rows = data.get("version"), data.get("jobs")
        if version != VERSION or not isinstance(rows, list):
            raise ValueError(f"version {version!r} (this hidvfs reads {VERSION})")
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as err:
        log.error("event=registrations_unreadable path=%s detail=%r", path, str(err))
        return []
    if boot is None or data.get("boot_id") != boot:
        log.info("event=registrations_of_another_boot path=%s jobs=%d", path, len(rows))
        return []
    if data.get("tree") != tree:
        log.info(
            "event=registrations_of_another_tree path=%s jobs=%d tree=%r",
            path,
            len(rows),
            data.get("tree"),
        )
        return []
    out: list[JobEntry] = []
    for row in rows:
        entry = from_row(row)
        if entry is None:
            log.warning("event=registration_unreadable path=%s row=%r", path, row)
            continue
        if start_time(entry.pid) != entry.start_time:
            continue  # ended while no daemon ran (or its pid belongs to another process now)
        why = refuse(entry) if refuse is not None else None
        if why is not None:
            log.warning(
                "event=job_not_taken_up pid=%d registrant_uid=%s detail=%r",
                entry.pid,
                entry.registrant_uid,
                why,
            )
            continue
        adopter = entry.adopter
        if adopter is not None and adopter[1] is not None and start_time(adopter[0]) != adopter[1]:
            adopter = None  # its `hidvfs run` is gone: the job's own tree is still the job
        out.append(replace(entry, adopter=adopter))
    return out


__all__ = ["FILE_NAME", "RegistrationsFile", "from_row", "registrations_path", "take_up", "to_row"]
