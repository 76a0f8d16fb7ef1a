"""A results file that cannot take runs is refused when it is opened, before any run (a
read-only file used to crash with a traceback after the first run, losing it); an older file
missing a newer column is extended; an SQLite error while storing a run is a clean error that
says what the run measured; a report only reads its file; without a named or usual baseline
the report's ratios are taken to the first policy stored."""

from __future__ import annotations

import json
import sqlite3

import pytest
from click.testing import CliRunner

from bots_bench.report import write_report
from bots_bench.store import Store, StoreError
from tools.cli import cli


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


def _make_read_only(path):
    """SQLite treats a file whose header asks for a newer write format as read-only: a real
    read-only results file even for root, whom file permissions do not stop."""
    data = bytearray(path.read_bytes())
    data[18] = 3
    path.write_bytes(bytes(data))


def test_a_read_only_file_is_refused_at_open(tmp_path):
    db = tmp_path / "r.sqlite"
    with Store(db) as s:
        s.add(_record())
    _make_read_only(db)
    with pytest.raises(StoreError, match="cannot store runs in this file.*readonly"):
        Store(db)
    with Store(db, readonly=True) as s:  # still readable for a report
        assert [r["makespan_s"] for r in s.runs()] == [1.5]


def test_bots_run_on_a_read_only_file_fails_before_running(tmp_path):
    db = tmp_path / "r.sqlite"
    Store(db).close()
    _make_read_only(db)
    args = ["bots", "run", "--bench", "fib", "--class", "test", "--policy", "maxfreq"]
    r = CliRunner().invoke(cli, [*args, "--db", str(db)])
    assert r.exit_code == 2, r.output
    assert "cannot store runs in this file" in r.output and "Traceback" not in r.output
    assert "fib" not in r.stdout  # no run was made (and lost)


def test_an_older_file_without_a_column_is_extended(tmp_path):
    db = tmp_path / "old.sqlite"
    with Store(db) as s:
        s.add(_record(cpu_energy_j=1.0))
    con = sqlite3.connect(db)
    con.execute("ALTER TABLE runs DROP COLUMN cpu_energy_j")
    con.commit()
    con.close()
    with Store(db, readonly=True) as s:  # read as it is: the missing value is unknown
        assert s.runs()[0]["cpu_energy_j"] is None
    with Store(db) as s:
        s.add(_record(seed=1, cpu_energy_j=2.0))
        assert [r["cpu_energy_j"] for r in s.runs()] == [None, 2.0]


def test_an_sqlite_error_while_storing_is_a_store_error_naming_the_run(tmp_path):
    db = tmp_path / "r.sqlite"
    s = Store(db)
    con = sqlite3.connect(db)
    con.execute("ALTER TABLE runs RENAME TO gone")
    con.commit()
    con.close()
    with pytest.raises(StoreError) as err:
        s.add(_record())
    msg = str(err.value)
    assert "fib/test maxfreq seed 0" in msg and "makespan 1.5 s" in msg and "no such table" in msg
    s.close()


def test_a_report_leaves_an_empty_file_as_it_was(tmp_path):
    db = tmp_path / "zero.sqlite"
    db.write_bytes(b"")
    r = CliRunner().invoke(cli, ["bots", "report", "--db", str(db), "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "not a hidvfs results store" in r.output
    assert db.read_bytes() == b""


def test_the_report_baseline_falls_back_to_the_first_policy(tmp_path):
    db = tmp_path / "r.sqlite"
    with Store(db) as s:
        for seed in (0, 1):
            s.add(_record(policy="hidvfs", seed=seed, makespan_s=2.0))
            s.add(_record(policy="geardvfs", seed=seed, makespan_s=1.0))
    files = write_report(db, tmp_path / "out")
    summary = json.loads(files.summary.read_text())
    assert summary["baseline"] == "hidvfs"
    gear = next(p for p in files.groups[0].policies if p.policy == "geardvfs")
    assert gear.speedup is not None and gear.speedup.mean == pytest.approx(2.0)


def test_creating_a_store_is_one_transaction(tmp_path, monkeypatch):
    """Tables and schema version land together: a creation cut short leaves an empty file
    that the next run makes a store of, never tables without a version ("not a store")."""
    import sqlite3

    import bots_bench.store as st

    db = tmp_path / "r.sqlite"
    monkeypatch.setattr(st, "_SCHEMA", st._SCHEMA + "\nCREATE TABLE broken (;\n")
    with pytest.raises(st.StoreError, match="syntax error"):
        st.Store(db)
    con = sqlite3.connect(db)
    assert con.execute("PRAGMA user_version").fetchone()[0] == 0
    assert con.execute("SELECT name FROM sqlite_master WHERE type='table'").fetchall() == []
    con.close()
    monkeypatch.undo()
    with st.Store(db) as s:  # the next run creates it
        assert len(s) == 0
