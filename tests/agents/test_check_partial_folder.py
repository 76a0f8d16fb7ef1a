"""`agents check --models DIR` on a folder that `agents train --policy P --out DIR` wrote: the
policies it did not train are said as such, not failed as missing files; a policy the
manifest lists whose file is gone still fails, and the shipped folder must hold every one."""

from __future__ import annotations

import json
import shutil

import pytest

from agents.learned import MODELS_DIR, check_board


@pytest.fixture
def tx2_without_ztt(tmp_path):
    dst = tmp_path / "tx2"
    shutil.copytree(MODELS_DIR / "tx2", dst)
    (dst / "ztt.onnx").unlink()
    man = json.loads((dst / "manifest.json").read_text())
    del man["policies"]["ztt"]
    (dst / "manifest.json").write_text(json.dumps(man))
    return dst


def test_a_policy_the_folder_never_trained_is_skipped_not_failed(tx2_without_ztt):
    report = check_board("tx2", tx2_without_ztt)
    rows = {r["file"]: r for r in report["files"]}
    assert report["ok"], [r for r in report["files"] if not r["ok"]]
    assert rows["ztt.onnx"]["skipped"] == "ztt not trained in this folder"
    assert "max_abs_diff" in rows["geardvfs.onnx"] and "skipped" not in rows["geardvfs.onnx"]


def test_a_listed_policy_whose_file_is_gone_still_fails(tx2_without_ztt):
    (tx2_without_ztt / "geardvfs.onnx").unlink()
    report = check_board("tx2", tx2_without_ztt)
    rows = {r["file"]: r for r in report["files"]}
    assert not report["ok"] and not rows["geardvfs.onnx"]["ok"]
    assert "skipped" not in rows["geardvfs.onnx"]


def test_the_check_command_says_which_policies_a_folder_did_not_train(tx2_without_ztt):
    from click.testing import CliRunner

    from tools.cli import cli

    r = CliRunner().invoke(cli, ["agents", "check", "--board", "tx2", "--models", tx2_without_ztt])
    assert r.exit_code == 0, r.output
    lines = {ln.split()[1]: ln for ln in r.output.splitlines()}
    assert lines["ztt.onnx"].endswith("-- ztt not trained in this folder")
    assert " ok max|diff| " in lines["geardvfs.onnx"]
