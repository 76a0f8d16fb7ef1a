"""A file read once from its start whatever it is (a file, a pipe, a FIFO, ``/dev/fd/N``),
with whether it is gzip known by its first bytes, not its name: a ``<(zcat ...)`` cannot be
opened twice, and a peek on a pipe may see fewer bytes than were asked for."""

from __future__ import annotations

import io
from typing import IO

#: the first two bytes of every gzip stream
GZIP_MAGIC = b"\x1f\x8b"


class _Rejoined(io.RawIOBase):
    """The bytes already read from a stream that cannot seek back, then the rest of it."""

    def __init__(self, head: bytes, rest: IO[bytes]):
        self._head = head
        self._rest = rest

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:  # type: ignore[override]
        if self._head:
            n = min(len(b), len(self._head))
            b[:n] = self._head[:n]
            self._head = self._head[n:]
            return n
        return self._rest.readinto(b)  # type: ignore[attr-defined]


def sniff_gzip(f: IO[bytes]) -> tuple[io.BufferedIOBase, bool]:
    """(the whole stream of the open binary ``f``, whether it is gzip) from its first two
    bytes: a file is sought back to its start; a pipe, a FIFO or a /dev/fd gets them put in
    front of the rest. The stream returned can ``peek``."""
    head = f.read(2)  # blocks until two bytes or the end, unlike a peek on a pipe
    gz = head == GZIP_MAGIC
    if f.seekable():
        f.seek(0)
        return f, gz  # type: ignore[return-value]
    return io.BufferedReader(_Rejoined(head, f)), gz
