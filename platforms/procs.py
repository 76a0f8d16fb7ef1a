"""Process control: where a job runs and at what priority.

The live implementation (psutil, every thread of the job's process tree) and the simulator's
implement the same interface, so the actuator cannot tell them apart.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod


class ProcessGone(Exception):
    """The pid no longer exists."""

    def __init__(self, pid: int):
        self.pid = pid
        super().__init__(f"process {pid} no longer exists")


class SetidProcess(Exception):
    """The process runs with ids it did not start with: its real, effective and saved uids
    (or gids) differ, as in a setuid or setgid program. It acts with rights its real owner
    does not have, so it is no one user's process to steer."""

    def __init__(self, pid: int, uids: tuple[int, ...], gids: tuple[int, ...], program: str = ""):
        self.pid, self.uids, self.gids = pid, tuple(uids), tuple(gids)
        self.program = program
        which = "setuid" if len(set(self.uids)) > 1 else "setgid"
        named = f" ({program})" if program else ""
        super().__init__(
            f"pid {pid}{named} runs a {which} program (real/effective/saved uids "
            f"{'/'.join(map(str, self.uids))}, gids {'/'.join(map(str, self.gids))}): it acts "
            "with rights its owner does not have"
        )


class ProcessControl(ABC):
    @abstractmethod
    def alive(self, pid: int) -> bool: ...

    @abstractmethod
    def set_affinity(self, pid: int, cpus: tuple[int, ...]) -> None:
        """Confine every thread of ``pid``'s process tree to ``cpus``; ProcessGone if gone."""

    @abstractmethod
    def get_affinity(self, pid: int) -> tuple[int, ...]: ...

    @abstractmethod
    def set_priority(self, pid: int, rt_priority: int = 0, nice: int = 0) -> None:
        """``rt_priority`` 1..99 selects SCHED_FIFO; 0 selects SCHED_OTHER with ``nice``."""

    @abstractmethod
    def cpu_time(self, pid: int) -> float:
        """CPU seconds used so far by the process tree."""

    def start_time(self, pid: int) -> float | None:
        """When ``pid`` started (None: unknown); a different value later is another process
        that reused the pid."""
        return None

    def get_priority(self, pid: int) -> tuple[int, int]:
        """(rt_priority, nice) of the main thread; (0, 0) where it cannot be read."""
        return 0, 0

    def set_own_affinity(self, pid: int, cpus: tuple[int, ...]) -> None:
        """:meth:`set_affinity` for the threads of ``pid`` alone, not the processes below it
        (each of those is handled on its own)."""
        self.set_affinity(pid, cpus)

    def set_own_priority(self, pid: int, rt_priority: int = 0, nice: int = 0) -> None:
        """:meth:`set_priority` for the threads of ``pid`` alone."""
        self.set_priority(pid, rt_priority, nice)

    def parent(self, pid: int) -> int | None:
        """The pid of ``pid``'s parent (None: gone or unknown)."""
        return None

    def descendants(self, pid: int) -> list[tuple[int, float | None]]:
        """(pid, start time) of every process below ``pid`` now. They took the job's settings
        with it, and keep them if ``pid`` exits first (they are reparented, out of its tree)."""
        return []

    def rt_allowed(self, pid: int) -> int:
        """The highest SCHED_FIFO priority the process could take itself (99: no limit)."""
        return 99

    def rt_limit(self, pid: int) -> int:
        """The highest SCHED_FIFO priority every process of ``pid``'s tree could take by its
        own RLIMIT_RTPRIO, whoever owns it (no shortcut for root's processes): what the
        daemon may hand a job a user who is not root registered. By default
        :meth:`rt_allowed`."""
        return self.rt_allowed(pid)

    def identity(self, pid: int) -> tuple | None:
        """What changes when ``pid`` execs or is reused (start time, executable); None when
        it has gone. By default the start time alone."""
        start = self.start_time(pid)
        return None if start is None else (start, None)

    def process_map(self, *, fresh_recheck: bool = False) -> contextlib.AbstractContextManager:
        """A round of tree walks (one apply of the actuator): inside it the walks may share
        one look at every process instead of one each. ``fresh_recheck``: a walk's second
        look (for processes forked while it wrote) reads the tree as it is now, not the
        round's (a release: a child missed there would keep the job's settings for good).
        By default nothing is shared."""
        return contextlib.nullcontext()

    def unmanageable(self, pid: int) -> str | None:
        """Why ``pid`` must never be steered (init, a kernel thread, the daemon), or None."""
        return None

    def machine_cpus(self) -> frozenset[int] | None:
        """The CPUs the processes' kernel runs on now (None: the board's tree tells). The
        daemon on a fake tree steers real processes: their affinity lands on this machine's
        CPUs, not the tree's."""
        return None


class NoProcesses(ProcessControl):
    """A replay has no live jobs: every pid is gone."""

    def alive(self, pid: int) -> bool:
        return False

    def set_affinity(self, pid, cpus):
        raise ProcessGone(pid)

    def get_affinity(self, pid):
        raise ProcessGone(pid)

    def set_priority(self, pid, rt_priority=0, nice=0):
        raise ProcessGone(pid)

    def cpu_time(self, pid):
        raise ProcessGone(pid)
