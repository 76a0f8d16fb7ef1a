"""Clocks. Only the platforms layer reads time; the loop asks its clock.

``MonotonicClock`` is wall time for a board; ``VirtualClock`` is advanced by whoever owns it
(the simulator or a trace replay), so a run can go faster than real time.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod


class Clock(ABC):
    @abstractmethod
    def now(self) -> float:
        """Seconds since an arbitrary origin (monotonic)."""

    @abstractmethod
    def sleep(self, seconds: float) -> None:
        """Let ``seconds`` pass (really, or by advancing the virtual time)."""

    def wait(self, seconds: float, *events) -> bool:
        """Sleep up to ``seconds``, returning True early when one of ``events`` is set.

        A virtual clock has nobody to wake it (its own ``sleep`` already stops at simulated
        job events), so by default this is a plain sleep.
        """
        self.sleep(seconds)
        return False


class MonotonicClock(Clock):
    def now(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)

    #: longest slice between checks of the wake events
    POLL_S = 0.05

    def wait(self, seconds: float, *events) -> bool:
        deadline = time.monotonic() + seconds
        while True:
            if any(e.is_set() for e in events):
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            if events:
                events[0].wait(min(remaining, self.POLL_S))
            else:
                time.sleep(remaining)


class VirtualClock(Clock):
    """A clock that moves only when told.

    ``on_advance(target) -> float | None`` lets a simulator step with it; it may return an
    earlier time at which it stopped (a job arrived or finished), and the clock stops there, so
    the control loop can decide at job arrival and completion, not only on its period.
    """

    def __init__(self, start: float = 0.0, on_advance=None):
        self._t = float(start)
        self._on_advance = on_advance

    def now(self) -> float:
        return self._t

    def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            return
        target = self._t + seconds
        stopped = self._on_advance(target) if self._on_advance is not None else None
        self._t = target if stopped is None else min(max(float(stopped), self._t), target)

    def set(self, t: float) -> None:
        self._t = float(t)
