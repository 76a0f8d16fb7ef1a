"""The higfrl ONNX loader refuses a model the placer cannot feed or read, in one line."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from agents.placement.features import FEATURE_VERSION, N_GLOBAL, N_PAIR
from agents.placement.higfrl import DEFAULT_MODEL
from agents.placement.onnx_mlp import Mlp, NumpyPolicyModel, OnnxPolicyModel, build_onnx

META = {"feature_version": str(FEATURE_VERSION)}


def _save(path, pair_dim=N_PAIR, ctx_dim=N_GLOBAL, meta=META):
    rng = np.random.default_rng(0)
    path.write_bytes(
        build_onnx(Mlp.init([pair_dim, 8, 1], rng), Mlp.init([ctx_dim, 4, 1], rng), meta)
    )
    return path


def _numpy_model(seed=3, hidden=4):
    rng = np.random.default_rng(seed)
    return NumpyPolicyModel(
        Mlp.init([N_PAIR, hidden, 1], rng, out_scale=1.0),
        Mlp.init([N_GLOBAL, hidden, 1], rng, out_scale=1.0),
        rng.normal(size=N_PAIR),
        rng.uniform(0.5, 2, size=N_PAIR),
        rng.normal(size=N_GLOBAL),
        rng.uniform(0.5, 2, size=N_GLOBAL),
    )


def _exported(path, seed=3):
    _numpy_model(seed).export(path, META)
    return path


def test_a_matching_model_and_the_shipped_model_load(tmp_path):
    m = OnnxPolicyModel(_exported(tmp_path / "ok.onnx"))
    assert (m.n_pair, m.n_global) == (N_PAIR, N_GLOBAL)
    assert m.reference_diff <= 1e-5
    shipped = OnnxPolicyModel(DEFAULT_MODEL)
    assert shipped.logits(np.zeros((3, N_PAIR), np.float32)).shape == (3,)


@pytest.mark.parametrize(
    "kw, needle",
    [
        ({"pair_dim": 30}, "input pairs has shape ['N', 30], expected [N, 49] (features.N_PAIR)"),
        ({"ctx_dim": 5}, "input context has shape [1, 5], expected [1, 11] (features.N_GLOBAL)"),
        ({"meta": {"feature_version": "1"}}, "feature_version '1', expected '2'"),
        ({"meta": {}}, "feature_version None, expected '2'"),
    ],
)
def test_mismatched_models_are_refused_naming_the_file(tmp_path, kw, needle):
    assert (N_PAIR, N_GLOBAL, FEATURE_VERSION) == (49, 11, 2)  # the messages below
    path = _save(tmp_path / "bad.onnx", **kw)
    with pytest.raises(ValueError) as err:
        OnnxPolicyModel(path)
    assert str(err.value).startswith(f"{path}: ") and needle in str(err.value)


def _edit_shipped(tmp_path, name, edit):
    m = onnx.load(DEFAULT_MODEL)
    edit(m)
    path = tmp_path / name
    onnx.save(m, path)
    return path


def test_a_model_without_logits_is_refused(tmp_path):
    def drop_logits(m):
        keep = [o for o in m.graph.output if o.name != "logits"]
        del m.graph.output[:]
        m.graph.output.extend(keep)

    path = _edit_shipped(tmp_path, "nologits.onnx", drop_logits)
    with pytest.raises(ValueError, match=r"lack \['logits'\]"):
        OnnxPolicyModel(path)


def test_a_symbolic_feature_dim_is_refused(tmp_path):
    def symbolic(m):
        dim = m.graph.input[0].type.tensor_type.shape.dim[1]
        dim.ClearField("dim_value")
        dim.dim_param = "F"

    path = _edit_shipped(tmp_path, "symdim.onnx", symbolic)
    with pytest.raises(ValueError, match=r"input pairs has shape \['N', 'F'\]"):
        OnnxPolicyModel(path)


def test_a_model_that_fails_to_run_is_a_value_error(tmp_path):
    # the right signature, but a Reshape no batch of one row can satisfy
    shape = helper.make_tensor("shape", TensorProto.INT64, [2], [3, -1])
    graph = helper.make_graph(
        [
            helper.make_node("Reshape", ["pairs", "shape"], ["logits"]),
            helper.make_node("Identity", ["context"], ["value"]),
        ],
        "broken",
        [
            helper.make_tensor_value_info("pairs", TensorProto.FLOAT, ["N", N_PAIR]),
            helper.make_tensor_value_info("context", TensorProto.FLOAT, [1, N_GLOBAL]),
        ],
        [
            helper.make_tensor_value_info("logits", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("value", TensorProto.FLOAT, None),
        ],
        initializer=[shape],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    entry = model.metadata_props.add()
    entry.key, entry.value = "feature_version", str(FEATURE_VERSION)
    path = tmp_path / "broken.onnx"
    onnx.save(model, path)
    with pytest.raises(ValueError, match=f"{path}: the model does not run"):
        OnnxPolicyModel(path)


def test_numpy_export_round_trips_through_the_checked_loader(tmp_path):
    model = _numpy_model()
    model.export(tmp_path / "m.onnx", META)
    onx = OnnxPolicyModel(tmp_path / "m.onnx")
    ref = json.loads(onx.metadata["reference"])
    assert len(ref["pairs"]) == 8 and len(ref["context"]) == 2
    # the recorded outputs are the numpy network's, not the exported file's
    np.testing.assert_array_equal(ref["logits"], model.logits(np.asarray(ref["pairs"])))


def _with_metadata(src, dst, **changes):
    m = onnx.load(str(src))
    kept = [p for p in m.metadata_props if p.key not in changes]
    del m.metadata_props[:]
    m.metadata_props.extend(kept)
    for key, value in changes.items():
        if value is not None:
            entry = m.metadata_props.add()
            entry.key, entry.value = key, value
    onnx.save(m, str(dst))
    return dst


def test_a_model_without_reference_outputs_is_refused(tmp_path):
    """Before: any file with the right signature loaded, whatever its weights."""
    path = _with_metadata(_exported(tmp_path / "ok.onnx"), tmp_path / "noref.onnx", reference=None)
    with pytest.raises(ValueError, match=r"noref\.onnx: no training-time reference outputs"):
        OnnxPolicyModel(path)


@pytest.mark.parametrize(
    "text",
    ["[1, 2]", "{}", "not json", '{"pairs": [[1.0]], "context": [], "logits": [], "value": []}'],
)
def test_unreadable_reference_metadata_is_refused(tmp_path, text):
    path = _with_metadata(_exported(tmp_path / "ok.onnx"), tmp_path / "bad.onnx", reference=text)
    with pytest.raises(ValueError, match=r"bad\.onnx: its 'reference' metadata is not reference"):
        OnnxPolicyModel(path)


def test_a_changed_weight_or_another_runs_reference_is_refused(tmp_path):
    from onnx import numpy_helper

    src = _exported(tmp_path / "ok.onnx")
    m = onnx.load(str(src))
    w = numpy_helper.to_array(m.graph.initializer[0]).copy()
    w.flat[0] += 1e-3  # one weight of the first layer, nudged
    m.graph.initializer[0].CopyFrom(numpy_helper.from_array(w, m.graph.initializer[0].name))
    onnx.save(m, str(tmp_path / "nudged.onnx"))
    with pytest.raises(ValueError, match=r"nudged\.onnx: outputs differ from the training-time"):
        OnnxPolicyModel(tmp_path / "nudged.onnx")
    other = OnnxPolicyModel(_exported(tmp_path / "other.onnx", seed=4)).metadata["reference"]
    pasted = _with_metadata(src, tmp_path / "pasted.onnx", reference=other)
    with pytest.raises(ValueError, match="file was changed after training"):
        OnnxPolicyModel(pasted)


def test_a_model_with_non_finite_outputs_is_refused(tmp_path):
    """A NaN bias gave NaN scores for every edge, and placement went on, arbitrary."""
    from onnx import numpy_helper

    m = onnx.load(str(_exported(tmp_path / "ok.onnx")))
    for i, init in enumerate(m.graph.initializer):
        w = numpy_helper.to_array(init)
        if w.ndim == 1:  # a bias
            m.graph.initializer[i].CopyFrom(
                numpy_helper.from_array(np.full_like(w, np.nan), init.name)
            )
            break
    onnx.save(m, str(tmp_path / "nan.onnx"))
    with pytest.raises(ValueError, match=r"nan\.onnx: the model's outputs are not finite"):
        OnnxPolicyModel(tmp_path / "nan.onnx")


def test_the_extender_loads_its_learned_model_at_start(tmp_path):
    """`coordinator serve --policy higfrl` with a truncated model started, then answered every
    /prioritize with the load error (and a traceback in the log)."""
    from daemon.coordinator import Coordinator, TelemetryClient

    bad = tmp_path / "cut.onnx"
    bad.write_bytes(open(DEFAULT_MODEL, "rb").read()[:100])
    with pytest.raises(ValueError, match=r"cut\.onnx: not a loadable ONNX model"):
        Coordinator("higfrl", TelemetryClient({}), model_path=bad)
    assert Coordinator("heft", TelemetryClient({}), model_path=bad).policy == "heft"


def test_an_interrupted_export_leaves_the_old_model_and_no_temporary_file(tmp_path, monkeypatch):
    """The export wrote NAME.tmp then renamed it: interrupted at the rename, NAME.tmp stayed
    (and two runs writing one path shared that name)."""
    path = _exported(tmp_path / "m.onnx")
    old = path.read_bytes()

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("os.replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        _numpy_model(seed=5).export(path, META)
    monkeypatch.undo()
    assert path.read_bytes() == old and [p.name for p in tmp_path.iterdir()] == ["m.onnx"]
    _numpy_model(seed=5).export(path, META)
    assert path.read_bytes() != old and oct(path.stat().st_mode & 0o777) == "0o644"


def test_a_reference_that_is_not_finite_is_refused(tmp_path):
    """An Infinity among the recorded outputs made the tolerance infinite: any weights passed."""
    src = _exported(tmp_path / "ok.onnx")
    ref = json.loads(OnnxPolicyModel(src).metadata["reference"])
    ref["value"][0] = float("inf")
    path = _with_metadata(src, tmp_path / "inf.onnx", reference=json.dumps(ref))
    with pytest.raises(ValueError, match="not reference inputs and outputs .* not finite"):
        OnnxPolicyModel(path)
