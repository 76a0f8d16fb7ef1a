"""Run exported agents with onnxruntime: one thread, no spinning, checked provenance.

onnxruntime by default sizes its pool to the physical cores and lets idle workers spin, which
would pollute the very utilisation, power and temperature readings the daemon acts on
(reference/models.md 9.3). Sessions here use one intra-op and one inter-op thread, spinning
off, and one warm-up run. A file whose metadata names another board or another observation
schema than this daemon's is refused with :class:`ModelMismatch`, naming file, key and values;
a file onnxruntime cannot load (truncated, corrupt) with :class:`ModelUnreadable`, naming it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from agents.features import SCHEMA_VERSION, schema


class ModelMismatch(ValueError):
    """An ONNX file that must not be used by this daemon (board, schema or role differ)."""

    def __init__(self, path: str | os.PathLike[str], key: str, expected: object, got: object):
        self.path, self.key, self.expected, self.got = str(path), key, expected, got
        super().__init__(
            f"{path}: metadata {key!r} is {got!r}, this daemon needs {expected!r}; "
            "refusing to load (retrain with `hidvfs agents train` for this board/schema)"
        )


class ModelUnreadable(ValueError):
    """An ONNX file onnxruntime cannot load or run (truncated, corrupt, not a model)."""

    def __init__(self, path: str | os.PathLike[str], err: BaseException):
        self.path = str(path)
        detail = " ".join(str(err).split()) or type(err).__name__
        super().__init__(
            f"{path}: not a usable ONNX model ({detail}); restore the file or retrain with "
            "`hidvfs agents train`"
        )


def onnxruntime():
    """The onnxruntime module, imported with its telemetry off unless the environment says
    otherwise. onnxruntime 1.2x persists a device id under ``~/.cache/Microsoft`` at the first
    session, and where the home cannot be written (a systemd unit's ``ProtectHome``, a user
    without one) prints a warning on every start; only ``ORT_DISABLE_TELEMETRY`` read at
    import time stops it (``disable_telemetry_events()`` comes too late)."""
    os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
    import onnxruntime as ort

    return ort


def _session(path: str | os.PathLike[str]):
    """An onnxruntime session of ``path``; its own exception types become one clear error."""
    ort = onnxruntime()

    try:
        return ort.InferenceSession(
            str(path), session_options(), providers=["CPUExecutionProvider"]
        )
    except OSError:
        raise
    except Exception as err:  # noqa: BLE001 - onnxruntime's errors derive from Exception only
        raise ModelUnreadable(path, err) from None


def session_options():
    ort = onnxruntime()

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.add_session_config_entry("session.inter_op.allow_spinning", "0")
    so.log_severity_level = 3
    return so


def read_metadata(path: str | os.PathLike[str]) -> dict[str, str]:
    """The metadata_props of an ONNX file (via onnxruntime, no onnx package needed)."""
    return dict(_session(path).get_modelmeta().custom_metadata_map)


def _direct_run(sess):
    """The session's native ``run``, without the Python wrapper's per-call checks.

    ``InferenceSession.run`` re-validates on every call what is fixed here at load time (the
    one input is always fed, as a numpy array, on the CPU provider, no graph capture): about
    a quarter of a small network's call. Falls back to the public ``run`` when the binding
    is not where onnxruntime 1.x keeps it.
    """
    native = getattr(sess, "_sess", None)
    run = getattr(native, "run", None)
    return run if callable(run) else sess.run


class OnnxModel:
    """One exported network: ``model(x)`` -> float32 outputs for a [N, in] float32 batch."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        board: str | None = None,
        role: str | None = None,
        schema_version: int = SCHEMA_VERSION,
    ):
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"model file {self.path} does not exist")
        self.sess = _session(self.path)
        self.meta = dict(self.sess.get_modelmeta().custom_metadata_map)
        check_metadata(self.path, self.meta, board, role, schema_version)
        try:
            inp = self.sess.get_inputs()[0]
            self.input_name = inp.name
            self.n_in = int(inp.shape[1])
            self.output_names = [o.name for o in self.sess.get_outputs()]
            self._out = [self.output_names[0]]
            self._run = _direct_run(self.sess)
            self(np.zeros((1, self.n_in), dtype=np.float32))  # warm-up
        except Exception as err:  # noqa: BLE001 - a loadable file that is not our [N, in] net
            raise ModelUnreadable(self.path, err) from None

    def __call__(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float32)
        if x.ndim == 1:
            x = x[None, :]
        return self._run(self._out, {self.input_name: x}, None)[0]

    def json_meta(self, key: str, default=None):
        v = self.meta.get(key)
        return default if v is None else json.loads(v)


def check_metadata(
    path: str | os.PathLike[str],
    meta: dict[str, str],
    board: str | None,
    role: str | None,
    schema_version: int = SCHEMA_VERSION,
) -> None:
    """Raise :class:`ModelMismatch` unless board, role and schema match this daemon's."""
    got_v = meta.get("schema_version")
    if got_v != str(schema_version):
        raise ModelMismatch(path, "schema_version", str(schema_version), got_v)
    if got_v == str(SCHEMA_VERSION) and "schema" in meta:
        try:
            got_schema = json.loads(meta["schema"])
        except json.JSONDecodeError:
            got_schema = meta["schema"]
        if got_schema != schema():
            raise ModelMismatch(path, "schema", schema(), got_schema)
    if board is not None and meta.get("board") != board:
        raise ModelMismatch(path, "board", board, meta.get("board"))
    if role is not None and meta.get("role") != role:
        raise ModelMismatch(path, "role", role, meta.get("role"))


__all__ = [
    "ModelMismatch",
    "ModelUnreadable",
    "OnnxModel",
    "session_options",
    "read_metadata",
    "check_metadata",
]
