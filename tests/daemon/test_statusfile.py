"""The status file: readable by the dashboards it is for, and its mode kept."""

import json
import os
import stat

from daemon.statusfile import write_status


def test_a_new_status_file_is_readable_and_an_existing_one_keeps_its_mode(tmp_path):
    path = tmp_path / "status.json"
    write_status(str(path), {"ok": True})
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644  # not mkstemp's 0600
    assert json.loads(path.read_text()) == {"ok": True}
    os.chmod(path, 0o640)  # an admin's choice
    write_status(str(path), {"ok": False})
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o640
    assert json.loads(path.read_text()) == {"ok": False}
    assert [p.name for p in tmp_path.iterdir()] == ["status.json"]  # no temp file left
