"""Every option that names an output treats a missing folder alike (tools.common.ensure_parent):
the folder is made (0o755) once the option's own checks have passed and before the work; one
that cannot be made or written (a file in the way, no permission, a read-only or pseudo
filesystem) is refused in one line naming the option, the path and why, exit 2, before
anything runs or is written. It used to be made by some options, refused by others, and
failed after the work by one (`daemon --replay --status-file`)."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from platforms.clock import VirtualClock
from platforms.faketree import write_fake_tree
from platforms.spec import load_board
from platforms.sysfs import DirSysfs
from platforms.trace import record
from tools.cli import cli
from tools.common import OutputFolderError, ensure_parent

ROOT = Path(__file__).resolve().parents[2]


def hv(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _blocked(option: str, path: Path, blocker: Path) -> str:
    """The one line a ``path`` whose folder ``blocker`` (a file) is in the way of gets."""
    folder = path.parent
    return (
        f"hidvfs: error: {option} {path}: its folder {folder} cannot be made ({blocker} is a "
        f"file, not a folder); choose another {option}"
    )


@pytest.fixture
def blocker(tmp_path):
    """A regular file where a folder is wanted."""
    f = tmp_path / "afile"
    f.write_text("in the way\n")
    return f


@pytest.fixture
def tree(tmp_path):
    write_fake_tree(load_board("tx2"), tmp_path / "tree")
    return tmp_path / "tree"


# -- the helper ---------------------------------------------------------------------------------


def test_the_missing_folders_are_made_0755_and_no_probe_file_is_left(tmp_path):
    out = tmp_path / "a" / "b" / "c" / "out.json"
    ensure_parent("--out", out)
    for folder in (tmp_path / "a", tmp_path / "a" / "b", out.parent):
        assert os.stat(folder).st_mode & 0o777 == 0o755 & ~_umask()
    assert list(out.parent.iterdir()) == [] and not out.exists()
    ensure_parent("--out", out)  # an existing folder is fine, again
    out.write_text("x")
    ensure_parent("--out", out)  # and so is an existing file in it
    ensure_parent("--out", tmp_path / "rep" / "report", folder=True)
    assert (tmp_path / "rep").is_dir() and not (tmp_path / "rep" / "report").exists()
    ensure_parent("--out", tmp_path / "rep", folder=True)  # an existing output folder


def test_a_file_in_the_way_is_refused_and_nothing_is_made(tmp_path, blocker):
    for out in (blocker / "out.json", blocker / "sub" / "deeper" / "out.json"):
        with pytest.raises(OutputFolderError) as err:
            ensure_parent("--db", out)
        assert str(err.value) == _blocked("--db", out, blocker).removeprefix("hidvfs: error: ")
    with pytest.raises(OutputFolderError, match=f"--out {tmp_path}: is a folder; give a file"):
        ensure_parent("--out", tmp_path)
    with pytest.raises(OutputFolderError, match=f"--out {blocker}: is a file; give a folder"):
        ensure_parent("--out", blocker, folder=True)
    assert blocker.read_text() == "in the way\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def test_a_folder_without_write_permission_is_refused(tmp_path, monkeypatch):
    """As a user: os.access says no (root is let through by it, see the probe below)."""
    ro = tmp_path / "ro"
    ro.mkdir()
    real_access = os.access
    monkeypatch.setattr(
        os, "access", lambda p, m, *a, **k: False if str(p) == str(ro) else real_access(p, m)
    )
    with pytest.raises(OutputFolderError) as err:
        ensure_parent("--store", ro / "p.json")
    assert str(err.value) == (
        f"--store {ro / 'p.json'}: its folder {ro} is not writable (permission denied); "
        "choose another --store"
    )
    with pytest.raises(OutputFolderError) as err:
        ensure_parent("--store", ro / "sub" / "p.json")
    assert f"its folder {ro / 'sub'} cannot be made ({ro} is not writable)" in str(err.value)
    assert list(ro.iterdir()) == []


def test_a_folder_no_file_can_be_made_in_is_refused(tmp_path, monkeypatch):
    """os.access says yes to root on a read-only mount: a file is made there for real."""
    import tempfile

    def read_only(*a, **k):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(tempfile, "mkstemp", read_only)
    with pytest.raises(OutputFolderError) as err:
        ensure_parent("--record", tmp_path / "r.jsonl")
    assert str(err.value) == (
        f"--record {tmp_path / 'r.jsonl'}: its folder {tmp_path} is not writable (Read-only "
        "file system); choose another --record"
    )


@pytest.mark.skipif(not os.path.exists("/proc/self/mounts"), reason="needs Linux's /proc")
def test_pseudo_filesystems_are_refused_without_making_anything():
    """As root, os.access says yes to /proc and /sys; a mkdir under /sys/fs/cgroup would even
    make a cgroup."""
    cases = [
        ("/proc/hidvfs-out.json", "its folder /proc is not writable (/proc is on the proc"),
        ("/proc/hidvfs-new/x.json", "its folder /proc/hidvfs-new cannot be made (/proc is on"),
        ("/sys/hidvfs-new/x.json", "its folder /sys/hidvfs-new cannot be made (/sys is on the"),
    ]
    for out, said in cases:
        with pytest.raises(OutputFolderError) as err:
            ensure_parent("--out", out)
        assert said in str(err.value) and "pseudo filesystem" in str(err.value)
    assert not os.path.exists("/sys/hidvfs-new")


def test_a_device_or_a_fifo_passes_as_it_is(tmp_path):
    ensure_parent("--status-file", "/dev/null")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    ensure_parent("--out", fifo)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo"]


# -- hidvfs daemon ------------------------------------------------------------------------------


def _daemon(tree: Path, state: Path, *extra) -> subprocess.CompletedProcess:
    """The daemon as a process on ``tree`` (its logging is set up for a process)."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "tools.cli",
            "daemon",
            "--sysfs-root",
            str(tree),
            "--policy",
            "maxfreq",
            "--period-ms",
            "50",
            "--duration",
            "0.4",
            "--state-dir",
            str(state),
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


