"""Two campaigns started at once on one --db (two shells, a timer overlapping a manual run)
both ran every run: the results stayed right (one row per key) but the work was doubled.
Each run is now claimed before it runs (table ``claims``): a run another live campaign holds
is left to it and waited for at the end; a claim whose owner died (its PID gone, or given to
another process) or whose heartbeat is stale is taken over; the claim ends with the stored
result, in the same transaction, or when the run is interrupted."""

from __future__ import annotations

import json
import socket
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import bots_bench.claims as claims_mod
import bots_bench.store as store_mod
from bots_bench.campaign_run import run_pending
from bots_bench.claims import CLAIM_STALE_S, Owner, _start_ticks, owner_alive
from bots_bench.store import SCHEMA_VERSION, RunKey, Store, StoreError

ROOT = Path(__file__).resolve().parents[2]


def _config(seed: int = 0, policy: str = "maxfreq") -> dict:
    return {
        "bench": "fib",
        "class": "test",
        "policy": policy,
        "seed": seed,
        "board": "tx2",
        "backend": "sim",
    }


def _key(cfg: dict) -> RunKey:
    return store_mod.run_key(cfg)


def _result(cfg: dict, **kw) -> dict:
    return {**cfg, "ok": True, "makespan_s": 1.0, "energy_j": 2.0, **kw}


def _ok(cfg) -> dict:
    return {"ok": True, "makespan_s": 1.0, "energy_j": 2.0}


