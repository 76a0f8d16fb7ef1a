"""Bounds for the small stdlib HTTP servers against slow and idle clients.

Shared by the daemon's metrics and telemetry endpoints (:mod:`daemon.metrics`) and the
coordinator's scheduler extender (:mod:`daemon.extender`). A thread per connection with a
timeout per ``recv`` let a client dripping a byte every few seconds hold a thread for as long
as it liked, and a few hundred idle sockets held a few hundred threads. Here:

- the request head (request line and headers) must arrive whole within one deadline and one
  size (:class:`HeadReader`; 414 past the size in the request line, 431 in the headers);
- a server holds at most ``max_connections()`` connections, ``max_per_peer()`` of them from
  one peer address. When all are taken, the connection still *receiving* its request that
  belongs to the peer holding the most (the oldest of those) is dropped for the new one; a
  peer at its own cap drops its own oldest. A connection stops receiving once its request has
  arrived (:meth:`BoundedHandler.claim_slot`; the head by default, the body too where a
  handler reads one first) and is then never dropped: only when every slot is being answered
  is the new connection refused (:meth:`BoundedServer.refuse`, a close unless overridden);
- handler threads are at most twice ``max_connections()``;
- refusals and drops are logged one line per ``refused_log_s()``, with a count
  (``event=http_refused`` / ``event=http_shed``).

Subclasses give the limits (their module's constants, read at each use), the ``endpoint``
name and the ``logger``.
"""

from __future__ import annotations

import io
import logging
import math
import socket
import sys
import threading
import time
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from daemon.deadlineio import DeadlineReader


def host_port(host: str, port: int) -> str:
    """``HOST:PORT`` as a listen address is written: an IPv6 host in brackets (``[::1]:9466``;
    ``::1:9466`` reads as another address)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class HeadTooLarge(Exception):
    """The request head went past its size limit."""


class HeadReader(DeadlineReader):
    """Reads of a request head: under one deadline, and ``limit`` bytes at most.
    :meth:`rearm` gives the same reader another deadline and limit (a request body)."""

    def __init__(self, sock: socket.socket, deadline: float, limit: int):
        super().__init__(sock, deadline)
        self.left = limit

    def rearm(self, deadline: float, limit: int) -> None:
        self._deadline, self.left = deadline, limit

    def readinto(self, buf) -> int:
        if self.left <= 0:
            raise HeadTooLarge
        n = super().readinto(memoryview(buf)[: self.left])
        self.left -= n
        return n


@dataclass(eq=False)
class Conn:
    peer: str
    since: float  # accepted at (time.monotonic)
    receiving: bool = True  # its request has not all arrived: it may be dropped for another


class BoundedServer(ThreadingHTTPServer):
    """A threading HTTP server with the bounds of this module (see there)."""

    daemon_threads = True
    endpoint = "http"
    logger = logging.getLogger("hidvfs.http")

    # the limits, read at each use: subclasses return their own module's constants

    def max_connections(self) -> int:
        raise NotImplementedError

    def max_per_peer(self) -> int:
        raise NotImplementedError

    def refused_log_s(self) -> float:
        raise NotImplementedError

    def __init__(self, *args, **kwargs):
        self._lock = threading.Lock()
        self._conns: dict[socket.socket, Conn] = {}  # those holding a slot
        self._threads_live = 0  # handler threads, dropped ones included until they end
        self._counts = {"refused": 0, "shed": 0}  # since the last line of each
        self._logged = {"refused": -math.inf, "shed": -math.inf}
        self._last = {"refused": ("-", ""), "shed": ("-", "")}  # client, reason
        super().__init__(*args, **kwargs)

    def _victim(self, peer: str) -> tuple[socket.socket | None, str]:
        """Under the lock, with no slot for ``peer``: the connection to drop for it (``None``
        when every candidate is being answered) and the reason. A peer at its own cap drops its
        oldest unfinished request; otherwise the peer holding the most slots loses its oldest."""
        held: dict[str, int] = {}
        for c in self._conns.values():
            held[c.peer] = held.get(c.peer, 0) + 1
        if held.get(peer, 0) >= self.max_per_peer():
            reason = "too many connections from one client"
            pool = [(s, c) for s, c in self._conns.items() if c.peer == peer and c.receiving]
        else:
            reason = "too many connections"
            pool = [(s, c) for s, c in self._conns.items() if c.receiving]
        if not pool:
            return None, reason
        return min(pool, key=lambda sc: (-held[sc[1].peer], sc[1].since))[0], reason

    def process_request(self, request, client_address):
        peer = str(client_address[0])
        admitted, victim, reason = True, None, ""
        with self._lock:
            mine = sum(1 for c in self._conns.values() if c.peer == peer)
            if self._threads_live >= 2 * self.max_connections():
                # dropped threads end at once (their recv sees the shutdown): a bound on the
                # threads even if some did not
                admitted, reason = False, "too many connections"
                self._count("refused", peer, reason)
            elif mine >= self.max_per_peer() or len(self._conns) >= self.max_connections():
                victim, reason = self._victim(peer)
                if victim is None:
                    admitted = False
                    self._count("refused", peer, reason)
                else:
                    dropped = self._conns.pop(victim)
                    self._count("shed", dropped.peer, reason)
                    try:  # wakes its handler, which sees the end of its request and stops
                        victim.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
            if admitted:
                self._conns[request] = Conn(peer, time.monotonic())
                self._threads_live += 1
        if not admitted:
            self.refuse(request, reason)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:  # no thread: give the slot back
            self._leave(request)
            self.shutdown_request(request)
            raise

    def refuse(self, request, reason: str) -> None:
        """A connection with no slot and none to drop for it (every slot is being answered):
        closed unanswered here (subclasses may answer first, from the accepting thread)."""
        self.shutdown_request(request)

    def request_received(self, request) -> bool:
        """The request has arrived: the connection keeps its slot until answered. False when
        it was dropped for another one meanwhile (it must not be answered)."""
        with self._lock:
            conn = self._conns.get(request)
            if conn is None:
                return False
            conn.receiving = False
            return True

    def holds(self, request) -> bool:
        """The connection still has its slot (it was not dropped for another one)."""
        with self._lock:
            return request in self._conns

    def count_refused(self, client: str, reason: str) -> None:
        """A request refused by the handler (a 503): counted and logged like the others."""
        with self._lock:
            self._count("refused", client, reason)

    def _leave(self, request) -> None:
        with self._lock:
            self._conns.pop(request, None)
            self._threads_live -= 1

    def _count(self, kind: str, client: str, reason: str) -> None:
        self._counts[kind] += 1
        self._last[kind] = (client, reason)
        if time.monotonic() - self._logged[kind] >= self.refused_log_s():
            self._log(kind)

    def _log(self, kind: str) -> None:
        """One line for the refusals (or drops) since the last one (a flood logged one line
        each): ``event=http_refused ... refused=N`` or ``event=http_shed ... shed=N``."""
        if not self._counts[kind]:
            return
        host, port = self.server_address[:2]
        client, reason = self._last[kind]
        self.logger.warning(
            "event=http_%s endpoint=%s address=%s %s=%d last_client=%s reason=%r",
            kind,
            self.endpoint,
            host_port(host, port),
            kind,
            self._counts[kind],
            client,
            reason,
        )
        self._counts[kind] = 0
        self._logged[kind] = time.monotonic()
        self._last[kind] = ("-", "")

    def log_refused(self) -> None:
        """The counts since the last lines (at stop)."""
        with self._lock:
            self._log("refused")
            self._log("shed")

    def drain(self, timeout_s: float) -> int:
        """After :meth:`shutdown` (no new connection accepted): wait up to ``timeout_s`` for
        the requests being answered (arrived whole) to be answered; returns how many were
        still being answered then. A client still sending its request is not waited for."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                busy = sum(1 for c in self._conns.values() if not c.receiving)
            if busy == 0 or time.monotonic() >= deadline:
                return busy
            time.sleep(0.02)

    def server_close(self) -> None:
        self.log_refused()
        super().server_close()

    def process_request_thread(self, request, client_address):
        try:
            self.finish_request(request, client_address)
        except Exception:
            self.handle_error(request, client_address)
        finally:
            self._leave(request)  # before the close: a dropped socket is never a closed one
            self.shutdown_request(request)

    def handle_error(self, request, client_address) -> None:
        """A client that hangs up early is routine (a scrape timeout): no traceback in the
        journal; anything else is one event line."""
        exc = sys.exc_info()[1]
        if isinstance(exc, (BrokenPipeError, ConnectionResetError, TimeoutError)):
            return
        self.logger.warning(
            "event=http_error endpoint=%s client=%s detail=%r",
            self.endpoint,
            client_address[0],
            repr(exc),
        )


