"""Files a root daemon writes where another user can reach: the atomic writer's temporary
(F3), the status file's mode (F7), a recording (F5) and a --sysfs-root tree (F6).

Each case plants what the audit's unprivileged user planted, at the moment it mattered (a
symlink renamed over the temporary name between its write and the chmod; a dangling link
where the recording goes; a link inside the tree), and checks that root's write lands
nowhere but where it should."""

from __future__ import annotations

import gzip
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from platforms import atomicfile, outputs
from platforms.atomicfile import write_text_atomic
from platforms.clock import VirtualClock
from platforms.faketree import write_fake_tree
from platforms.outputs import OutputFileError, open_output
from platforms.spec import load_board
from platforms.sysfs import DirSysfs, untrusted_tree_entry
from platforms.trace import TickRecorder, keep_previous_recording, read_trace
from platforms.trace_io import TraceHeader, TraceWriter

ROOT = Path(__file__).resolve().parents[2]
NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown to another user")


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def _header() -> TraceHeader:
    return TraceHeader(board="tx2", period_s=0.1, files=["a"])


# -- F3: the atomic writer's mode goes on its descriptor -----------------------------------


def test_a_symlink_swapped_in_for_the_temporary_does_not_take_the_chmod(tmp_path, monkeypatch):
    """The audit's race, made deterministic: while the temporary is being written, the
    folder's other user renames a symlink to a root file over its name. A chmod by name
    afterwards made that file 0666."""
    victim = tmp_path / "victim"
    victim.write_text("root's\n")
    victim.chmod(0o600)
    folder = tmp_path / "udir"
    folder.mkdir()
    real_fsync = os.fsync

    def swap_then_fsync(fd):
        (tmp,) = [n for n in os.listdir(folder) if n.startswith(".st.json.")]
        os.symlink(victim, folder / "planted")
        os.rename(folder / "planted", folder / tmp)
        return real_fsync(fd)

    monkeypatch.setattr(atomicfile.os, "fsync", swap_then_fsync)
    write_text_atomic(folder / "st.json", "{}\n", mode=0o666)
    monkeypatch.undo()
    assert _mode(victim) == 0o600  # it became 0666
    assert victim.read_text() == "root's\n"
    # the rename moved the user's link to the name: their folder, their link; root's write
    # went to the temporary it made, never through the link
    assert (folder / "st.json").is_symlink()


def test_the_mode_is_set_before_the_file_appears_and_never_by_name(tmp_path, monkeypatch):
    def no_chmod_by_name(*a, **kw):
        raise AssertionError("chmod by name")

    monkeypatch.setattr(atomicfile.os, "chmod", no_chmod_by_name)
    target = tmp_path / "unit"
    write_text_atomic(target, "x\n", mode=0o640)
    assert _mode(target) == 0o640 and target.read_text() == "x\n"
    assert os.listdir(tmp_path) == ["unit"]


# -- F7: the status file's mode is copied only from root's own file, narrowed --------------


def test_the_status_mode_is_narrowed_and_never_setuid_or_writable_by_others(tmp_path):
    from daemon.statusfile import status_mode, write_status

    path = tmp_path / "st.json"
    assert status_mode(str(path)) == 0o644  # none yet
    for have, want in ((0o600, 0o600), (0o640, 0o640), (0o644, 0o644), (0o664, 0o644),
                       (0o4777, 0o644), (0o2666, 0o644), (0o1777, 0o644)):  # fmt: skip
        path.write_text("{}")
        os.chmod(path, have)
        write_status(str(path), {"ok": True})
        assert _mode(path) == want, oct(have)
        assert json.loads(path.read_text()) == {"ok": True}


def test_the_status_mode_does_not_follow_a_symlink(tmp_path):
    from daemon.statusfile import write_status

    other = tmp_path / "other"
    other.write_text("x")
    other.chmod(0o600)
    path = tmp_path / "st.json"
    path.symlink_to(other)
    write_status(str(path), {"ok": True})
    assert _mode(path) == 0o644 and not path.is_symlink()  # the default, not the target's
    assert other.read_text() == "x" and _mode(other) == 0o600


