"""Rival cpufreq daemons are found by the program they run (daemons.md 8): the unit's
Conflicts= stops them only when systemd starts hidvfs."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from daemon.service import warn_rivals
from platforms.liveprocs import program_name, rival_daemons


@pytest.mark.parametrize(
    "name,cmdline,want",
    [
        ("tuned", ["/usr/bin/python3", "-Es", "/usr/sbin/tuned", "-l", "-P"], "tuned"),
        (
            "auto-cpufreq",
            ["/usr/bin/python3.10", "/usr/local/bin/auto-cpufreq", "--daemon"],
            "auto-cpufreq",
        ),
        ("power-profiles-", ["/usr/libexec/power-profiles-daemon"], "power-profiles-daemon"),
        ("kworker/0:1", [], "kworker/0:1"),  # a kernel thread: no command line
        ("bash", ["bash"], "bash"),
        ("python3", ["python3", "-m", "http.server"], "http.server"),
    ],
)
def test_the_program_a_process_runs(name, cmdline, want):
    assert program_name(name, cmdline) == want


def test_a_running_rival_is_found_and_named_in_a_warning(tmp_path, caplog):
    script = tmp_path / "tuned"  # a process that runs a program called tuned, as the daemon's
    script.write_text("import time\ntime.sleep(30)\n")
    proc = subprocess.Popen([sys.executable, str(script)])
    try:
        found = [f for f in rival_daemons() if f[0] == proc.pid]
        assert found == [(proc.pid, "tuned")]
        log = logging.getLogger("test.rivals")
        with caplog.at_level(logging.WARNING, logger="test.rivals"):
            assert warn_rivals(log, find=lambda: found) == found
        assert "event=rival_daemon" in caplog.text and f"pid={proc.pid}" in caplog.text
        assert "systemctl stop tuned" in caplog.text
    finally:
        proc.kill()
        proc.wait()
    assert all(pid != proc.pid for pid, _ in rival_daemons())


def test_a_failed_look_does_not_stop_the_start():
    def broken():
        raise PermissionError("no /proc")

    assert warn_rivals(logging.getLogger("test.rivals"), find=broken) == []
