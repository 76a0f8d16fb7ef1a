"""An output option whose file is already there and that this user cannot write over, the
way the command will write it, is refused up front like a folder that cannot be written
(tools.common.ensure_parent): one line naming the option, exit 2, before any work.

It used to fail at the first write (after the run, for some) with a raw errno, such as
``[Errno 1] Operation not permitted: '/tmp/.o-st.json.4zi6c5a4' -> '/tmp/o-st.json'`` for a
status file another user owns in /tmp (a sticky folder: only the file's or the folder's
owner may rename over it), ``[Errno 13] Permission denied`` for a trace file opened for
writing, and ``fake-sysfs DIR`` named its internal temporary file.

As root every one of these passes (root may replace or write any file): the unprivileged
user is simulated here (``os.geteuid``, ``os.access``), and shown for real as ``nobody``
where this machine lets a test run the CLI as that user."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner

import platforms.outputs as outputs
from platforms.atomicfile import write_bytes_atomic
from tools.cli import cli
from tools.common import OutputFolderError, ensure_parent

ROOT = Path(__file__).resolve().parents[2]


def hv(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def _must_not_run(*args, **kwargs):
    raise AssertionError("the work started")


@pytest.fixture
def sticky(tmp_path):
    """A sticky, world-writable folder (as /tmp) holding ``st.json``, a file of this test's
    user; :func:`as_another_user` then makes ensure_parent see another user."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    folder.chmod(0o1777)
    (folder / "st.json").write_text("{}\n")
    return folder


@pytest.fixture
def as_another_user(monkeypatch):
    """ensure_parent judges as a user who owns neither the files nor the folders made here
    (a uid no file of the test has)."""
    other = os.geteuid() + 4242
    monkeypatch.setattr(outputs.os, "geteuid", lambda: other)
    return other


def _owner(path: Path) -> str:
    import pwd

    uid = path.stat().st_uid
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def _not_replaceable(option: str, path: Path) -> str:
    return (
        f"{option} {path}: belongs to {_owner(path)} in the sticky folder {path.parent}, where "
        f"only its owner may replace or remove it; choose another {option}"
    )


@pytest.fixture
def unwritable(monkeypatch):
    """``unwritable(path)``: os.access says no write to ``path`` (as to a user without the
    permission; root's os.access says yes to any file)."""
    shut: set[str] = set()
    real_access = os.access

    def access(p, mode, *a, **k):
        if str(p) in shut and mode & os.W_OK:
            return False
        return real_access(p, mode, *a, **k)

    monkeypatch.setattr(os, "access", access)
    return lambda path: shut.add(str(path))


def _not_writable(option: str, path: Path) -> str:
    mode = stat.S_IMODE(path.stat().st_mode)
    return (
        f"{option} {path}: is not writable by this user (it belongs to {_owner(path)}, mode "
        f"{mode:04o}); choose another {option}"
    )


# -- the helper ----------------------------------------------------------------------------------


def test_a_file_renamed_over_is_judged_by_the_sticky_folder_rule(sticky, tmp_path, monkeypatch):
    target = sticky / "st.json"
    ensure_parent("--status-file", target, replace="rename")  # its owner: fine
    other = os.geteuid() + 4242
    monkeypatch.setattr(outputs.os, "geteuid", lambda: other)
    with pytest.raises(OutputFolderError) as err:
        ensure_parent("--status-file", target, replace="rename")
    assert str(err.value) == _not_replaceable("--status-file", target)
    ensure_parent("--status-file", sticky / "new.json", replace="rename")  # nothing there yet
    ensure_parent("--status-file", target, replace="open")  # written in place: its mode rules
    plain = tmp_path / "plain"  # no sticky bit: whoever may write the folder may rename
    plain.mkdir()
    (plain / "st.json").write_text("{}\n")
    ensure_parent("--status-file", plain / "st.json", replace="rename")
    monkeypatch.setattr(outputs.os, "geteuid", lambda: 0)  # root: as it always was
    ensure_parent("--status-file", target, replace="rename")
    assert sorted(p.name for p in sticky.iterdir()) == ["st.json"]


