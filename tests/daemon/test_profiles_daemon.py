"""The board daemon gives a registered job the reference profile stored under its name, so the
gate and the shield can plan its deadline; a job without one is still accepted."""

from __future__ import annotations

import signal
import subprocess
import sys

from agents import deadlines
from platforms.faketree import write_fake_tree
from platforms.observation import JobProfile
from platforms.spec import load_board
from tests.daemon.test_daemon_process import start_daemon, wait_serving


def test_registered_jobs_get_their_profile_by_name(tmp_path):
    spec = load_board("tx2")
    tree, state = tmp_path / "tree", tmp_path / "state"
    write_fake_tree(spec, tree)
    state.mkdir()
    store = deadlines.ProfileStore()
    store.put("tx2", JobProfile("sleeper", 2.0, 0.5, 0.1, 1.0, 2035200, 4))
    store.put("orin-nx", JobProfile("other", 2.0, 0.5, 0.1, 1.0, 1984000, 4))
    deadlines.save(store, tmp_path / "profiles.json")
    cfg = tmp_path / "config.yaml"
    cfg.write_text(f"profiles: {tmp_path / 'profiles.json'}\n")
    proc, log = start_daemon(tree, state, "--config", str(cfg))
    jobs = []
    try:
        client = wait_serving(state / "hidvfs.sock")
        for name in ("sleeper", "other"):
            jobs.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]))
            client.register(jobs[-1].pid, deadline_s=5.0, criticality="lo", name=name)
        by_name = {j["name"]: j for j in client.status()["jobs"]}
        assert by_name["sleeper"]["profile_version"] == 1
        assert by_name["other"]["profile_version"] is None  # another board's profile
    finally:
        for j in jobs:
            j.kill()
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    text = log.read_text()
    assert proc.returncode == 0, text
    assert "profiles=1" in text and "profile=v1" in text and "profile=none" in text
