"""Load the shipped learned policies (hidvfs, geardvfs, ztt) from ``agents/models/<board>/``.

Layout of a board's folder (written by ``hidvfs agents train``, checked by ``agents check``):

* ``manifest.json``: schema, action space, the shield's alpha, q, coverage; ``seed`` and
  ``command`` of the last training run into the folder (which may have retrained only some
  policies: its ``--policy``), and per policy ``policies.NAME.provenance`` (seed, command,
  git commit) of the run that made that policy's files, which ``agents check`` compares with
  each file's own metadata;
* ``profiler.onnx``, ``thermal.onnx``, ``priority.onnx``: the hidvfs agents;
* ``response_time.onnx``: the shield's predictor (log remaining response time);
* ``noshaping/{profiler,thermal,priority}.onnx``: the same agents trained without shaping
  (the ablation);
* ``geardvfs.onnx``, ``ztt.onnx``: the fair baseline ports (Q networks);
* ``reference.npz``: reference inputs/outputs of every network from training time, and the
  conformal calibration scores.

Every ONNX file is checked against this daemon's board and observation schema on load
(:class:`agents.runtime.ModelMismatch`), and its outputs on reference.npz's inputs against the
training-time ones (:class:`ReferenceMismatch`: one small batch per file, as ``agents check``
does), so a folder an interrupted training left half replaced is refused, never run.
"""

from __future__ import annotations

import json
import math
import os
import zipfile
from pathlib import Path

import numpy as np

from agents.features import SCHEMA_VERSION
from agents.policy import Policy
from agents.runtime import ModelMismatch, OnnxModel
from platforms.spec import BoardSpec

MODELS_DIR = Path(__file__).with_name("models")
MANIFEST = "manifest.json"
#: the manifest's ``format`` (written by ``agents train``)
FORMAT = "hidvfs-models"
AGENT_FILES = ("profiler", "thermal", "priority")


#: scores the adaptive shield keeps (the shipped calibration and the newest observed): the
#: pool would grow with every job for as long as the daemon runs
ADAPTIVE_WINDOW = 5000


def boards_with_agents() -> list[str]:
    """The boards hidvfs ships trained agents for: a folder under ``agents/models`` with a
    manifest (the learned policies run there and nowhere else)."""
    if not MODELS_DIR.is_dir():
        return []
    return sorted(d.name for d in MODELS_DIR.iterdir() if (d / MANIFEST).is_file())


def model_dir(board: str, root: str | os.PathLike[str] | None = None) -> Path:
    """``board``'s models: agents/models/BOARD; under a given ``root`` (``--models``) its
    BOARD subfolder when that holds a manifest, else ``root`` itself, which then serves only
    the board its manifest names (one folder must not stand in for every board)."""
    if root is None:
        return MODELS_DIR / board
    root = Path(root)
    if (root / board / MANIFEST).is_file():
        return root / board
    try:
        other = json.loads((root / MANIFEST).read_text()).get("board")
    except (OSError, ValueError, AttributeError):
        return root  # no or unreadable manifest: the loader says so, naming the file
    if other != board:
        raise FolderOfAnotherBoard(root, board, other)
    return root


class FolderOfAnotherBoard(ModelMismatch):
    """A ``--models`` folder of one board given for another (its own message: the fix is a
    different folder, not retraining)."""

    def __init__(self, root: Path, board: str, other: object):
        self.path, self.key, self.expected, self.got = str(root / MANIFEST), "board", board, other
        ValueError.__init__(
            self,
            f"{root} holds the models of board {other!r} only, not {board!r} (and has no "
            f"{board}/{MANIFEST}); give a folder of {board}'s models or one with a subfolder "
            "per board",
        )


def folder_boards(root: str | os.PathLike[str]) -> list[str]:
    """The boards a ``--models`` root holds models for, as :func:`model_dir` serves them: the
    names of its subfolders with a manifest, and the board its own manifest names (none when
    it has neither, or that manifest is unreadable: the loader then says why)."""
    root = Path(root)
    found = []
    try:
        found = sorted(d.name for d in root.iterdir() if (d / MANIFEST).is_file())
    except OSError:
        pass
    try:
        own = json.loads((root / MANIFEST).read_text()).get("board")
    except (OSError, ValueError, AttributeError):
        own = None
    if isinstance(own, str) and own not in found:
        found.append(own)
    return found


