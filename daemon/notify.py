"""sd_notify(3) without a dependency: readiness, status, watchdog and stopping for systemd.

The protocol is one AF_UNIX datagram of ``KEY=value`` lines to ``$NOTIFY_SOCKET`` (a leading
``@`` names the abstract namespace). With ``Type=notify`` the daemon sends ``READY=1`` once the
board is discovered and the original settings are saved; with ``WatchdogSec=`` systemd exports
``$WATCHDOG_USEC`` and expects ``WATCHDOG=1`` at least that often, so we ping at half of it.
Outside systemd (no ``$NOTIFY_SOCKET``) every call is a no-op that returns False. A failed send
is logged at debug level and never raised: readiness reporting must not kill the daemon.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Mapping

log = logging.getLogger("hidvfs.notify")


class Notifier:
    #: ``READY=1`` announcements made in this process (delivered or not, with or without
    #: ``$NOTIFY_SOCKET``): a failure after one is not a refused start
    readies = 0

    def __init__(self, env: Mapping[str, str] | None = None):
        env = os.environ if env is None else env
        self.address = env.get("NOTIFY_SOCKET") or None
        self._watchdog_usec = env.get("WATCHDOG_USEC")
        self._watchdog_pid = env.get("WATCHDOG_PID")

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def _sockaddr(self) -> str | bytes:
        assert self.address is not None
        if self.address.startswith("@"):
            return b"\0" + self.address[1:].encode()
        return self.address

    def send(self, *assignments: str) -> bool:
        """Send ``KEY=value`` lines in one datagram; True when it was delivered."""
        if self.address is None:
            return False
        payload = "\n".join(assignments).encode()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
                s.connect(self._sockaddr())
                s.sendall(payload)
        except OSError as err:
            log.debug(
                "event=sd_notify_failed socket=%s error=%r", self.address, err.strerror or str(err)
            )
            return False
        return True

    def ready(self, status: str | None = None) -> bool:
        Notifier.readies += 1
        lines = ["READY=1", f"MAINPID={os.getpid()}"]
        if status:
            lines.append(f"STATUS={_one_line(status)}")
        return self.send(*lines)

    def status(self, text: str) -> bool:
        return self.send(f"STATUS={_one_line(text)}")

    def watchdog(self) -> bool:
        return self.send("WATCHDOG=1")

    def stopping(self, status: str | None = None) -> bool:
        lines = ["STOPPING=1"]
        if status:
            lines.append(f"STATUS={_one_line(status)}")
        return self.send(*lines)

    def reloading(self) -> bool:
        return self.send("RELOADING=1")

    def watchdog_interval_s(self) -> float | None:
        """Seconds between pings (half of ``$WATCHDOG_USEC``); None when no watchdog is set,
        or when ``$WATCHDOG_PID`` names another process (sd_watchdog_enabled(3))."""
        if not self._watchdog_usec:
            return None
        if self._watchdog_pid:
            try:
                if int(self._watchdog_pid) != os.getpid():
                    return None
            except ValueError:
                return None
        try:
            usec = int(self._watchdog_usec)
        except ValueError:
            log.warning("event=watchdog_usec_invalid value=%r", self._watchdog_usec)
            return None
        return usec / 2e6 if usec > 0 else None


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


class WatchdogPinger:
    """Pings the watchdog when half its interval has passed; call :meth:`tick` from the loop.

    ``now`` is the caller's clock (the daemon passes its platform clock's ``now``).
    """

    def __init__(self, notifier: Notifier, now: Callable[[], float]):
        self.notifier = notifier
        self.now = now
        self.interval_s = notifier.watchdog_interval_s()
        self._last: float | None = None

    def tick(self) -> bool:
        """Ping if due; True when a ping was sent."""
        if self.interval_s is None:
            return False
        t = self.now()
        if self._last is not None and t - self._last < self.interval_s:
            return False
        self._last = t
        return self.notifier.watchdog()


_default: Notifier | None = None


def default() -> Notifier:
    """The process-wide notifier, built from the environment on first use."""
    global _default
    if _default is None:
        _default = Notifier()
    return _default


def ready(status: str | None = None) -> bool:
    return default().ready(status)


def status(text: str) -> bool:
    return default().status(text)


def watchdog() -> bool:
    return default().watchdog()


def stopping(status: str | None = None) -> bool:
    return default().stopping(status)


def watchdog_interval_s() -> float | None:
    return default().watchdog_interval_s()
