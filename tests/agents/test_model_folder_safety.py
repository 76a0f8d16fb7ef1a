"""A models folder is used whole or not at all.

The daemon's loaders compare every network with reference.npz's training-time outputs (as
``agents check`` does), so a folder that an interrupted or failed training left half
replaced is refused with one line naming the file; and training moves each policy's files,
reference outputs and manifest entry into place together, so an interrupted run leaves the
policies it finished consistent and the others as they were.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time

import numpy as np
import pytest

from agents.learned import (
    MODELS_DIR,
    ReferenceMismatch,
    check_board,
    hash_mismatches,
    make_hidvfs,
    make_learned_policy,
)
from agents.runtime import ModelMismatch
from agents.train import CALIB_SEEDS, TrainConfig
from agents.trainboard import train_board
from platforms.spec import load_board
from tests.agents.test_model_loading import copy_without_hashes

TX2 = load_board("tx2")
RUBIK = load_board("rubikpi3")
#: the advice for a folder outside the repository (every test's copy): not "git checkout"
RESTORE = "restore the folder from where it came, or re-run the `hidvfs agents train` that wrote it"


@pytest.fixture
def tx2_copy(tmp_path):
    """The shipped tx2 folder without its manifest's sha256 map: the checks beneath it (the
    reference outputs, the calibration, the metadata), which hold for a folder trained
    before the map was recorded, are what these tests change files to reach."""
    return copy_without_hashes(MODELS_DIR / "tx2", tmp_path / "tx2")


def _perturbed(src, dst, delta: float = 0.05) -> None:
    """``src`` with its first weight matrix shifted: same board, role and metadata."""
    import onnx
    from onnx import numpy_helper

    m = onnx.load(str(src))
    for i, init in enumerate(m.graph.initializer):
        if init.name == "W0":
            w = numpy_helper.to_array(init) + np.float32(delta)
            m.graph.initializer[i].CopyFrom(numpy_helper.from_array(w, "W0"))
    onnx.save_model(m, str(dst))


def _refused(load, fname: str) -> ReferenceMismatch:
    with pytest.raises(ReferenceMismatch) as e:
        load()
    msg = str(e.value)
    assert isinstance(e.value, ModelMismatch) and isinstance(e.value, ValueError)
    assert "\n" not in msg and fname in msg and RESTORE in msg, msg
    assert "git checkout" not in msg, msg
    return e.value


def test_only_the_shipped_folder_is_restored_with_git(tmp_path):
    """Every refusal said "restore the folder (git checkout agents/models)", also for a
    folder `agents train --out` wrote in /tmp, which git cannot restore."""
    from agents.learned import restore_advice

    for folder in (MODELS_DIR, MODELS_DIR / "tx2", MODELS_DIR / "tx2" / "noshaping"):
        assert (
            restore_advice(folder) == "restore the folder (git checkout agents/models) or retrain"
        )
    assert RESTORE in restore_advice(tmp_path) and "git" not in restore_advice(tmp_path)


def test_an_agent_of_another_run_is_refused_by_the_daemon_s_loader(tx2_copy):
    """profiler.onnx replaced (as an interrupted retrain left it) while reference.npz and the
    manifest stayed: the loader ran it without complaint, only `agents check` failed."""
    shutil.copy(tx2_copy / "noshaping" / "profiler.onnx", tx2_copy / "profiler.onnx")
    for shield in (True, False):
        err = _refused(lambda s=shield: make_hidvfs(TX2, models=tx2_copy, shield=s), "profiler")
        assert "outputs differ from the training-time ones in reference.npz" in str(err)
    row = next(r for r in check_board("tx2", tx2_copy)["files"] if r["file"] == "profiler.onnx")
    assert not row["ok"]
    # the ablation variant is checked against its own reference entries
    _perturbed(tx2_copy / "noshaping" / "thermal.onnx", tx2_copy / "noshaping" / "thermal.onnx")
    _refused(lambda: make_hidvfs(TX2, models=tx2_copy, variant="noshaping"), "thermal.onnx")


@pytest.mark.parametrize("name", ["ztt", "geardvfs"])
def test_a_baseline_network_of_another_run_is_refused(tx2_copy, name):
    _perturbed(MODELS_DIR / "tx2" / f"{name}.onnx", tx2_copy / f"{name}.onnx")
    _refused(lambda: make_learned_policy(name, TX2, models=tx2_copy), f"{name}.onnx")
    # the other baseline and hidvfs are consistent and still load
    other = "geardvfs" if name == "ztt" else "ztt"
    assert make_learned_policy(other, TX2, models=tx2_copy).name == other
    assert make_hidvfs(TX2, models=tx2_copy).name == "hidvfs"


def test_a_network_without_reference_outputs_is_refused(tx2_copy):
    path = tx2_copy / "reference.npz"
    with np.load(path) as z:
        ref = {k: z[k] for k in z.files if not k.startswith("ztt_")}
    np.savez(path, **ref)
    err = _refused(lambda: make_learned_policy("ztt", TX2, models=tx2_copy), "ztt.onnx")
    assert "holds no training-time outputs" in str(err)
    assert make_learned_policy("geardvfs", TX2, models=tx2_copy).name == "geardvfs"


@pytest.mark.parametrize(
    ("tamper", "said"),
    [
        (lambda c: -np.abs(c) * 100, "cal_scores give q"),  # the shield then certifies all
        (lambda c: c[:0], "the manifest's shield.n_cal 882"),
        (lambda c: np.stack([c, c]), "the manifest's shield.n_cal 882"),
        (lambda c: np.where(np.arange(c.size) == 0, np.nan, c), "(finite: False)"),
    ],
)
def test_a_tampered_shield_calibration_is_refused_by_check_and_loader(tx2_copy, tamper, said):
    """reference.npz's outputs covered the networks, not the shield's scores: negated ones
    gave q -6.5 instead of 0.40 and `agents check`, eval and the daemon took them."""
    path = tx2_copy / "reference.npz"
    with np.load(path) as z:
        ref = {k: z[k] for k in z.files}
    ref["cal_scores"] = tamper(ref["cal_scores"])
    np.savez(path, **ref)
    err = _refused(lambda: make_hidvfs(TX2, models=tx2_copy), "reference.npz")
    assert said in str(err)
    assert make_hidvfs(TX2, models=tx2_copy, shield=False).name == "hidvfs-noshield"
    report = check_board("tx2", tx2_copy)
    row = next(r for r in report["files"] if r["file"].startswith("reference.npz"))
    assert not report["ok"] and not row["ok"] and said in row["error"]


def test_a_file_that_does_not_hash_as_training_recorded_is_refused(tx2_copy):
    """A change the reference rows do not exercise (here: a metadata string; in an audit, tree
    leaves the 16 reference rows never reach) passed every check. A folder whose manifest
    records the files' sha256 (`agents train` writes them) refuses it, naming the file."""
    import onnx

    from agents.learned import file_sha256

    man_path = tx2_copy / "manifest.json"
    man = json.loads(man_path.read_text())
    man["sha256"] = {
        p.relative_to(tx2_copy).as_posix(): file_sha256(p)
        for p in sorted(tx2_copy.rglob("*"))
        if p.suffix in (".onnx", ".npz")
    }
    man_path.write_text(json.dumps(man))
    assert make_hidvfs(TX2, models=tx2_copy).name == "hidvfs" and check_board("tx2", tx2_copy)["ok"]
    m = onnx.load(str(tx2_copy / "thermal.onnx"))
    m.doc_string = "edited"  # the outputs are the same to the bit
    onnx.save(m, str(tx2_copy / "thermal.onnx"))
    err = _refused(lambda: make_hidvfs(TX2, models=tx2_copy), "thermal.onnx")
    assert "is not the" in str(err) and "training recorded" in str(err)
    assert "the file changed after training wrote it" in str(err)
    _refused(lambda: make_learned_policy("ztt", TX2, models=tx2_copy), "thermal.onnx")
    # `agents check` fails the file's row, not the manifest's, and checks every other file
    report = check_board("tx2", tx2_copy)
    assert not report["ok"]
    bad = [r for r in report["files"] if not r["ok"]]
    assert [r["file"] for r in bad] == ["thermal.onnx"] and "sha256" in bad[0]["error"]
    assert RESTORE in bad[0]["error"] and str(tx2_copy) not in bad[0]["error"]
    assert len(report["files"]) == 9