def test_a_file_opened_for_writing_is_judged_by_its_own_permission(tmp_path, unwritable):
    trace = tmp_path / "t.jsonl.gz"
    trace.write_bytes(b"")
    ensure_parent("--out", trace, replace="open")
    unwritable(trace)
    with pytest.raises(OutputFolderError) as err:
        ensure_parent("--out", trace, replace="open")
    assert str(err.value) == _not_writable("--out", trace)
    ensure_parent("--out", trace, replace="rename")  # a rename needs the folder only
    ensure_parent("--out", trace, replace=None)  # not judged at all (the socket)
    ensure_parent("--out", trace.parent, folder=True)  # a folder output: its own check


def test_a_link_followed_by_the_writer_is_judged_by_its_target(sticky, tmp_path, as_another_user):
    link = tmp_path / "link.csv"
    link.symlink_to(sticky / "st.json")
    with pytest.raises(OutputFolderError) as err:
        ensure_parent("--out", link, replace="rename", follow=True)
    assert str(err.value) == (
        f"--out {link}: leads to {sticky / 'st.json'}, which belongs to "
        f"{_owner(sticky / 'st.json')} in the sticky folder {sticky}, where only its owner may "
        "replace or remove it; choose another --out"
    )
    ensure_parent("--out", link, replace="rename")  # the link itself is this folder's


def test_streams_pass_as_they_are(tmp_path, as_another_user, unwritable):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path in ("/dev/null", "/dev/stdout", fifo):
        unwritable(path)
        for how in ("open", "rename"):
            ensure_parent("--out", path, replace=how)


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs /dev/shm")
def test_a_regular_file_in_dev_shm_is_a_file_not_a_stream(tmp_path):
    """Every path in /dev passed as a stream: a status file in /dev/shm was then written in
    place (a reader could see half of it), and the checks above were skipped for it."""
    try:
        fd, name = tempfile.mkstemp(dir="/dev/shm", prefix="hidvfs-test-")
    except OSError:
        pytest.skip("/dev/shm is not writable here")
    os.close(fd)
    try:
        assert not outputs.is_stream_path(name)
    finally:
        os.unlink(name)
    assert outputs.is_stream_path("/dev/null") and outputs.is_stream_path("/dev/stdout")
    assert outputs.is_stream_path(f"/proc/self/fd/{sys.stdout.fileno()}")
    link = tmp_path / "out"  # a link to /dev/stdout is the descriptor's name too
    link.symlink_to("/dev/stdout")
    assert outputs.is_stream_path(link) and not outputs.is_stream_path(tmp_path)


def test_an_atomic_write_to_a_stream_writes_it_and_renames_nothing_over_it(tmp_path):
    """As root, `daemon --sim --status-file /dev/null` renamed its temporary file over
    /dev/null: the device became a regular file. A FIFO shows it without touching /dev."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader has it open
    try:
        write_bytes_atomic(fifo, b'{"t": 1}\n')
        assert os.read(reader, 100) == b'{"t": 1}\n'
    finally:
        os.close(reader)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo"]  # no temporary left


# -- the commands --------------------------------------------------------------------------------


def test_daemon_sim_refuses_a_status_file_it_cannot_rename_over_before_the_run(
    sticky, as_another_user, monkeypatch
):
    from tools import simdaemon

    monkeypatch.setattr(simdaemon, "run_sim_daemon", _must_not_run)
    target = sticky / "st.json"
    r = hv("daemon", "--sim", "tx2", "--duration", "1", "--status-file", target)
    assert r.exit_code == 2, r.output
    assert r.output == f"hidvfs: error: {_not_replaceable('--status-file', target)}\n"


def test_daemon_sim_writes_a_fifo_status_file_as_a_stream(tmp_path):
    """Each status is written into the FIFO while a reader holds it open (with none it is
    skipped with a warning, never waited for); the FIFO stays one (a rename replaced it with
    a regular file)."""

    fifo = tmp_path / "status"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # held open for the whole run
    try:
        r = hv("daemon", "--sim", "tx2", "--duration", "0.3", "--period-ms", "100",
               "--status-file", fifo)  # fmt: skip
        got = b""
        while chunk := _read_some(reader):
            got += chunk
    finally:
        os.close(reader)
    assert r.exit_code == 0, r.output
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert got.decode().count('"board": "tx2"') >= 2  # the loop's statuses and the last one


def _read_some(fd: int) -> bytes:
    try:
        return os.read(fd, 1 << 16)
    except BlockingIOError:
        return b""


def test_coordinator_synth_refuses_a_file_it_cannot_rename_over(sticky, as_another_user):
    target = sticky / "st.json"
    r = hv("coordinator", "synth", "--out", target, "--jobs", "3")
    assert r.exit_code == 2, r.output
    assert r.output == f"hidvfs: error: {_not_replaceable('--out', target)}\n"
    assert target.read_text() == "{}\n"


def test_trace_record_refuses_a_file_it_cannot_write_before_recording(
    tmp_path, unwritable, monkeypatch
):
    import platforms.trace
    from platforms.faketree import write_fake_tree
    from platforms.spec import load_board

    write_fake_tree(load_board("tx2"), tmp_path / "tree")
    monkeypatch.setattr(platforms.trace, "record", _must_not_run)
    # an empty file is opened in place (a non-empty one, an earlier recording, is moved to
    # its .prev name instead, as `daemon --record` keeps it: its folder's rule then)
    out = tmp_path / "t.jsonl.gz"
    out.write_bytes(b"")
    unwritable(out)
    r = hv("trace", "record", "--sysfs-root", tmp_path / "tree", "--out", out)
    assert r.exit_code == 2, r.output
    assert r.output == f"hidvfs: error: {_not_writable('--out', out)}\n"
    assert out.read_bytes() == b"" and sorted(p.name for p in tmp_path.iterdir()) == [
        "t.jsonl.gz",
        "tree",
    ]


def test_trace_record_refuses_an_earlier_recording_it_cannot_move_aside(
    sticky, as_another_user, monkeypatch
):
    """An earlier recording is kept as .prev by a rename (as `daemon --record` keeps it): in
    a sticky folder another user's cannot be, which is said before recording."""
    import platforms.trace
    from platforms.faketree import write_fake_tree
    from platforms.spec import load_board

    write_fake_tree(load_board("tx2"), sticky.parent / "tree")
    monkeypatch.setattr(platforms.trace, "record", _must_not_run)
    out = sticky / "t.jsonl.gz"
    out.write_bytes(b"old")
    r = hv("trace", "record", "--sysfs-root", sticky.parent / "tree", "--out", out)
    assert r.exit_code == 2, r.output
    assert r.output == f"hidvfs: error: {_not_replaceable('--out', out)}\n"
    assert out.read_bytes() == b"old" and not (sticky / "t.prev.jsonl.gz").exists()