@needs_root
def test_a_status_file_another_user_made_gives_root_no_mode(tmp_path):
    """The audit: a 4777 st.json pre-made in a 1777 folder became root's -rwsrwxrwx file."""
    from daemon.statusfile import write_status

    folder = tmp_path / "shared"
    folder.mkdir()
    folder.chmod(0o1777)
    path = folder / "st.json"
    path.write_text("{}")
    os.chown(path, NOBODY, NOBODY)
    os.chmod(path, 0o4777)
    write_status(str(path), {"ok": True})
    st = os.stat(path)
    assert st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o644
    os.chown(path, NOBODY, NOBODY)  # even a narrow mode of theirs is not taken
    os.chmod(path, 0o600)
    write_status(str(path), {"ok": False})
    assert _mode(path) == 0o644


# -- F5: a recording never goes through another user's link --------------------------------


def _open_folder(tmp_path) -> Path:
    """A folder another user can write (as the audit's ``udir``): 0777 without sticky."""
    folder = tmp_path / "udir"
    folder.mkdir()
    folder.chmod(0o777)
    return folder


@pytest.mark.parametrize("name", ["rec.jsonl", "rec.jsonl.gz"])
def test_a_dangling_link_where_the_recording_goes_creates_nothing(tmp_path, name):
    folder = _open_folder(tmp_path)
    target = tmp_path / "anything"
    (folder / name).symlink_to(target)
    sysfs = DirSysfs(str(tmp_path / "no-tree"))
    with pytest.raises(OutputFileError, match=r"--record .*: is a symbolic link"):
        TickRecorder(sysfs, VirtualClock(), folder / name, board="tx2", period_s=0.1, policy="x")
    assert not target.exists()  # root created it with the trace in it


def test_a_link_to_an_existing_file_is_not_written_through(tmp_path):
    folder = _open_folder(tmp_path)
    victim = tmp_path / "victim"
    victim.write_text("")  # empty: keep_previous_recording does not move it away
    (folder / "rec.jsonl").symlink_to(victim)
    assert keep_previous_recording(folder / "rec.jsonl") is None
    with pytest.raises(OutputFileError, match="symbolic link"):
        TraceWriter(folder / "rec.jsonl", _header(), option="--record").open()
    assert victim.read_text() == ""


@needs_root
def test_another_users_link_is_refused_even_in_roots_folder(tmp_path):
    """A link owned by another uid is theirs wherever it is (a folder root later took)."""
    victim = tmp_path / "victim"
    victim.write_text("keep")
    link = tmp_path / "rec.jsonl"
    link.symlink_to(victim)
    os.chown(link, NOBODY, NOBODY, follow_symlinks=False)
    with pytest.raises(OutputFileError, match="symbolic link"):
        open_output(link, "--record")
    assert victim.read_text() == "keep"


def test_a_link_that_is_not_a_recording_is_not_kept_as_one(tmp_path):
    """keep_previous_recording followed the link (stat) and moved it to .prev; a symlink is
    nothing to keep (the writer decides whether it may write through it)."""
    data = tmp_path / "data"
    data.write_text("not a recording")
    (tmp_path / "rec.jsonl").symlink_to(data)
    assert keep_previous_recording(tmp_path / "rec.jsonl") is None
    assert (tmp_path / "rec.jsonl").is_symlink()
    assert not (tmp_path / "rec.prev.jsonl").exists()


