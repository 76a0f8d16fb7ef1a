"""Messages a first-hour review found unclear: each says what is wrong and what to do, in
one `hidvfs: error:` line, as the other commands do.

- `bots report` without a results store said click's "Invalid value for '--db': File
  'results.sqlite' does not exist." (which campaigns write one was left to guess);
- `coordinator synth` said its errors as click usage errors ("Usage: ... Error: ...");
- `hidvfs run` with no daemon did not name `--if-no-daemon run`, the way to run anyway;
- a socket this user may not use ended with "is it running?", which sends the user to look
  at a daemon that runs;
- `daemon --help` showed `--sim TEXT` (a board), and other options a TEXT for a name;
- `trace info` printed "unavailable reads 150" without saying what they are."""

from __future__ import annotations

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

from daemon.client import DaemonUnreachable, NotAllowed, RegistryClient
from tools.cli import cli

ROOT = Path(__file__).resolve().parents[2]


def hv(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


# -- bots report without a results store ---------------------------------------------------------


def test_bots_report_without_a_store_says_which_campaigns_write_one(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = hv("bots", "report")
    assert r.exit_code == 2
    assert r.output == (
        "hidvfs: error: no results store results.sqlite here: run a campaign first (`hidvfs "
        "bots run --spec FILE` and --backend native write results.sqlite in the current folder; "
        "a simulated campaign from flags keeps its runs in memory unless given --db "
        "results.sqlite), or name the store with --db\n"
    )
    missing = tmp_path / "runs.sqlite"
    r = hv("bots", "report", "--db", missing)
    assert r.exit_code == 2 and r.output == (
        f"hidvfs: error: --db {missing}: no such results store; run a campaign with --db "
        f"{missing} first\n"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no report folder made


def test_what_bots_report_says_of_a_campaign_without_db_is_true(tmp_path, monkeypatch):
    """A simulated campaign from flags keeps nothing; given --db results.sqlite, report reads
    it from the default place."""
    monkeypatch.chdir(tmp_path)
    args = ["bots", "run", "--bench", "fib", "--class", "test", "--policy", "performance"]
    assert hv(*args).exit_code == 0
    assert not (tmp_path / "results.sqlite").exists()
    assert hv(*args, "--db", "results.sqlite").exit_code == 0
    r = hv("bots", "report", "--out", tmp_path / "rep")
    assert r.exit_code == 0, r.output
    assert (tmp_path / "rep" / "report.md").is_file()


# -- coordinator synth: hidvfs: error:, not a usage error ---------------------------------------


def test_coordinator_synth_errors_are_hidvfs_error_lines(tmp_path):
    r = hv("coordinator", "synth", "--out", tmp_path / "d.csv", "--nodes", "bogus:3")
    assert r.exit_code == 2
    assert r.output.startswith("hidvfs: error: unknown board 'bogus'")
    assert "Usage:" not in r.output and len(r.output.splitlines()) == 1
    blocker = tmp_path / "afile"
    blocker.write_text("")
    r = hv("coordinator", "synth", "--out", blocker / "d.csv")
    assert r.exit_code == 2 and r.output == (
        f"hidvfs: error: --out {blocker / 'd.csv'}: its folder {blocker} cannot be made "
        f"({blocker} is a file, not a folder); choose another --out\n"
    )


# -- hidvfs run without a daemon; a socket this user may not use --------------------------------


def test_run_without_a_daemon_names_the_option_that_runs_anyway(tmp_path):
    marker = tmp_path / "ran"
    cmd = [sys.executable, "-c", f"open({str(marker)!r}, 'w')"]
    sock = tmp_path / "none.sock"
    r = hv("run", "--socket", sock, "--", *cmd)
    assert r.exit_code == 2 and not marker.exists()
    assert r.output == (
        f"hidvfs: error: cannot reach the hidvfs daemon at {sock}: no such socket; is it "
        "running? (systemctl status hidvfs); or add --if-no-daemon run before the command to "
        "run it without the daemon (unmanaged: its deadline neither planned nor protected)\n"
    )
    assert "--if-no-daemon [fail|run]" in hv("run", "--help").output  # the option's name
    r = hv("run", "--if-no-daemon", "run", "--socket", sock, "--", *cmd)
    assert r.exit_code == 0 and marker.exists()


@pytest.fixture
def root_only_socket():
    """A listening socket of mode 0600 (the daemon's when its group is unset or missing)."""
    folder = Path(tempfile.mkdtemp(prefix="hidvfs-sock-"))
    folder.chmod(0o755)
    path = folder / "h.sock"
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        srv.bind(str(path))
    finally:
        os.umask(old)
    srv.listen(8)
    yield path
    srv.close()
    shutil.rmtree(folder)


def _refuse(monkeypatch):
    """Every connect is refused with EACCES (as to a user the socket's mode leaves out; root
    passes any mode)."""

    def connect(self):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(RegistryClient, "_connect", connect)


def _owner_name() -> str:
    import pwd

    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())


def test_a_socket_this_user_may_not_use_says_so_not_is_it_running(root_only_socket, monkeypatch):
    _refuse(monkeypatch)
    with pytest.raises(DaemonUnreachable) as err:  # callers that catch it still do
        RegistryClient(str(root_only_socket)).status()
    assert isinstance(err.value, NotAllowed)
    text = str(err.value)
    assert "is it running" not in text
    import grp

    group = grp.getgrgid(os.stat(root_only_socket).st_gid).gr_name
    me = _owner_name()
    assert text == (
        f"this user is not allowed to use the hidvfs daemon's socket {root_only_socket} "
        f"(mode 0600, owner {me}, group {group}): only {me} may use it (the daemon's "
        f"socket.group is unset, or that group is missing): run as {me}"
    )
    os.chmod(root_only_socket, 0o660)  # the daemon's with its group: join it
    text = str(NotAllowed(str(root_only_socket)))
    assert text.endswith(
        f"(mode 0660, owner {me}, group {group}): join the {group!r} group (sudo usermod "
        f"-aG {group} $USER, then log in again)"
    )
    r = hv("status", "--socket", root_only_socket)
    assert r.exit_code == 2 and r.output == f"hidvfs: error: {text}\n"
    r = hv("run", "--socket", root_only_socket, "--", "true")
    assert r.exit_code == 2 and r.output.startswith(f"hidvfs: error: {text}; or add --if-no-")


def test_a_socket_in_a_folder_closed_to_this_user(tmp_path, monkeypatch):
    """The folder says who may come in: its group (join it), or its owner alone. The advice
    was "run as root, or give a --socket in a folder this user can enter", which reaches no
    daemon."""
    import grp
    import pwd

    _refuse(monkeypatch)
    folder = tmp_path / "closed"
    folder.mkdir()
    sock = folder / "h.sock"
    real_stat = os.stat

    def stat(p, *a, **k):
        if str(p) == str(sock):
            raise PermissionError(13, "Permission denied")
        return real_stat(p, *a, **k)

    monkeypatch.setattr(os, "stat", stat)
    st = real_stat(folder)
    me, group = pwd.getpwuid(st.st_uid).pw_name, grp.getgrgid(st.st_gid).gr_name
    head = f"this user is not allowed to use the hidvfs daemon's socket {sock} (its folder {folder} is closed to this user: "
    folder.chmod(0o750)
    assert str(NotAllowed(str(sock))) == (
        f"{head}mode 0750, owner {me}, group {group}): join the {group!r} group (sudo usermod "
        f"-aG {group} $USER, then log in again)"
    )
    folder.chmod(0o700)
    assert str(NotAllowed(str(sock))) == (
        f"{head}mode 0700, owner {me}, group {group}): only {me} may enter it: run as {me}"
    )


def test_as_nobody_a_root_only_socket_says_who_may_use_it(root_only_socket, nobody):
    p = subprocess.run(
        [*nobody, "-m", "tools.cli", "status", "--socket", str(root_only_socket)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, HOME=str(root_only_socket.parent)),
    )
    assert p.returncode == 2
    assert p.stderr.startswith(
        f"hidvfs: error: this user is not allowed to use the hidvfs daemon's socket "
        f"{root_only_socket} (mode 0600, owner root, "
    )
    assert "only root may use it" in p.stderr and "is it running" not in p.stderr


# -- metavars ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "command, shown",
    [
        ("daemon", ["--sim BOARD", "--replay TRACE", "--policy POLICY", "--sysfs-root DIR"]),
        ("run", ["--name NAME", "--socket SOCKET"]),
        ("status", ["--socket SOCKET"]),
        ("trace record", ["--board BOARD"]),
        ("trace replay", ["--policy POLICY"]),
        ("bots run", ["--board BOARD", "--bench KERNELS", "--class CLASS", "--policy POLICIES"]),
        ("bots report", ["--baseline POLICY"]),
        ("profile measure", ["--name NAME", "--board BOARD", "--store FILE"]),
        ("agents eval", ["--board BOARDS", "--policy POLICIES", "--models ROOT"]),
        ("coordinator simulate", ["--policy POLICIES", "--nodes NODES"]),
    ],
)
def test_options_that_take_a_name_show_what_name(command, shown):
    r = hv(*command.split(), "--help")
    assert r.exit_code == 0, r.output
    for text in shown:
        assert re.search(rf"^\s+{re.escape(text)}\b", r.output, re.M), (command, text)
        flag = text.split()[0]
        assert not re.search(rf"^\s+{flag} TEXT", r.output, re.M), (command, flag)


# -- trace info ----------------------------------------------------------------------------------


def test_trace_info_says_what_unavailable_reads_are(tmp_path):
    from platforms.clock import VirtualClock
    from platforms.faketree import write_fake_tree
    from platforms.spec import load_board
    from platforms.sysfs import DirSysfs
    from platforms.trace import format_info, read_trace, record, trace_info

    tree = tmp_path / "tree"
    write_fake_tree(load_board("tx2"), tree)
    out = tmp_path / "t.jsonl"
    record(DirSysfs(tree), VirtualClock(0.0), str(out), period_s=0.1, duration_s=0.3,
           board="tx2")  # fmt: skip
    info = trace_info(read_trace(out))
    assert info["unavailable_reads"] > 0  # the fake tx2's EAGAIN zone, its rails
    text = format_info(info)
    assert (
        f"unavailable reads {info['unavailable_reads']} (reads that found no value: a missing "
        "or empty file, EAGAIN, a permission or read error; a replay fails them the same way)"
    ) in text.splitlines()
    r = hv("trace", "info", out)
    assert r.exit_code == 0 and "reads that found no value" in r.output
    info["unavailable_reads"] = 0
    assert "unavailable reads 0" in format_info(info).splitlines()