@pytest.mark.parametrize("board", ["tx2", "orin-nx", "rubikpi3"])
def test_the_shipped_folders_pass_the_loader_s_check(board):
    spec = load_board(board)
    assert make_hidvfs(spec).name == "hidvfs"
    assert make_hidvfs(spec, variant="noshaping", shield=False).name.endswith("noshaping")
    for name in ("ztt", "geardvfs"):
        assert make_learned_policy(name, spec).name == name


@pytest.mark.parametrize("board", ["tx2", "orin-nx", "rubikpi3"])
def test_the_shipped_folders_record_every_file_s_sha256(board):
    """The shipped folders were trained before `agents train` recorded hashes, so a byte
    changed where the reference rows never look (an unused unit, a tree leaf) loaded; each
    manifest now names every file beside it with its digest, and those digests hold."""
    from agents.learned import file_sha256

    folder = MODELS_DIR / board
    man = json.loads((folder / "manifest.json").read_text())
    files = {
        p.relative_to(folder).as_posix()
        for p in folder.rglob("*")
        if p.is_file() and p.name != "manifest.json"
    }
    assert set(man["sha256"]) == files == set(man["sha256_recorded"]["files"])
    assert all(file_sha256(folder / rel) == want for rel, want in man["sha256"].items())
    assert hash_mismatches(folder, man) == {}