def test_bots_run_refuses_a_results_store_it_cannot_write_before_the_campaign(
    tmp_path, unwritable, monkeypatch
):
    import tools.native_campaign

    monkeypatch.setattr(tools.native_campaign, "run_configs", _must_not_run)
    db = tmp_path / "r.sqlite"
    db.write_bytes(b"")
    unwritable(db)
    r = hv("bots", "run", "--bench", "fib", "--class", "test", "--policy", "performance",
           "--db", db)  # fmt: skip
    assert r.exit_code == 2, r.output
    assert r.output == f"hidvfs: error: {_not_writable('--db', db)}\n"


def test_fake_sysfs_refuses_a_folder_it_cannot_write_naming_it(tmp_path, monkeypatch, unwritable):
    """It named the first file it failed on, an internal temporary:
    [Errno 13] Permission denied: '/tmp/tx2/..hidvfs-fake-tree.ji406bnm'."""
    import platforms.faketree

    monkeypatch.setattr(platforms.faketree, "write_fake_tree", _must_not_run)
    folder = tmp_path / "tx2"
    folder.mkdir()
    unwritable(folder)
    r = hv("fake-sysfs", "tx2", folder)
    assert r.exit_code == 2, r.output
    assert r.output == (
        f"hidvfs: error: DIRECTORY {folder}: is not writable (permission denied); choose "
        "another DIRECTORY\n"
    )
    r = hv("fake-sysfs", "tx2", folder / "sub" / "tree")
    assert r.exit_code == 2 and r.output == (
        f"hidvfs: error: DIRECTORY {folder / 'sub' / 'tree'}: its folder {folder / 'sub'} cannot "
        f"be made ({folder} is not writable); choose another DIRECTORY\n"
    )
    assert list(folder.iterdir()) == []


# -- for real, as nobody -------------------------------------------------------------------------


@pytest.fixture
def shared(tmp_path):
    """A sticky, world-writable folder outside root's private tmp_path (as /tmp)."""
    top = Path(tempfile.mkdtemp(prefix="hidvfs-targets-"))
    top.chmod(0o1777)
    yield top
    shutil.rmtree(top)


