"""The daemon's table of registered jobs and their outcomes (thread-safe, in memory).

The Unix-socket registry, ``hidvfs run`` and the simulator's workload all register here; the
control loop reads a snapshot every tick and records completions (makespan and deadline met).

A job is scored by time (met or missed) unless the process that launched it said how it
ended (:class:`JobExit`, the ``exit`` of an ``unregister``): one that failed (a non-zero
exit, death by a signal, or stopped by ``hidvfs run`` on a signal of its own) is counted
apart as failed and is neither met nor missed. A job whose end the daemon sees without being
told (an orphan after ``hidvfs run`` was SIGKILLed, a client that registered a pid of its
own) is scored by time, as it cannot know better.
"""

from __future__ import annotations

import signal as _signal
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


def signal_name(signum: int) -> str:
    """``SIGSEGV`` for 11; ``signal 99`` for a number without a name."""
    try:
        return _signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


@dataclass(frozen=True)
class JobExit:
    """How a job's command ended, as the process that launched and reaped it (``hidvfs run``)
    tells the daemon: ``code`` its exit status when it exited, ``signal`` the signal that
    killed it (one of the two), ``stopped_by`` the signal ``hidvfs run`` itself got (a
    SIGTERM passed on, a Ctrl-C) when it was stopped, whatever the command made of it."""

    code: int | None = None
    signal: int | None = None
    stopped_by: str | None = None

    @property
    def failure(self) -> str | None:
        """Why the job did not complete ("stopped by SIGTERM", "killed by SIGSEGV", "exit
        1"), None when it did (exit 0 and not stopped): a failed job is neither met nor missed."""
        if self.stopped_by:
            return f"stopped by {self.stopped_by}"
        if self.signal:
            return f"killed by {signal_name(self.signal)}"
        if self.code:
            return f"exit {self.code}"
        return None


@dataclass(frozen=True)
class JobOutcome:
    pid: int
    name: str
    criticality: str
    release_t: float
    finish_t: float
    deadline_s: float | None
    #: how it ended, when the process that launched it said (None: not told; scored by time)
    exit: JobExit | None = None

    @property
    def makespan_s(self) -> float:
        return self.finish_t - self.release_t

    @property
    def failure(self) -> str | None:
        """Why it failed (:attr:`JobExit.failure`), None when it completed or was not told."""
        return None if self.exit is None else self.exit.failure

    @property
    def deadline_met(self) -> bool | None:
        """None without a deadline or for a failed job (not scored: neither met nor missed)."""
        if self.deadline_s is None or self.failure is not None:
            return None
        return self.makespan_s <= self.deadline_s + 1e-9


#: finished jobs the table keeps (the newest); the counts cover all of them
RECENT_OUTCOMES = 1000
#: how long the outcome of a job whose end the loop saw waits for the process that launched
#: it (``hidvfs run``, its adopter, still alive) to say how it ended: run unregisters right
#: after it reaped the command, or after what it passed a signal on to had its grace
#: (client.STOP_GRACE_S, 5 s) and its connection its timeout (5 s); past this, by time
REPORT_WAIT_S = 12.0