def test_a_file_with_another_hard_link_is_not_overwritten(tmp_path):
    folder = _open_folder(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("")
    os.link(elsewhere, folder / "rec.jsonl")
    with pytest.raises(OutputFileError, match="other hard link"):
        open_output(folder / "rec.jsonl", "--record")
    elsewhere.write_text("precious")
    with pytest.raises(OutputFileError, match="other hard link"):
        open_output(folder / "rec.jsonl", "--record")
    assert elsewhere.read_text() == "precious"  # not truncated before the refusal


def test_a_block_device_is_refused(tmp_path, monkeypatch):
    real = os.fstat

    def as_block_device(fd):
        st = real(fd)
        return os.stat_result((stat.S_IFBLK | 0o660,) + tuple(st)[1:])

    monkeypatch.setattr(outputs.os, "fstat", as_block_device)
    with pytest.raises(OutputFileError, match="--record .*: is a block device"):
        open_output(tmp_path / "rec.jsonl", "--record")


def test_a_regular_file_a_users_own_link_and_a_device_still_record(tmp_path):
    out = tmp_path / "r.jsonl"
    out.write_bytes(b"x" * 5000)  # an existing file is truncated, as open(path, "wb") did
    with TraceWriter(out, _header()) as w:
        w.write_sample(0.0, {"a": "1"})
    assert len(read_trace(out).samples) == 1 and out.stat().st_size < 5000
    link = tmp_path / "mine.jsonl"  # this user's link in this user's own folder
    link.symlink_to(tmp_path / "target.jsonl")
    with TraceWriter(link, _header()) as w:
        w.write_sample(0.0, {"a": "1"})
    assert len(read_trace(tmp_path / "target.jsonl").samples) == 1
    with TraceWriter("/dev/null", _header()) as w:
        w.write_sample(0.0, {"a": "1"})


def test_a_gzip_recording_through_the_descriptor_is_as_before(tmp_path):
    out = tmp_path / "r.jsonl.gz"
    w = TraceWriter(out, _header()).open()
    w.write_sample(0.0, {"a": "1"})
    assert w.size() == out.stat().st_size > 0
    w.close()
    w.close()  # once closed, closed
    raw = out.read_bytes()
    assert raw[3] & 0x08 and raw[10:].split(b"\0", 1)[0] == b"r.jsonl"  # the name in the header
    assert len(read_trace(out).samples) == 1
    with gzip.open(out) as f:
        assert f.read().count(b"\n") == 2


@pytest.mark.parametrize("to", ["file", "pipe"])
def test_dev_stdout_still_records(tmp_path, to):
    code = (
        "from platforms.trace_io import TraceHeader, TraceWriter\n"
        "from platforms.trace import keep_previous_recording\n"
        "assert keep_previous_recording('/dev/stdout') is None\n"
        "w = TraceWriter('/dev/stdout', TraceHeader(board='tx2', period_s=0.1, files=[]))\n"
        "w.open()\n"
        "w.write_sample(0.0, {'a': '1'}); w.close()\n"
    )
    if to == "file":
        out = tmp_path / "out.jsonl"
        out.write_text("what was there\n")
        with open(out, "wb") as f:
            subprocess.run([sys.executable, "-c", code], stdout=f, check=True, cwd=ROOT, timeout=60)
        text = out.read_bytes()
    else:
        text = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, check=True, cwd=ROOT, timeout=60
        ).stdout
    assert text.count(b"\n") == 2 and text.startswith(b'{"format":"hidvfs-trace"')


# -- F6: a root daemon refuses a --sysfs-root tree another user can change -----------------


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "tree"
    write_fake_tree(load_board("tx2"), root)
    return root


def test_a_tree_is_never_refused_to_its_own_user_nor_the_live_root(tree):
    assert untrusted_tree_entry(tree, euid=1000) is None
    assert untrusted_tree_entry("/", euid=0) is None


@needs_root
def test_roots_own_fake_tree_passes(tree):
    assert untrusted_tree_entry(tree) is None
    tree.chmod(0o775)  # group root: root's own
    assert untrusted_tree_entry(tree) is None