def test_the_daemon_makes_the_folders_of_its_status_file_record_and_socket(tmp_path, tree):
    """--record used to be refused (after the snapshot) when its folder was missing."""
    status = tmp_path / "s" / "sub" / "status.json"
    rec = tmp_path / "r" / "sub" / "run.jsonl"
    sock = tmp_path / "k" / "sub" / "hidvfs.sock"
    p = _daemon(
        tree, tmp_path / "state", "--status-file", status, "--record", rec, "--socket", sock
    )
    assert p.returncode == 0, p.stderr[-2000:]
    assert json.loads(status.read_text())["ticks"] > 0
    assert rec.stat().st_size > 0
    assert "registry_unavailable" not in p.stderr and "event=ready" in p.stderr
    for folder in (status.parent, rec.parent, sock.parent):
        assert os.stat(folder).st_mode & 0o777 == 0o755 & ~_umask()


@pytest.mark.parametrize("flag", ["--status-file", "--record", "--socket"])
def test_the_daemon_refuses_a_blocked_output_folder_before_it_starts(tmp_path, tree, flag):
    """--socket used to start the daemon without its registry (a warning in the log),
    --status-file said it without naming the option."""
    blocker = tmp_path / "afile"
    blocker.write_text("in the way\n")
    out = blocker / "out"
    state = tmp_path / "state"
    extra = [flag, out] if flag == "--socket" else [flag, out, "--socket", state / "s.sock"]
    before = {p: p.read_bytes() for p in tree.rglob("*") if p.is_file()}
    p = _daemon(tree, state, *extra)
    assert p.returncode == 2, p.stderr[-2000:]
    assert p.stderr.splitlines()[-1] == _blocked(flag, out, blocker)
    assert "Traceback" not in p.stderr and "event=ready" not in p.stderr
    assert not state.exists()  # no snapshot, no lock: nothing ran
    assert {p: p.read_bytes() for p in tree.rglob("*") if p.is_file()} == before
    assert blocker.read_text() == "in the way\n"


def _must_not_run(*args, **kwargs):
    raise AssertionError("the run started")


def _trace(tmp_path: Path) -> Path:
    spec = load_board("tx2")
    write_fake_tree(spec, tmp_path / "rec-tree")
    out = tmp_path / "t.jsonl"
    record(DirSysfs(tmp_path / "rec-tree"), VirtualClock(0.0), str(out), period_s=0.1,
           duration_s=1.0, board="tx2")  # fmt: skip
    return out


