"""Export the agents' MLPs (and the shield's regressor) to ONNX with provenance metadata.

The graph is built with ``onnx.helper`` from MatMul, Add and Relu (optionally a final Softmax):
``x [N, in] -> y [N, out]`` with a dynamic batch. Every file carries ``metadata_props``:
``board``, ``schema_version`` (agents.features), ``role``, ``seed``, ``command`` (the exact
training command), ``git_commit`` and ``date``, plus role-specific entries (e.g. the head
sizes). :mod:`agents.runtime` refuses a file whose board or schema does not match.

``onnx`` and ``skl2onnx`` are imported lazily: the daemon on a board only needs onnxruntime.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from agents.features import SCHEMA_VERSION, schema
from agents.nn import MLP

OPSET = 17
IR_VERSION = 9  # readable by onnxruntime >= 1.16 (the boards' L4T / Ubuntu wheels)
REQUIRED_KEYS = ("board", "schema_version", "role", "seed", "command", "git_commit", "date")


#: what training itself writes: its outputs do not make the source tree count as modified
_OUTPUTS = (":(top,exclude)agents/models", ":(top,exclude)tests/agents/data")


def git_commit(cwd: str | os.PathLike[str] | None = None) -> str:
    """``git rev-parse HEAD`` of the source tree, with ``+dirty`` when tracked files other than
    the model and test-data folders differ from it (the code that ran is then not that
    commit), or "unknown" when git cannot tell. Read it when training starts."""
    where = cwd or Path(__file__).resolve().parent

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(
                ["git", *args], cwd=where, capture_output=True, text=True, timeout=5, check=False
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    sha = git("rev-parse", "HEAD")
    if not sha:
        return "unknown"
    status = git("status", "--porcelain", "--untracked-files=no", "--", ":(top)", *_OUTPUTS)
    return sha + "+dirty" if status else sha


def provenance(
    board: str,
    role: str,
    seed: int,
    command: str,
    extra: Mapping[str, object] | None = None,
    commit: str | None = None,
) -> dict[str, str]:
    """The metadata every exported file carries (values as strings, JSON for structures);
    ``commit`` is the source tree's commit when training started (default: now)."""
    meta = {
        "board": board,
        "schema_version": str(SCHEMA_VERSION),
        "schema": json.dumps(schema(), sort_keys=True),
        "role": role,
        "seed": str(int(seed)),
        "command": command,
        "git_commit": commit or git_commit(),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    for k, v in (extra or {}).items():
        meta[k] = v if isinstance(v, str) else json.dumps(v, sort_keys=True)
    return meta


def dense_nodes(
    layers: Sequence[tuple[np.ndarray, np.ndarray]], x: str, out: str, prefix: str = ""
) -> tuple[list, list]:
    """ONNX nodes and float32 initialisers of ``x -> (MatMul, Add, Relu)* -> out`` for
    ``layers[i] = (W [in, out], b [out])``, ReLU between layers and a linear last layer (the
    one graph every exported MLP of the project uses)."""
    from onnx import helper, numpy_helper

    nodes, inits = [], []
    h = x
    last = len(layers) - 1
    for i, (w, b) in enumerate(layers):
        wn, bn = f"{prefix}W{i}", f"{prefix}B{i}"
        inits.append(numpy_helper.from_array(np.asarray(w, np.float32), wn))
        inits.append(numpy_helper.from_array(np.asarray(b, np.float32), bn))
        nodes.append(helper.make_node("MatMul", [h, wn], [f"{prefix}mm{i}"]))
        z = out if i == last else f"{prefix}z{i}"
        nodes.append(helper.make_node("Add", [f"{prefix}mm{i}", bn], [z]))
        if i < last:
            nodes.append(helper.make_node("Relu", [z], [f"{prefix}h{i}"]))
            h = f"{prefix}h{i}"
    return nodes, inits


def mlp_to_onnx(net: MLP, meta: Mapping[str, str], softmax: bool = False):
    """An ``onnx.ModelProto`` computing the MLP (raw outputs, or Softmax over the last axis)."""
    from onnx import TensorProto, helper

    nodes, inits = dense_nodes(list(zip(net.weights, net.biases)), "x", "z")
    if softmax:
        nodes.append(helper.make_node("Softmax", ["z"], ["y"], axis=-1))
    else:
        nodes.append(helper.make_node("Identity", ["z"], ["y"]))
    n_in, n_out = net.sizes[0], net.sizes[-1]
    graph = helper.make_graph(
        nodes,
        f"hidvfs_{meta.get('role', 'mlp')}",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", n_in])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", n_out])],
        inits,
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="hidvfs",
    )
    model.ir_version = IR_VERSION
    set_metadata(model, meta)
    import onnx

    onnx.checker.check_model(model)
    return model


def set_metadata(model, meta: Mapping[str, str]) -> None:
    """Replace the model's ``metadata_props`` by ``meta`` (checks the required keys)."""
    missing = [k for k in REQUIRED_KEYS if k not in meta]
    if missing:
        raise ValueError(f"ONNX metadata lacks required keys {missing}")
    del model.metadata_props[:]
    for k, v in meta.items():
        p = model.metadata_props.add()
        p.key, p.value = str(k), str(v)


def save_mlp(
    net: MLP, path: str | os.PathLike[str], meta: Mapping[str, str], softmax: bool = False
) -> Path:
    import onnx

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(mlp_to_onnx(net, meta, softmax), str(path))
    return path


def save_sklearn(
    estimator, n_features: int, path: str | os.PathLike[str], meta: Mapping[str, str]
) -> Path:
    """A fitted scikit-learn regressor as ONNX (skl2onnx), input ``x`` [N, n_features].

    The graph is named ``hidvfs_<role>`` as the MLPs' are: skl2onnx would give it a random
    UUID, so the same estimator exported twice would differ (the graph is byte-reproducible;
    the metadata's ``date`` is the export's)."""
    import onnx
    from skl2onnx import convert_sklearn
    from skl2onnx.common.data_types import FloatTensorType

    name = f"hidvfs_{meta.get('role', 'sklearn')}"
    model = convert_sklearn(
        estimator,
        initial_types=[("x", FloatTensorType([None, n_features]))],
        target_opset={"": OPSET, "ai.onnx.ml": 3},
        name=name,
    )
    model.graph.name = name  # whatever the skl2onnx version does with ``name``
    model.ir_version = min(model.ir_version, IR_VERSION)
    set_metadata(model, meta)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, str(path))
    return path


__all__ = [
    "OPSET",
    "REQUIRED_KEYS",
    "git_commit",
    "provenance",
    "mlp_to_onnx",
    "set_metadata",
    "save_mlp",
    "save_sklearn",
]
