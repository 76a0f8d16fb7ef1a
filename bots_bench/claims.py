"""Claims: which campaign is doing which run of a shared results file, and whether it still is.

Campaigns writing one results file share its runs through the store's ``claims`` table. Here
is what that table's rows mean: who an owner is (``host:pid:start``) and whether it still
runs, whether a campaign may take a run (:func:`decide_claim`), what a waiting campaign says,
and the thread that keeps a holder's claims fresh. The store (:mod:`bots_bench.store`) makes
the table and runs the claim transactions with these rules; this module imports nothing of
it, so the rules can be read, and tested, apart from the database.
"""

from __future__ import annotations

import os
import socket
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

#: a claim whose heartbeat is older than this is taken over whoever holds it (an owner on
#: another host that stopped, or hung); a holder refreshes it every CLAIM_HEARTBEAT_S
CLAIM_STALE_S = 600.0
#: how often a campaign refreshes the heartbeat of the claim it holds, from a thread: a
#: native run blocks the campaign loop for up to 5 x its timeout plus the cool-down (the
#: verification run has 4x), 52 min with the default 600 s timeout, and longer with a longer one
CLAIM_HEARTBEAT_S = 60.0
#: how often a campaign waiting for runs another campaign claimed looks again
CLAIM_POLL_S = 1.0
_BEAT = "UPDATE claims SET heartbeat = ? WHERE owner = ?"


@dataclass(frozen=True)
class Owner:
    """The process holding a claim. Its start time tells it from a later process given the
    same PID, which must not be taken for the owner (nor keep a dead owner's claims)."""

    host: str
    pid: int
    started: float

    @classmethod
    def current(cls) -> Owner:
        return cls(socket.gethostname(), os.getpid(), _start_ticks(os.getpid()) or 0.0)

    def text(self) -> str:
        """``host:pid:start`` as stored in ``claims.owner`` (start: clock ticks since boot)."""
        return f"{self.host}:{self.pid}:{self.started:.0f}"

    @classmethod
    def parse(cls, text: str) -> Owner | None:
        """The owner of a stored ``host:pid:start``; None for text no hidvfs wrote."""
        parts = text.rsplit(":", 2)
        try:
            host, pid, started = parts[0], int(parts[1]), float(parts[2])
        except (IndexError, ValueError):
            return None
        return cls(host, pid, started) if host else None

    def describe(self) -> str:
        return f"pid {self.pid} on host {self.host}"


def _start_ticks(pid: int) -> float | None:
    """When ``pid`` started, in clock ticks since boot (``/proc/PID/stat``); None when it
    has gone. Not psutil's ``create_time``: that adds the boot time in wall-clock seconds,
    re-read at each call, so a clock step (NTP on a board without a battery clock) made a
    running campaign look like another process, and its claims were taken over."""
    from platforms.liveprocs import LiveProcessControl

    return LiveProcessControl().start_time(pid)


def owner_alive(owner: Owner) -> bool | None:
    """Whether ``owner`` runs: True or False on this host (its PID, started when the claim
    says, not a zombie), None on another host, where only its heartbeat can tell."""
    if owner.host != socket.gethostname():
        return None
    import psutil

    started = _start_ticks(owner.pid)
    if started is None:
        return False
    if started != owner.started:
        return False  # the PID was given to another process since
    try:
        return psutil.Process(owner.pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:  # not ours to inspect: alive as far as we can tell
        return True


@dataclass(frozen=True)
class Claim:
    """What a campaign found for a run: ``claimed`` (it is this campaign's to do now;
    ``took_over`` says why from ``holder``: ``dead`` or ``stale``), ``done`` (a result is
    stored) or ``held`` by ``holder``, another live campaign with a fresh heartbeat."""

    status: Literal["claimed", "done", "held"]
    holder: str | None = None
    took_over: Literal["dead", "stale"] | None = None


def decide_claim(
    *,
    stored: tuple | None,
    redo: tuple | None,
    holder: str | None,
    heartbeat: float | None,
    me: Owner,
    now: float,
    stale_s: float = CLAIM_STALE_S,
    alive: Callable[[Owner], bool | None] = owner_alive,
) -> Claim:
    """Whether this campaign may run a key. ``stored``: the stored row's mark (None: no row);
    ``redo``: the mark of the stored failure this campaign means to run again, so a failure
    stored since by another campaign counts as done, not as one to retry twice."""
    if stored is not None and stored != redo:
        return Claim("done")
    if holder is None or holder == me.text():
        return Claim("claimed")
    if heartbeat is None or now - heartbeat > stale_s:
        return Claim("claimed", holder, "stale")
    other = Owner.parse(holder)
    if other is not None and alive(other) is False:
        return Claim("claimed", holder, "dead")
    return Claim("held", holder)


def _describe_owner(text: str) -> str:
    owner = Owner.parse(text)
    return text if owner is None else owner.describe()


def describe_owners(holders: Iterable[str]) -> tuple[int, str]:
    """(how many campaigns, "pid P on host H, ...") of stored owner texts."""
    names = sorted({_describe_owner(h) for h in holders})
    return len(names), ", ".join(names)


def waiting_message(n_runs: int, holders: Iterable[str], path: Path) -> str:
    """What a campaign waiting for runs another one claimed says on stderr."""
    count, who = describe_owners(holders)
    runs = "1 run" if n_runs == 1 else f"{n_runs} runs"
    other = "another campaign" if count == 1 else f"{count} other campaigns"
    return (
        f"waiting for {runs} claimed by {other} ({who}) on {path}; a run is taken over if "
        f"its campaign stops or goes {CLAIM_STALE_S:g} s without a heartbeat"
    )


class _Heartbeat:
    """Refreshes ``owner``'s claims every ``every_s`` from a thread with a connection of its
    own, while a run blocks the campaign loop. A missed beat is not an error: it only brings
    the claim nearer to stale, and the run is at worst done twice."""

    def __init__(self, path: Path, owner: Owner, every_s: float):
        self.path, self.owner, self.every_s = path, owner.text(), every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hidvfs-claims", daemon=True)

    def __enter__(self) -> _Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=2.0)  # a beat waiting for the lock ends on its own

    def _run(self) -> None:
        try:
            db = sqlite3.connect(str(self.path), timeout=self.every_s / 2)
        except sqlite3.Error:
            return
        try:
            while not self._stop.wait(self.every_s):
                try:
                    with db:
                        db.execute(_BEAT, (time.time(), self.owner))
                except sqlite3.Error:
                    pass
        finally:
            db.close()
