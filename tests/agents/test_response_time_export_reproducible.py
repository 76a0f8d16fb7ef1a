"""The shield's response_time.onnx is reproducible: skl2onnx named its graph with a random
UUID, so the same trees exported twice gave different files."""

from __future__ import annotations

import numpy as np
import onnx

from agents.onnx_export import provenance, save_sklearn


def test_the_same_estimator_exports_the_same_graph(tmp_path):
    from sklearn.ensemble import GradientBoostingRegressor

    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 8)).astype(np.float32)
    est = GradientBoostingRegressor(n_estimators=10, max_depth=2, random_state=0)
    est.fit(X, X[:, 0] + 0.1 * rng.normal(size=200))
    meta = provenance("tx2", "response_time", 0, "test", {"fields": ["a"]}, commit="abc")
    a = save_sklearn(est, 8, tmp_path / "a.onnx", meta)
    b = save_sklearn(est, 8, tmp_path / "b.onnx", meta)
    ga, gb = onnx.load(str(a)).graph, onnx.load(str(b)).graph
    assert ga.name == "hidvfs_response_time"  # named as the MLPs' graphs are
    assert ga.SerializeToString() == gb.SerializeToString()
    assert a.read_bytes() == b.read_bytes()  # one metadata (date included): the same bytes
