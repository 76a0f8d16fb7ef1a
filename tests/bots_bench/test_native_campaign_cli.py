"""`hidvfs bots run --backend native`, as a user meets it.

A campaign resumes only runs measured as the re-run would measure them: the same tree, the
same frequency control and the same build of the kernel (its content, not its folder); a
re-run on a fake tree after one on the board, after a run without frequency control, or with
a rebuilt BOTS measured again, never reused them. Runs that could not set frequencies say so
under the table; a learned policy on a board without agents and a refused start stop before
anything runs or is stored."""

from __future__ import annotations

import shutil
from dataclasses import replace

from click.testing import CliRunner

from bots_bench.spec import MeasuredOn, RunConfig
from bots_bench.store import Store
from platforms.faketree import write_fake_tree
from platforms.spec import load_board
from tools.cli import cli


def _campaign(bots_bin, tree, db):
    args = ["bots", "run", "--backend", "native", "--bench", "fib", "--class", "smoke"]
    args += ["--policy", "performance", "--seeds", "1", "--bots-bin", str(bots_bin)]
    args += ["--sysfs-root", str(tree), "--db", str(db)]
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 0, r.output
    return Store(db).runs()


def test_a_rerun_measures_again_on_another_tree_or_build_and_resumes_a_moved_one(
    bots_tree, tmp_path
):
    spec = load_board("tx2")
    tree, other_tree = tmp_path / "tree", tmp_path / "other"
    write_fake_tree(spec, tree)
    write_fake_tree(spec, other_tree)
    db = tmp_path / "r.sqlite"
    first = _campaign(bots_tree.bin, tree, db)
    assert len(first) == 1 and first[0]["ok"], first
    on = first[0]["config"]["measured_on"]
    assert on["sysfs_root"] == str(tree) and on["frequency_control"] is True
    assert len(on["binary_sha256"]) == 64

    # the same command again: resumed, nothing measured
    assert len(_campaign(bots_tree.bin, tree, db)) == 1
    # the same build in another folder: still the same measurement
    moved = tmp_path / "moved"
    shutil.copytree(bots_tree.bin, moved)
    assert len(_campaign(moved, tree, db)) == 1
    # another tree: measured again, the first run kept beside it
    runs = _campaign(moved, other_tree, db)
    assert len(runs) == 2
    assert {r["config"]["measured_on"]["sysfs_root"] for r in runs} == {str(tree), str(other_tree)}
    # a rebuilt binary (other content, same name and folder): measured again
    with open(moved / "fib.gcc.omp-tasks", "ab") as f:
        f.write(b"\0rebuilt")
    runs = _campaign(moved, other_tree, db)
    assert len(runs) == 3 and len({r["spec_hash"] for r in runs}) == 3


def test_frequency_control_and_the_tree_are_part_of_the_key_the_bots_path_is_not():
    base = RunConfig("fib", "smoke", "maxfreq", 0, "tx2", "native", 0, bots_bin="/a")
    on = MeasuredOn("/", True, "ab" * 32)
    cfg = replace(base, measured_on=on)
    assert cfg.key != base.key
    assert replace(cfg, bots_bin="/b").key == cfg.key
    assert replace(cfg, measured_on=replace(on, frequency_control=False)).key != cfg.key
    assert replace(cfg, measured_on=replace(on, sysfs_root="/tmp/t")).key != cfg.key
    assert replace(cfg, measured_on=replace(on, binary_sha256=None)).key != cfg.key
    # a simulated run has none, and keeps the hash it had before the field existed (so its
    # stored runs still resume)
    assert base.spec_hash == "7291c03cb8b1"
    assert replace(base, backend="sim", deadline_slack=1.5).spec_hash == "bcfb25b3f39c"


def test_runs_without_frequency_control_are_marked_after_the_table_and_in_the_report(
    bots_tree, tmp_path
):
    """A machine with no writable cpufreq ran every governor alike; the table of ratios
    between them said nothing of it (one note at the start, hours of runs before)."""
    from bots_bench.report import setting_label

    tree = tmp_path / "tree"
    write_fake_tree(load_board("tx2"), tree)
    shutil.rmtree(tree / "devices/system/cpu/cpufreq")
    args = ["bots", "run", "--backend", "native", "--bench", "fib", "--class", "smoke"]
    args += ["--policy", "performance,powersave", "--seeds", "1", "--board", "tx2"]
    args += ["--bots-bin", str(bots_tree.bin), "--sysfs-root", str(tree)]
    args += ["--db", str(tmp_path / "r.sqlite")]
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 0, r.output
    assert "note: 2 of 2 runs could not set CPU frequencies" in r.output
    assert "do not compare frequency policies" in r.output
    runs = Store(tmp_path / "r.sqlite").runs()
    assert {x["frequency_control"] for x in runs} == {False}
    label = setting_label(runs[0]["config"])
    assert f"tree {tree}" in label and "no frequency control" in label


def test_a_learned_policy_on_a_board_without_agents_is_refused_before_any_run(bots_tree, tmp_path):
    """Every run failed with the loader's "run `hidvfs agents train`", which cannot train a
    board without plant parameters; now one line before anything runs, the board given back."""
    from platforms import paths

    tree = tmp_path / "tree"
    write_fake_tree(load_board("tx2"), tree)
    for name in (paths.DT_COMPATIBLE, paths.DT_MODEL):  # nothing detected: a probed board
        (tree / name).unlink(missing_ok=True)
    governor = tree / "devices/system/cpu/cpufreq/policy0/scaling_governor"
    before = governor.read_text()
    db = tmp_path / "r.sqlite"
    args = ["bots", "run", "--backend", "native", "--bench", "fib", "--class", "smoke"]
    args += ["--policy", "schedutil,hidvfs,ztt", "--seeds", "1"]
    args += ["--bots-bin", str(bots_tree.bin), "--sysfs-root", str(tree), "--db", str(db)]
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 2, r.output
    assert "policy hidvfs, ztt: these run agents trained for one board" in r.output
    assert "this board (unknown) is not one of them" in r.output
    assert "Traceback" not in r.output and "hidvfs agents train" not in r.output
    assert not db.exists() or Store(db).runs() == []
    assert governor.read_text() == before