def test_as_nobody_each_output_that_cannot_be_written_over_is_one_line(nobody, shared):
    def hidvfs(*args) -> tuple[int, str]:
        env = dict(os.environ, HOME=str(shared))
        p = subprocess.run(
            [*nobody, "-m", "tools.cli", *map(str, args)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        return p.returncode, p.stderr

    status, csv, trace = shared / "st.json", shared / "x.csv", shared / "x.jsonl.gz"
    for path in (status, csv, trace):
        path.write_text("")  # root's, 0644
    (shared / "tx2").mkdir()  # root's, 0755
    sim = ["daemon", "--sim", "tx2", "--duration", "1", "--status-file"]
    assert hidvfs(*sim, status) == (
        2,
        f"hidvfs: error: {_not_replaceable('--status-file', status)}\n",
    )
    assert hidvfs("coordinator", "synth", "--jobs", "3", "--out", csv) == (
        2,
        f"hidvfs: error: {_not_replaceable('--out', csv)}\n",
    )
    assert hidvfs("fake-sysfs", "tx2", shared / "tx2") == (
        2,
        f"hidvfs: error: DIRECTORY {shared / 'tx2'}: is not writable (permission denied); "
        "choose another DIRECTORY\n",
    )
    assert hidvfs("fake-sysfs", "tx2", shared / "tree")[0] == 0  # nobody's own
    record = ["trace", "record", "--sysfs-root", shared / "tree", "--duration", "0.2", "--out"]
    assert hidvfs(*record, trace) == (2, f"hidvfs: error: {_not_writable('--out', trace)}\n")
    # the daemon on nobody's tree: a non-empty recording of root's is moved to .prev (a
    # rename in the sticky folder) before a new one is written
    trace.write_text("old")
    state = shared / "state"
    daemon = ["daemon", "--sysfs-root", shared / "tree", "--policy", "maxfreq"]
    daemon += ["--duration", "0.2", "--state-dir", state, "--socket", state / "s.sock"]
    code, err = hidvfs(*daemon, "--record", trace)
    assert code == 2, err
    assert err.splitlines()[-1] == f"hidvfs: error: {_not_replaceable('--record', trace)}"
    assert not state.exists()  # refused before anything was written
    # what is this user's passes (its own status file, made then replaced)
    mine = shared / "mine.json"
    assert hidvfs(*sim, mine)[0] == 0 and hidvfs(*sim, mine)[0] == 0
    assert hidvfs(*record, shared / "mine.jsonl")[0] == 0
    # and root's files are as they were
    assert status.read_text() == "" and csv.read_text() == "" and trace.read_text() == "old"
    assert list((shared / "tx2").iterdir()) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a link to another user")
def test_root_synth_refuses_another_users_link_before_writing(sticky):
    """Root's `coordinator synth --out LINK` wrote, by rename, over the file another user's
    link named (it followed the link with realpath): a root 0600 file became a CSV."""
    victim = sticky.parent / "victim"
    victim.write_text("secret\n")
    victim.chmod(0o600)
    link = sticky / "trace.csv"
    link.symlink_to(victim)
    os.lchown(link, 65534, 65534)
    r = hv("coordinator", "synth", "--out", link, "--jobs", "3")
    assert r.exit_code == 2, r.output
    assert "is a symbolic link that another user owns or could have placed" in r.output
    assert r.output.startswith(f"hidvfs: error: --out {link}: ")
    assert victim.read_text() == "secret\n" and link.is_symlink()


def test_synth_through_a_users_own_link_writes_its_target(tmp_path):
    target = tmp_path / "data" / "t.csv"
    target.parent.mkdir()
    link = tmp_path / "t.csv"
    link.symlink_to(target)
    r = hv("coordinator", "synth", "--out", link, "--jobs", "3")
    assert r.exit_code == 0, r.output
    assert link.is_symlink() and len(target.read_text().splitlines()) >= 3


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a link to another user")
def test_another_users_link_to_a_stream_is_refused_up_front_naming_the_option(sticky):
    """It passed the up-front check as a stream and failed at the first write, as "the
    output ...: is a symbolic link" (no option named) or a raw EACCES."""
    link = sticky / "s.json"
    link.symlink_to("/dev/stdout")
    os.lchown(link, 65534, 65534)
    with pytest.raises(OutputFolderError) as err:
        ensure_parent("--status-file", link, replace="rename")
    assert str(err.value).startswith(f"--status-file {link}: is a symbolic link that another")
    ensure_parent("--status-file", "/dev/stdout", replace="rename")  # root's own link passes
