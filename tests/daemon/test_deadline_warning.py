"""The board daemon tells at registration a deadline that the job's reference profile says no
operating point of the board can meet: the job is registered all the same, the answer carries
the warning, `hidvfs run` prints it on stderr and the daemon logs it once."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
from pathlib import Path

from agents import deadlines
from daemon.profiles import DeadlineCheck
from platforms.faketree import write_fake_tree
from platforms.observation import JobProfile
from platforms.spec import load_board
from tests.daemon.test_daemon_process import start_daemon, wait_serving

#: tx2 at its top OPP: span 431 ms on denver (capacity 1.3), work 2 s on an a57
HEAVY = JobProfile("heavy", 2.0, 0.5, 0.1, 1.0, 2035200, 4)
WARNING = (
    "deadline 50 ms is below the job's span at the fastest point as the gate bounds it "
    "(431 ms on denver at 2035 MHz): the gate can plan no operating point for it"
)


def _register(sock: Path, pid: int, deadline_s: float, name: str) -> dict:
    """One register request over the daemon's socket, its answer as sent."""
    req = {"op": "register", "pid": pid, "deadline_s": deadline_s, "criticality": "hi"}
    req["name"] = name
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(10)
        s.connect(str(sock))
        s.sendall(json.dumps(req).encode() + b"\n")
        return json.loads(s.makefile().readline())


def test_the_daemon_warns_of_an_infeasible_hi_deadline_at_registration(tmp_path):
    spec = load_board("tx2")
    tree, state = tmp_path / "tree", tmp_path / "state"
    write_fake_tree(spec, tree)
    state.mkdir()
    store = deadlines.ProfileStore()
    store.put("tx2", HEAVY)
    deadlines.save(store, tmp_path / "profiles.json")
    cfg = tmp_path / "config.yaml"
    cfg.write_text(f"profiles: {tmp_path / 'profiles.json'}\n")
    proc, log = start_daemon(tree, state, "--config", str(cfg))
    sock = state / "hidvfs.sock"
    sleeper = None
    try:
        wait_serving(sock)
        run = subprocess.run(
            [
                *(sys.executable, "-m", "tools.cli", "run", "--socket", str(sock)),
                *("--deadline", "0.05", "--criticality", "hi", "--name", "heavy", "--json", "--"),
                *(sys.executable, "-c", "import time; time.sleep(0.3)"),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=Path(__file__).resolve().parents[2],
        )
        # run all the same, its exit status its own
        assert run.returncode == 0, run.stderr
        # the warning, then the --json result: both on stderr, stdout is the command's
        warning = f"hidvfs: warning: {WARNING}\n"
        assert run.stderr.startswith(warning) and run.stdout == ""
        assert json.loads(run.stderr[len(warning) :])["profile_version"] == 1
        # a feasible deadline: registered without a warning
        sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        answer = _register(sock, sleeper.pid, 5.0, "heavy")
        assert answer["ok"] is True and answer["job"]["pid"] == sleeper.pid
        assert "warning" not in answer
    finally:
        if sleeper is not None:
            sleeper.kill()
            sleeper.wait()
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    text = log.read_text()
    assert proc.returncode == 0, text
    lines = [ln for ln in text.splitlines() if "event=job_deadline_infeasible" in ln]
    assert len(lines) == 1, text
    assert "name=heavy" in lines[0] and "criticality=hi" in lines[0] and WARNING in lines[0]


def test_the_fastest_point_is_below_the_static_caps():
    """A cluster capped by `thermal.cap_khz` never gets past its cap: the check plans there."""
    check = DeadlineCheck(load_board("tx2"), {"denver": 1000000, "a57": 1500000})
    assert check(HEAVY, 0.45) == (
        "deadline 450 ms is below the job's span at the fastest point as the gate bounds it "
        "(716 ms on a57 at 1420 MHz): the gate can plan no operating point for it"
    )
    assert DeadlineCheck(load_board("tx2"))(HEAVY, 0.45) is None
