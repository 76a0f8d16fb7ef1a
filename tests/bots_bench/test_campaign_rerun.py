"""Re-running `hidvfs bots run` on an existing --db: a new deadline slack starts fresh runs
(it used to return the old ones, measured without deadlines), a stored failure is run again
(so "measure the profile first" can be followed) and a success is kept, one row per run; the
command exits 1 when a run of the campaign failed; native runs are stored under the board
that was detected, and a --board naming another one is refused."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from agents import deadlines
from bots_bench.store import Store
from platforms.faketree import write_fake_tree
from platforms.observation import JobProfile
from platforms.spec import load_board
from tools.cli import cli


def _sim(db, *extra):
    args = ["bots", "run", "--bench", "fib", "--class", "test", "--policy", "maxfreq,schedutil"]
    return CliRunner().invoke(cli, [*args, "--seeds", "2", "--db", str(db), "--json", *extra])


def test_a_new_deadline_slack_does_not_reuse_runs_without_deadlines(tmp_path):
    db = tmp_path / "r.sqlite"
    first = _sim(db)
    assert first.exit_code == 0, first.output
    assert all(r["deadline_s"] is None for r in json.loads(first.stdout))
    assert all(r["criticality"] is None for r in json.loads(first.stdout))
    second = _sim(db, "--deadline-slack", "1.5")
    assert second.exit_code == 0, second.output
    recs = json.loads(second.stdout)
    assert len(recs) == 4 and all(r["deadline_s"] is not None for r in recs)
    assert all(r["criticality"] == "lo" for r in recs)  # as the job ran: the report splits
    with Store(db) as s:
        assert len(s) == 8
    again = _sim(db, "--deadline-slack", "1.5")  # the same slack resumes: nothing new
    assert again.exit_code == 0 and json.loads(again.stdout) == recs
    with Store(db) as s:
        assert len(s) == 8


@pytest.fixture
def native(bots_tree, tmp_path):
    root = tmp_path / "tree"
    write_fake_tree(load_board("tx2"), root)
    db = tmp_path / "r.sqlite"
    base = [
        "bots",
        "run",
        "--backend",
        "native",
        "--sysfs-root",
        str(root),
        "--bots-bin",
        str(bots_tree.bin),
        "--bench",
        "fib",
        "--class",
        "smoke",
        "--policy",
        "maxfreq",
        "--db",
        str(db),
        "--json",
    ]

    def run(*extra):
        return CliRunner().invoke(cli, [*base, *extra])

    return run, db, tmp_path


def test_a_failed_run_is_retried_and_a_success_kept(native, monkeypatch):
    run, db, _ = native
    monkeypatch.setenv("BOTS_TEST_FAULT", "bad")
    r = run()
    assert r.exit_code == 1, r.output
    assert "UNSUCCESSFUL" in json.loads(r.stdout)[0]["error"]
    kept = run("--no-retry-failed")  # the old behaviour on request: the failure stays
    assert kept.exit_code == 1 and json.loads(kept.stdout) == json.loads(r.stdout)
    monkeypatch.delenv("BOTS_TEST_FAULT")
    r = run()
    assert r.exit_code == 0, r.output
    (rec,) = json.loads(r.stdout)
    assert rec["ok"]
    monkeypatch.setenv("BOTS_TEST_FAULT", "bad")  # a success is never run again
    r = run()
    assert r.exit_code == 0 and json.loads(r.stdout) == [rec]
    with Store(db) as s:
        assert len(s) == 1


def test_measuring_the_profile_then_re_running_sets_the_deadline(native):
    run, db, tmp = native
    profiles = tmp / "profiles.json"
    r = run("--deadline-slack", "2", "--profiles", str(profiles))
    assert r.exit_code == 1
    assert "measure it first" in json.loads(r.stdout)[0]["error"]
    store = deadlines.ProfileStore()
    store.put("tx2", JobProfile("fib.smoke", 0.5, 0.05, 0.1, 0.4, 2035200, 4))
    deadlines.save(store, profiles)
    r = run("--deadline-slack", "2", "--profiles", str(profiles))
    assert r.exit_code == 0, r.output
    (rec,) = json.loads(r.stdout)
    assert rec["ok"] and rec["deadline_s"] == pytest.approx(0.8)


def test_native_runs_carry_the_detected_board(bots_tree, tmp_path):
    root = tmp_path / "orin"
    write_fake_tree(load_board("orin-nx"), root)
    args = [
        "bots",
        "run",
        "--backend",
        "native",
        "--sysfs-root",
        str(root),
        "--bots-bin",
        str(bots_tree.bin),
        "--bench",
        "fib",
        "--class",
        "smoke",
        "--policy",
        "maxfreq",
        "--db",
        str(tmp_path / "r.sqlite"),
    ]
    r = CliRunner().invoke(cli, [*args, "--json"])
    assert r.exit_code == 0, r.output
    (rec,) = json.loads(r.stdout)
    assert rec["board"] == "orin-nx" and rec["config"]["board"] == "orin-nx"
    r = CliRunner().invoke(cli, [*args, "--board", "rubikpi3"])
    assert r.exit_code == 2
    assert "--board rubikpi3 was asked for" in r.output and "orin-nx" in r.output
    assert "Traceback" not in r.output


def test_a_native_study_refuses_another_board(bots_tree, tmp_path):
    root = tmp_path / "tx2"
    write_fake_tree(load_board("tx2"), root)
    r = CliRunner().invoke(
        cli,
        [
            "bots",
            "study",
            "vs-geardvfs",
            "--backend",
            "native",
            "--board",
            "orin-nx",
            "--sysfs-root",
            str(root),
            "--bots-bin",
            str(bots_tree.bin),
        ],
    )
    assert r.exit_code == 2 and "detected as tx2" in r.output


def test_bots_list_says_a_missing_folder_does_not_exist(tmp_path):
    r = CliRunner().invoke(cli, ["bots", "list", "--bots-bin", str(tmp_path / "nope")])
    assert r.exit_code == 2 and "no such folder" in r.output
