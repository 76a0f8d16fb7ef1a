"""The atomic writer: the target holds the old text or the new, never part of either."""

from __future__ import annotations

import os
import stat

import pytest

from platforms import atomicfile
from platforms.atomicfile import write_text_atomic


def test_writes_creates_folder_and_sets_mode(tmp_path):
    target = tmp_path / "a" / "b" / "unit.service"
    assert write_text_atomic(target, "x = 1\n", mode=0o644) == os.fspath(target)
    assert target.read_text() == "x = 1\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    write_text_atomic(target, "x = 2\n", mode=0o600, durable_dir=True)
    assert target.read_text() == "x = 2\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert os.listdir(target.parent) == ["unit.service"]  # no temporary left behind


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path, monkeypatch):
    target = tmp_path / "status.json"
    target.write_text("old\n")

    def broken_replace(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomicfile.os, "replace", broken_replace)
    with pytest.raises(OSError, match="No space"):
        write_text_atomic(target, "new\n")
    assert target.read_text() == "old\n"
    assert os.listdir(tmp_path) == ["status.json"]


def test_fsync_dir_of_a_missing_folder_is_quiet(tmp_path):
    atomicfile.fsync_dir(tmp_path / "nope")  # best effort: no exception
