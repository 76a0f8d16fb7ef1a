"""Stop on SIGTERM, SIGINT or SIGHUP: how every long-running hidvfs command ends cleanly.

The board daemon, the simulated daemon and ``trace record`` run a loop that checks a
:class:`threading.Event`; while :class:`StopOnSignals` is active these signals set that event
instead of killing the process (SIGTERM, SIGHUP) or raising KeyboardInterrupt (SIGINT), so the
loop ends at its next check and the command finishes its work: restore the board, print its
summary, close its trace. SIGHUP too: its default would kill the process when its terminal
closes. The previous handlers come back on exit.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class StopOnSignals:
    """While installed (:meth:`install` to :meth:`restore`, or as a context manager), the
    :data:`STOP_SIGNALS` set :attr:`stop`, and :attr:`received` names the first one received
    (``"SIGTERM"``...). ``on_signal(name)`` is called for each (a log line). Handlers can only
    be set in the main thread: elsewhere nothing is installed, and only whoever holds the
    event can stop the loop."""

    def __init__(
        self,
        stop: threading.Event | None = None,
        on_signal: Callable[[str], None] | None = None,
    ):
        self.stop = stop if stop is not None else threading.Event()
        self.received: str | None = None
        self._on_signal = on_signal
        self._previous: dict[int, object] = {}

    def _handle(self, signum: int, _frame: object) -> None:
        name = signal.Signals(signum).name
        if self.received is None:
            self.received = name
        if self._on_signal is not None:
            self._on_signal(name)
        self.stop.set()

    #: the signals handled while installed
    SIGNALS: tuple[signal.Signals, ...] = STOP_SIGNALS
    #: those left alone when they are ignored at install
    KEEP_IGNORED: tuple[signal.Signals, ...] = (signal.SIGHUP,)

    def install(self) -> StopOnSignals:
        """A hangup that is ignored (``nohup``) stays ignored: the user asked that a dropped
        session not end the command."""
        if not self._previous and threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                if sig in self.KEEP_IGNORED and signal.getsignal(sig) is signal.SIG_IGN:
                    continue
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def restore(self) -> None:
        """Put the previous handlers back (a signal from now on does what it did before)."""
        for sig, handler in self._previous.items():
            # None: a handler set outside Python, which cannot be put back; the default then
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        self._previous.clear()

    def __enter__(self) -> StopOnSignals:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.restore()


class InterruptOnSignals(StopOnSignals):
    """While active, SIGTERM and SIGHUP raise KeyboardInterrupt in the main thread, as SIGINT
    does: for commands whose whole cleanup already runs on Ctrl-C (a campaign kills its
    running kernel, gives the board back and stores nothing half done). Without it, systemd's
    stop or a dropped SSH session killed them with the board still pinned. The previous
    handlers come back on exit; outside the main thread nothing is installed."""

    SIGNALS = (signal.SIGTERM, signal.SIGHUP)

    def _handle(self, signum: int, frame: object) -> None:
        super()._handle(signum, frame)
        raise KeyboardInterrupt(self.received)


class PassOnSignals(StopOnSignals):
    """While active, each of the :data:`STOP_SIGNALS` is offered to ``pass_on(signum)``
    (``hidvfs run`` gives it to its command); one it takes (returns True) is recorded as
    :class:`StopOnSignals` records it, one it declines (a Ctrl-C the command got from the
    terminal already) changes nothing. A signal ignored at install stays ignored, SIGINT and
    SIGTERM too: the command inherited that ignore (``cmd &`` in a script ignores SIGINT)."""

    KEEP_IGNORED = STOP_SIGNALS

    def __init__(
        self,
        pass_on: Callable[[int], bool],
        stop: threading.Event | None = None,
        on_signal: Callable[[str], None] | None = None,
    ):
        super().__init__(stop, on_signal)
        self._pass_on = pass_on

    def _handle(self, signum: int, frame: object) -> None:
        if self._pass_on(signum):
            super()._handle(signum, frame)