@needs_root
def test_a_tree_another_user_owns_or_can_write_is_named(tree, tmp_path):
    pol = tree / "devices/system/cpu/cpufreq/policy0"
    link = pol / "scaling_setspeed"
    link.unlink()
    link.symlink_to(tmp_path / "rootonly")
    assert untrusted_tree_entry(tree) is None  # root's own link: root's choice
    os.chown(link, NOBODY, NOBODY, follow_symlinks=False)
    assert untrusted_tree_entry(tree) == f"{link} is owned by uid {NOBODY}"
    os.chown(link, 0, 0, follow_symlinks=False)
    pol.chmod(0o1777)  # sticky does not help inside: a new name there is read
    assert untrusted_tree_entry(tree) == (
        f"{pol} is a folder writable by others (sticky, but inside the tree a new name is read)"
    )
    pol.chmod(0o755)
    os.chown(pol, 0, NOBODY)
    pol.chmod(0o775)
    assert untrusted_tree_entry(tree) == f"{pol} is a folder writable by group {NOBODY}"
    pol.chmod(0o755)
    os.chown(tree, NOBODY, NOBODY)
    assert untrusted_tree_entry(tree) == f"{tree} is owned by uid {NOBODY}"


@needs_root
def test_the_folders_above_the_tree_count(tmp_path):
    above = tmp_path / "above"
    root = above / "tree"
    write_fake_tree(load_board("tx2"), root)
    above.chmod(0o777)  # the tree can be renamed away and another put in its place
    assert untrusted_tree_entry(root) == f"{above} is a folder writable by others"
    above.chmod(0o1777)  # sticky, like /tmp: root's tree in it stays root's
    assert untrusted_tree_entry(root) is None
    above.chmod(0o755)
    link = tmp_path / "link"  # given through another user's link
    link.symlink_to(root)
    os.chown(link, NOBODY, NOBODY, follow_symlinks=False)
    assert untrusted_tree_entry(link) == f"{link} is owned by uid {NOBODY}"


@needs_root
def test_the_daemon_refuses_a_tree_with_a_planted_link_before_any_write(tree, tmp_path):
    from daemon.service import DaemonError, run_live

    rootonly = tmp_path / "rootonly"
    rootonly.write_text("root only\n")
    rootonly.chmod(0o600)
    link = tree / "devices/system/cpu/cpufreq/policy0/scaling_setspeed"
    link.unlink()
    link.symlink_to(rootonly)
    os.chown(link, NOBODY, NOBODY, follow_symlinks=False)
    state = tmp_path / "state"
    with pytest.raises(DaemonError, match=rf"--sysfs-root {tree}: {link} is owned by uid"):
        run_live(
            sysfs_root=str(tree),
            policy="maxfreq",
            period_ms=20,
            state_dir=str(state),
            duration_s=0.2,
            socket_path=str(tmp_path / "s.sock"),
            record=str(tmp_path / "r.jsonl"),
        )
    assert rootonly.read_text() == "root only\n"  # it held the frequency the daemon wrote
    assert not (tmp_path / "r.jsonl").exists() and not state.exists()


# -- the other commands that take --sysfs-root, and a crashed run's restore -------------------


@pytest.mark.skipif(os.geteuid() != 0, reason="the check is for root")
@pytest.mark.parametrize(
    "args",
    [
        ["probe"],
        ["trace", "record", "--out", "{tmp}/t.jsonl", "--duration", "0.1"],
        ["profile", "measure", "--name", "x", "--store", "{tmp}/p.json", "--", "true"],
    ],
)
def test_root_commands_refuse_a_tree_another_user_can_change(tmp_path, args):
    from click.testing import CliRunner

    from tools.cli import cli

    tree = tmp_path / "tree"
    write_fake_tree(load_board("tx2"), tree)
    victim = next(tree.glob("**/scaling_setspeed"))
    os.chown(victim, 65534, 65534)  # a file another user owns: they can make it anything
    argv = [a.replace("{tmp}", str(tmp_path)) for a in args]
    r = CliRunner().invoke(cli, [*argv[:2], "--sysfs-root", str(tree), *argv[2:]])
    assert r.exit_code == 2 and "owned by uid 65534" in r.output, r.output
    assert "--sysfs-root" in r.output


