"""Small MLPs: numpy forward/backward for training, ONNX export and onnxruntime inference.

The exported graph uses only MatMul, Add, Relu and Softmax, built with ``onnx.helper``:
``pairs [N, F] -> logits [N, 1] -> probs`` (Softmax over the N candidate pairs, axis 0) for
the actor, and ``context [1, G] -> value [1, 1]`` for the critic. Input normalisation is folded
into the first layer. onnxruntime runs with one intra-op and one inter-op thread and spinning
off, so inference does not steal cycles from the boards' workloads.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import numpy as np

OPSET = 17
IR_VERSION = 9  # readable by onnxruntime >= 1.16 on the boards
REFERENCE_KEY = "reference"  # metadata: training-time inputs and outputs, checked at load
REFERENCE_ROWS = 8
REFERENCE_TOLERANCE = 1e-5  # absolute, relative above |y| = 1 (as the board agents' check)


@dataclass
class Mlp:
    """``layers[i] = (W [in, out], b [out])``; ReLU between layers, linear output."""

    layers: list[tuple[np.ndarray, np.ndarray]]

    @classmethod
    def init(cls, sizes: list[int], rng: np.random.Generator, out_scale: float = 0.01) -> Mlp:
        layers = []
        for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
            scale = np.sqrt(2.0 / a) if i < len(sizes) - 2 else out_scale / np.sqrt(a)
            layers.append((rng.normal(0.0, scale, size=(a, b)), np.zeros(b)))
        return cls(layers)

    def forward(self, x: np.ndarray) -> np.ndarray:
        h = x
        for i, (w, b) in enumerate(self.layers):
            h = h @ w + b
            if i < len(self.layers) - 1:
                h = np.maximum(h, 0.0)
        return h

    def forward_cache(self, x: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
        acts = [x]
        h = x
        for i, (w, b) in enumerate(self.layers):
            h = h @ w + b
            if i < len(self.layers) - 1:
                h = np.maximum(h, 0.0)
            acts.append(h)
        return h, acts

    def backward(
        self, acts: list[np.ndarray], grad_out: np.ndarray
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """Gradients of sum(grad_out * output) for every (W, b)."""
        grads = []
        g = grad_out
        for i in range(len(self.layers) - 1, -1, -1):
            w, _ = self.layers[i]
            a_in = acts[i]
            grads.append((a_in.T @ g, g.sum(axis=0)))
            if i > 0:
                g = (g @ w.T) * (acts[i] > 0)
        return grads[::-1]

    def folded(self, mean: np.ndarray, std: np.ndarray) -> Mlp:
        """The same function of raw inputs x, for a net trained on (x - mean) / std."""
        w0, b0 = self.layers[0]
        w = w0 / std[:, None]
        b = b0 - (mean / std) @ w0
        return Mlp([(w, b)] + [(wi.copy(), bi.copy()) for wi, bi in self.layers[1:]])

    def to_dict(self) -> list[dict]:
        return [{"W": w.tolist(), "b": b.tolist()} for w, b in self.layers]


def build_onnx(actor: Mlp, critic: Mlp, metadata: dict[str, str]) -> bytes:
    """Serialised ONNX model with inputs ``pairs``, ``context`` and outputs ``logits``,
    ``probs``, ``value`` (weights already folded with the input normalisation)."""
    import onnx
    from onnx import TensorProto, helper

    from agents.onnx_export import dense_nodes

    f_in = actor.layers[0][0].shape[0]
    g_in = critic.layers[0][0].shape[0]
    a_nodes, a_init = dense_nodes(actor.layers, "pairs", "logits", prefix="actor_")
    c_nodes, c_init = dense_nodes(critic.layers, "context", "value", prefix="critic_")
    soft = helper.make_node("Softmax", ["logits"], ["probs"], axis=0)
    graph = helper.make_graph(
        a_nodes + [soft] + c_nodes,
        "higfrl",
        [
            helper.make_tensor_value_info("pairs", TensorProto.FLOAT, ["N", f_in]),
            helper.make_tensor_value_info("context", TensorProto.FLOAT, [1, g_in]),
        ],
        [
            helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 1]),
            helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["N", 1]),
            helper.make_tensor_value_info("value", TensorProto.FLOAT, [1, 1]),
        ],
        initializer=a_init + c_init,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="hidvfs"
    )
    model.ir_version = IR_VERSION
    for k, v in metadata.items():
        entry = model.metadata_props.add()
        entry.key = k
        entry.value = v if isinstance(v, str) else json.dumps(v)
    onnx.checker.check_model(model)
    return model.SerializeToString()


class OnnxPolicyModel:
    """The shipped actor-critic run by onnxruntime (1 thread, no spinning)."""

    def __init__(self, path: str | os.PathLike[str]):
        from agents.runtime import onnxruntime

        ort = onnxruntime()
        self.path = os.fspath(path)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        opts.inter_op_num_threads = 1
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        opts.add_session_config_entry("session.inter_op.allow_spinning", "0")
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        try:
            self.session = ort.InferenceSession(
                self.path, sess_options=opts, providers=["CPUExecutionProvider"]
            )
        except Exception as err:  # onnxruntime raises its own exception types
            raise ValueError(f"{self.path}: not a loadable ONNX model ({err})") from err
        meta = self.session.get_modelmeta().custom_metadata_map
        self.metadata: dict[str, str] = dict(meta)
        self.n_pair, self.n_global = self._check_signature()
        self._ctx0 = np.zeros((1, self.n_global), np.float32)
        try:  # warm-up run: a model whose graph cannot run fails here, not mid-placement
            out = self.session.run(
                ["logits", "value"],
                {"pairs": np.zeros((1, self.n_pair), np.float32), "context": self._ctx0},
            )
        except Exception as err:  # onnxruntime's own exception types
            raise ValueError(f"{self.path}: the model does not run ({err})") from err
        if not all(np.all(np.isfinite(o)) for o in out):
            # a NaN weight gives NaN scores: every placement would be arbitrary
            raise ValueError(f"{self.path}: the model's outputs are not finite (a damaged file?)")
        self.reference_diff = self._check_reference()

    def _check_signature(self) -> tuple[int, int]:
        """Inputs, outputs and feature layout the placer feeds and reads, checked at load
        (a mismatch surfaced as an onnxruntime error at the first decision, or not at all)."""
        from agents.placement.features import FEATURE_VERSION, N_GLOBAL, N_PAIR

        shapes = {i.name: i.shape for i in self.session.get_inputs()}
        if set(shapes) != {"pairs", "context"}:
            raise ValueError(f"{self.path}: inputs {sorted(shapes)}, expected ['context', 'pairs']")
        outputs = {o.name for o in self.session.get_outputs()}
        missing = sorted({"logits", "value"} - outputs)
        if missing:
            raise ValueError(
                f"{self.path}: outputs {sorted(outputs)} lack {missing} (not a higfrl model)"
            )
        dims = []
        for name, rows, want, const in (
            ("pairs", "N", N_PAIR, "N_PAIR"),
            ("context", "1", N_GLOBAL, "N_GLOBAL"),
        ):
            shape = shapes[name]
            got = shape[1] if len(shape) == 2 else None
            if not isinstance(got, int) or got != want:
                raise ValueError(
                    f"{self.path}: input {name} has shape {shape}, expected [{rows}, {want}] "
                    f"(features.{const})"
                )
            dims.append(got)
        version = self.metadata.get("feature_version")
        if version != str(FEATURE_VERSION):
            raise ValueError(
                f"{self.path}: feature_version {version!r}, expected {str(FEATURE_VERSION)!r} "
                "(trained on another feature layout; retrain with hidvfs coordinator train)"
            )
        return dims[0], dims[1]

    def _check_reference(self) -> float:
        """The outputs on the reference inputs training recorded, within
        :data:`REFERENCE_TOLERANCE` of the training-time network's (else ValueError): a
        nudged weight, a swapped layer or a file another run's metadata was pasted into runs
        without any other error, and places worse. Returns the largest difference."""
        raw = self.metadata.get(REFERENCE_KEY)
        if raw is None:
            raise ValueError(
                f"{self.path}: no training-time reference outputs in its metadata (exported "
                "before they were recorded, or stripped); retrain with hidvfs coordinator train"
            )
        try:
            ref = json.loads(raw)
            pairs = np.asarray(ref["pairs"], np.float32).reshape(-1, self.n_pair)
            ctx = np.asarray(ref["context"], np.float32).reshape(-1, self.n_global)
            want_l = np.asarray(ref["logits"], np.float64).reshape(len(pairs))
            want_v = np.asarray(ref["value"], np.float64).reshape(len(ctx))
            if not (len(pairs) and len(ctx)):
                raise ValueError("no rows")
            if not all(np.all(np.isfinite(a)) for a in (pairs, ctx, want_l, want_v)):
                raise ValueError("values that are not finite")
        except (ValueError, TypeError, KeyError, AttributeError) as err:
            raise ValueError(
                f"{self.path}: its {REFERENCE_KEY!r} metadata is not reference inputs and "
                f"outputs of this network's shape ({type(err).__name__}: {err})"
            ) from None
        got = np.concatenate([self.logits(pairs), [self.value(c) for c in ctx]])
        want = np.concatenate([want_l, want_v])
        err = np.abs(got.astype(np.float64) - want)
        tol = REFERENCE_TOLERANCE * np.maximum(1.0, np.abs(want))  # each output its own
        if not np.all(err <= tol):
            i = int(np.argmax(err / tol))
            raise ValueError(
                f"{self.path}: outputs differ from the training-time network's on its "
                f"reference inputs by {err[i]:.3g} (> {tol[i]:.3g}): the file was changed "
                "after training; retrain with hidvfs coordinator train"
            )
        return float(np.max(err))

    def logits(self, pairs: np.ndarray) -> np.ndarray:
        out = self.session.run(
            ["logits"], {"pairs": np.ascontiguousarray(pairs, np.float32), "context": self._ctx0}
        )
        return out[0][:, 0]

    def value(self, context: np.ndarray) -> float:
        x = np.zeros((1, self.n_pair), np.float32)
        out = self.session.run(
            ["value"], {"pairs": x, "context": np.asarray(context, np.float32).reshape(1, -1)}
        )
        return float(out[0][0, 0])


class NumpyPolicyModel:
    """Same interface as :class:`OnnxPolicyModel` on raw inputs, for training and checks."""

    def __init__(
        self,
        actor: Mlp,
        critic: Mlp,
        mean: np.ndarray,
        std: np.ndarray,
        g_mean: np.ndarray,
        g_std: np.ndarray,
    ):
        self.actor, self.critic = actor, critic
        self.mean, self.std, self.g_mean, self.g_std = mean, std, g_mean, g_std
        self.metadata: dict[str, str] = {}
        self.n_pair = actor.layers[0][0].shape[0]
        self.n_global = critic.layers[0][0].shape[0]

    def logits(self, pairs: np.ndarray) -> np.ndarray:
        return self.actor.forward((pairs - self.mean) / self.std)[:, 0]

    def value(self, context: np.ndarray) -> float:
        return float(
            self.critic.forward(((np.asarray(context) - self.g_mean) / self.g_std)[None, :])[0, 0]
        )

    def reference(self, seed: int = 0) -> dict[str, list]:
        """Inputs around the training data (its mean plus its spread times normal noise, so
        every first-layer unit sees both signs) and this network's outputs on them, computed
        here in float64 from the unfolded weights: what the exported file must reproduce."""
        rng = np.random.default_rng(seed)
        pairs = (self.mean + self.std * rng.standard_normal((REFERENCE_ROWS, self.n_pair))).astype(
            np.float32
        )
        ctx = (self.g_mean + self.g_std * rng.standard_normal((2, self.n_global))).astype(
            np.float32
        )
        return {
            "pairs": pairs.tolist(),
            "context": ctx.tolist(),
            "logits": self.logits(pairs.astype(np.float64)).tolist(),
            "value": [self.value(c.astype(np.float64)) for c in ctx],
        }

    def export(self, path: str | os.PathLike[str], metadata: dict[str, str]) -> None:
        data = build_onnx(
            self.actor.folded(self.mean, self.std),
            self.critic.folded(self.g_mean, self.g_std),
            metadata | {REFERENCE_KEY: json.dumps(self.reference())},
        )
        from platforms.atomicfile import write_bytes_atomic

        # an interrupted export leaves the old file and no temporary one behind
        write_bytes_atomic(path, data, mode=0o644, dir_mode=0o755)
