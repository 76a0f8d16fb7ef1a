"""The daemon's table of registered jobs and their outcomes (thread-safe, in memory).

The Unix-socket registry, ``hidvfs run`` and the simulator's workload all register here; the
control loop reads a snapshot every tick and records completions (makespan and deadline met).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from platforms.observation import JobProfile


@dataclass
class JobEntry:
    pid: int
    name: str
    release_t: float
    deadline_s: float | None = None
    criticality: str = "lo"
    profile: JobProfile | None = None
    #: uid of the client that registered it (None: in-process), who may unregister it
    registrant_uid: int | None = None
    #: when the process started (None: unknown): another start time is a reused pid
    start_time: float | None = None
    #: (pid, start time) of the process that launched it and adopts what it leaves behind
    #: (``hidvfs run``, a child subreaper): its other descendants are the job's too
    adopter: tuple[int, float | None] | None = None
    #: what the registration was told besides its acceptance (a deadline its profile says no
    #: operating point can meet), None when nothing
    warning: str | None = None


@dataclass(frozen=True)
class JobOutcome:
    pid: int
    name: str
    criticality: str
    release_t: float
    finish_t: float
    deadline_s: float | None

    @property
    def makespan_s(self) -> float:
        return self.finish_t - self.release_t

    @property
    def deadline_met(self) -> bool | None:
        return None if self.deadline_s is None else self.makespan_s <= self.deadline_s + 1e-9


#: finished jobs the table keeps (the newest); the counts cover all of them
RECENT_OUTCOMES = 1000


@dataclass
class JobTable:
    _jobs: dict[int, JobEntry] = field(default_factory=dict)
    #: the newest finished jobs (a daemon runs for months: all of them would grow for ever
    #: and every status would scan them under the lock)
    outcomes: deque = field(default_factory=lambda: deque(maxlen=RECENT_OUTCOMES))
    #: every job finished since start, and the deadline misses among them per criticality
    done: int = 0
    _misses: dict = field(default_factory=lambda: {"hi": 0, "lo": 0})
    _ended: list = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    #: set whenever a job registers or leaves, so the loop can decide right away
    changed: threading.Event = field(default_factory=threading.Event, repr=False)
    #: called with the registered jobs after every registration and departure, and whether
    #: the change was a registration (the daemon keeps them on disk for its next start:
    #: :mod:`daemon.jobpersist`); calls are serialised, each with the table as it stands
    #: then. What it returns, when callable, is called once the next change may go ahead (a
    #: wait for the disk that must not hold up a departure on the control loop's thread)
    on_change: Callable[[list[JobEntry], bool], Callable[[], object] | None] | None = field(
        default=None, repr=False
    )
    _change_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def register(self, entry: JobEntry, *, defer_wait: bool = False):
        """Add ``entry``. What :attr:`on_change` asks to wait for (its row on disk) is done
        here, or with ``defer_wait`` returned for the caller to run once it holds no lock of
        its own (the registry: other registrations must not queue behind one fsync)."""
        if entry.criticality not in ("hi", "lo"):
            raise ValueError(f"criticality must be 'hi' or 'lo', got {entry.criticality!r}")
        if entry.deadline_s is not None and not entry.deadline_s > 0:
            raise ValueError(f"deadline_s must be > 0, got {entry.deadline_s!r}")
        with self._lock:
            self._jobs[entry.pid] = entry
        self.changed.set()
        then = self._tell(registered=True)
        if defer_wait:
            return then
        if then is not None:
            then()
        return None

    def unregister(self, pid: int) -> JobEntry | None:
        with self._lock:
            entry = self._jobs.pop(pid, None)
        self.changed.set()
        if entry is not None:
            then = self._tell(registered=False)
            if then is not None:
                then()
        return entry

    def _tell(self, registered: bool):
        """Hand the change to :attr:`on_change`; what it asks to wait for, or None."""
        if self.on_change is None:
            return None
        with self._change_lock:  # the snapshot inside: a later change is written later
            then = self.on_change(self.snapshot(), registered)
        return then if callable(then) else None

    def finish(self, pid: int, finish_t: float, *, seen: bool = False) -> JobOutcome | None:
        """The job ended at ``finish_t``: record its outcome. One the control loop did not see
        itself (``seen`` False: reported through the registry) waits in :meth:`take_ended`
        so the loop still scores it (the adaptive shield)."""
        entry = self.unregister(pid)
        if entry is None:
            return None
        out = JobOutcome(
            entry.pid, entry.name, entry.criticality, entry.release_t, finish_t, entry.deadline_s
        )
        with self._lock:
            self.outcomes.append(out)
            if not seen:
                self._ended.append(out)
            self.done += 1
            if out.deadline_met is False:
                self._misses[out.criticality] = self._misses.get(out.criticality, 0) + 1
        return out

    def take_ended(self) -> list[JobOutcome]:
        """Outcomes recorded since the last call that the loop did not see itself."""
        with self._lock:
            out, self._ended = self._ended, []
        return out

    def snapshot(self) -> list[JobEntry]:
        with self._lock:
            return list(self._jobs.values())

    def get(self, pid: int) -> JobEntry | None:
        with self._lock:
            return self._jobs.get(pid)

    def __len__(self) -> int:
        with self._lock:
            return len(self._jobs)

    def misses(self) -> dict[str, int]:
        """Deadline misses per criticality since start (counted, never rescanned)."""
        with self._lock:
            return dict(self._misses)