class BoundedHandler(BaseHTTPRequestHandler):
    """The handler side: the head under one deadline and size (:meth:`head_limits`), 414/431
    past the size, and the slot claimed once the request has arrived (:meth:`head_complete`:
    at the end of the head unless overridden). ``timeout`` is the answer's."""

    server: BoundedServer

    def head_limits(self) -> tuple[float, int]:
        """(seconds for the whole head, its most bytes): subclasses give their constants."""
        raise NotImplementedError

    def setup(self) -> None:
        super().setup()
        # the request line and headers under one deadline and size: a timeout per recv let
        # clients sending a header byte every few seconds hold every slot
        timeout_s, limit = self.head_limits()
        self.reader = HeadReader(self.connection, time.monotonic() + timeout_s, limit)
        self.rfile = io.BufferedReader(self.reader)
        self._in_headers = False

    def handle_one_request(self) -> None:
        try:
            super().handle_one_request()
        except HeadTooLarge:
            if self._in_headers:
                self.send_error(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE)
            else:  # still in the request line (as http.server does past 64 KiB)
                self.requestline = self.request_version = self.command = ""
                self.send_error(HTTPStatus.REQUEST_URI_TOO_LONG)
            self.close_connection = True

    def parse_request(self) -> bool:
        self._in_headers = True
        if not super().parse_request():
            return False
        return self.head_complete()

    def head_complete(self) -> bool:
        """The head has arrived: by default the whole request has (no body is read)."""
        return self.claim_slot()

    def claim_slot(self) -> bool:
        """The request has arrived: keep the slot until answered, with the answer's timeout.
        False (and the connection to close) when it was dropped for another one meanwhile."""
        if not self.server.request_received(self.connection):
            self.close_connection = True
            return False
        self.connection.settimeout(self.timeout)
        return True