@pytest.mark.skipif(os.geteuid() != 0, reason="the check is for root")
def test_a_crashed_runs_restore_is_not_written_into_a_tree_another_user_took(tmp_path):
    """The restore of a crashed run comes before the start's other checks: the tree is
    judged before it too."""
    from daemon.restore import FILE_NAME as SNAPSHOT_NAME
    from daemon.service import DaemonError, run_live

    tree, state = tmp_path / "tree", tmp_path / "state"
    write_fake_tree(load_board("tx2"), tree)
    state.mkdir(mode=0o700)
    (state / SNAPSHOT_NAME).write_text("{}")  # a crashed run's snapshot
    os.chown(next(tree.glob("**/scaling_governor")), 65534, 65534)
    with pytest.raises(DaemonError, match="owned by uid 65534"):
        run_live(sysfs_root=str(tree), policy="maxfreq", state_dir=str(state), duration_s=0.1)
    assert (state / SNAPSHOT_NAME).read_text() == "{}"  # nothing restored through it


def test_the_profile_store_keeps_a_mode_only_from_its_own_regular_file(tmp_path):
    from agents import deadlines
    from platforms.observation import JobProfile

    prof = JobProfile("fib", 1.0, 0.5, 0.2, 1.0, 2035200, 4)
    path = tmp_path / "p.json"
    path.write_text("")
    os.chmod(path, 0o4777)
    deadlines.update(path, "tx2", prof)
    assert oct(path.stat().st_mode & 0o7777) == "0o644"  # narrowed, setuid gone
    target = tmp_path / "target.json"
    target.write_text("")
    os.chmod(target, 0o600)
    link = tmp_path / "link.json"
    link.symlink_to(target)
    deadlines.update(link, "tx2", prof)
    assert not link.is_symlink() and oct(link.stat().st_mode & 0o777) == "0o644"
    assert target.read_text() == ""  # the link's target untouched


# -- a root-owned link in the tree that leads out of it (a root copy of a user's tree) --------


def _theirs(path: Path, mode: int = 0o755) -> Path:
    """A folder another user owns (as the audit's ``u`` and ``u/evil``)."""
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, NOBODY, NOBODY)
    path.chmod(mode)
    return path


def _relink(tree: Path, target) -> Path:
    link = tree / "devices/system/cpu/cpufreq/policy0/scaling_setspeed"
    link.unlink()
    link.symlink_to(target)  # root's own link, as `cp -r` by root leaves it
    return link


@needs_root
def test_a_root_link_through_another_users_folder_is_refused(tree, tmp_path):
    """The review's repro: root `cp -r` of a user's tree whose scaling_setspeed links into
    their folder; later their own link there points at a root-only file. Root's daemon wrote
    a frequency into it, and trace record read it into a 0644 trace."""
    from daemon.service import DaemonError, run_live

    rootonly = tmp_path / "rootonly"
    rootonly.write_text("root only\n")
    rootonly.chmod(0o600)
    evil = _theirs(_theirs(tmp_path / "u") / "evil")
    (evil / "s").symlink_to(rootonly)
    os.chown(evil / "s", NOBODY, NOBODY, follow_symlinks=False)
    link = _relink(tree, evil / "s")
    assert untrusted_tree_entry(tree) == (
        f"{link} links to {rootonly} by way of {tmp_path / 'u'}, which is owned by uid {NOBODY}"
    )
    with pytest.raises(DaemonError, match=rf"--sysfs-root {tree}: {link} links to {rootonly}"):
        run_live(sysfs_root=str(tree), policy="maxfreq", period_ms=20,
                 state_dir=str(tmp_path / "state"), duration_s=0.2,
                 socket_path=str(tmp_path / "s.sock"), record=str(tmp_path / "r.jsonl"))  # fmt: skip
    assert rootonly.read_text() == "root only\n"
    assert not (tmp_path / "r.jsonl").exists()


