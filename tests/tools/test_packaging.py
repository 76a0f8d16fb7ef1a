"""The wheel carries every file the packages read at run time: a board is installed with a
plain (non-editable) ``pip install``, where a model, board spec or unit file left out of the
package data is missing only there."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("platforms", "agents", "daemon", "bots_bench", "tools")


def shipped_data_files() -> set[str]:
    """Every non-Python file under the packages (links followed, as the wheel does)."""
    out = set()
    for pkg in PACKAGES:
        for dirpath, dirnames, filenames in os.walk(ROOT / pkg, followlinks=True):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            for f in filenames:
                if not f.endswith((".py", ".pyc")):
                    out.add((Path(dirpath) / f).relative_to(ROOT).as_posix())
    return out


def clean_copy(dest: Path) -> Path:
    """The project as a fresh clone has it: an in-tree ``build/`` or ``*.egg-info`` left by
    an earlier build would put its stale copies into the wheel and hide a missing pattern."""
    keep = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build", "dist")
    for name in (*PACKAGES, "systemd"):
        shutil.copytree(ROOT / name, dest / name, symlinks=True, ignore=keep)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, dest / name)
    return dest


def test_the_wheel_holds_the_models_board_specs_and_unit_files(tmp_path):
    src = clean_copy(tmp_path / "src")
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(src),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, PIP_NO_INDEX="1"),
    )
    # (the dev extra installs the build-system requirements, so no index is needed)
    assert build.returncode == 0, build.stderr
    (wheel,) = tmp_path.glob("hidvfs-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    data = shipped_data_files()
    # what the daemon and the CLI load: the check must not pass on an empty list
    assert {"platforms/boards/tx2.yaml", "tools/systemd/hidvfs.service"} <= data
    assert sum(f.endswith(".onnx") for f in data) >= 3 * 7 + 1  # three boards + the placer
    assert sorted(data - names) == []
