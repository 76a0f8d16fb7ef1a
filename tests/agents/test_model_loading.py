"""Loading a models folder: a corrupt file or another board's manifest or reference.npz is a
clear one-line error naming the file, never a traceback or a silent mix."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from click.testing import CliRunner

from agents.learned import (
    MODELS_DIR,
    check_board,
    load_manifest,
    load_reference,
    make_hidvfs,
    make_learned_policy,
)
from agents.runtime import ModelMismatch, ModelUnreadable, OnnxModel, read_metadata
from platforms.spec import load_board
from tools.cli import cli

TX2 = load_board("tx2")


def copy_without_hashes(src, dst):
    """A copy of model folder ``src`` at ``dst`` whose manifest has no sha256 map, as a
    folder trained before `agents train` recorded one: the loaders then check it by its
    reference outputs and metadata alone."""
    shutil.copytree(src, dst)
    man = json.loads((dst / "manifest.json").read_text())
    man.pop("sha256", None)
    man.pop("sha256_recorded", None)
    (dst / "manifest.json").write_text(json.dumps(man, indent=1, sort_keys=True) + "\n")
    return dst


@pytest.fixture
def tx2_copy(tmp_path):
    """The shipped tx2 folder without its manifest's sha256 map: the checks beneath it (the
    reference outputs, the calibration, the metadata), which hold for a folder trained
    before the map was recorded, are what these tests change files to reach."""
    return copy_without_hashes(MODELS_DIR / "tx2", tmp_path / "tx2")


def test_truncated_onnx_is_a_clear_error_naming_the_file(tx2_copy):
    f = tx2_copy / "profiler.onnx"
    f.write_bytes(f.read_bytes()[:200])
    for load in (
        lambda: OnnxModel(f, "tx2", "profiler"),
        lambda: read_metadata(f),
        lambda: make_hidvfs(TX2, models=tx2_copy),
    ):
        with pytest.raises(ModelUnreadable, match="profiler.onnx: not a usable ONNX model") as e:
            load()
        assert isinstance(e.value, ValueError) and "\n" not in str(e.value)
    row = next(r for r in check_board("tx2", tx2_copy)["files"] if r["file"] == "profiler.onnx")
    assert not row["ok"] and "not a usable ONNX model" in row["error"]


def test_eval_with_a_corrupt_model_prints_one_line(tx2_copy):
    (tx2_copy / "ztt.onnx").write_bytes(b"not a model")
    r = CliRunner().invoke(
        cli,
        [
            "agents",
            "eval",
            "--board",
            "tx2",
            "--policy",
            "ztt",
            "--seeds",
            "1",
            "--models",
            str(tx2_copy),
        ],
    )
    assert r.exit_code == 2
    assert "ztt.onnx: not a usable ONNX model" in r.output and "Traceback" not in r.output


def test_manifest_of_another_board_is_refused(tx2_copy):
    path = tx2_copy / "manifest.json"
    man = json.loads(path.read_text())
    man["board"] = "orin-nx"
    path.write_text(json.dumps(man))
    with pytest.raises(ModelMismatch, match="manifest.json: metadata 'board' is 'orin-nx'"):
        load_manifest(tx2_copy, "tx2")
    # given as --models, the folder serves only the board its manifest names
    with pytest.raises(ValueError, match="holds the models of board 'orin-nx' only, not 'tx2'"):
        make_hidvfs(TX2, models=tx2_copy, shield=False)
    with pytest.raises(ValueError, match="holds the models of board 'orin-nx' only"):
        make_learned_policy("ztt", TX2, models=tx2_copy)
    # under a root with a tx2/ subfolder, that subfolder's manifest is checked on load
    root = tx2_copy.parent
    with pytest.raises(ModelMismatch, match="manifest.json: metadata 'board' is 'orin-nx'"):
        make_learned_policy("ztt", TX2, models=root)
    report = check_board("tx2", tx2_copy)
    assert not report["ok"] and report["files"][0]["file"] == "manifest.json"


def test_reference_of_another_board_is_refused(tx2_copy):
    # a reference.npz names its board (older files did not: for those the response-time
    # parity ties the shield calibration to this folder's response_time.onnx instead)
    shutil.copy(MODELS_DIR / "orin-nx" / "reference.npz", tx2_copy / "reference.npz")
    with pytest.raises(ValueError, match="reference.npz: metadata 'board' is 'orin-nx'"):
        make_hidvfs(TX2, models=tx2_copy)
    with np.load(MODELS_DIR / "orin-nx" / "reference.npz") as z:
        older = {k: z[k] for k in z.files if k != "board"}
    np.savez(tx2_copy / "reference.npz", **older)
    with pytest.raises(ValueError, match="reference.npz: its response_time reference outputs"):
        make_hidvfs(TX2, models=tx2_copy)
    # without the shield too: every agent is compared with reference.npz's outputs on load
    with pytest.raises(ModelMismatch, match="profiler.onnx: outputs differ from the training"):
        make_hidvfs(TX2, models=tx2_copy, shield=False)
    assert make_hidvfs(TX2).name == "hidvfs"  # the shipped folder passes the same check


def test_reference_naming_another_board_is_refused(tx2_copy):
    path = tx2_copy / "reference.npz"
    with np.load(path) as z:
        ref = {k: z[k] for k in z.files}
    np.savez(path, **{**ref, "board": np.array("orin-nx")})
    with pytest.raises(ModelMismatch, match="reference.npz: metadata 'board' is 'orin-nx'"):
        load_reference(tx2_copy, "tx2")
    report = check_board("tx2", tx2_copy)
    assert not report["ok"] and report["files"][0]["file"] == "reference.npz"
    np.savez(path, **{**ref, "board": np.array("tx2")})
    assert check_board("tx2", tx2_copy)["ok"]


def test_training_refuses_a_folder_of_another_board(tx2_copy):
    from agents.train import TrainConfig
    from agents.trainboard import train_board

    with pytest.raises(ValueError, match="holds models of board 'tx2', not 'rubikpi3'"):
        train_board(
            load_board("rubikpi3"),
            None,
            None,
            0,
            tx2_copy,
            "test",
            policies=("ztt",),
            cfg=TrainConfig(episodes=1),
        )


def _train_ztt_into(folder, board="rubikpi3", *, run=False):
    """zTT trained into ``folder``; without ``run`` only its refusals can happen (no episode
    runner is given, so one that got past them would fail)."""
    from agents.train import TrainConfig
    from agents.trainboard import train_board
    from tools.agents_episodes import EpisodeSpec, episode_items, make_runner

    ep = EpisodeSpec(n_jobs=2)
    train_board(
        load_board(board),
        make_runner(board, ep) if run else None,
        (lambda s: episode_items(board, s, ep)) if run else None,
        1,
        folder,
        "hidvfs agents train --board rubikpi3 --seed 1 --policy ztt",
        policies=("ztt",),
        cfg=TrainConfig(episodes=2 if run else 1),
    )


def test_training_refuses_another_boards_files_without_their_manifest(tx2_copy):
    """With the manifest gone, training one rubikpi3 policy into a tx2 folder went through:
    the tx2 files stayed, and its reference.npz (with tx2's shield calibration) was labelled
    rubikpi3."""
    (tx2_copy / "manifest.json").rename(tx2_copy / "manifest.json.away")
    before = {p.name: p.read_bytes() for p in tx2_copy.rglob("*") if p.is_file()}
    with pytest.raises(ValueError, match="holds ONNX files but no manifest.json"):
        _train_ztt_into(tx2_copy)
    for p in tx2_copy.glob("*.onnx"):  # references alone, of another board: refused too
        p.unlink()
    for p in tx2_copy.glob("*/*.onnx"):
        p.unlink()
    with pytest.raises(ValueError, match="references .* of board 'tx2', not 'rubikpi3'"):
        _train_ztt_into(tx2_copy)
    assert (tx2_copy / "reference.npz").read_bytes() == before["reference.npz"]


def test_a_killed_first_runs_staging_folder_does_not_block_the_next_run(tmp_path):
    """The no-manifest check saw the ONNX files of a dead run's .staging-PID folder and
    refused every retry of a first training killed mid-way."""
    out = tmp_path / "m"
    (out / ".staging-999999" / "hidvfs").mkdir(parents=True)
    (out / ".staging-999999" / "hidvfs" / "profiler.onnx").write_bytes(b"half")
    _train_ztt_into(out, run=True)
    assert (out / "manifest.json").is_file() and not (out / ".staging-999999").exists()


def test_a_damaged_manifest_is_named_when_training_into_its_folder(tx2_copy):
    (tx2_copy / "manifest.json").write_text('{"board": "tx2", "policies": {')
    with pytest.raises(ValueError, match=r"manifest\.json: unreadable \(Expecting"):
        _train_ztt_into(tx2_copy, "tx2")


def test_retraining_one_policy_records_its_own_provenance(tmp_path):
    folder = tmp_path / "rubikpi3"
    shutil.copytree(MODELS_DIR / "rubikpi3", folder)
    _train_ztt_into(folder, run=True)
    man = json.loads((folder / "manifest.json").read_text())
    # the top level is the last run (its command names what it retrained); per policy its own
    assert man["seed"] == 1 and "--policy ztt" in man["command"]
    assert man["policies"]["ztt"]["provenance"]["seed"] == 1
    assert man["policies"]["hidvfs"]["provenance"]["seed"] == 0  # kept from its own run
    report = check_board("rubikpi3", folder)
    assert report["ok"], report
    rows = {r["file"]: r for r in report["files"]}
    assert rows["ztt.onnx"]["seed"] == "1" and rows["profiler.onnx"]["seed"] == "0"
    # a file that is not from the run the manifest names is reported
    man["policies"]["ztt"]["provenance"]["seed"] = 7
    (folder / "manifest.json").write_text(json.dumps(man))
    row = next(r for r in check_board("rubikpi3", folder)["files"] if r["file"] == "ztt.onnx")
    assert not row["ok"] and "seed '1' in the file, '7' in the manifest's ztt entry" in row["error"]


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"shield": None}, "shield"),
        ({"shield": "x"}, "shield"),
        ({"shield": {"q": 1.0}}, "shield.alpha"),
        ({"shield": {"alpha": 1.5}}, "shield.alpha"),
        ({"period_s": "x"}, "period_s"),
        ({"period_s": 0}, "period_s"),
        ({"policies": []}, "policies"),
        ({"policies": {"ztt": "x"}}, "policies.ztt"),
        ({"policies": {"ztt": {"provenance": []}}}, "policies.ztt.provenance"),
        ({"format": "other"}, "format"),
    ],
)
def test_a_malformed_manifest_is_refused_naming_the_file_and_key(tx2_copy, change, key):
    """These passed `agents check` (`policies: []` as ok, with an AttributeError in its
    row) and then crashed eval and the daemon with a TypeError, or named neither."""
    path = tx2_copy / "manifest.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **change}))
    with pytest.raises(ModelMismatch, match=rf"manifest.json: key '{key}' must be") as e:
        load_manifest(tx2_copy, "tx2")
    assert "\n" not in str(e.value)
    with pytest.raises(ModelMismatch, match=rf"key '{key}'"):
        make_hidvfs(TX2, models=tx2_copy)
    report = check_board("tx2", tx2_copy)
    assert not report["ok"] and report["files"][0]["file"] == "manifest.json"


def test_check_fails_a_manifest_that_is_a_list(tx2_copy):
    """It used to end `agents check` with an AttributeError traceback."""
    (tx2_copy / "manifest.json").write_text("[1, 2]")
    r = CliRunner().invoke(cli, ["agents", "check", "--board", "tx2", "--models", str(tx2_copy)])
    assert r.exit_code == 1 and isinstance(r.exception, SystemExit), r.output
    assert "key '<top>' must be a JSON object, got 'list'" in r.output
    assert "model check failed for tx2" in r.output


def test_a_manifest_without_a_shield_is_named_when_the_shield_is_loaded(tx2_copy):
    path = tx2_copy / "manifest.json"
    man = json.loads(path.read_text())
    del man["shield"]
    path.write_text(json.dumps(man))
    with pytest.raises(ModelMismatch, match="manifest.json: key 'shield'"):
        make_hidvfs(TX2, models=tx2_copy)
    assert make_hidvfs(TX2, models=tx2_copy, shield=False).name == "hidvfs-noshield"


def test_a_cut_short_reference_file_is_a_failed_check_not_a_traceback(tmp_path):
    import shutil

    from click.testing import CliRunner

    from agents.learned import MODELS_DIR
    from tools.cli import cli

    folder = tmp_path / "tx2"
    shutil.copytree(MODELS_DIR / "tx2", folder)
    data = (folder / "reference.npz").read_bytes()
    (folder / "reference.npz").write_bytes(data[:5000])
    r = CliRunner().invoke(cli, ["agents", "check", "--board", "tx2", "--models", str(folder)])
    assert r.exit_code != 0 and r.exception is None or isinstance(r.exception, SystemExit)
    assert "reference.npz: unreadable" in r.output and "Traceback" not in r.output


def test_a_changed_action_space_is_refused_by_every_loader(tx2_copy):
    """The networks' outputs index the manifest's action space: a spec whose table gives
    other levels (here one OPP fewer on the first cluster) must not run them."""
    import dataclasses

    man = json.loads((tx2_copy / "manifest.json").read_text())
    assert make_hidvfs(TX2, models=tx2_copy) is not None
    cl = TX2.clusters[0]
    shorter = dataclasses.replace(cl, freqs_khz=tuple(cl.freqs_khz[:-1]))
    spec = dataclasses.replace(TX2, clusters=(shorter, *TX2.clusters[1:]))
    for load in (
        lambda: make_hidvfs(spec, models=tx2_copy),
        lambda: make_learned_policy("ztt", spec, models=tx2_copy),
        lambda: make_learned_policy("geardvfs", spec, models=tx2_copy),
    ):
        with pytest.raises(ModelMismatch, match="action_space") as e:
            load()
        assert "\n" not in str(e.value)
    # the folder itself: a manifest naming other levels fails `agents check`
    man["action_space"]["levels"][0] = man["action_space"]["levels"][0][:-1]
    (tx2_copy / "manifest.json").write_text(json.dumps(man))
    report = check_board("tx2", tx2_copy)
    assert not report["ok"] and "action_space" in report["files"][0]["error"]


@pytest.mark.parametrize("loader", ["board", "placer"])
def test_loading_a_model_writes_nothing_to_home_and_warns_of_no_telemetry(tmp_path, loader):
    """onnxruntime 1.2x persists a telemetry device id under ~/.cache/Microsoft at its first
    session and, where the home cannot be written (a unit's ProtectHome), warns on every
    start. The loaders import it with its telemetry off."""
    import os
    import subprocess
    import sys

    load = {
        "board": "from agents.learned import check_board; check_board('tx2')",
        "placer": "from agents.placement.higfrl import HigfrlPlacer; HigfrlPlacer()._model()",
    }[loader]
    env = {k: v for k, v in os.environ.items() if k != "ORT_DISABLE_TELEMETRY"}
    for home, writable in ((tmp_path / "home", True), ("/proc/1/nonexistent-home", False)):
        if writable:
            home.mkdir()
        env.update(HOME=str(home), XDG_CACHE_HOME=str(home) + "/.cache")
        out = subprocess.run(
            [sys.executable, "-c", load + "; print('loaded')"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == "loaded"
        assert "telemetry" not in out.stderr.lower(), out.stderr
        if writable:
            assert not any(home.rglob("*")), sorted(map(str, home.rglob("*")))
