"""The daemon's view of the reference-profile store (``hidvfs profile measure`` writes it).

A job registered by name gets the profile stored for it on this board; the store is reread
when the file changes, so a profile measured while the daemon runs serves the next job.
:class:`DeadlineCheck` tells, at registration, a deadline the gate can plan no operating
point of the board for.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from agents.deadlines import load, span_at, work_bound
from agents.policy import nearest_freq
from platforms.errors import SpecError
from platforms.observation import JobProfile
from platforms.spec import BoardSpec


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


def _duration(s: float) -> str:
    return f"{s * 1e3:.3g} ms" if s < 1.0 else f"{s:.3g} s"


class DeadlineCheck:
    """``check(profile, deadline_s)``: why the gate can plan no operating point of the board
    that meets ``deadline_s`` for a job of ``profile``, or None when it may.

    It uses the gate's two-point scaling (:func:`agents.deadlines.span_at` and
    :func:`~agents.deadlines.work_bound`, what :func:`agents.schedulability.requirement` plans with) at
    each cluster's top frequency (below its static cap, config ``thermal.cap_khz``). These are
    upper bounds (the gate plans with them; the job may run faster, so it is a warning, not a
    refusal), and it tells only what no placement the gate plans can beat: a deadline below
    the job's span at the fastest point, or below the time its work takes on every core of
    the board at once (a HI job may get several clusters together, agents.mixed). A deadline past both may still be more than one cluster
    can give; the gate says so once the job runs."""

    def __init__(self, spec: BoardSpec, caps_khz: Mapping[str, int] | None = None):
        caps = dict(caps_khz or {})
        self.tops = []  # (cluster, its fastest allowed kHz)
        for c in spec.clusters:
            if not c.freqs_khz or not c.cpus:
                continue
            cap = caps.get(c.name)
            top = c.freqs_khz[-1] if cap is None else nearest_freq(c.freqs_khz, cap, mode="floor")
            self.tops.append((c, top))

    def __call__(self, profile: JobProfile, deadline_s: float) -> str | None:
        if not self.tops:
            return None
        span, c, khz = min(
            ((span_at(profile, f, k.capacity), k, f) for k, f in self.tops), key=lambda t: t[0]
        )
        if deadline_s < span:
            return (
                f"deadline {_duration(deadline_s)} is below the job's span at the fastest point "
                f"as the gate bounds it ({_duration(span)} on {c.name} at {khz // 1000} MHz): "
                "the gate can plan no operating point for it"
            )
        # every core of the board at its top frequency: the work done per second adds up
        rate = sum(len(k.cpus) / work_bound(profile, f, k.capacity) for k, f in self.tops)
        if deadline_s < 1.0 / rate:
            cores = sum(len(k.cpus) for k, _ in self.tops)
            return (
                f"deadline {_duration(deadline_s)} is below the time the job's work takes on all "
                f"{cores} cores of the board at their fastest points as the gate bounds it "
                f"({_duration(1.0 / rate)}): the gate can plan no operating point for it"
            )
        return None