def _snapshot(folder) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


class Interrupted(KeyboardInterrupt):
    pass


def test_an_interrupted_training_leaves_the_folder_as_it_was(tmp_path):
    """hidvfs trained, its agents exported, then the run stopped during the shield's
    calibration: the new profiler/thermal/priority files used to sit in the folder beside
    the old reference.npz and manifest, and the daemon loaded the mix."""
    from tools.agents_episodes import EpisodeSpec, episode_items, make_runner

    folder = tmp_path / "rubikpi3"
    shutil.copytree(MODELS_DIR / "rubikpi3", folder)
    before = _snapshot(folder)
    ep = EpisodeSpec(n_jobs=2)
    run = make_runner("rubikpi3", ep)

    def run_episode(policy, items, seed, **kw):
        if CALIB_SEEDS <= seed < CALIB_SEEDS + 100_000:
            raise Interrupted("SIGTERM")  # as InterruptOnSignals raises it
        return run(policy, items, seed, **kw)

    with pytest.raises(Interrupted):
        train_board(
            RUBIK,
            run_episode,
            lambda s: episode_items("rubikpi3", s, ep),
            1,
            folder,
            "test",
            policies=("hidvfs",),
            cfg=TrainConfig(episodes=1, val_episodes=1),
        )
    assert _snapshot(folder) == before  # nothing moved in, no staging folder left
    assert make_hidvfs(RUBIK, models=folder).name == "hidvfs"


