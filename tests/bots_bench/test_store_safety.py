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


@pytest.mark.parametrize("readonly", [True, False])
def test_a_renamed_core_column_is_refused_not_read_as_empty(tmp_path, readonly):
    """A renamed `makespan_s` read as an older file's missing column: the report said
    makespan n/a and 0 failed runs, and a campaign re-added it and counted its runs failed."""
    db = tmp_path / "r.sqlite"
    with Store(db) as s:
        s.add(_record())
    con = sqlite3.connect(db)
    con.execute("ALTER TABLE runs RENAME COLUMN makespan_s TO mk")
    con.commit()
    con.close()
    with pytest.raises(StoreError, match=r"lacks .*makespan_s \(renamed or dropped\?\)"):
        Store(db, readonly=readonly)
    have = {r[1] for r in sqlite3.connect(db).execute("PRAGMA table_info(runs)")}
    assert "makespan_s" not in have  # not re-added


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


# -- reading a results file without writing beside it ------------------------------------------
def test_a_read_only_open_leaves_nothing_beside_the_file(tmp_path):
    """A report used to leave r.sqlite-shm and r.sqlite-wal beside a results file (a WAL file
    needs them even to be read, and a read-only connection cannot remove them)."""
    db = tmp_path / "r.sqlite"
    with Store(db) as s:
        s.add(_record())
    before = db.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.sqlite"]
    with Store(db, readonly=True) as s:
        assert len(s.runs()) == 1 and not s.immutable
        with pytest.raises(sqlite3.OperationalError, match="readonly|query_only"):
            s._db.execute("DELETE FROM runs")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.sqlite"]
    assert db.read_bytes() == before
    with Store(db) as w, Store(db, readonly=True) as r:  # beside a campaign writing it
        w.add(_record(seed=1))
        assert [x["seed"] for x in r.runs()] == [0, 1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.sqlite"]


def _as_nobody():
    """The command prefix that runs a process as an unprivileged user (None when this cannot
    be done here): as root, file permissions stop nothing, so only another user shows them."""
    import os
    import shutil
    import subprocess
    import sys

    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        return None
    cmd = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", sys.executable]
    probe = subprocess.run([*cmd, "-c", "import bots_bench.store"], cwd=_REPO, capture_output=True)
    return cmd if probe.returncode == 0 else None


from pathlib import Path  # noqa: E402

_REPO = Path(__file__).resolve().parents[2]

_READ = """
import sys
from bots_bench.store import Store, StoreError
try:
    with Store(sys.argv[1], readonly=True) as s:
        print("runs", len(s.runs()), "immutable", s.immutable)
except StoreError as err:
    print("refused", err)
"""


def test_a_user_reads_a_results_file_in_a_folder_only_root_may_write():
    """`sudo hidvfs bots run` leaves the file in a root-owned folder; a user's report could not
    read it ("attempt to write a readonly database": SQLite wanted to make the -shm)."""
    import os
    import shutil
    import subprocess
    import tempfile

    nobody = _as_nobody()
    if nobody is None:
        pytest.skip("needs root and setpriv, and a python an unprivileged user can run")
    top = Path(tempfile.mkdtemp(prefix="hidvfs-store-"))  # tmp_path is private to root
    try:
        top.chmod(0o755)
        folder = top / "rootonly"
        folder.mkdir(mode=0o755)
        out = top / "out"
        out.mkdir()
        out.chmod(0o777)
        db = folder / "r.sqlite"
        with Store(db) as s:
            for seed in (0, 1):
                s.add(_record(seed=seed))
                s.add(_record(seed=seed, policy="schedutil", makespan_s=2.0))

        def read():
            p = subprocess.run(
                [*nobody, "-c", _READ, str(db)], cwd=_REPO, capture_output=True, text=True
            )
            assert p.returncode == 0, p.stderr
            return p.stdout.strip()

        assert read() == "runs 4 immutable True"  # the campaign is over: read as it is
        assert sorted(p.name for p in folder.iterdir()) == ["r.sqlite"]

        env = dict(os.environ, MPLCONFIGDIR=str(out / "mpl"), HOME=str(out))
        cli = [*nobody, "-c", "from tools.cli import main; main()"]
        if subprocess.run([*cli, "--help"], cwd=_REPO, capture_output=True, env=env).returncode:
            pass  # that user's python lacks the CLI's packages: the Store is what is tested
        else:  # the whole `hidvfs bots report`
            args = ["bots", "report", "--db", str(db), "--out", str(out / "rep")]
            p = subprocess.run([*cli, *args], cwd=_REPO, capture_output=True, text=True, env=env)
            assert p.returncode == 0, p.stdout + p.stderr
            assert (out / "rep" / "summary.json").is_file()
            assert sorted(p.name for p in folder.iterdir()) == ["r.sqlite"]

        with Store(db) as w:  # a campaign writing it: read through its -shm, with its runs
            w.add(_record(seed=2))
            assert read() == "runs 5 immutable False"

        # a campaign killed before it closed the file, its -shm not readable: its last runs
        # are only in the -wal, so the file is refused rather than read without them
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            s = Store(db)
            s.add(_record(seed=3))
            os._exit(0)
        os.waitpid(pid, 0)
        assert (folder / "r.sqlite-wal").stat().st_size > 0
        (folder / "r.sqlite-shm").chmod(0o600)
        got = read()
        assert got.startswith("refused") and "r.sqlite-wal beside it still holds data" in got
        assert f"{folder} is not writable for you" in got
        with Store(db, readonly=True) as s:  # its owner still reads every run
            assert len(s) == 6
    finally:
        shutil.rmtree(top)


def test_a_file_locked_by_another_process_is_said_to_be_locked(tmp_path, monkeypatch):
    """A write lock held elsewhere was reported, after 30 s, as "cannot store runs in this
    file (database is locked)" or "not a usable SQLite results store": the file is fine."""
    import bots_bench.store as store

    db = tmp_path / "r.sqlite"
    with Store(db) as s:
        s.add(_record())
    monkeypatch.setattr(store, "_BUSY_TIMEOUT_S", 0.2)
    holder = sqlite3.connect(db)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(StoreError, match=r"locked by another process for longer than 0\.2 s"):
            Store(db)
    finally:
        holder.rollback()
        holder.close()
    with Store(db) as s:  # and usable again once it is released
        assert len(s.runs()) == 1
