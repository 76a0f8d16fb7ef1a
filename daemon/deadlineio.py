"""Socket reads under one deadline for a whole exchange.

A socket timeout bounds each ``recv`` only, so a peer dripping a byte every few seconds can
hold a connection without bound: a status fetch by the coordinator, a request to the
daemon's HTTP endpoints. :class:`DeadlineReader` gives every read what is left of one
deadline (``time.monotonic``) and raises ``TimeoutError`` once it has passed.
"""

from __future__ import annotations

import io
import socket
import time


class DeadlineReader(io.RawIOBase):
    """Raw reads of ``sock`` that end at ``deadline`` (wrap it in ``io.BufferedReader``)."""

    def __init__(self, sock: socket.socket, deadline: float):
        self._sock, self._deadline = sock, deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("deadline passed")
        self._sock.settimeout(left)
        return self._sock.recv_into(buf)