def test_a_replay_makes_the_status_folder_and_refuses_a_blocked_one_before_replaying(
    tmp_path, blocker, monkeypatch
):
    """The replay wrote its status at the end: a blocked folder failed there, after the
    whole replay, with a bare errno line."""
    trace = _trace(tmp_path)
    status = tmp_path / "new" / "sub" / "status.json"
    r = hv("daemon", "--replay", trace, "--status-file", status)
    assert r.exit_code == 0, r.output
    assert json.loads(status.read_text())["board"] == "tx2"
    import tools.replay

    monkeypatch.setattr(tools.replay, "replay_trace", _must_not_run)
    out = blocker / "status.json"
    r = hv("daemon", "--replay", trace, "--status-file", out)
    assert r.exit_code == 2 and r.output.splitlines() == [_blocked("--status-file", out, blocker)]


def test_a_sim_makes_the_status_folder(tmp_path):
    status = tmp_path / "new" / "sub" / "status.json"
    r = hv("daemon", "--sim", "tx2", "--duration", "0.5", "--status-file", status)
    assert r.exit_code == 0, r.output
    assert json.loads(status.read_text())["board"] == "tx2"


# -- hidvfs bots report, profile measure, agents train ------------------------------------------


def test_bots_report_makes_the_parent_of_out_and_refuses_a_blocked_one(tmp_path, blocker):
    db = tmp_path / "r.sqlite"
    ran = hv("bots", "run", "--bench", "fib", "--class", "test", "--policy", "performance",
             "--db", db)  # fmt: skip
    assert ran.exit_code == 0, ran.output
    out = tmp_path / "new" / "sub" / "report"
    r = hv("bots", "report", "--db", db, "--out", out)
    assert r.exit_code == 0, r.output
    assert (out / "report.md").is_file()
    bad = blocker / "report"
    r = hv("bots", "report", "--db", db, "--out", bad)
    assert r.exit_code == 2 and r.output.splitlines() == [_blocked("--out", bad, blocker)]


def test_profile_measure_makes_the_folder_of_its_store_before_the_runs(tmp_path, tree):
    store = tmp_path / "new" / "sub" / "profiles.json"
    r = hv("profile", "measure", "--store", store, "--sysfs-root", tree,
           "--state-dir", tmp_path / "state", "--socket", tmp_path / "state" / "none.sock",
           "--name", "tst", "--json", "--", sys.executable, "-c", "pass")  # fmt: skip
    assert r.exit_code == 0, r.output
    assert json.loads(store.read_text())["format"] == "hidvfs-profiles"
    assert os.stat(store.parent).st_mode & 0o777 == 0o755 & ~_umask()


@pytest.fixture
def no_training(monkeypatch):
    """Replaces agents.trainboard.train_board: records the folder it was given."""
    import agents.trainboard as t

    calls = []

    def fake(spec, run_episode, make_mix, seed, out, command, **kw):
        calls.append(Path(out))
        return {}

    monkeypatch.setattr(t, "train_board", fake)
    return calls


def test_agents_train_makes_the_parent_of_out_and_refuses_a_blocked_one_before_training(
    tmp_path, blocker, no_training
):
    args = ["agents", "train", "--board", "tx2", "--episodes", "1", "--policy", "geardvfs"]
    out = tmp_path / "new" / "sub" / "models"
    r = hv(*args, "--out", out)
    assert r.exit_code == 0, r.output
    assert no_training == [out] and out.parent.is_dir()
    bad = blocker / "models"
    r = hv(*args, "--out", bad)
    assert r.exit_code == 2 and r.output.splitlines() == [_blocked("--out", bad, blocker)]
    assert no_training == [out]  # not trained again


def test_dev_stdout_redirected_to_a_file_passes_as_it_is(tmp_path):
    """/dev/stdout to a file stats as a regular file in /dev: its folder was checked (and a
    non-root user refused, root got a probe file made in /dev)."""
    import subprocess
    import sys

    out = tmp_path / "o.json"
    code = (
        "from tools.common import ensure_parent; import os; "
        "ensure_parent('--out', '/dev/stdout'); "
        "print(sorted(n for n in os.listdir('/dev') if n.startswith('.hidvfs')))"
    )
    with open(out, "w") as f:
        subprocess.run([sys.executable, "-c", code], stdout=f, check=True, timeout=60)
    assert out.read_text() == "[]\n"