@dataclass
class JobTable:
    _jobs: dict[int, JobEntry] = field(default_factory=dict)
    #: the newest finished jobs (a daemon runs for months: all of them would grow for ever
    #: and every status would scan them under the lock)
    outcomes: deque = field(default_factory=lambda: deque(maxlen=RECENT_OUTCOMES))
    #: every job finished since start, and the deadline misses among them per criticality
    done: int = 0
    _misses: dict = field(default_factory=lambda: {"hi": 0, "lo": 0})
    #: finished jobs whose launcher said they failed (:attr:`JobOutcome.failure`), per
    #: criticality: neither met nor missed
    _failed: dict = field(default_factory=lambda: {"hi": 0, "lo": 0})
    #: pid -> (entry, finish_t, until): jobs the loop saw end whose launcher is still alive,
    #: their outcome waiting for it to say how they ended (:meth:`hold`, :meth:`report`)
    _held: dict = field(default_factory=dict)
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
        return self._left(entry)

    def _left(self, entry: JobEntry | None) -> JobEntry | None:
        """A job left the running ones (``entry``; None: none did): told, and waited for."""
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

    def finish(
        self, pid: int, finish_t: float, *, seen: bool = False, exit: JobExit | None = None
    ) -> JobOutcome | None:
        """The job ended at ``finish_t``: record its outcome (``exit``: how it ended, when its
        launcher said; a failed one is counted apart, neither met nor missed). One the control
        loop did not see itself (``seen`` False: reported through the registry) waits in
        :meth:`take_ended` so the loop still scores it (the adaptive shield)."""
        entry = self.unregister(pid)
        if entry is None:
            return None
        return self._record(entry, finish_t, seen=seen, exit=exit)

    def _record(
        self, entry: JobEntry, finish_t: float, *, seen: bool, exit: JobExit | None
    ) -> JobOutcome:
        out = JobOutcome(
            entry.pid,
            entry.name,
            entry.criticality,
            entry.release_t,
            finish_t,
            entry.deadline_s,
            exit,
        )
        return self.record_outcome(out, seen=seen)

    def record_outcome(self, out: JobOutcome, *, seen: bool) -> JobOutcome:
        """Count a finished job's outcome: kept among the recent :attr:`outcomes`, counted in
        :attr:`done`, and as failed (:attr:`JobOutcome.failure`) or a deadline miss per
        criticality. One the control loop did not see end itself (``seen`` False) waits in
        :meth:`take_ended`. Every outcome is counted here (a replay too): returns ``out``."""
        with self._lock:
            self.outcomes.append(out)
            if not seen:
                self._ended.append(out)
            self.done += 1
            if out.failure is not None:
                self._failed[out.criticality] = self._failed.get(out.criticality, 0) + 1
            elif out.deadline_met is False:
                self._misses[out.criticality] = self._misses.get(out.criticality, 0) + 1
        return out

    def hold(self, pid: int, finish_t: float, until: float) -> JobEntry | None:
        """The loop saw ``pid`` end at ``finish_t`` while the process that launched it lives:
        it leaves the running jobs, and its outcome waits until ``until`` for that process to
        say how it ended (:meth:`report`); then :meth:`release_held` scores it by time."""
        with self._lock:  # one step: an unregister between the two finds it held, not gone
            entry = self._jobs.pop(pid, None)
            if entry is not None:
                self._held[pid] = (entry, finish_t, until)
        return self._left(entry)

    def held(self, pid: int) -> JobEntry | None:
        """The job of ``pid`` whose outcome waits for its launcher (:meth:`hold`), or None."""
        with self._lock:
            got = self._held.get(pid)
        return None if got is None else got[0]

    def held_jobs(self) -> list[JobEntry]:
        with self._lock:
            return [entry for entry, _t, _until in self._held.values()]

    def report(self, pid: int, exit: JobExit | None) -> JobOutcome | None:
        """The launcher of a held job says how it ended (``exit`` None: it did not say):
        recorded with the end the loop saw, and handed to the loop through :meth:`take_ended`."""
        with self._lock:
            got = self._held.pop(pid, None)
        if got is None:
            return None
        entry, finish_t, _until = got
        out = self._record(entry, finish_t, seen=False, exit=exit)
        self.changed.set()
        return out

    def release_held(self, now: float, waiting: Callable[[JobEntry], bool]) -> list[JobOutcome]:
        """Score by time the held jobs whose wait is over: past their ``until``, or whose
        launcher no longer lives (``waiting(entry)`` False: SIGKILLed, it will never say)."""
        with self._lock:
            items = list(self._held.items())
        out = []
        for pid, (entry, finish_t, until) in items:
            if now < until and waiting(entry):
                continue
            with self._lock:
                if self._held.get(pid, (None,))[0] is not entry:  # reported meanwhile
                    continue
                del self._held[pid]
            out.append(self._record(entry, finish_t, seen=True, exit=None))
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

    def failed(self) -> dict[str, int]:
        """Jobs that failed (a non-zero exit, a signal, stopped), per criticality since start."""
        with self._lock:
            return dict(self._failed)

    def overdue(self, now: float) -> dict[str, int]:
        """Running jobs already past their deadline at ``now``, per criticality."""
        counts = {"hi": 0, "lo": 0}
        for e in self.snapshot():
            if e.deadline_s is not None and now - e.release_t > e.deadline_s:
                counts[e.criticality] = counts.get(e.criticality, 0) + 1
        return counts
