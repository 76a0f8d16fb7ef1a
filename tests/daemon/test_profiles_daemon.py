"""The board daemon gives a registered job the reference profile stored under its name, so the
gate and the shield can plan its deadline; a job without one is still accepted."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

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


def test_the_daemon_reads_a_zero_byte_store_as_empty_and_sees_a_profile_saved_later(tmp_path):
    """A zero-byte store (`touch`) failed the daemon's start like a corrupt one."""
    from daemon.profiles import ProfileLookup

    path = tmp_path / "profiles.json"
    path.touch()
    errors = []
    lookup = ProfileLookup(path, "tx2", on_error=errors.append)
    assert len(lookup) == 0 and lookup("sleeper") is None
    deadlines.update(path, "tx2", JobProfile("sleeper", 2.0, 0.5, 0.1, 1.0, 2035200, 4))
    assert lookup("sleeper").version == 1 and not errors
    path.write_bytes(b"")  # emptied while it runs: an empty store, not a bad one
    assert lookup("sleeper") is None and not errors


@pytest.mark.parametrize("deadline_s", [0.3, 30.0])
def test_the_gate_plans_a_board_jobs_deadline_from_its_profile(tmp_path, deadline_s):
    """On a board backend (fake tree, a real process, no progress reported) the federated gate
    now sees the job's profile: a tight deadline gets a whole cluster at its top frequency, a
    loose one leaves the policy's slow point and one core."""
    import time

    from agents.governors import make_governor
    from agents.stages import GateStage
    from daemon.jobs import JobEntry
    from daemon.loop import ControlLoop
    from platforms.clock import MonotonicClock
    from platforms.liveprocs import LiveProcessControl
    from platforms.platform import Platform
    from platforms.sysfs import DirSysfs

    spec = load_board("tx2")
    write_fake_tree(spec, tmp_path)
    clock = MonotonicClock()
    loop = ControlLoop(
        Platform(spec, DirSysfs(tmp_path), LiveProcessControl(), clock, kind="fake"),
        make_governor("powersave"),
        period_s=0.05,
        stages=[GateStage()],
    )
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        prof = JobProfile("j", 1.2, 0.1, 0.05, 0.4, 2035200, 4)
        loop.jobs.register(JobEntry(job.pid, "j", clock.now(), deadline_s, "lo", prof))
        res = loop.tick()
        time.sleep(0.05)
    finally:
        job.kill()
        job.wait()
    a57 = spec.cluster("a57")
    cores = res.decision.jobs[job.pid].cpus
    if deadline_s < 1:
        # the largest cluster at its top first; the job short of cores then also gets the
        # cores no other job holds (here every other core of the board)
        assert res.decision.freq_khz["a57"] == a57.fmax_khz and set(a57.cpus) <= set(cores)
        assert set(cores) == {c for k in spec.clusters for c in k.cpus}
        assert any("cannot meet its deadline" in e for e in res.decision.events)
    else:
        assert res.decision.freq_khz["a57"] == a57.freqs_khz[0] and len(cores) == 1