@pytest.fixture
def other_process():
    """A live process on this host: the owner of another campaign's claims."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        yield proc, Owner(socket.gethostname(), proc.pid, _start_ticks(proc.pid))
    finally:
        proc.kill()
        proc.wait()


# -- two real campaigns ----------------------------------------------------------------------
_DRIVER = textwrap.dedent(
    """
    import json, os, sys, time
    from pathlib import Path

    import bots_bench.campaign_sim as cs
    import bots_bench.progress, tools.native_campaign, tools.policies  # imported before the start
    from tools.cli import cli

    log, barrier, me, *args = sys.argv[1:]
    real = cs.run_one

    def counted(cfg, build):  # every execution, by whom
        with open(log, "a") as f:
            f.write(json.dumps([cfg.bench, cfg.policy, cfg.seed]) + "\\n")
        time.sleep(0.15)  # long enough for the two campaigns to meet
        return real(cfg, build)

    cs.run_one = counted
    Path(barrier, me).touch()
    while len(os.listdir(barrier)) < 2:  # both start together
        time.sleep(0.005)
    cli(args=args, prog_name="hidvfs")
    """
)


def test_two_concurrent_campaigns_run_every_run_once_and_both_report_all(tmp_path):
    db = tmp_path / "r.db"
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    args = ["bots", "run", "--backend", "sim", "--board", "tx2", "--bench", "fib,sort"]
    args += ["--class", "test", "--policy", "maxfreq,schedutil", "--seeds", "2"]
    args += ["--db", str(db), "--json"]
    procs = {
        me: subprocess.Popen(
            [sys.executable, "-c", _DRIVER, str(tmp_path / f"{me}.log"), str(barrier), me, *args],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for me in ("a", "b")
    }
    out = {me: p.communicate(timeout=120) for me, p in procs.items()}
    for me, p in procs.items():
        assert p.returncode == 0, out[me][1]
    ran = {
        me: [tuple(json.loads(line)) for line in (tmp_path / f"{me}.log").read_text().splitlines()]
        if (tmp_path / f"{me}.log").exists()
        else []
        for me in procs
    }
    every = [(b, p, s) for b in ("fib", "sort") for p in ("maxfreq", "schedutil") for s in (0, 1)]
    assert sorted(ran["a"] + ran["b"]) == sorted(every)  # each run once, in all
    assert ran["a"] and ran["b"]  # the work was shared
    reports = {me: json.loads(out[me][0]) for me in procs}
    for me in procs:  # each report covers every run it was asked for
        assert sorted((r["bench"], r["policy"], r["seed"]) for r in reports[me]) == sorted(every)
        assert all(r["ok"] for r in reports[me])
        left = 8 - len(ran[me])
        other_pid = procs["b" if me == "a" else "a"].pid
        assert f"{left} of 8 runs were left to another campaign on {db}" in out[me][1]
        assert f"pid {other_pid} on host {socket.gethostname()}" in out[me][1]
    assert reports["a"] == reports["b"]
    with Store(db) as s:
        assert len(s) == 8 and s.claims() == {}


# -- taking a claim ----------------------------------------------------------------------------
def test_a_claim_of_a_live_campaign_is_left_to_it(tmp_path, other_process):
    _, owner = other_process
    cfg = _config()
    with Store(tmp_path / "r.db") as s:
        assert s.claim(_key(cfg), owner).status == "claimed"
        got = s.claim(_key(cfg), Owner.current())
        assert (got.status, got.holder) == ("held", owner.text())
        assert s.claims() == {_key(cfg): (owner.text(), pytest.approx(time.time(), abs=5))}


@pytest.mark.parametrize("how", ["exited", "pid reused"])
def test_a_claim_held_by_a_dead_process_is_taken_over(tmp_path, how):
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    started = _start_ticks(proc.pid)
    if how == "exited":
        proc.kill()
        proc.wait()
        dead = Owner(socket.gethostname(), proc.pid, started)
    else:  # a live PID that started after the owner did is another process
        dead = Owner(socket.gethostname(), proc.pid, started - 100.0)
    try:
        cfg = _config()
        ran = []
        with Store(tmp_path / "r.db") as s:
            assert s.claim(_key(cfg), dead).status == "claimed"
            summary = run_pending([cfg], lambda c: ran.append(c) or _ok(c), s, poll_s=0.01)
            assert ran == [cfg]
            assert (summary.executed, summary.taken_over, summary.by_others) == (1, 1, 0)
            assert s.claims() == {} and [r["seed"] for r in s.runs()] == [0]
    finally:
        proc.kill()
        proc.wait()


def test_a_stale_claim_is_taken_over_and_a_fresh_one_on_another_host_is_not(tmp_path):
    elsewhere = Owner("another-host", 4242, 1.0e9)  # its PID cannot be looked up from here
    stale, fresh = _config(seed=0), _config(seed=1)
    with Store(tmp_path / "r.db") as s:
        s.claim(_key(stale), elsewhere, now=time.time() - CLAIM_STALE_S - 60)
        s.claim(_key(fresh), elsewhere)
        me = Owner.current()
        got = s.claim(_key(stale), me)
        assert (got.status, got.took_over, got.holder) == ("claimed", "stale", elsewhere.text())
        assert s.claim(_key(fresh), me).status == "held"
        assert s.claims()[_key(stale)][0] == me.text()


# -- giving a claim back -----------------------------------------------------------------------
def test_an_interrupted_run_gives_its_claim_back(tmp_path):
    cfg = _config()
    held_while_running = []
    with Store(tmp_path / "r.db") as s:

        def interrupted(c):
            held_while_running.append(s.claims())
            raise KeyboardInterrupt

        with pytest.raises(KeyboardInterrupt):
            run_pending([cfg], interrupted, s)
        assert held_while_running == [
            {_key(cfg): (Owner.current().text(), pytest.approx(time.time(), abs=5))}
        ]
        assert s.claims() == {} and len(s) == 0
        # so the next campaign (or one waiting for it) runs it at once
        assert run_pending([cfg], _ok, s).executed == 1


def test_a_failed_run_is_stored_and_its_claim_ends(tmp_path):
    cfg = _config()
    with Store(tmp_path / "r.db") as s:
        summary = run_pending([cfg], lambda c: 1 / 0, s)
        assert (summary.executed, summary.failed) == (1, 1)
        assert s.claims() == {} and s.runs()[0]["error"].startswith("ZeroDivisionError")


def test_storing_a_result_ends_its_claim_in_the_same_transaction(tmp_path):
    path = tmp_path / "r.db"
    first, second = _config(seed=0), _config(seed=1)
    me = Owner.current()
    with Store(path) as s:
        s.claim(_key(first), me)
        s.add(_result(first))
        assert s.claims() == {}
        s.claim(_key(second), me)
    con = sqlite3.connect(path)  # a claim that cannot end: the result is not stored either
    con.execute(
        "CREATE TRIGGER keep BEFORE DELETE ON claims BEGIN SELECT RAISE(ABORT, 'kept'); END"
    )
    con.commit()
    con.close()
    with Store(path) as s:
        with pytest.raises(StoreError, match="kept"):
            s.add(_result(second))
        assert [r["seed"] for r in s.runs()] == [0]
        assert list(s.claims()) == [_key(second)]


# -- waiting for another campaign --------------------------------------------------------------
@pytest.mark.parametrize("then", ["stores it", "gives it back"])
def test_a_campaign_waits_for_the_runs_another_one_holds(tmp_path, other_process, then):
    proc, owner = other_process
    path = tmp_path / "r.db"
    held, free = _config(seed=0), _config(seed=1)
    with Store(path) as s:
        s.claim(_key(held), owner)

    def other_campaign():  # finishes its run a moment after this one starts waiting
        time.sleep(0.4)
        with Store(path) as o:
            if then == "stores it":
                o.add(_result(held, makespan_s=7.0))
            else:
                o.release(_key(held), owner)

    said, ran = [], []
    t = threading.Thread(target=other_campaign)
    t.start()
    with Store(path) as s:
        summary = run_pending(
            [held, free],
            lambda c: ran.append(c["seed"]) or _ok(c),
            s,
            on_wait=said.append,
            poll_s=0.02,
        )
        t.join()
        rows = {r["seed"]: r["makespan_s"] for r in s.runs()}
    assert said == [
        f"waiting for 1 run claimed by another campaign (pid {proc.pid} on host "
        f"{socket.gethostname()}) on {path}; a run is taken over if its campaign stops or goes "
        f"{CLAIM_STALE_S:g} s without a heartbeat"
    ]
    if then == "stores it":
        assert ran == [1] and (summary.executed, summary.by_others) == (1, 1)
        assert rows == {0: 7.0, 1: 1.0}
    else:
        assert ran == [1, 0] and (summary.executed, summary.by_others) == (2, 0)
        assert rows == {0: 1.0, 1: 1.0}
    assert summary.keys == {_key(held), _key(free)} and summary.others == {owner.text()}


def test_a_failure_retried_by_another_campaign_is_not_retried_again(tmp_path, other_process):
    """Two campaigns retrying stored failures (the default) must not both retry one."""
    _, owner = other_process
    cfg = _config()
    with Store(tmp_path / "r.db") as s:
        s.add(_result(cfg, ok=False, error="first", started="t0", ended="t1"))
        marks = s.failure_marks()
        me = Owner.current()
        assert s.claim(_key(cfg), owner, redo=marks[_key(cfg)]).status == "claimed"
        s.add(_result(cfg, ok=False, error="again", started="t2", ended="t3"))  # its retry
        assert s.claim(_key(cfg), me, redo=marks[_key(cfg)]).status == "done"
        ran = []
        summary = run_pending([cfg], lambda c: ran.append(c) or _ok(c), s, retry_failed=True)
        assert ran == [cfg] and summary.executed == 1  # a failure stored before it began


def test_a_long_run_keeps_its_claim_fresh(tmp_path, monkeypatch):
    monkeypatch.setattr(claims_mod, "CLAIM_HEARTBEAT_S", 0.05)
    beats = []
    with Store(tmp_path / "r.db") as s:

        def slow(c):
            for _ in range(2):
                beats.append(next(iter(s.claims().values()))[1])
                time.sleep(0.3)
            return _ok(c)

        run_pending([_config()], slow, s)
    assert beats[1] > beats[0]


# -- files from before claims ------------------------------------------------------------------
def test_an_old_file_without_the_claims_table_opens_and_gains_it(tmp_path):
    path = tmp_path / "old.db"
    with Store(path) as s:
        s.add(_result(_config()))
    con = sqlite3.connect(path)
    con.execute("DROP TABLE claims")
    con.commit()
    con.close()

    def tables():
        con = sqlite3.connect(path)
        try:
            names = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            return names, con.execute("PRAGMA user_version").fetchone()[0]
        finally:
            con.close()

    with Store(path, readonly=True) as s:  # a report changes nothing
        assert len(s.runs()) == 1
    assert "claims" not in tables()[0]
    with Store(path) as s:
        assert len(s) == 1
        assert run_pending([_config(seed=1)], _ok, s).executed == 1
    names, version = tables()
    assert "claims" in names and version == SCHEMA_VERSION  # no new version for old readers


def test_a_foreign_claims_table_is_refused(tmp_path):
    path = tmp_path / "r.db"
    Store(path).close()
    con = sqlite3.connect(path)
    con.execute("DROP TABLE claims")
    con.execute("CREATE TABLE claims (who TEXT)")
    con.commit()
    con.close()
    with pytest.raises(StoreError, match="claims table lacks column"):
        Store(path)


def test_a_clock_step_does_not_make_a_running_campaign_look_dead(other_process, monkeypatch):
    """The owner's start is clock ticks since boot, not psutil's wall-clock create time,
    which moved with an NTP step and made a running campaign's claims be taken over."""
    import psutil._pslinux as pslinux

    proc, owner = other_process
    assert owner_alive(owner) is True
    real = pslinux.boot_time
    monkeypatch.setattr(pslinux, "boot_time", lambda: real() + 120.0)  # the clock stepped
    assert owner_alive(owner) is True
    assert Owner.parse(owner.text()) == owner