def test_parallel_training_saves_each_policy_as_it_arrives(tmp_path):
    """With --workers 2 the results were saved only once every job had finished: a failure
    of the slower one lost the finished one, whose files had already replaced the old ones."""
    from agents.geardvfs import GearDvfsPolicy
    from tools.agents_episodes import EpisodeSpec, episode_items, make_runner

    folder = tmp_path / "rubikpi3"
    shutil.copytree(MODELS_DIR / "rubikpi3", folder)
    ep = EpisodeSpec(n_jobs=2)
    run = make_runner("rubikpi3", ep)
    man_path = folder / "manifest.json"
    shipped_hashes = json.loads(man_path.read_text())["sha256"]

    def ztt_saved() -> bool:
        try:
            man = json.loads(man_path.read_text())
        except (OSError, ValueError):
            return False
        return man["policies"]["ztt"]["provenance"]["seed"] == 1

    def run_episode(policy, items, seed, **kw):
        if isinstance(policy, GearDvfsPolicy):  # fails once zTT's result is in (or 60 s on)
            t_end = time.monotonic() + 60
            while not ztt_saved() and time.monotonic() < t_end:
                time.sleep(0.1)
            raise RuntimeError("geardvfs worker failed")
        return run(policy, items, seed, **kw)

    with pytest.raises(RuntimeError, match="geardvfs worker failed"):
        train_board(
            RUBIK,
            run_episode,
            lambda s: episode_items("rubikpi3", s, ep),
            1,
            folder,
            "test",
            policies=("ztt", "geardvfs"),
            cfg=TrainConfig(episodes=1, val_episodes=1),
            workers=2,
        )
    man = json.loads(man_path.read_text())
    assert man["policies"]["ztt"]["provenance"]["seed"] == 1  # saved, with its reference
    assert man["policies"]["geardvfs"]["provenance"]["seed"] == 0  # the old one, untouched
    # the files this run wrote carry their new hashes, the others keep theirs
    changed = {rel for rel, h in man["sha256"].items() if h != shipped_hashes[rel]}
    assert changed == {"ztt.onnx", "reference.npz"} and set(man["sha256"]) == set(shipped_hashes)
    # the files hashed after their training: the ones this run wrote have left the list
    assert set(man["sha256_recorded"]["files"]) == set(shipped_hashes) - changed
    report = check_board("rubikpi3", folder)
    assert report["ok"], report
    assert make_learned_policy("ztt", RUBIK, models=folder).name == "ztt"
    assert make_learned_policy("geardvfs", RUBIK, models=folder).name == "geardvfs"
    assert not [p for p in folder.iterdir() if p.name.startswith(".staging-")]


def test_a_signal_during_the_move_into_place_waits_for_it(tmp_path, monkeypatch):
    """The renames that put a policy in place are not cut by a signal: it is acted on (here
    KeyboardInterrupt, as the CLI's handlers raise) once the folder is consistent again."""
    import signal

    import agents.trainboard as t

    out, staged = tmp_path / "out", tmp_path / "stage"
    (staged / "sub").mkdir(parents=True)
    out.mkdir()
    for rel in ("a.onnx", "sub/b.onnx"):
        (staged / rel).write_bytes(b"new " + rel.encode())
    real_replace = os.replace
    moved: list[str] = []

    def replace(src, dst):
        into_out = str(out) in os.fspath(dst)
        if into_out and not moved:  # the signal arrives as the first file goes in place
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
        real_replace(src, dst)
        if into_out:
            moved.append(os.path.basename(dst))

    monkeypatch.setattr(t.os, "replace", replace)
    assert threading.current_thread() is threading.main_thread()
    with pytest.raises(KeyboardInterrupt):
        t.commit_policy(out, staged, ["a.onnx", "sub/b.onnx"], {"k": np.arange(3)}, {"m": 1})
    assert moved == ["a.onnx", "b.onnx", "reference.npz", "manifest.json"]
    assert (out / "sub" / "b.onnx").read_bytes() == b"new sub/b.onnx"
    man = json.loads((out / "manifest.json").read_text())
    assert man["m"] == 1 and set(man["sha256"]) == {"a.onnx", "sub/b.onnx", "reference.npz"}
    with np.load(out / "reference.npz") as z:
        assert z["k"].tolist() == [0, 1, 2]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_staging_folder_left_under_this_pid_is_stale(tmp_path):
    """A SIGKILLed training in a container restarts as the same pid (1): its leftover
    staging folder made the next mkdir fail."""
    import os

    from agents.trainboard import STAGING_PREFIX, _remove_stale_staging

    mine = tmp_path / f"{STAGING_PREFIX}{os.getpid()}"
    (mine / "hidvfs").mkdir(parents=True)
    alive = tmp_path / f"{STAGING_PREFIX}1"  # init: alive, another process's
    alive.mkdir()
    _remove_stale_staging(tmp_path)
    assert not mine.exists() and alive.exists()
