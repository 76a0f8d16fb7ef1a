"""Results store: round trip, resume after an interrupted campaign, crash safety, schema."""

from __future__ import annotations

import csv
import json
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bots_bench.campaign_run import run_pending
from bots_bench.spec import expand, parse_spec
from bots_bench.store import (
    SCHEMA_VERSION,
    RunKey,
    Store,
    StoreError,
    normalize_timeseries,
    run_key,
)


def record(**kw):
    rec = {
        "bench": "fib",
        "class": "test",
        "policy": "schedutil",
        "seed": 0,
        "board": "tx2",
        "backend": "sim",
        "rep": 0,
        "makespan_s": 1.5,
        "energy_j": None,
        "peak_temp_c": 51.0,
        "deadline_s": None,
        "deadline_met": None,
        "lower_bound_s": 1.0,
        "graham_bound_s": 2.0,
        "ok": True,
        "error": None,
    }
    rec.update(kw)
    return rec


def test_round_trip(tmp_path):
    with Store(tmp_path / "r.sqlite") as s:
        ts = {"t": [0.0, 0.1], "freq_khz": {"a57": [345600, 2035200]}, "temp_c": {"cpu": [40, 41]}}
        rid = s.add(
            record(
                energy_j=12.0,
                deadline_s=2.0,
                deadline_met=True,
                criticality="hi",
                time_program_s=1.2,
                cpu_energy_j=5.0,
                stdout="Program = Fibonacci\n",
                timeseries=ts,
                config={"threads": 4},
                started="2024-05-01T12:00:00Z",
                ended="2024-05-01T12:00:02Z",
                ticks=15,
                interventions={"gate": 2},
            )
        )
        s.add(record(seed=1))
        assert len(s) == 2
        got = s.get(rid)
    assert got["id"] == rid and got["class"] == "test" and got["ok"] is True
    assert got["energy_j"] == 12.0 and got["edp"] == pytest.approx(18.0)  # EDP derived
    assert got["deadline_met"] is True and got["criticality"] == "hi"
    assert got["timeseries"] == ts and got["config"] == {"threads": 4}
    assert got["stdout"].startswith("Program") and got["time_program_s"] == 1.2
    assert got["ticks"] == 15 and got["interventions"] == {"gate": 2}  # extras survive
    with Store(tmp_path / "r.sqlite") as s:
        other = s.runs({"seed": 1})[0]
    assert other["energy_j"] is None and other["edp"] is None and other["deadline_met"] is None
    assert other["timeseries"] is None


def test_runs_without_blobs_do_not_read_them(tmp_path):
    """A report over a campaign asks for no time series: they are not read from the file."""
    ts = {"t": [0.0, 0.1], "freq_khz": {"a57": [345600, 2035200]}}
    with Store(tmp_path / "r.sqlite") as s:
        s.add(record(stdout="Program = Fibonacci\n", timeseries=ts, config={"threads": 4}))
    with Store(tmp_path / "r.sqlite") as s:
        statements: list[str] = []
        s._db.set_trace_callback(statements.append)
        lean = s.runs(with_stdout=False, with_timeseries=False)[0]
        selects = [q for q in statements if q.lstrip().upper().startswith("SELECT")]
        s._db.set_trace_callback(None)
        full = s.runs()[0]
    runs_select = [q for q in selects if "FROM runs" in q]
    assert runs_select and all(
        '"timeseries"' not in q and '"stdout"' not in q and "*" not in q for q in runs_select
    )
    assert "timeseries" not in lean and "stdout" not in lean
    assert lean["config"] == {"threads": 4} and lean["makespan_s"] == 1.5
    assert full["timeseries"] == ts and full["stdout"].startswith("Program")
    assert {k: v for k, v in full.items() if k not in ("timeseries", "stdout")} == lean


def test_wal_mode_and_version(tmp_path):
    Store(tmp_path / "r.sqlite").close()
    db = sqlite3.connect(tmp_path / "r.sqlite")
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_same_key_replaces(tmp_path):
    with Store(tmp_path / "r.sqlite") as s:
        a = s.add(record(ok=False, error="timeout", makespan_s=None))
        b = s.add(record(makespan_s=1.25))
        assert a == b and len(s) == 1 and s.get(a)["ok"] is True and s.get(a)["error"] is None
        s.add(record(spec_hash="abc"))  # another spec hash is another run
        assert len(s) == 2