def test_a_refused_start_leaves_no_empty_results_file(bots_tree, tmp_path, monkeypatch):
    """The store was opened before the board: a wrong --board or a busy tree left an empty
    ./results.sqlite behind."""
    tree = tmp_path / "tree"
    write_fake_tree(load_board("tx2"), tree)
    monkeypatch.chdir(tmp_path)
    args = ["bots", "run", "--backend", "native", "--bench", "fib", "--class", "smoke"]
    args += ["--policy", "performance", "--board", "orin-nx"]
    args += ["--bots-bin", str(bots_tree.bin), "--sysfs-root", str(tree)]
    r = CliRunner().invoke(cli, args)
    assert r.exit_code != 0 and "is detected as tx2" in r.output, r.output
    assert not (tmp_path / "results.sqlite").exists()


def test_the_cool_down_says_when_it_waits_and_when_a_run_starts_hot(tmp_path):
    """Two 0.3 s runs on a board at 70 °C took four minutes with nothing on the screen."""
    from bots_bench.native import cool_down, open_board

    tree = tmp_path / "tree"
    writer = write_fake_tree(load_board("tx2"), tree)
    said = []
    nb = open_board(str(tree), "tx2", str(tmp_path / "state"), say=said.append)
    try:
        said.clear()
        for zone in ("BCPU-therm", "MCPU-therm"):
            writer.set_temp(zone, 70.0)
        temp, waited = cool_down(nb, 45.0, 0.6)
        assert temp == 70.0 and waited >= 0.6
        assert len(said) == 2
        assert said[0].startswith("cooling down: the hottest CPU zone is at 70.0 °C")
        assert "waiting up to 0.6 s for 45 °C" in said[0]
        assert "still at 70.0 °C" in said[1] and "the run starts hot" in said[1]
        # a cool board: no wait, nothing said
        said.clear()
        for zone in ("BCPU-therm", "MCPU-therm"):
            writer.set_temp(zone, 40.0)
        assert cool_down(nb, 45.0, 0.6)[0] == 40.0 and said == []
    finally:
        nb.close()


def test_a_campaign_from_flags_sets_its_timeout_and_cool_down(bots_tree, tmp_path):
    """They were fixed at 600 s and 45 °C / 120 s for a campaign from flags: a spec file was
    the only way to change them, and the timeout's hint said to edit a spec there was none of."""
    tree = tmp_path / "tree"
    write_fake_tree(load_board("tx2"), tree)
    args = ["bots", "run", "--backend", "native", "--bench", "fib", "--class", "smoke"]
    args += ["--policy", "performance", "--bots-bin", str(bots_tree.bin)]
    args += ["--sysfs-root", str(tree), "--db", str(tmp_path / "r.sqlite")]
    r = CliRunner().invoke(cli, [*args, "--timeout", "30", "--cooldown-max-wait", "0"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(cli, [*args, "--cooldown-start-temp", "60", "--cooldown-max-wait", "5"])
    assert r.exit_code == 0, r.output
    configs = sorted(
        (x["config"] for x in Store(tmp_path / "r.sqlite").runs()), key=lambda c: c["timeout_s"]
    )
    assert [(c["timeout_s"], c["cooldown"]) for c in configs] == [
        (30.0, None),
        (600.0, {"start_temp_c": 60.0, "max_wait_s": 5.0}),
    ]


def test_the_native_only_flags_are_named_as_ignored_in_the_simulator():
    args = ["bots", "run", "--bench", "fib", "--class", "test", "--policy", "maxfreq"]
    r = CliRunner().invoke(cli, [*args, "--timeout", "5", "--cooldown-max-wait", "0"])
    assert r.exit_code == 0, r.output
    assert "note: --timeout, --cooldown-max-wait ignored with the sim backend" in r.output


def test_a_spec_file_names_the_run_flags_it_replaces(tmp_path):
    spec = tmp_path / "c.yaml"
    spec.write_text(
        "kernels: [fib]\nclasses: [test]\npolicies: [maxfreq]\nseeds: 1\nboard: tx2\nbackend: sim\n"
    )
    r = CliRunner().invoke(
        cli,
        ["bots", "run", "--spec", str(spec), "--class", "small", "--timeout", "5"]
        + ["--db", str(tmp_path / "r.sqlite")],
    )
    assert r.exit_code == 0, r.output
    assert f"note: --spec {spec} sets the campaign: --class, --timeout ignored" in r.output


def test_a_native_study_of_learned_policies_on_a_board_without_agents_is_refused(
    bots_tree, tmp_path
):
    from platforms import paths

    tree = tmp_path / "tree"
    write_fake_tree(load_board("tx2"), tree)
    for name in (paths.DT_COMPATIBLE, paths.DT_MODEL):
        (tree / name).unlink(missing_ok=True)
    args = ["bots", "study", "vs-geardvfs", "--backend", "native", "--bench", "fib"]
    args += ["--class", "smoke", "--bots-bin", str(bots_tree.bin), "--sysfs-root", str(tree)]
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 2, r.output
    assert "policy geardvfs, hidvfs: these run agents trained for one board" in r.output