@needs_root
def test_where_a_link_out_of_the_tree_leads_is_judged(tree, tmp_path):
    rootonly = tmp_path / "rootonly"
    rootonly.write_text("0\n")
    link = _relink(tree, rootonly)
    assert untrusted_tree_entry(tree) is None  # through root's folders to root's file
    os.chown(rootonly, NOBODY, NOBODY)  # the target itself is theirs
    assert (
        untrusted_tree_entry(tree) == f"{link} links to {rootonly}, which is owned by uid {NOBODY}"
    )
    os.chown(rootonly, 0, 0)
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)  # like /tmp: fine to pass through, but not for a link of theirs in it
    hop = sticky / "hop"
    hop.symlink_to(rootonly)
    os.chown(hop, NOBODY, NOBODY, follow_symlinks=False)
    _relink(tree, hop)
    assert untrusted_tree_entry(tree) == (
        f"{link} links to {rootonly} by way of {hop}, which is owned by uid {NOBODY}"
    )
    os.chown(hop, 0, 0, follow_symlinks=False)  # root's link in a sticky folder stays root's
    assert untrusted_tree_entry(tree) is None
    _relink(tree, sticky / "not-yet")  # a missing name there: anyone may make it
    assert untrusted_tree_entry(tree) == (
        f"{link} links to {sticky / 'not-yet'} by way of {sticky}, which is a folder writable "
        "by others (sticky, but anyone may make not-yet there)"
    )
    outside = tmp_path / "outside"  # a folder out of the tree: what is under it is judged
    (outside / "deeper").mkdir(parents=True)
    (outside / "deeper" / "f").write_text("1\n")
    link.unlink()
    link.symlink_to(outside)
    assert untrusted_tree_entry(tree) is None
    os.chown(outside / "deeper" / "f", NOBODY, NOBODY)
    assert untrusted_tree_entry(tree) == f"{outside / 'deeper' / 'f'} is owned by uid {NOBODY}"


@needs_root
def test_the_trees_own_name_is_judged_along_every_link(tree, tmp_path):
    """root link -> their link in a sticky folder -> the tree: they can repoint the middle one
    (the old check looked only at the name given and where it ended)."""
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    hop = sticky / "hop"
    hop.symlink_to(tree)
    os.chown(hop, NOBODY, NOBODY, follow_symlinks=False)
    given = tmp_path / "given"
    given.symlink_to(hop)
    assert untrusted_tree_entry(given) == f"{hop} is owned by uid {NOBODY}"
    os.chown(hop, 0, 0, follow_symlinks=False)
    assert untrusted_tree_entry(given) is None


# -- a copied root filesystem: only its sys/ and proc/ are read, so only they are judged ------


@pytest.fixture
def rootfs(tmp_path):
    fake, rootfs = tmp_path / "fake", tmp_path / "rootfs"
    write_fake_tree(load_board("tx2"), fake)
    rootfs.mkdir()
    os.rename(fake / "proc", rootfs / "proc")
    os.rename(fake, rootfs / "sys")
    return rootfs


@needs_root
def test_a_copied_root_filesystem_is_judged_by_its_sys_and_proc_only(rootfs):
    from platforms import cpufreq

    _theirs(rootfs / "home" / "user")  # a user's home and a /tmp are never read
    (rootfs / "tmp").mkdir()
    (rootfs / "tmp").chmod(0o1777)
    assert cpufreq.list_policies(DirSysfs(rootfs))  # read as a full root: sys/, proc/
    assert untrusted_tree_entry(rootfs) is None  # was: home/user is owned by uid 65534
    stat_file = rootfs / "proc" / "stat"
    os.chown(stat_file, NOBODY, NOBODY)
    assert untrusted_tree_entry(rootfs) == f"{stat_file} is owned by uid {NOBODY}"
    os.chown(stat_file, 0, 0)
    gov = next((rootfs / "sys").glob("**/scaling_governor"))
    os.chown(gov, NOBODY, NOBODY)
    assert untrusted_tree_entry(rootfs) == f"{gov} is owned by uid {NOBODY}"
    os.chown(gov, 0, 0)
    rootfs.chmod(0o777)  # the folder above sys/ and proc/ counts, as above any tree
    assert untrusted_tree_entry(rootfs) == f"{rootfs} is a folder writable by others"


