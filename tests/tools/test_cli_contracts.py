"""CLI fixes: `daemon --json` on a tree, `--replay --duration`, sim-only flags refused,
`status` shows power, a --socket that is not a socket, `bots run --db` defaults and errors,
`bots list` per backend, a profile store that cannot be written, an unknown --board, and the
help texts that named a default or an option wrongly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from daemon.jobs import JobTable
from daemon.registry import JobRegistry
from daemon.registryserver import RegistryServer
from platforms.clock import VirtualClock
from platforms.faketree import write_fake_tree
from platforms.spec import load_board
from platforms.sysfs import DirSysfs
from platforms.trace import read_trace, record
from platforms.trace_io import TraceWriter
from tools.cli import cli

REPO = Path(__file__).resolve().parents[2]


def hv(*args):
    return CliRunner().invoke(cli, list(args))


@pytest.fixture
def tree(tmp_path):
    spec = load_board("tx2")
    write_fake_tree(spec, tmp_path / "tree")
    (tmp_path / "state").mkdir()
    return tmp_path / "tree"


def _daemon(tmp_path, *extra):
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "tools.cli",
            "daemon",
            "--sysfs-root",
            str(tmp_path / "tree"),
            "--state-dir",
            str(tmp_path / "state"),
            "--socket",
            str(tmp_path / "state" / "s.sock"),
            "--period-ms",
            "50",
            "--duration",
            "0.3",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )


# -- 1. daemon --json on a tree ------------------------------------------------------------
def test_daemon_json_on_a_tree_prints_the_final_status(tmp_path, tree):
    r = _daemon(tmp_path, "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    status = json.loads(r.stdout)  # it used to print nothing
    assert status["board"] == "tx2" and status["backend"] == "fake" and status["ticks"] >= 1
    assert {"freq_khz", "power_w", "energy_j", "jobs_done"} <= set(status)


def test_daemon_dry_run_json_keeps_the_plan_off_stdout(tmp_path, tree):
    r = _daemon(tmp_path, "--json", "--dry-run")
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout)["ticks"] >= 1  # stdout is the JSON alone
    assert "dry-run: would write" in r.stderr
    plain = _daemon(tmp_path, "--dry-run")
    assert "dry-run: would write" in plain.stdout  # without --json, as before


# -- 5. --replay --duration, sim-only flags ------------------------------------------------
def _trace(tmp_path, lockstep=False):
    spec = load_board("tx2")
    root = tmp_path / "rtree"
    write_fake_tree(spec, root)
    out = tmp_path / "t.jsonl"
    record(DirSysfs(root), VirtualClock(0.0), str(out), period_s=0.1, duration_s=2.0, board="tx2")
    if not lockstep:
        return out
    tr = read_trace(out)  # as `daemon --record` marks its recordings
    tr.header.extra.update(recorded_by="daemon", policy="schedutil")
    daemon_made = tmp_path / "d.jsonl"
    with TraceWriter(daemon_made, tr.header) as w:
        for s in tr.samples:
            w.write_sample(s.t, s.r, s.w)
    return daemon_made


@pytest.mark.parametrize("lockstep", [False, True])
def test_replay_honours_duration(tmp_path, lockstep):
    trace = _trace(tmp_path, lockstep)
    whole = hv("daemon", "--replay", str(trace), "--json")
    assert whole.exit_code == 0, whole.output
    # samples at 0 .. 1.9 s: one tick each in lockstep, over [0, 1.9 s) at the period
    n = 20 if lockstep else 19
    assert json.loads(whole.stdout)["ticks"] == n
    cut = hv("daemon", "--replay", str(trace), "--duration", "1", "--json")
    assert cut.exit_code == 0, cut.output
    status = json.loads(cut.stdout)
    assert status["ticks"] == 10  # ticks over [0, 1 s), as --sim --duration 1
    assert status["t"] == pytest.approx(0.9 if lockstep else 1.0)
    longer = hv("daemon", "--replay", str(trace), "--duration", "60", "--json")
    assert json.loads(longer.stdout)["ticks"] == n  # the whole trace, no more


def test_a_duration_past_a_trace_shorter_than_a_period_still_replays_it(tmp_path):
    """A one-sample trace replays one tick; with a longer --duration it ran none."""
    spec = load_board("tx2")
    root = tmp_path / "rtree"
    write_fake_tree(spec, root)
    out = tmp_path / "one.jsonl"
    record(DirSysfs(root), VirtualClock(0.0), str(out), period_s=0.1, duration_s=0.05, board="tx2")
    assert len(read_trace(out).samples) == 1
    for extra in ([], ["--duration", "5"]):
        r = hv("daemon", "--replay", str(out), "--json", *extra)
        assert r.exit_code == 0 and json.loads(r.stdout)["ticks"] == 1, (extra, r.output)


@pytest.mark.parametrize("flags", [["--load", "1.0"], ["--seed", "3"], ["--seed", "0"]])
def test_sim_only_flags_are_refused_off_the_simulator(tmp_path, tree, flags):
    trace = _trace(tmp_path)
    for where in (["--sysfs-root", str(tree)], ["--replay", str(trace)]):
        r = hv("daemon", *where, *flags, "--duration", "0.1")
        assert r.exit_code == 2 and f"{flags[0]}: only for --sim" in r.output, r.output
    ok = hv("daemon", "--sim", "tx2", *flags, "--duration", "1")
    assert ok.exit_code == 0, ok.output


# -- 7. power in the status text -------------------------------------------------------------
def _status(power):
    return {
        "t": 1.0,
        "board": "tx2",
        "backend": "live",
        "policy": "hidvfs",
        "ticks": 10,
        "freq_khz": {"a57": 2035200},
        "temp_c": {"CPU-therm": 45.0},
        "power_w": power,
        "energy_j": None,
        "jobs_done": 0,
        "jobs_running": 0,
        "deadline_misses": {"hi": 0, "lo": 0},
        "interventions": 0,
    }


@pytest.mark.parametrize(
    "power, shown",
    [
        ({"total": 4.2, "cpu": 0.99}, "power: 4.20 W (CPU 0.99 W)"),
        ({"total": 4.2, "cpu": None}, "power: 4.20 W;"),
        ({"total": None, "cpu": None}, "power: unavailable"),
    ],
)
def test_status_text_shows_power(tmp_path, power, shown):
    sock = tmp_path / "d.sock"
    reg = JobRegistry(
        JobTable(),
        now=time.monotonic,
        alive=lambda pid: True,
        status_provider=lambda: _status(power),
    )
    srv = RegistryServer(reg, str(sock), group=None).start()
    try:
        r = hv("status", "--socket", str(sock))
    finally:
        srv.stop()
    assert r.exit_code == 0, r.output
    assert shown in r.output and "frequencies: a57 2035 MHz" in r.output


def test_sim_summary_shows_power():
    r = hv("daemon", "--sim", "tx2", "--duration", "1")
    assert r.exit_code == 0 and "power: " in r.output and " W" in r.output


# -- 10. a --socket that is not a socket ---------------------------------------------------
def test_status_and_run_name_a_path_that_is_not_a_socket(tmp_path):
    folder, plain = tmp_path / "adir", tmp_path / "afile"
    folder.mkdir()
    plain.write_text("")
    r = hv("status", "--socket", str(folder))
    assert r.exit_code == 2 and f"{folder} is not a socket but a folder" in r.output
    assert "refused" not in r.output
    marker = tmp_path / "ran"
    cmd = [sys.executable, "-c", f"open({str(marker)!r}, 'w')"]
    r = hv("run", "--socket", str(plain), "--", *cmd)
    assert r.exit_code == 2 and f"{plain} is not a socket but a file" in r.output
    assert "refused" not in r.output and not marker.exists()
    r = hv("run", "--if-no-daemon", "run", "--socket", str(plain), "--", *cmd)
    assert r.exit_code == 0 and marker.exists()
    assert "not a socket but a file" in r.output and "refused" not in r.output


# -- 10. bots run --db in a folder that is missing, blocked or cannot be written -------------
def test_bots_db_in_a_missing_folder_makes_it_and_a_blocked_or_unwritable_one_says_so(
    tmp_path, monkeypatch
):
    """A missing folder is made, as for every output option (it used to be refused); one
    that cannot be made or written is refused in one line before the campaign."""
    args = ["bots", "run", "--bench", "fib", "--class", "test", "--policy", "performance"]
    db = tmp_path / "nodir" / "sub" / "r.sqlite"
    r = hv(*args, "--db", str(db))
    assert r.exit_code == 0, r.output
    from bots_bench.store import Store

    with Store(db, readonly=True) as store:
        assert len(store) == 1
    blocker = tmp_path / "afile"
    blocker.write_text("")
    r = hv(*args, "--db", str(blocker / "r.sqlite"))
    assert r.exit_code == 2
    assert r.output == (
        f"hidvfs: error: --db {blocker / 'r.sqlite'}: its folder {blocker} cannot be made "
        f"({blocker} is a file, not a folder); choose another --db\n"
    )
    assert blocker.read_text() == ""
    import sqlite3

    import bots_bench.store as store

    ro = tmp_path / "ro"
    ro.mkdir()
    real_access = os.access

    def connect(*a, **k):  # what SQLite says in a folder it cannot write (not as root)
        raise sqlite3.OperationalError("unable to open database file")

    monkeypatch.setattr(store.sqlite3, "connect", connect)
    monkeypatch.setattr(
        os, "access", lambda p, m, *a, **k: False if str(p) == str(ro) else real_access(p, m)
    )
    r = hv(*args, "--db", str(ro / "r.sqlite"))
    assert (
        r.exit_code == 2 and f"--db {ro / 'r.sqlite'}: its folder {ro} is not writable" in r.output
    )
    assert len(r.output.strip().splitlines()) == 1 and not list(ro.iterdir())


# -- 2. where bots run keeps its results -----------------------------------------------------
def test_bots_run_db_help_and_readme_say_where_results_go():
    r = hv("bots", "run", "--help")
    text = " ".join(r.output.split())
    assert "in memory only" in text and "results.sqlite in the current folder" in text
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("## BOTS campaigns") :]
    section = " ".join(section[: section.index("\n## ")].split())
    assert "keeps its runs in memory only" in section and "pass `--db results.sqlite`" in section


# -- 4. bots list per backend, and the class error names its backend ---------------------------
def test_bots_list_tells_sim_classes_from_native_ones():
    r = hv("bots", "list")
    assert r.exit_code == 0, r.output
    head, *rows = r.output.splitlines()
    assert "sim classes" in head and "native classes" in head
    fib = next(x for x in rows if x.startswith("fib "))
    sim_at, native_at = head.index("sim classes"), head.index("native classes")
    assert fib[sim_at:native_at].strip() == "test,small,medium,large"
    assert "t40" in fib[native_at:] and "smoke" in fib[native_at:]
    assert any(x.startswith("sim classes: ") for x in rows)  # the legend


def test_a_class_error_names_the_backend_whose_classes_it_lists():
    r = hv("bots", "run", "--bench", "fib", "--class", "smoke")
    assert r.exit_code == 2
    assert "every selected kernel has under --backend sim" in r.output
    assert "fib's sim classes: test, small, medium, large" in r.output
    assert "smoke is a native-only class of fib" in r.output
    r = hv("bots", "run", "--bench", "concom", "--class", "large", "--backend", "native")
    assert r.exit_code == 2 and "under --backend native" in r.output
    assert "concom's native classes: smoke, test, small, medium" in r.output
    assert "large is a sim-only class of concom" in r.output


# -- 3. a profile store that cannot be written -------------------------------------------------
def _measure_args(tmp_path, store, *extra):
    return [
        "profile",
        "measure",
        "--store",
        str(store),
        "--sysfs-root",
        str(tmp_path / "tree"),
        "--state-dir",
        str(tmp_path / "state"),
        "--socket",
        str(tmp_path / "state" / "none.sock"),
        *extra,
        "--",
        "true",
    ]


@pytest.fixture
def no_runs(monkeypatch):
    import tools.profile_measure as pm

    ran = []

    def fake(*a, **k):
        ran.append(a)
        raise AssertionError("a timed run happened")

    monkeypatch.setattr(pm, "measure", fake)
    return ran


@pytest.mark.parametrize("where", ["folder", "parent", "lock"])
def test_an_unwritable_store_is_refused_before_any_run(tmp_path, tree, monkeypatch, no_runs, where):
    base = tmp_path / "ro"
    base.mkdir()
    store = base / ("sub/p.json" if where == "parent" else "p.json")
    denied = str(base)
    if where == "lock":
        (base / "p.json.lock").write_text("")
        denied = str(base / "p.json.lock")
    real_access = os.access
    monkeypatch.setattr(
        os, "access", lambda p, m, *a, **k: False if str(p) == denied else real_access(p, m)
    )
    r = hv(*_measure_args(tmp_path, store))
    assert r.exit_code == 2 and not no_runs
    assert f"--store {store}: " in r.output and "Errno" not in r.output
    assert ("lock file" if where == "lock" else "is not writable") in r.output
    assert len(r.output.strip().splitlines()) == 1
    assert not (base / "sub").exists()  # refused, nothing made


def test_a_store_under_a_file_is_refused_before_any_run(tmp_path, tree, no_runs):
    (tmp_path / "afile").write_text("")
    store = tmp_path / "afile" / "p.json"
    r = hv(*_measure_args(tmp_path, store))
    assert r.exit_code == 2 and not no_runs
    assert r.output == (
        f"hidvfs: error: --store {store}: its folder {tmp_path / 'afile'} cannot be made "
        f"({tmp_path / 'afile'} is a file, not a folder); choose another --store\n"
    )


# -- 10. an unknown --board before any detection -----------------------------------------------
def test_an_unknown_board_is_named_before_the_detected_one(tmp_path, tree, no_runs):
    r = hv(*_measure_args(tmp_path, tmp_path / "p.json", "--board", "tx3"))
    assert r.exit_code == 2 and "unknown board 'tx3'; known boards:" in r.output
    assert "tx2" in r.output and "detected" not in r.output
    (tmp_path / "bin").mkdir()
    r = hv(
        "bots",
        "profile",
        "--bots-bin",
        str(tmp_path / "bin"),
        "--bench",
        "fib",
        "--class",
        "test",
        "--board",
        "tx3",
        "--sysfs-root",
        str(tree),
        "--state-dir",
        str(tmp_path / "state"),
        "--socket",
        str(tmp_path / "state" / "none.sock"),
        "--store",
        str(tmp_path / "p.json"),
    )
    assert r.exit_code == 2 and "unknown board 'tx3'" in r.output and "detected" not in r.output


# -- 11, 8. help texts -------------------------------------------------------------------------
def test_daemon_help_shows_the_policy_default():
    text = " ".join(hv("daemon", "--help").output.split())
    assert "Default: the config's policy, hidvfs unless the config names another" in text


def test_sweep_help_names_no_option_it_lacks():
    sweep = hv("agents", "sweep", "--help").output
    assert "--reserve" not in sweep and "--hi-fraction" in sweep
    assert "(see --reserve)" in " ".join(hv("agents", "eval", "--help").output.split())
