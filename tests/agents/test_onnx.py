"""ONNX export and load: outputs match numpy to 1e-5, provenance is stored, mismatches refused."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.features import SCHEMA_VERSION
from agents.nn import MLP
from agents.onnx_export import mlp_to_onnx, provenance, save_mlp, save_sklearn
from agents.runtime import ModelMismatch, OnnxModel, read_metadata


def _net(sizes, seed=0):
    return MLP.init(sizes, np.random.default_rng(seed), out_scale=1.0)


@settings(max_examples=10, deadline=None)
@given(
    n_in=st.integers(1, 40),
    hidden=st.integers(1, 64),
    n_out=st.integers(1, 36),
    seed=st.integers(0, 1000),
)
def test_exported_mlp_matches_numpy(tmp_path_factory, n_in, hidden, n_out, seed):
    net = _net([n_in, hidden, hidden, n_out], seed)
    path = tmp_path_factory.mktemp("m") / "m.onnx"
    save_mlp(net, path, provenance("tx2", "profiler", seed, "cmd"))
    model = OnnxModel(path, "tx2", "profiler")
    x = np.random.default_rng(seed).normal(size=(7, n_in)).astype(np.float32)
    np.testing.assert_allclose(model(x), net.forward(x), atol=1e-5)


def test_softmax_head(tmp_path):
    net = _net([5, 8, 3])
    save_mlp(net, tmp_path / "s.onnx", provenance("tx2", "thermal", 0, "c"), softmax=True)
    y = OnnxModel(tmp_path / "s.onnx", "tx2", "thermal")(np.ones((2, 5), np.float32))
    np.testing.assert_allclose(y.sum(axis=1), 1.0, atol=1e-6)


def test_metadata_is_stored(tmp_path):
    save_mlp(
        _net([3, 4, 2]),
        tmp_path / "a.onnx",
        provenance("orin-nx", "ztt", 42, "hidvfs agents train --board orin-nx --seed 42"),
    )
    meta = read_metadata(tmp_path / "a.onnx")
    assert meta["board"] == "orin-nx" and meta["seed"] == "42"
    assert meta["schema_version"] == str(SCHEMA_VERSION)
    assert meta["command"].startswith("hidvfs agents train")
    assert meta["git_commit"] and meta["date"]
    assert json.loads(meta["schema"])["version"] == SCHEMA_VERSION


def test_board_mismatch_is_refused(tmp_path):
    save_mlp(_net([3, 4, 2]), tmp_path / "a.onnx", provenance("tx2", "profiler", 0, "c"))
    with pytest.raises(ModelMismatch, match="board"):
        OnnxModel(tmp_path / "a.onnx", "rubikpi3", "profiler")
    with pytest.raises(ModelMismatch, match="role"):
        OnnxModel(tmp_path / "a.onnx", "tx2", "thermal")


def test_schema_mismatch_is_refused(tmp_path):
    meta = provenance("tx2", "profiler", 0, "c")
    meta["schema_version"] = str(SCHEMA_VERSION + 1)
    save_mlp(_net([3, 4, 2]), tmp_path / "v.onnx", meta)
    with pytest.raises(ModelMismatch, match="schema_version"):
        OnnxModel(tmp_path / "v.onnx", "tx2", "profiler")
    meta = provenance("tx2", "profiler", 0, "c")
    meta["schema"] = json.dumps({"version": SCHEMA_VERSION, "cluster": ["other"]})
    save_mlp(_net([3, 4, 2]), tmp_path / "f.onnx", meta)
    with pytest.raises(ModelMismatch, match="schema"):
        OnnxModel(tmp_path / "f.onnx", "tx2", "profiler")


def test_required_metadata_keys():
    with pytest.raises(ValueError, match="required"):
        mlp_to_onnx(_net([2, 2]), {"board": "tx2"})


def test_missing_file_names_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.onnx"):
        OnnxModel(tmp_path / "nope.onnx")


def test_sklearn_regressor_export_matches(tmp_path):
    from sklearn.ensemble import GradientBoostingRegressor

    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 8)).astype(np.float32)
    y = X[:, 0] * 2 + np.sin(X[:, 1])
    est = GradientBoostingRegressor(n_estimators=20, max_depth=3, random_state=0).fit(X, y)
    save_sklearn(est, 8, tmp_path / "rt.onnx", provenance("tx2", "response_time", 0, "c"))
    m = OnnxModel(tmp_path / "rt.onnx", "tx2", "response_time")
    np.testing.assert_allclose(m(X[:20]).reshape(-1), est.predict(X[:20]), atol=1e-5)


def test_git_commit_marks_a_modified_source_tree_but_not_training_outputs(tmp_path):
    import subprocess

    from agents.onnx_export import git_commit

    def git(*a):
        subprocess.run(["git", *a], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "agents" / "models").mkdir(parents=True)
    (tmp_path / "agents" / "train.py").write_text("x = 1\n")
    (tmp_path / "agents" / "models" / "m.onnx").write_text("old\n")
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "init")
    sha = git_commit(tmp_path)
    assert len(sha) == 40 and "+" not in sha
    (tmp_path / "agents" / "models" / "m.onnx").write_text("retrained\n")
    (tmp_path / "agents" / "new_untracked.py").write_text("")
    assert git_commit(tmp_path) == sha  # its own output and untracked files do not count
    (tmp_path / "agents" / "train.py").write_text("x = 2\n")
    assert git_commit(tmp_path) == sha + "+dirty"
    assert git_commit(tmp_path / "agents") == sha + "+dirty"  # from any folder of the tree