def test_filters(tmp_path):
    with Store(tmp_path / "r.sqlite") as s:
        for p in ("a", "b", "c"):
            for seed in (0, 1):
                s.add(record(policy=p, seed=seed, energy_j=None if p == "a" else 3.0, ok=p != "c"))
        assert len(s.runs({"policy": "a"})) == 2
        assert len(s.runs({"policy": ["a", "b"], "seed": 1})) == 2
        assert {r["policy"] for r in s.runs({"energy_j": None})} == {"a"}
        assert {r["policy"] for r in s.runs({"ok": False})} == {"c"}
        assert s.runs({"policy": []}) == []
        with pytest.raises(StoreError, match="cannot filter runs on 'stdout'"):
            s.runs({"stdout": "x"})


def test_done_keys(tmp_path):
    with Store(tmp_path / "r.sqlite") as s:
        s.add(record(seed=0))
        s.add(record(seed=1, ok=False, error="boom"))
        keys = s.done_keys()
        assert RunKey("fib", "test", "schedutil", 0, "tx2", "sim", 0, "") in keys
        assert len(keys) == 2 and len(s.done_keys(ok_only=True)) == 1
        assert s.key_for(record(seed=1)) in keys


SPEC = {
    "kernels": ["fib", "sort"],
    "classes": ["test"],
    "policies": ["schedutil", "hidvfs"],
    "seeds": [1, 2, 3],
    "board": "tx2",
    "backend": "sim",
}


def _fake_run(cfg):
    return {"makespan_s": 1.0 + cfg.seed / 10 + cfg.rep, "energy_j": 2.0 * cfg.seed, "ok": True}


def test_interrupted_campaign_resumes_without_loss(tmp_path):
    configs = expand(parse_spec(SPEC))
    assert len(configs) == 12
    db = tmp_path / "r.sqlite"
    calls = []

    def interrupted(cfg):
        if len(calls) == 3:
            raise KeyboardInterrupt
        calls.append(cfg.key)
        return _fake_run(cfg)

    with Store(db) as s, pytest.raises(KeyboardInterrupt):
        run_pending(configs, interrupted, s)
    assert calls == [c.key for c in configs[:3]]

    with Store(db) as s:  # a new session sees the 3 finished runs
        before = s.runs()
        assert [run_key(r) for r in before] == calls

    second = []
    with Store(db) as s:
        summary = run_pending(configs, lambda c: second.append(c.key) or _fake_run(c), s)
        after = s.runs()
    assert second == [c.key for c in configs[3:]]  # only the remaining runs executed
    assert (summary.executed, summary.skipped, summary.failed) == (9, 3, 0)
    assert len(after) == 12 and {run_key(r) for r in after} == {c.key for c in configs}
    assert after[:3] == before  # nothing finished was rewritten
    assert after[0]["config"]["class"] == "test" and after[0]["spec_hash"] == configs[0].spec_hash

    third = []
    with Store(db) as s:
        summary = run_pending(configs, lambda c: third.append(c) or _fake_run(c), s)
    assert third == [] and summary.skipped == 12


