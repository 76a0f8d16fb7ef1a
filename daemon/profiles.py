"""The daemon's view of the reference-profile store (``hidvfs profile measure`` writes it).

A job registered by name gets the profile stored for it on this board; the store is reread
when the file changes, so a profile measured while the daemon runs serves the next job.
"""

from __future__ import annotations

import os

from agents.deadlines import load
from platforms.errors import SpecError
from platforms.observation import JobProfile


class ProfileLookup:
    """``lookup(name)`` for one board, reread when the file changes; a store that turns
    unreadable keeps the last good one and reports why through ``on_error``."""

    def __init__(self, path: str | os.PathLike[str], board: str, on_error=None):
        self.path = os.fspath(path)
        self.board = board
        self.on_error = on_error
        self._stamp: tuple[int, int] | None = None
        self._store = load(self.path, missing_ok=True)  # a bad store fails the start
        self._stamp = self._mtime()

    def _mtime(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size)

    def __len__(self) -> int:
        return sum(1 for board, _ in self._store if board == self.board)

    def __call__(self, name: str) -> JobProfile | None:
        stamp = self._mtime()
        if stamp != self._stamp:
            try:
                self._store = load(self.path, missing_ok=True)
            except SpecError as err:
                if self.on_error is not None:
                    self.on_error(str(err))
            self._stamp = stamp
        return self._store.find(name, self.board)
