"""A results file locked by another process (a concurrent `hidvfs bots run` on the same --db)
was waited for up to 30 s without a word: the user saw a hang. The wait is now said on
stderr, once, about a second into it; the operation then goes on, and after the same budget
the file is refused as locked, as before."""

from __future__ import annotations

import sqlite3
import threading
import time

import pytest

import bots_bench.store as store
from bots_bench.store import Store, StoreError

NOTICE = "for the lock on"


def _record(**kw):
    rec = {
        "bench": "fib",
        "class": "test",
        "policy": "maxfreq",
        "seed": 0,
        "board": "tx2",
        "backend": "sim",
        "makespan_s": 1.5,
        "energy_j": 3.0,
        "ok": True,
    }
    rec.update(kw)
    return rec


class _Holder(threading.Thread):
    """Another connection that takes the file's lock (``begin``) and keeps it ``hold_s``."""

    def __init__(self, db, begin="BEGIN IMMEDIATE", hold_s=1.5):
        super().__init__(daemon=True)
        self.db, self.begin, self.hold_s = db, begin, hold_s
        self.taken = threading.Event()

    def run(self):
        con = sqlite3.connect(self.db)
        try:
            con.execute(self.begin)
            self.taken.set()
            time.sleep(self.hold_s)
            con.rollback()
        finally:
            con.close()

    def __enter__(self):
        self.start()
        assert self.taken.wait(10), "the holder did not get the lock"
        return self

    def __exit__(self, *exc):
        self.join(10)


def _notices(err: str) -> list[str]:
    return [line for line in err.splitlines() if NOTICE in line]


@pytest.mark.parametrize("where", ["open", "add"])
def test_a_campaign_waiting_for_the_lock_says_so_once_then_stores(tmp_path, capsys, where):
    db = tmp_path / "r.sqlite"
    with Store(db) as s:
        s.add(_record())
    capsys.readouterr()
    if where == "open":  # BEGIN IMMEDIATE of the schema check waits
        with _Holder(db):
            s = Store(db)
        s.add(_record(seed=1))
    else:  # a run's commit waits
        s = Store(db)
        with _Holder(db):
            s.add(_record(seed=1))
    with s:
        assert len(s) == 2
    notices = _notices(capsys.readouterr().err)
    assert notices == [
        f"waiting up to 30 s for the lock on {db}, held by another process "
        "(a concurrent `hidvfs bots run` on the same --db?)"
    ]


@pytest.mark.parametrize("where", ["open", "runs"])
def test_a_report_waiting_for_the_lock_says_so_once_then_reads(tmp_path, capsys, where):
    """Readers wait on a file in rollback-journal mode whose writer holds it exclusively."""
    db = tmp_path / "r.sqlite"
    with Store(db) as s:
        s.add(_record())
    con = sqlite3.connect(db)
    assert con.execute("PRAGMA journal_mode=DELETE").fetchone()[0] == "delete"
    con.close()
    capsys.readouterr()
    if where == "open":
        with _Holder(db, "BEGIN EXCLUSIVE"):
            r = Store(db, readonly=True)
        rows = r.runs()
    else:
        r = Store(db, readonly=True)
        with _Holder(db, "BEGIN EXCLUSIVE"):
            rows = r.runs()
    r.close()
    assert [x["seed"] for x in rows] == [0]
    assert len(_notices(capsys.readouterr().err)) == 1


def test_without_contention_nothing_is_said(tmp_path, capsys):
    db = tmp_path / "r.sqlite"
    with Store(db) as s:
        s.add(_record())
        s.add(_record(seed=1))
        assert len(s.done_keys()) == 2
    with Store(db) as w, Store(db, readonly=True) as r:  # a report beside a campaign
        w.add(_record(seed=2))
        assert len(r.runs()) == 3 and len(r) == 3
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out == ""


def test_the_wait_keeps_its_budget_and_the_refusal(tmp_path, capsys, monkeypatch):
    """The notice does not add to the budget: SQLite is given the time up to the notice, then
    what is left, and never a wait past the budget's end; then the file is refused as before."""
    db = tmp_path / "r.sqlite"
    with Store(db) as s:
        s.add(_record())
    capsys.readouterr()
    budget, notice = 0.5, 0.1
    monkeypatch.setattr(store, "_BUSY_TIMEOUT_S", budget)
    monkeypatch.setattr(store, "_BUSY_NOTICE_S", notice)
    calls: list[tuple[float, float]] = []
    real = store._set_busy_timeout

    def spy(db_, seconds):
        calls.append((time.monotonic(), seconds))
        real(db_, seconds)

    monkeypatch.setattr(store, "_set_busy_timeout", spy)
    holder = sqlite3.connect(db)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(StoreError, match=r"locked by another process for longer than 0\.5 s"):
            Store(db)
    finally:
        holder.rollback()
        holder.close()
    assert _notices(capsys.readouterr().err) == [
        f"waiting up to 0.5 s for the lock on {db}, held by another process "
        "(a concurrent `hidvfs bots run` on the same --db?)"
    ]
    *waits, restored = calls
    assert restored[1] == budget  # the connection's own timeout is put back
    start, first = waits[0]
    assert first == pytest.approx(notice, abs=0.01)  # the first wait ends at the notice
    assert len(waits) >= 2
    for at, seconds in waits:  # and none runs past the budget
        assert at + seconds <= start + budget + 0.01