def test_a_killed_process_keeps_its_finished_runs(tmp_path):
    db = tmp_path / "r.sqlite"
    script = textwrap.dedent(
        f"""
        import os, signal
        from bots_bench.store import Store
        s = Store({str(db)!r})
        for seed in range(3):
            s.add({{"bench": "fib", "class": "test", "policy": "p", "seed": seed, "board": "tx2",
                    "backend": "native", "ok": True, "makespan_s": 1.0}})
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    p = subprocess.run(
        [sys.executable, "-c", script], cwd=Path(__file__).resolve().parents[2], capture_output=True
    )
    assert p.returncode == -9, p.stderr
    with Store(db) as s:
        assert [r["seed"] for r in s.runs()] == [0, 1, 2]
        assert s._db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_failures_are_recorded_and_retried(tmp_path):
    configs = expand(parse_spec(dict(SPEC, kernels=["fib"], seeds=[1])))

    def flaky(cfg):
        if cfg.policy == "hidvfs":
            raise RuntimeError("binary died")
        return _fake_run(cfg)

    with Store(tmp_path / "r.sqlite") as s:
        summary = run_pending(configs, flaky, s)
        assert (summary.executed, summary.failed) == (2, 1)
        bad = s.runs({"ok": False})[0]
        assert bad["policy"] == "hidvfs" and bad["error"] == "RuntimeError: binary died"
        assert run_pending(configs, flaky, s).executed == 0  # a failure is a result
        again = run_pending(configs, _fake_run, s, retry_failed=True)
        assert again.executed == 1 and s.runs({"ok": False}) == [] and len(s) == 2


def test_run_function_may_not_change_the_key(tmp_path):
    configs = expand(parse_spec(dict(SPEC, kernels=["fib"], seeds=[1], policies=["hidvfs"])))
    with Store(tmp_path / "r.sqlite") as s, pytest.raises(StoreError, match="changed the key"):
        run_pending(configs, lambda c: {"ok": True, "seed": 99}, s)


def test_newer_schema_is_refused(tmp_path):
    db = tmp_path / "r.sqlite"
    Store(db).close()
    con = sqlite3.connect(db)
    con.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    con.close()
    with pytest.raises(StoreError, match=rf"newer hidvfs \(results schema {SCHEMA_VERSION + 1}"):
        Store(db)


def test_foreign_files_are_refused(tmp_path):
    other = tmp_path / "other.sqlite"
    con = sqlite3.connect(other)
    con.execute("CREATE TABLE t (x)")
    con.commit()
    con.close()
    with pytest.raises(StoreError, match="not a hidvfs results store"):
        Store(other)
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(StoreError, match="not a usable SQLite results store"):
        Store(junk)


@pytest.mark.parametrize(
    ("bad", "msg"),
    [
        ({"seed": "1"}, "'seed' must be an integer"),
        ({"bench": ""}, "'bench' must be a non-empty string"),
        ({"makespan_s": "fast"}, "'makespan_s' must be a number or null"),
        ({"deadline_met": "yes"}, "'deadline_met' must be true/false or null"),
        ({"config": {"f": object()}}, "'config' is not JSON-serialisable"),
        (
            {"timeseries": {"t": [0, 1], "temp_c": {"cpu": [1]}}},
            "temp_c.cpu must be a list as long",
        ),
    ],
)
def test_malformed_records(tmp_path, bad, msg):
    with Store(tmp_path / "r.sqlite") as s, pytest.raises(StoreError, match=msg):
        s.add(record(**bad))
    with Store(tmp_path / "r2.sqlite") as s, pytest.raises(StoreError, match="lacks key field"):
        s.add({"bench": "fib", "ok": True})


def test_sample_list_series_is_stored_in_column_form(tmp_path):
    series = [
        {"t": 0.0, "freq_khz": {"a57": 345600, "denver": None}, "temp_c": 40.0, "power_w": 3.0},
        {
            "t": 0.05,
            "freq_khz": {"a57": 2035200, "denver": 2035200},
            "temp_c": 41.5,
            "power_w": 5.0,
        },
    ]
    with Store(tmp_path / "r.sqlite") as s:
        rid = s.add(record(series=series))
        got = s.get(rid)
    assert "series" not in got
    assert got["timeseries"] == {
        "t": [0.0, 0.05],
        "freq_khz": {"a57": [345600, 2035200], "denver": [None, 2035200]},
        "temp_c": {"max": [40.0, 41.5]},
        "power_w": {"total": [3.0, 5.0]},
    }
    assert normalize_timeseries(got["timeseries"]) == got["timeseries"]


def test_exports(tmp_path):
    with Store(tmp_path / "r.sqlite") as s:
        for seed in range(3):
            s.add(record(seed=seed, energy_j=None if seed == 1 else seed * 2.5, stdout="x;y\nz"))
        assert s.export_csv(tmp_path / "r.csv") == 3
        assert s.export_json(tmp_path / "r.json", {"seed": [0, 2]}) == 2
        assert s.export_csv(tmp_path / "b.csv", with_blobs=True) == 3
    rows = list(csv.DictReader(open(tmp_path / "r.csv", newline="")))
    assert [r["seed"] for r in rows] == ["0", "1", "2"]
    assert rows[1]["energy_j"] == "" and rows[2]["energy_j"] == "5.0" and "stdout" not in rows[0]
    assert rows[0]["ok"] == "True" and rows[0]["class"] == "test"
    blobs = list(csv.DictReader(open(tmp_path / "b.csv", newline="")))
    assert blobs[0]["stdout"] == "x;y\nz"
    data = json.loads((tmp_path / "r.json").read_text())
    assert [d["seed"] for d in data] == [0, 2] and data[1]["energy_j"] == 5.0


metric = st.one_of(st.none(), st.floats(-1e9, 1e9, allow_nan=False))


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    makespan=metric,
    energy=metric,
    temp=metric,
    met=st.one_of(st.none(), st.booleans()),
    ok=st.booleans(),
    error=st.one_of(st.none(), st.text(max_size=30)),
    seed=st.integers(-(2**31), 2**31),
)
def test_metrics_survive_the_round_trip(tmp_path, makespan, energy, temp, met, ok, error, seed):
    with Store(tmp_path / "h.sqlite") as s:
        rid = s.add(
            record(
                seed=seed,
                makespan_s=makespan,
                energy_j=energy,
                peak_temp_c=temp,
                deadline_met=met,
                ok=ok,
                error=error,
            )
        )
        got = s.get(rid)
    assert (got["makespan_s"], got["energy_j"], got["peak_temp_c"]) == (makespan, energy, temp)
    assert (got["deadline_met"], got["ok"], got["error"], got["seed"]) == (met, ok, error, seed)


def _open_fresh_files(paths, barrier, results):
    """One of several processes opening the same new files at once (one file per round)."""
    for p in paths:
        barrier.wait()
        try:
            Store(p).close()
            results.put("ok")
        except Exception as err:  # noqa: BLE001 - the test reports what went wrong
            results.put(f"{type(err).__name__}: {err}")


def test_campaigns_started_together_on_a_new_file_all_open_it(tmp_path):
    """Several campaigns given one new --db at once: the schema is made once, inside the
    write lock, and every process opens the store (the check used to run outside the lock:
    "table runs already exists", or tables without a version read as "not a store")."""
    import collections
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    paths = [tmp_path / f"r{i}.sqlite" for i in range(15)]
    barrier, results = ctx.Barrier(4), ctx.Queue()
    procs = [
        ctx.Process(target=_open_fresh_files, args=(paths, barrier, results)) for _ in range(4)
    ]
    for p in procs:
        p.start()
    got = collections.Counter(results.get(timeout=120) for _ in range(4 * len(paths)))
    for p in procs:
        p.join(timeout=60)
    assert got == {"ok": 4 * len(paths)}
    for p in paths:
        with Store(p) as s:
            assert len(s) == 0
        con = sqlite3.connect(p)
        assert con.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        con.close()


def _add_runs(path, policy, barrier, results):
    try:
        barrier.wait()
        for seed in range(10):
            with Store(path) as s:
                s.add(record(policy=policy, seed=seed))
        results.put("ok")
    except Exception as err:  # noqa: BLE001
        results.put(f"{type(err).__name__}: {err}")


def test_campaigns_writing_one_new_file_together_keep_every_run(tmp_path):
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    db = tmp_path / "r.sqlite"
    barrier, results = ctx.Barrier(3), ctx.Queue()
    procs = [ctx.Process(target=_add_runs, args=(db, f"p{i}", barrier, results)) for i in range(3)]
    for p in procs:
        p.start()
    got = [results.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert got == ["ok"] * 3
    with Store(db, readonly=True) as s:
        assert len(s) == 30


def test_schema_statements_are_split_for_one_transaction():
    from bots_bench.store import _SCHEMA, _statements

    stmts = _statements(_SCHEMA)
    assert [s.split()[:2] for s in stmts] == [["CREATE", "TABLE"], ["CREATE", "INDEX"]]
    assert _statements("CREATE TABLE a (x TEXT DEFAULT ';');\n") == [
        "CREATE TABLE a (x TEXT DEFAULT ';');"
    ]


def test_run_pending_stamps_each_run_with_its_start_and_end(tmp_path):
    """The store's started/ended columns were never filled."""
    import re

    with Store(tmp_path / "r.sqlite") as st:
        run_pending(
            [
                {
                    "bench": "fib",
                    "class": "test",
                    "policy": "maxfreq",
                    "seed": 0,
                    "board": "tx2",
                    "backend": "sim",
                }
            ],
            lambda cfg: {"ok": True, "makespan_s": 1.0},
            st,
        )
        (rec,) = st.runs()
    stamp = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d{4}"
    assert re.fullmatch(stamp, rec["started"]) and re.fullmatch(stamp, rec["ended"])
    assert rec["started"] <= rec["ended"]


@pytest.mark.parametrize(
    ("sql", "said"),
    [
        ("UPDATE runs SET config = '[1,2]'", "column config: a JSON list, not an object"),
        ("UPDATE runs SET extra = '[1,2]'", "column extra: a JSON list, not an object"),
        ("UPDATE runs SET timeseries = '\"hello\"'", "column timeseries: a JSON str"),
        ("UPDATE runs SET config = '{garbage'", "column config: not JSON"),
        ("UPDATE runs SET makespan_s = 'fast'", "column makespan_s: 'fast' is not a number"),
        ('UPDATE runs SET run_key = \'["fib","test",1]\'', "column run_key"),
        ("UPDATE runs SET class = CAST(x'ff' AS TEXT)", "cannot read its runs"),
    ],
)
def test_a_damaged_row_is_said_with_the_file_and_the_run(tmp_path, sql, said):
    """Edited or damaged rows crashed `bots report` with tracebacks (AttributeError,
    TypeError) or errors that named neither the file nor the row."""
    path = tmp_path / "r.sqlite"
    with Store(path) as st:
        st.add(record(timeseries={"t": [0.0], "freq_khz": {"a57": [345600]}}))
    con = sqlite3.connect(path)
    con.execute(sql)
    con.commit()
    con.close()
    with Store(path) as st, pytest.raises(StoreError) as e:
        st.runs()
        st.done_keys()
    msg = str(e.value)
    assert str(path) in msg and said in msg, msg
    if "cannot read" not in msg:
        assert "run 1:" in msg and "edited or damaged" in msg
