"""`hidvfs daemon` as a systemd Type=notify service (daemons.md sections 8 and 9.3): a start it
refuses says why in ``STATUS=`` and never claims readiness; a failure after READY says so too;
when stderr is the journal every line carries a ``<N>`` priority prefix (the error line
``<3>``, so that ``journalctl -p err`` shows it), JSON logs included."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from platforms.faketree import write_fake_tree
from platforms.spec import load_board
from tools.cli import cli

REPO = Path(__file__).resolve().parents[2]
REFUSED = "STATUS=start refused: "


@pytest.fixture
def notify_socket():
    """A datagram socket standing in for systemd's ``$NOTIFY_SOCKET`` (in a short folder:
    an AF_UNIX path has at most 107 bytes)."""
    folder = tempfile.mkdtemp(prefix="hv-notify-")
    path = os.path.join(folder, "notify.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(path)
    s.settimeout(0.3)
    yield path, s
    s.close()
    shutil.rmtree(folder, ignore_errors=True)


def datagrams(s: socket.socket) -> list[str]:
    """Every datagram sent so far."""
    out = []
    try:
        while True:
            out.append(s.recv(65536).decode())
    except TimeoutError:
        return out


@pytest.fixture
def tree(tmp_path):
    write_fake_tree(load_board("tx2"), tmp_path / "tree")
    return tmp_path / "tree"


def daemon_under_systemd(tmp_path, tree, notify_path, *extra):
    """The daemon as systemd starts it: ``$NOTIFY_SOCKET`` set, stderr the journal
    (``$JOURNAL_STREAM`` names the file stderr goes to). Its exit code and stderr lines."""
    err = tmp_path / "journal"
    err.write_text("")
    st = os.stat(err)
    with open(err, "a") as f:
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "tools.cli",
                "daemon",
                "--sysfs-root",
                str(tree),
                "--state-dir",
                str(tmp_path / "state"),
                "--socket",
                str(tmp_path / "s.sock"),
                "--policy",
                "maxfreq",
                "--period-ms",
                "50",
                "--duration",
                "0.3",
                *extra,
            ],
            stdout=subprocess.DEVNULL,
            stderr=f,
            timeout=120,
            cwd=REPO,
            env=dict(
                os.environ,
                NOTIFY_SOCKET=notify_path,
                JOURNAL_STREAM=f"{st.st_dev}:{st.st_ino}",
                PYTHONUNBUFFERED="1",
            ),
        )
    return r.returncode, err.read_text().splitlines()


@pytest.mark.parametrize("why", ["config typo", "busy state dir"])
def test_a_refused_start_says_why_in_status_and_at_error_priority(
    tmp_path, tree, notify_socket, why
):
    from daemon.statelock import StateLock

    path, rx = notify_socket
    cfg = tmp_path / "config.yaml"
    cfg.write_text("perod_ms: 100\n" if why == "config typo" else "")
    lock = StateLock(tmp_path / "state").acquire() if why == "busy state dir" else None
    try:
        code, lines = daemon_under_systemd(tmp_path, tree, path, "--config", str(cfg))
    finally:
        if lock is not None:
            lock.release()
    assert code == 2, lines
    expected = "perod_ms" if why == "config typo" else f"another hidvfs daemon (pid {os.getpid()})"
    msgs = datagrams(rx)
    # one datagram, the reason alone, nothing that claims readiness
    assert len(msgs) == 1 and msgs[0].startswith(REFUSED) and expected in msgs[0], msgs
    assert "\n" not in msgs[0] and "READY=1" not in msgs[0]
    # the same reason, at error priority, as the last line on stderr
    assert lines[-1] == "<3>hidvfs: error: " + msgs[0][len(REFUSED) :]
    assert all(re.match(r"<[0-7]>", line) for line in lines), lines


def test_a_mistyped_option_is_a_refused_start_too(tmp_path, tree, notify_socket):
    """click refuses an unknown option before the command runs: systemd still hears why, and
    the journal gets the reason at error priority."""
    path, rx = notify_socket
    code, lines = daemon_under_systemd(tmp_path, tree, path, "--perod-ms", "100")
    assert code == 2, lines
    (msg,) = datagrams(rx)
    assert msg.startswith(REFUSED) and "--perod-ms" in msg and "READY=1" not in msg
    assert "<3>hidvfs: error: " + msg[len(REFUSED) :] in lines


def test_a_refused_start_on_a_terminal_prints_the_plain_line(tmp_path, tree, notify_socket):
    """No journal (CliRunner's stderr is no file): no prefix; the STATUS= goes out all the
    same whenever ``$NOTIFY_SOCKET`` is set."""
    path, rx = notify_socket
    cfg = tmp_path / "config.yaml"
    cfg.write_text("perod_ms: 100\n")
    r = CliRunner().invoke(
        cli,
        ["daemon", "--config", str(cfg), "--sysfs-root", str(tree)],
        env={"NOTIFY_SOCKET": path, "JOURNAL_STREAM": "1:1"},
    )
    assert r.exit_code == 2
    assert r.output.startswith("hidvfs: error: ") and "perod_ms" in r.output
    (msg,) = datagrams(rx)
    assert msg == REFUSED + r.output.strip()[len("hidvfs: error: ") :]


def test_a_refusal_before_the_run_and_a_failure_after_ready_say_which(
    tmp_path, monkeypatch, notify_socket
):
    """Only a start that never got to READY is "refused"; a failure after it (a restore that
    failed at stop) is "failed", and an unexpected error is named by its type."""
    import daemon.service
    from daemon.notify import Notifier
    from daemon.service import DaemonError

    path, rx = notify_socket
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    raised: list[BaseException] = []

    def run_live(**_kw):
        if raised[0] is not None and "after ready" in str(raised[0]):
            Notifier().ready("controlling tx2 with maxfreq")
        raise raised[0]

    monkeypatch.setattr(daemon.service, "run_live", run_live)
    tree = tmp_path / "t"
    tree.mkdir()

    def run(err: BaseException):
        raised[:] = [err]
        return CliRunner().invoke(cli, ["daemon", "--sysfs-root", str(tree)])

    r = run(DaemonError("could not give back policy1/scaling_max_freq (after ready)"))
    assert r.exit_code == 2
    assert datagrams(rx) == [
        f"READY=1\nMAINPID={os.getpid()}\nSTATUS=controlling tx2 with maxfreq",
        "STATUS=failed: could not give back policy1/scaling_max_freq (after ready)",
    ]
    r = run(OSError(28, "No space left on device"))
    assert r.exit_code == 2
    assert datagrams(rx) == [REFUSED + "[Errno 28] No space left on device"]
    r = run(RuntimeError("a bug"))
    assert r.exit_code == 1 and isinstance(r.exception, RuntimeError)
    assert datagrams(rx) == [REFUSED + "RuntimeError: a bug"]


def test_fail_prefixes_every_line_with_the_error_priority_under_the_journal(monkeypatch, capsys):
    import tools.common
    from tools.common import fail

    monkeypatch.setattr(tools.common, "under_journal", lambda: True)
    with pytest.raises(SystemExit) as exc:
        fail("first\nsecond", code=3)
    assert exc.value.code == 3 and exc.value.message == "first\nsecond"
    assert capsys.readouterr().err == "<3>hidvfs: error: first\n<3>second\n"
    monkeypatch.setattr(tools.common, "under_journal", lambda: False)
    with pytest.raises(SystemExit) as exc:
        fail("plain")
    assert exc.value.code == 2
    assert capsys.readouterr().err == "hidvfs: error: plain\n"


def test_json_logs_of_a_daemon_under_the_journal_carry_their_priority(
    tmp_path, tree, notify_socket
):
    path, rx = notify_socket
    cfg = tmp_path / "config.yaml"
    cfg.write_text("logging:\n  format: json\n")
    code, lines = daemon_under_systemd(tmp_path, tree, path, "--config", str(cfg))
    assert code == 0, lines
    objs = {}
    for line in lines:
        m = re.match(r"<([0-7])>(\{.*\})$", line)
        assert m, line
        obj = json.loads(m.group(2))
        assert "ts" not in obj
        assert int(m.group(1)) == {"error": 3, "warning": 4, "info": 6}[obj["level"]]
        objs[obj["event"]] = obj
    assert "ready" in objs and "restored" in objs
    assert any(m.startswith("READY=1") for m in datagrams(rx))
