"""The native backend end to end on this machine, with the project's own OpenMP test kernels:
parse and verify, energy from a fake power rail that a background writer changes, failures
recorded while the campaign goes on, resume after an interruption, and a report that opens."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import pytest

from bots_bench.campaign_run import run_pending
from bots_bench.native import open_board, run_native
from bots_bench.spec import expand, parse_spec
from bots_bench.store import Store
from platforms.faketree import write_fake_tree
from platforms.spec import load_board
from tools.policies import build_policy_stack


@pytest.fixture
def fake_tx2(tmp_path):
    spec = load_board("tx2")
    root = tmp_path / "tree"
    writer = write_fake_tree(spec, root)
    return spec, root, writer


def _configs(bots_bin, kernels=("fib",), policies=("performance",), timeout_s=60.0, seeds=1):
    spec = parse_spec(
        {
            "kernels": list(kernels),
            "classes": ["smoke"],
            "policies": list(policies),
            "seeds": seeds,
            "board": "tx2",
            "backend": "native",
            "bots_bin": str(bots_bin),
            "timeout_s": timeout_s,
            "cooldown": None,
            "threads": 2,
        }
    )
    return expand(spec)


def test_native_run_parses_verifies_and_integrates_a_changing_rail(bots_tree, fake_tx2, tmp_path):
    spec, root, writer = fake_tx2
    nb = open_board(str(root), "tx2", str(tmp_path / "state"), say=lambda m: None)
    stop = threading.Event()

    def wobble():  # VDD_IN alternates 2 W / 6 W every 20 ms: mean 4 W
        high = False
        while not stop.is_set():
            writer.set_power("VDD_IN", 6000.0 if high else 2000.0)
            high = not high
            stop.wait(0.02)

    t = threading.Thread(target=wobble, daemon=True)
    t.start()
    try:
        cfg = _configs(bots_tree.bin, kernels=("sort",))[0]
        rec = run_native(cfg, nb, build_policy_stack)
    finally:
        stop.set()
        t.join()
        nb.close()
    assert rec["ok"], rec["error"]
    assert rec["verification"] == "successful"
    assert 0 < rec["time_program_s"] <= rec["makespan_s"]
    assert rec["sample_rate_hz"] >= 100
    mean_w = rec["energy_j"] / rec["makespan_s"]
    assert 3.0 < mean_w < 5.0  # the integral follows the changing rail, not one reading
    # The policy acted through the loop on the fake tree, and everything was restored.
    assert (
        root / "devices/system/cpu/cpufreq/policy0/scaling_governor"
    ).read_text().strip() == "schedutil"


def test_failures_are_recorded_and_the_campaign_goes_on(bots_tree, fake_tx2, tmp_path, monkeypatch):
    spec, root, _ = fake_tx2
    store = Store(tmp_path / "r.sqlite")
    nb = open_board(str(root), "tx2", str(tmp_path / "state"), say=lambda m: None)
    try:
        # nqueens was not built: a missing binary; then a failed verification; then a timeout.
        cfgs = _configs(bots_tree.bin, kernels=("nqueens", "fib"), timeout_s=2.0)
        run_pending(cfgs[:1], lambda c: run_native(c, nb, build_policy_stack), store)
        monkeypatch.setenv("BOTS_TEST_FAULT", "bad")
        run_pending(cfgs[1:], lambda c: run_native(c, nb, build_policy_stack), store)
        monkeypatch.setenv("BOTS_TEST_FAULT", "hang")
        hang_cfg = _configs(bots_tree.bin, kernels=("sort",), timeout_s=1.0)
        t0 = time.monotonic()
        run_pending(hang_cfg, lambda c: run_native(c, nb, build_policy_stack), store)
        assert time.monotonic() - t0 < 20
    finally:
        nb.close()
    rows = {r["bench"]: r for r in store.runs()}
    assert not rows["nqueens"]["ok"] and "not found" in rows["nqueens"]["error"]
    assert not rows["fib"]["ok"] and "UNSUCCESSFUL" in rows["fib"]["error"]
    assert not rows["sort"]["ok"] and "timeout" in rows["sort"]["error"]


def test_interrupted_campaign_resumes_without_losing_runs(bots_tree, fake_tx2, tmp_path):
    spec, root, _ = fake_tx2
    store = Store(tmp_path / "r.sqlite")
    cfgs = _configs(bots_tree.bin, kernels=("fib", "sort"), policies=("performance", "powersave"))
    assert len(cfgs) == 4
    nb = open_board(str(root), "tx2", str(tmp_path / "state"), say=lambda m: None)
    calls = []

    def flaky(cfg):
        if len(calls) == 2:
            raise KeyboardInterrupt
        calls.append(cfg.key)
        return run_native(cfg, nb, build_policy_stack)

    with pytest.raises(KeyboardInterrupt):
        run_pending(cfgs, flaky, store)
    assert len(store.runs()) == 2
    again = []
    run_pending(cfgs, lambda c: again.append(c.key) or run_native(c, nb, build_policy_stack), store)
    nb.close()
    assert len(again) == 2 and set(again).isdisjoint(calls)
    runs = store.runs()
    assert len(runs) == 4 and all(r["ok"] for r in runs)

    import matplotlib.image as mpimg

    from bots_bench.report import write_report

    files = write_report(tmp_path / "r.sqlite", tmp_path / "report", baseline="performance")
    assert files.markdown.exists() and files.html.exists() and files.plots
    for png in files.plots:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert mpimg.imread(png).ndim == 3


def test_machine_without_cpufreq_says_so_once_and_still_runs(bots_tree, tmp_path):
    # A tree with no cpufreq policy at all (like this machine's /sys).
    root = tmp_path / "bare"
    (root / "devices/system/cpu").mkdir(parents=True)
    (root / "devices/system/cpu/online").write_text("0-1\n")
    (root / "proc").mkdir()
    (root / "proc/stat").write_text(
        "cpu  1 0 1 100 0 0 0 0 0 0\ncpu0 1 0 1 50 0 0 0 0 0 0\ncpu1 0 0 0 50 0 0 0 0 0 0\n"
    )
    said = []
    nb = open_board(str(root), None, str(tmp_path / "state"), say=said.append)
    assert len(said) == 1 and "cannot set CPU frequencies" in said[0]
    cfg = _configs(bots_tree.bin, kernels=("fib",))[0]
    rec = run_native(cfg, nb, build_policy_stack)
    nb.close()
    assert rec["ok"], rec["error"]
    assert rec["energy_j"] is None  # no power monitor: unavailable, never 0


def test_native_study_deadline_vs_maxfreq_on_the_test_kernels(bots_tree, fake_tx2, tmp_path):
    from bots_bench.studies import deadline_vs_maxfreq
    from tools.native_study import native_runner

    spec, root, _ = fake_tx2
    runner, nb = native_runner("tx2", "smoke", str(bots_tree.bin), str(root), slack=3.0)
    try:
        res = deadline_vs_maxfreq(
            "tx2",
            policy="performance",
            seeds=1,
            slack=3.0,
            kernels=["sort"],
            cls="smoke",
            runner=runner,
        )
    finally:
        nb.close()
    assert res.backend == "native"
    assert res.summary["jobs"] == 1 and res.rows[0]["deadline_s"] is not None
    assert res.rows[0]["policy_energy_j"] > 0 and res.rows[0]["maxfreq_energy_j"] > 0


def test_native_deadlines_come_from_the_stored_profile(bots_tree, fake_tx2, tmp_path):
    """--deadline-slack natively: slack x the reference makespan of the profile stored as
    BENCH.CLASS, handed to the loop with the job; without a profile the run fails saying how
    to get one (it used to run with no deadline at all)."""
    from agents import deadlines
    from platforms.observation import JobProfile
    from tools.native_campaign import run_configs

    spec, root, _ = fake_tx2
    profiles = tmp_path / "profiles.json"
    store = deadlines.ProfileStore()
    store.put("tx2", JobProfile("fib.smoke", 0.5, 0.05, 0.1, 0.4, 2035200, 4))
    deadlines.save(store, profiles)
    db = Store(":memory:")
    configs = _configs(bots_tree.bin, kernels=("fib", "sort"))
    run_configs(
        configs,
        db,
        backend="native",
        sysfs_root=str(root),
        state_dir=str(tmp_path / "state"),
        quiet=True,
        deadline_slack=1.5,
        profiles_path=str(profiles),
        say=lambda m: None,
    )
    runs = {r["bench"]: r for r in db.runs()}
    assert runs["fib"]["ok"], runs["fib"]["error"]
    assert runs["fib"]["deadline_s"] == pytest.approx(1.5 * 0.4)
    assert runs["fib"]["deadline_met"] is not None
    assert not runs["sort"]["ok"]
    assert "no reference profile 'sort.smoke'" in runs["sort"]["error"]
    assert "hidvfs bots profile --bots-bin" in runs["sort"]["error"]
    assert "--bench sort --class smoke" in runs["sort"]["error"]


def test_bots_profile_measures_each_kernel_and_refuses_a_failed_verification(
    bots_tree, fake_tx2, tmp_path, monkeypatch
):
    """`hidvfs bots profile`: each built kernel's binary is timed on the reference cluster and
    stored as BENCH.CLASS; a missing binary or an UNSUCCESSFUL verification stores nothing
    for that kernel and the command exits 1 after the others."""
    import json

    from click.testing import CliRunner

    from agents import deadlines
    from tests.daemon.test_daemon_process import tree_state
    from tools.cli import cli

    spec, root, _ = fake_tx2
    original = tree_state(root, spec)
    store = tmp_path / "profiles.json"
    args = [
        "bots",
        "profile",
        "--bots-bin",
        str(bots_tree.bin),
        "--class",
        "smoke",
        "--store",
        str(store),
        "--sysfs-root",
        str(root),
        "--board",
        "tx2",
        "--state-dir",
        str(tmp_path / "state"),
        "--socket",
        str(tmp_path / "none.sock"),
        "--json",
    ]
    r = CliRunner().invoke(cli, [*args, "--bench", "fib,sort,nqueens"])
    assert r.exit_code == 1
    rows = {row["name"]: row for row in json.loads(r.stdout)}
    assert rows["fib.smoke"]["ok"] and rows["sort.smoke"]["ok"]
    assert not rows["nqueens.smoke"]["ok"] and "not found" in rows["nqueens.smoke"]["error"]
    db = deadlines.load(store)
    assert db.find("fib.smoke", "tx2").ref_makespan_s == rows["fib.smoke"]["ref_makespan_s"]
    assert db.find("nqueens.smoke", "tx2") is None
    assert tree_state(root, spec) == original
    monkeypatch.setenv("BOTS_TEST_FAULT", "bad")
    r = CliRunner().invoke(cli, [*args, "--bench", "fib", "--replace"])
    assert r.exit_code == 1 and "UNSUCCESSFUL" in r.stdout
    assert deadlines.load(store).find("fib.smoke", "tx2").version == 1  # nothing recorded
    # concom is timed without -c (its check runs the sequential version): one untimed -c run
    # before the timed ones must still catch a wrong result
    r = CliRunner().invoke(cli, [*args, "--bench", "concom"])
    assert r.exit_code == 1 and "UNSUCCESSFUL" in r.stdout
    assert deadlines.load(store).find("concom.smoke", "tx2") is None
    assert tree_state(root, spec) == original
    monkeypatch.delenv("BOTS_TEST_FAULT")
    r = CliRunner().invoke(cli, [*args, "--bench", "concom"])
    assert r.exit_code == 0, r.output
    assert deadlines.load(store).find("concom.smoke", "tx2") is not None


def test_a_kernel_timed_without_its_check_is_verified_once_by_a_separate_run(
    bots_tree, fake_tx2, tmp_path, monkeypatch
):
    """concom's -c also runs the sequential version, so its timed runs go without -c; one
    untimed -c run per campaign verifies it, and a wrong result fails every run of it."""
    from bots_bench import native

    spec, root, _ = fake_tx2
    calls = []
    real = native._verification_run
    monkeypatch.setattr(
        native,
        "_verification_run",
        lambda cfg, nb, build: calls.append(cfg.bench) or real(cfg, nb, build),
    )
    cfgs = _configs(bots_tree.bin, kernels=("concom", "fib"), policies=("performance", "powersave"))
    nb = open_board(str(root), "tx2", str(tmp_path / "state"), say=lambda m: None)
    try:
        good = [run_native(c, nb, build_policy_stack) for c in cfgs]
        assert all(r["ok"] for r in good), [r["error"] for r in good]
        assert calls == ["concom"]  # once for both policies; fib checks itself in its run
        assert [r.get("verified_separately") for r in good if r["bench"] == "concom"] == [True] * 2
        assert all("-c" not in r["argv"] for r in good if r["bench"] == "concom")
    finally:
        nb.close()
    monkeypatch.setenv("BOTS_TEST_FAULT", "bad")
    nb = open_board(str(root), "tx2", str(tmp_path / "state"), say=lambda m: None)
    try:
        bad = [run_native(c, nb, build_policy_stack) for c in cfgs if c.bench == "concom"]
        concom = next(c for c in cfgs if c.bench == "concom")
        unchecked = run_native(replace(concom, check=False), nb, build_policy_stack)
    finally:
        nb.close()
    assert calls == ["concom", "concom"]
    assert all(not r["ok"] and "verification run (-c" in r["error"] for r in bad)
    assert all("UNSUCCESSFUL" in r["error"] and r["makespan_s"] is None for r in bad)
    assert unchecked["ok"]  # check: false in a spec times it unverified, as asked


def _bare(tmp_path):
    """A tree no board is detected on, without cpufreq (like a PC's /sys)."""
    root = tmp_path / "bare"
    (root / "devices/system/cpu").mkdir(parents=True)
    (root / "devices/system/cpu/online").write_text("0-1\n")
    (root / "proc").mkdir()
    (root / "proc/stat").write_text(
        "cpu  1 0 1 100 0 0 0 0 0 0\ncpu0 1 0 1 50 0 0 0 0 0 0\ncpu1 0 0 0 50 0 0 0 0 0 0\n"
    )
    return root


def test_a_board_used_only_because_none_was_detected_is_named(bots_tree, tmp_path):
    """On a machine that is not a known board, --board tx2 was used silently: the runs were
    stored as tx2 with no word about it."""
    root = _bare(tmp_path)
    said = []
    nb = open_board(str(root), "tx2", str(tmp_path / "state"), say=said.append)
    try:
        assert nb.platform.spec.name == "tx2"  # kept: the spec given is the one used
        assert said[0] == (
            f"warning: no board detected under {root}: using --board tx2's spec as given; "
            "results are stored as tx2"
        )
        rec = run_native(_configs(bots_tree.bin)[0], nb, build_policy_stack)
    finally:
        nb.close()
    assert rec["board"] == "tx2"
    said.clear()
    open_board(str(root), None, str(tmp_path / "state"), say=said.append).close()
    assert not any("no board detected" in s for s in said)  # nothing asked, nothing to say


def test_a_native_study_s_notes_go_to_stderr(tmp_path, capsys):
    """They were print()ed to stdout, in the middle of `bots study --json`'s JSON."""
    from tools.native_study import native_runner

    _, nb = native_runner("tx2", "smoke", str(tmp_path), str(_bare(tmp_path)), slack=None)
    nb.close()
    out, err = capsys.readouterr()
    assert out == ""
    assert "no board detected" in err and "cannot set CPU frequencies" in err


def test_the_verification_run_is_at_maxfreq_not_where_the_last_run_left_the_board(
    bots_tree, fake_tx2, tmp_path, monkeypatch
):
    from bots_bench import native

    spec, root, _ = fake_tx2
    seen = []
    real = native.run_native

    def spy(cfg, nb, build, profile=None):
        rec = real(cfg, nb, build, profile)
        if cfg.check:  # the nested verification run: what did it run at?
            setspeed = root / "devices/system/cpu/cpufreq/policy0/scaling_setspeed"
            seen.append((cfg.policy, cfg.timeout_s, setspeed.read_text().strip()))
        return rec

    monkeypatch.setattr(native, "run_native", spy)
    slow = _configs(bots_tree.bin, kernels=("fib",), policies=("powersave",), timeout_s=30.0)
    concom = _configs(bots_tree.bin, kernels=("concom",), policies=("powersave",), timeout_s=30.0)
    nb = open_board(str(root), "tx2", str(tmp_path / "state"), say=lambda m: None)
    try:
        assert native.run_native(slow[0], nb, build_policy_stack)["ok"]
        assert native.run_native(concom[0], nb, build_policy_stack)["ok"]
    finally:
        nb.close()
    top = str(spec.clusters[0].freqs_khz[-1])
    assert seen == [("maxfreq", 30.0 * native.VERIFY_TIMEOUT_FACTOR, top)]


def test_a_campaign_holds_the_board_and_a_daemon_on_it_stops_one(fake_tx2, tmp_path):
    """A native campaign pins frequencies for its runs: it holds the board's lock (a daemon on
    the board refuses to start) and is itself refused while a daemon holds it."""
    from platforms.sysfs import DirSysfs
    from platforms.treelock import TreeBusy, TreeLock

    spec, root, _ = fake_tx2
    nb = open_board(str(root), "tx2", str(tmp_path / "state"), say=lambda m: None)
    try:
        with pytest.raises(TreeBusy):
            TreeLock(DirSysfs(root)).acquire()
    finally:
        nb.close()
    with TreeLock(DirSysfs(root)):  # let go at close
        with pytest.raises(TreeBusy):
            open_board(str(root), "tx2", str(tmp_path / "state2"), say=lambda m: None)
    assert not (tmp_path / "state2" / "restore.json").exists()