def restore_advice(folder: str | os.PathLike[str]) -> str:
    """How to get ``folder`` whole again: the shipped models come from the repository (or the
    installed package); any other folder from the training run that wrote it."""
    folder = Path(folder).resolve()
    shipped = MODELS_DIR.resolve()
    if folder == shipped or shipped in folder.parents:
        if any((p / ".git").exists() for p in shipped.parents):
            return "restore the folder (git checkout agents/models) or retrain"
        return "reinstall hidvfs to restore the shipped folder, or retrain"
    return (
        "restore the folder from where it came, or re-run the `hidvfs agents train` that "
        f"wrote it (its {MANIFEST}'s command)"
    )


#: ReferenceMismatch's cause, by default
MIXED_RUNS = (
    "the folder mixes files of different training runs (an interrupted or failed "
    "`hidvfs agents train`?)"
)
#: a file that does not hash as its manifest recorded
CHANGED_FILE = (
    "the file changed after training wrote it (damaged or edited), or comes from another "
    "training run"
)


class ReferenceMismatch(ModelMismatch):
    """A network whose outputs are not the ones its folder's reference.npz recorded when it
    was trained (or that reference.npz has none for), or a file that does not hash as its
    manifest recorded: the folder mixes files of different training runs, e.g. an
    interrupted or failed ``agents train`` that replaced some files and not the rest. Its own
    message: the fix is the whole folder, not this file; ``reason`` is it without the path
    (``agents check`` names the file in its row)."""

    def __init__(self, path: Path, ref_path: Path, detail: str, cause: str = MIXED_RUNS):
        self.path, self.key, self.expected, self.got = (
            str(path),
            "reference outputs",
            ref_path,
            detail,
        )
        # every caller's ref_path is a file at the top of the folder (reference.npz, manifest)
        self.reason = f"{detail}: {cause}; {restore_advice(Path(ref_path).parent)}"
        ValueError.__init__(self, f"{path}: {self.reason}")


class ManifestInvalid(ModelMismatch):
    """A manifest whose shape or a key the loader reads is wrong (its own message: the fix is
    restoring the file, and the key may be nested, e.g. ``shield.alpha``)."""

    def __init__(self, path: Path, key: str, expected: str, got: object):
        self.path, self.key, self.expected, self.got = str(path), key, expected, got
        ValueError.__init__(
            self,
            f"{path}: key {key!r} must be {expected}, got {got!r}; restore the file or retrain "
            "with `hidvfs agents train`",
        )