# -- /dev/fd/N (a link in a folder that is itself a link) and bash's >(cmd) ------------------


def _write_to(path: str, data: bytes) -> None:
    with open_output(path, "--out") as f:
        f.write(data)


def test_dev_fd_n_is_written_as_stdout_was(tmp_path):
    r, w = os.pipe()
    try:
        _write_to(f"/dev/fd/{w}", b"through /dev/fd\n")
    finally:
        os.close(w)
    with os.fdopen(r, "rb") as f:
        assert f.read() == b"through /dev/fd\n"


@needs_root
def test_dev_fd_n_is_written_by_a_user_too():
    """As a user (a forked child that dropped root); its pipe made after, so it can reopen it."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            r, w = os.pipe()
            _write_to(f"/dev/fd/{w}", b"as nobody\n")
            os.close(w)
            code = 0 if os.read(r, 100) == b"as nobody\n" else 3
        finally:
            os._exit(code)
    assert os.waitpid(pid, 0)[1] == 0


def test_bash_process_substitution_records(tmp_path):
    tree = tmp_path / "tree"
    write_fake_tree(load_board("tx2"), tree)
    cmd = [
        "bash", "-c", '"$0" -m tools.cli trace record --sysfs-root "$1" --duration 0.15 '
        '--period-ms 50 --out >(cat)', sys.executable, str(tree),
    ]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(b'{"format":"hidvfs-trace"'), (out.stdout[:200], out.stderr)


@needs_root
def test_a_link_in_a_folder_reached_through_a_link_is_judged_where_it_resolves(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (real / "out").symlink_to(tmp_path / "target")
    via = tmp_path / "via"
    via.symlink_to(real)
    _write_to(str(via / "out"), b"ok")  # root's folder through root's link: as /dev/fd
    assert (tmp_path / "target").read_bytes() == b"ok"
    os.chown(via, NOBODY, NOBODY, follow_symlinks=False)  # their link: it may lead anywhere
    with pytest.raises(OutputFileError, match="symbolic link"):
        _write_to(str(via / "out"), b"no")
    os.chown(via, 0, 0, follow_symlinks=False)
    real.chmod(0o777)  # the folder it resolves to, writable by others
    with pytest.raises(OutputFileError, match="symbolic link"):
        _write_to(str(via / "out"), b"no")
    real.chmod(0o755)
    tmp_path.chmod(0o777)  # the folder holding the folder's link, writable by others
    try:
        with pytest.raises(OutputFileError, match="symbolic link"):
            _write_to(str(via / "out"), b"no")
    finally:
        tmp_path.chmod(0o755)
    assert (tmp_path / "target").read_bytes() == b"ok"


# -- the profile store's lock file ------------------------------------------------------------


def test_the_store_lock_file_is_not_opened_through_a_link(tmp_path):
    from agents import deadlines
    from platforms.observation import JobProfile

    prof = JobProfile("fib", 1.0, 0.5, 0.2, 1.0, 2035200, 4)
    folder = _open_folder(tmp_path)
    store = folder / "p.json"
    made = tmp_path / "made-by-root"
    (folder / "p.json.lock").symlink_to(made)
    with pytest.raises(ValueError, match=rf"{store}: its lock file {store}.lock is a symbolic"):
        deadlines.update(store, "tx2", prof)
    assert not made.exists() and not store.exists()  # root created the link's target
    (folder / "p.json.lock").unlink()
    deadlines.update(store, "tx2", prof)  # a lock file of its own: as before
    assert _mode(folder / "p.json.lock") == 0o644 & ~_umask()
    (folder / "p.json.lock").unlink()
    (folder / "p.json.lock").symlink_to(made)
    with pytest.raises(ValueError, match="is a symbolic link"):
        deadlines.remove(store, "fib")
    assert not made.exists()
    assert [p.name for _, p in deadlines.load(store)] == ["fib"]  # nothing removed


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