def _positive(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def _check_manifest(path: Path, man: object) -> None:
    """Refuse, naming the key, what the loaders would crash on later (a TypeError in the
    daemon's start, an AttributeError in ``agents check``) or silently misread."""
    if not isinstance(man, dict):
        raise ManifestInvalid(path, "<top>", "a JSON object", type(man).__name__)
    if man.get("format", FORMAT) != FORMAT:
        raise ManifestInvalid(path, "format", repr(FORMAT), man["format"])
    if "period_s" in man and not _positive(man["period_s"]):
        raise ManifestInvalid(path, "period_s", "a finite number of seconds > 0", man["period_s"])
    if "shield" in man:
        sh = man["shield"]
        if not isinstance(sh, dict):
            raise ManifestInvalid(path, "shield", "an object with alpha", sh)
        alpha = sh.get("alpha")
        if not _positive(alpha) or alpha >= 1:
            raise ManifestInvalid(path, "shield.alpha", "a number in (0, 1)", alpha)
    pols = man.get("policies", {})
    if not isinstance(pols, dict):
        raise ManifestInvalid(path, "policies", "an object of policy entries", pols)
    for name, entry in pols.items():
        if not isinstance(entry, dict):
            raise ManifestInvalid(path, f"policies.{name}", "an object", entry)
        prov = entry.get("provenance", {})
        if prov is not None and not isinstance(prov, dict):
            raise ManifestInvalid(path, f"policies.{name}.provenance", "an object", prov)


def load_manifest(folder: Path, board: str | None = None, hashes: bool = True) -> dict:
    """The folder's manifest; refused when it names another schema or (given) another board,
    or when a key the loaders read is malformed (:class:`ManifestInvalid`), or (``hashes``)
    a file does not hash as it records (:func:`check_hashes`)."""
    path = folder / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(
            f"no trained models in {folder} ({MANIFEST} missing); run `hidvfs agents train`"
        )
    try:
        man = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(
            f"{path}: invalid JSON ({err.msg.removesuffix(' at')} at line {err.lineno})"
        ) from None
    _check_manifest(path, man)
    v = man.get("schema_version")
    if v != SCHEMA_VERSION:
        raise ModelMismatch(path, "schema_version", SCHEMA_VERSION, v)
    if board is not None and man.get("board") != board:
        raise ModelMismatch(path, "board", board, man.get("board"))
    if hashes:
        check_hashes(folder, man)
    return man


def file_sha256(path: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def hash_mismatches(folder: Path, man: dict) -> dict[str, ReferenceMismatch]:
    """The files (path relative to ``folder``) that do not hash as the manifest's ``sha256``
    map records, each with its refusal; ManifestInvalid when the map is malformed."""
    hashes = man.get("sha256")
    if hashes is None:
        return {}
    if not isinstance(hashes, dict):
        raise ManifestInvalid(folder / MANIFEST, "sha256", "a map of file to hex digest", hashes)
    bad = {}
    for rel, want in sorted(hashes.items()):
        path = folder / rel
        if not path.is_file():
            continue  # the loader that reads it says it is missing
        got = file_sha256(path)
        if got != want:
            bad[rel] = ReferenceMismatch(
                path,
                folder / MANIFEST,
                f"sha256 {got[:12]}... is not the {str(want)[:12]}... training recorded",
                CHANGED_FILE,
            )
    return bad


def check_hashes(folder: Path, man: dict) -> None:
    """Each file the manifest's ``sha256`` map names (``agents train`` records them since
    stop 36) must hash as recorded: the reference outputs only cover the inputs they hold,
    and a weight those never exercise (a tree leaf they do not reach) changed unnoticed.
    Folders trained before have no map and are checked by their outputs alone (the shipped
    ones had theirs recorded afterwards: ``sha256_recorded``). The refusal names the file."""
    for err in hash_mismatches(folder, man).values():
        raise err


def check_action_space(folder: Path, man: dict, spec: BoardSpec) -> None:
    """Refuse a manifest whose recorded action space (cluster names, selectable table
    levels) is not the one this board spec gives: the networks' outputs are indices into it,
    so a changed frequency table or cluster order would be read as other frequencies."""
    from agents.hidvfs import ActionSpace

    got = man.get("action_space")
    if got is None:  # manifests written before the action space was recorded
        return
    want = ActionSpace.of(spec).to_json()
    if not isinstance(got, dict) or {k: got.get(k) for k in want} != want:
        raise ModelMismatch(folder / MANIFEST, "action_space", want, got)


def load_reference(
    folder: Path, board: str | None = None, rt: OnnxModel | None = None
) -> dict[str, np.ndarray]:
    """reference.npz, checked to come from this board's training run.

    Files written since the board check record their ``board``; the shipped ones do not, so
    with ``rt`` (this folder's response_time.onnx, whose metadata names its board) the file's
    response-time reference pair must match that network, as ``agents check`` requires:
    another run's reference.npz (and its shield calibration) fails that parity.
    """
    path = folder / "reference.npz"
    if not path.is_file():
        raise FileNotFoundError(f"{path} missing; run `hidvfs agents train`")
    try:
        with np.load(path) as z:
            ref = {k: z[k] for k in z.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:  # a cut-short file
        raise ValueError(f"{path}: unreadable ({' '.join(str(err).split())})") from None
    got = str(ref["board"]) if "board" in ref else None
    if board is not None and got is not None and got != board:
        raise ModelMismatch(path, "board", board, got)
    if rt is not None:
        try:
            x, y = ref["response_time_x"], ref["response_time_y"]
        except KeyError as err:
            raise ValueError(f"{path}: no reference outputs {err}") from None
        diff = _max_diff(rt, x, y)
        if not diff <= _tolerance(y):
            raise ValueError(
                f"{path}: its response_time reference outputs differ from {rt.path} by "
                f"{diff:.3g}: the file is not from this folder's training run (another board's "
                "or an older run's shield calibration); restore it or retrain"
            )
    return ref


def _max_diff(m: OnnxModel, x: np.ndarray, y: np.ndarray) -> float:
    got = m(x).reshape(y.shape)
    return float(np.max(np.abs(got.astype(np.float64) - y.astype(np.float64))))


def _tolerance(y: np.ndarray) -> float:
    """1e-5 absolute, relative above |y| = 1 (Q-values of ~50 carry float32 ulps of 4e-6)."""
    return TOLERANCE * max(1.0, float(np.max(np.abs(y))))


def verified(m: OnnxModel, ref: dict[str, np.ndarray], key: str, ref_path: Path) -> OnnxModel:
    """``m``, once its outputs on reference.npz's ``key`` inputs (one small batch) are the
    training-time ones within :func:`_tolerance`, else :class:`ReferenceMismatch`: what the
    daemon's loaders run at start, so a folder an interrupted training left half replaced is
    refused instead of running networks its shield and manifest were not made with."""
    try:
        x, y = ref[f"{key}_x"], ref[f"{key}_y"]
    except KeyError:
        raise ReferenceMismatch(
            m.path, ref_path, f"{ref_path.name} holds no training-time outputs for it ({key}_y)"
        ) from None
    try:
        diff = _max_diff(m, x, y)
    except Exception as err:  # noqa: BLE001 - a reference batch of another network's shape
        raise ReferenceMismatch(
            m.path, ref_path, f"{ref_path.name}'s {key} inputs do not fit it ({type(err).__name__})"
        ) from None
    tol = _tolerance(y)
    if not diff <= tol:
        raise ReferenceMismatch(
            m.path,
            ref_path,
            f"outputs differ from the training-time ones in {ref_path.name} by {diff:.3g} "
            f"(> {tol:.3g})",
        )
    return m


def _agents(
    folder: Path, board: str, variant: str | None, ref: dict[str, np.ndarray]
) -> tuple[OnnxModel, ...]:
    sub = folder / variant if variant else folder
    prefix = f"{variant}_" if variant else ""
    ref_path = folder / "reference.npz"
    return tuple(
        verified(OnnxModel(sub / f"{n}.onnx", board, n), ref, prefix + n, ref_path)
        for n in AGENT_FILES
    )


def make_hidvfs(
    spec: BoardSpec,
    *,
    models: str | os.PathLike[str] | None = None,
    gate: bool = True,
    shield: bool = True,
    variant: str | None = None,
    period_s: float | None = None,
    adaptive_gamma: float | None = None,
):
    """The hidvfs policy from ONNX; ``variant="noshaping"`` loads the no-shaping ablation.
    ``adaptive_gamma``: the shield's calibration follows the realised response times online
    (Gibbs-Candes adaptive conformal, step gamma), starting from the shipped calibration."""
    from agents.hidvfs import HidvfsPolicy
    from agents.shield import AdaptiveConformal, Shield, SplitConformal
    from agents.stages import ShieldStage

    folder = model_dir(spec.name, models)
    man = load_manifest(folder, spec.name)
    check_action_space(folder, man, spec)
    rt = OnnxModel(folder / "response_time.onnx", spec.name, "response_time") if shield else None
    # every network is compared with its training-time outputs (one batch each)
    ref = load_reference(folder, spec.name, rt)
    prof, therm, prio = _agents(folder, spec.name, variant, ref)
    stage = None
    if rt is not None:
        alpha, scores = shield_calibration(folder, man, ref)
        cal = (
            AdaptiveConformal(alpha, gamma=adaptive_gamma, window=ADAPTIVE_WINDOW)
            if adaptive_gamma
            else SplitConformal(alpha)
        ).fit(scores)
        stage = ShieldStage(lambda x: rt(x).reshape(-1), Shield(lambda x: rt(x).reshape(-1), cal))
    pol = HidvfsPolicy(
        spec,
        prof,
        therm,
        prio,
        gate=gate,
        shield=stage,
        period_s=period_s or float(man.get("period_s", 0.05)),
    )
    suffix = "".join(
        s
        for s, on in (("-noshield", not shield), ("-nogate", not gate), (f"-{variant}", variant))
        if on
    )
    pol.name = "hidvfs" + suffix
    return pol


def make_learned_policy(name: str, spec: BoardSpec, **options) -> Policy:
    """``make_policy`` hook for hidvfs / geardvfs / ztt (options: models, gate, shield, variant)."""
    name = name.strip().lower()
    if name == "hidvfs":
        return make_hidvfs(spec, **options)
    folder = model_dir(spec.name, options.get("models"))
    man = load_manifest(folder, spec.name)
    check_action_space(folder, man, spec)
    period = options.get("period_s") or float(man.get("period_s", 0.05))
    if name not in ("geardvfs", "ztt"):
        raise ValueError(f"unknown learned policy {name!r}; known: hidvfs, geardvfs, ztt")
    q = OnnxModel(folder / f"{name}.onnx", spec.name, name)
    verified(q, load_reference(folder, spec.name), name, folder / "reference.npz")
    if name == "geardvfs":
        from agents.geardvfs import GearDvfsPolicy

        return GearDvfsPolicy(spec, q, period_s=period)
    from agents.ztt import ZttPolicy

    return ZttPolicy(spec, q, period_s=period)


#: (file, role, reference key prefix, trained policy) of everything a board folder holds
CHECKED = (
    ("profiler.onnx", "profiler", "profiler", "hidvfs"),
    ("thermal.onnx", "thermal", "thermal", "hidvfs"),
    ("priority.onnx", "priority", "priority", "hidvfs"),
    ("response_time.onnx", "response_time", "response_time", "hidvfs"),
    ("noshaping/profiler.onnx", "profiler", "noshaping_profiler", "noshaping"),
    ("noshaping/thermal.onnx", "thermal", "noshaping_thermal", "noshaping"),
    ("noshaping/priority.onnx", "priority", "noshaping_priority", "noshaping"),
    ("geardvfs.onnx", "geardvfs", "geardvfs", "geardvfs"),
    ("ztt.onnx", "ztt", "ztt", "ztt"),
)
#: provenance keys a manifest records per policy and every ONNX file in its metadata
PROVENANCE = ("seed", "command", "git_commit")
TOLERANCE = 1e-5


def shield_calibration(folder: Path, man: dict, ref) -> tuple[float, np.ndarray]:
    """The shield's alpha and calibration scores, checked against what training recorded in
    the manifest: as many scores as ``shield.n_cal``, all finite, and their conformal q equal
    to ``shield.q``. reference.npz's outputs cover the networks, not these scores: negated
    ones (q -6.5 for 0.40) made the shield certify everything, and check, eval and the daemon
    all took them."""
    from agents.shield import SplitConformal

    path = folder / "reference.npz"
    if "shield" not in man:  # a folder trained without hidvfs
        raise ManifestInvalid(folder / MANIFEST, "shield", "the shield's calibration", None)
    if "cal_scores" not in ref:
        raise ValueError(f"{path}: no cal_scores (shield calibration)")
    shield = man["shield"]
    try:
        alpha, n_cal, q = float(shield["alpha"]), int(shield["n_cal"]), float(shield["q"])
    except (KeyError, TypeError, ValueError) as err:
        raise ManifestInvalid(
            folder / MANIFEST, "shield", "alpha, n_cal and q (numbers)", shield
        ) from err
    try:
        scores = np.asarray(ref["cal_scores"], dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{path}: cal_scores are not numbers ({err})") from None
    if scores.ndim != 1 or scores.shape[0] != n_cal or not np.all(np.isfinite(scores)):
        raise ReferenceMismatch(
            path,
            folder / MANIFEST,
            f"cal_scores hold {scores.shape} values (finite: {bool(np.all(np.isfinite(scores)))}), "
            f"the manifest's shield.n_cal {n_cal} finite ones",
        )
    got = SplitConformal(alpha).fit(scores).q_
    if not math.isclose(got, q, rel_tol=1e-9, abs_tol=1e-12):
        raise ReferenceMismatch(
            path, folder / MANIFEST, f"cal_scores give q {got:.6g}, the manifest's shield.q {q:.6g}"
        )
    return alpha, scores


def check_board(board: str, models: str | os.PathLike[str] | None = None) -> dict:
    """Load every file with the daemon's checks and compare with the training-time outputs;
    each file's provenance (its own metadata) must match its policy's run in the manifest."""
    report: dict = {"board": board, "folder": str(models or MODELS_DIR / board), "files": []}
    report["ok"] = True
    name = MANIFEST
    try:
        folder = model_dir(board, models)
        report["folder"] = str(folder)
        # a file that does not hash as recorded is failed on its own row, not the manifest's
        man = load_manifest(folder, board, hashes=False)
        changed = hash_mismatches(folder, man)
        from platforms.spec import load_board

        check_action_space(folder, man, load_board(board))
        name = "reference.npz"
        ref = load_reference(folder, board)
    except (OSError, ValueError) as err:
        report["ok"] = False
        report["files"].append({"file": name, "ok": False, "error": str(err)})
        return report
    listed = {fname for fname, *_ in CHECKED}
    for rel, err in changed.items():  # files no row below checks (reference.npz): their own
        if rel not in listed:
            report["ok"] = False
            report["files"].append({"file": rel, "ok": False, "error": err.reason})
    trained = set(man.get("policies") or {})
    for fname, role, key, policy in CHECKED:
        row: dict = {"file": fname, "ok": False, "policy": policy}
        if models is not None and policy not in trained and not (folder / fname).exists():
            # a folder of `agents train --policy P --out DIR` holds only what it trained; the
            # shipped folder must hold every policy
            row.update(ok=True, skipped=f"{policy} not trained in this folder")
            report["files"].append(row)
            continue
        try:
            m = OnnxModel(folder / fname, board, role)
            x, y = ref[f"{key}_x"], ref[f"{key}_y"]
            diff = _max_diff(m, x, y)
            row["max_abs_diff"] = diff
            row["tolerance"] = _tolerance(y)
            row["ok"] = diff <= row["tolerance"]
            for k in PROVENANCE:
                row[k] = m.meta.get(k)
            row["date"] = m.meta.get("date")
            if not row["ok"]:
                row["error"] = (
                    f"outputs differ from training time by {diff:.3g} > {row['tolerance']:.3g}"
                )
            else:
                # manifests written before per-policy provenance have none to compare
                run = (man.get("policies", {}).get(policy) or {}).get("provenance") or {}
                wrong = [k for k in PROVENANCE if k in run and str(run[k]) != str(row[k])]
                if wrong:
                    row["ok"] = False
                    row["error"] = "; ".join(
                        f"{k} {row[k]!r} in the file, {str(run[k])!r} in the manifest's {policy} entry"
                        for k in wrong
                    )
        except KeyError as err:
            row["error"] = f"no reference outputs {err} in reference.npz"
        except (OSError, ValueError) as err:
            row["error"] = str(err)
        except Exception as err:  # noqa: BLE001 - onnxruntime raises its own types
            row["error"] = f"{type(err).__name__}: {err}"
        if fname in changed:  # outputs alike, bytes not: a weight the reference never reaches
            reason = changed[fname].reason
            row["error"] = f"{row['error']}; {reason}" if row.get("error") else reason
        if "error" in row:  # an error after the comparison passed is still a failed row
            row["ok"] = False
        report["ok"] &= row["ok"]
        report["files"].append(row)
    try:
        if models is None or "hidvfs" in trained:  # the shield is calibrated with hidvfs
            shield_calibration(folder, man, ref)
    except (OSError, ValueError) as err:  # what eval and the daemon would refuse, said here
        report["ok"] = False
        report["files"].append(
            {"file": "reference.npz (shield calibration)", "ok": False, "error": str(err)}
        )
    return report


__all__ = [
    "check_board",
    "folder_boards",
    "restore_advice",
    "MODELS_DIR",
    "model_dir",
    "load_manifest",
    "check_action_space",
    "ManifestInvalid",
    "ReferenceMismatch",
    "load_reference",
    "verified",
    "make_hidvfs",
    "make_learned_policy",
]
