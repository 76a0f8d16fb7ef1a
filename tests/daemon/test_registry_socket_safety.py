"""The registry socket is set up without following a path someone else can change (audit F4):
born with its mode, its group set without following a symlink, checked to be the socket just
bound before it is served; as root, a folder another user can write is refused."""

from __future__ import annotations

import grp
import os
import shutil
import socket
import stat
import tempfile
import time

import pytest

from daemon.client import RegistryClient
from daemon.registry import JobRegistry
from daemon.registryserver import RegistryServer, RegistryStartError

IS_ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not IS_ROOT, reason="the folder check applies to root")
OWN_GROUP = grp.getgrgid(os.getegid()).gr_name


@pytest.fixture
def folder():
    """A short folder (AF_UNIX paths are short) that the test may loosen, removed after."""
    d = tempfile.mkdtemp(prefix="hvs", dir="/tmp")
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def victim(folder):
    """A file only its owner may read, outside the socket's folder."""
    d = tempfile.mkdtemp(prefix="hvv", dir="/tmp")
    path = os.path.join(d, "secret")
    with open(path, "w") as f:
        f.write("secret")
    os.chmod(path, 0o600)
    yield path
    shutil.rmtree(d, ignore_errors=True)


def _reg() -> JobRegistry:
    return JobRegistry(now=time.monotonic, alive=lambda pid: True)


def _swap_for_link(path: str, target: str) -> None:
    os.unlink(path)
    os.symlink(target, path)


def _unchanged(path: str, before: os.stat_result) -> bool:
    after = os.stat(path)
    return (after.st_mode, after.st_uid, after.st_gid) == (
        before.st_mode,
        before.st_uid,
        before.st_gid,
    )


def test_the_socket_is_born_with_its_mode_and_group_set_without_chmod(folder, monkeypatch):
    path = os.path.join(folder, "s.sock")

    def no_chmod(*a, **kw):
        raise AssertionError("chmod by path follows a symlink put in the socket's place")

    monkeypatch.setattr(os, "chmod", no_chmod)
    with RegistryServer(_reg(), path, group=OWN_GROUP, mode=0o660):
        st = os.lstat(path)
        assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o660
        assert st.st_gid == os.getegid()
        RegistryClient(path).status()
    with RegistryServer(_reg(), path, group=None):
        assert stat.S_IMODE(os.lstat(path).st_mode) == 0o600


def test_a_socket_every_user_may_write_is_served_with_a_warning(folder, caplog):
    """socket.mode 0666 lets every local user register jobs, HI ones included: the operator's
    choice, kept, but it was taken without a word."""
    path = os.path.join(folder, "s.sock")
    with caplog.at_level("WARNING", logger="hidvfs"):
        with RegistryServer(_reg(), path, group=OWN_GROUP, mode=0o666):
            assert stat.S_IMODE(os.lstat(path).st_mode) == 0o666
        said = [r.getMessage() for r in caplog.records if "socket_world_writable" in r.getMessage()]
        assert len(said) == 1 and "mode=0666" in said[0] and "0660" in said[0], said
        caplog.clear()
        with RegistryServer(_reg(), path, group=OWN_GROUP, mode=0o660):
            pass
        assert not [r for r in caplog.records if "socket_world_writable" in r.getMessage()]


def test_a_socket_swapped_for_a_symlink_before_its_group_is_set_is_refused(
    folder, victim, monkeypatch
):
    """The audit's reproduction: the socket replaced by a link to a root 0600 file between the
    bind and the chown used to make that file 0660 and the socket's group."""
    path = os.path.join(folder, "s.sock")
    before = os.stat(victim)
    real_chown = os.chown

    def swapping_chown(p, uid, gid, **kw):
        if p == path:
            _swap_for_link(path, victim)
        return real_chown(p, uid, gid, **kw)

    monkeypatch.setattr(os, "chown", swapping_chown)
    with pytest.raises(RegistryStartError, match="replaced it; refusing to serve"):
        RegistryServer(_reg(), path, group=OWN_GROUP, mode=0o660).start()
    monkeypatch.undo()
    assert _unchanged(victim, before)
    assert os.path.islink(path)  # left as found: not ours to remove


def test_a_socket_swapped_right_after_the_bind_is_refused(folder, victim, monkeypatch):
    path = os.path.join(folder, "s.sock")
    before = os.stat(victim)
    real_umask = os.umask
    calls = []

    def swapping_umask(mask):
        calls.append(mask)
        if len(calls) == 2:  # restoring the umask after the bind
            _swap_for_link(path, victim)
        return real_umask(mask)

    monkeypatch.setattr(os, "umask", swapping_umask)
    for group in (OWN_GROUP, None):
        calls.clear()
        with pytest.raises(RegistryStartError, match="a symlink"):
            RegistryServer(_reg(), path, group=group, mode=0o660).start()
        os.unlink(path)
    monkeypatch.undo()
    assert _unchanged(victim, before)


def test_a_hard_link_to_another_socket_is_not_taken_for_ours(folder, monkeypatch):
    path = os.path.join(folder, "s.sock")
    other = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    other_path = os.path.join(folder, "other.sock")
    other.bind(other_path)
    try:
        real_chown = os.chown

        def linking_chown(p, uid, gid, **kw):
            if p == path:
                os.unlink(path)
                os.link(other_path, path)
            return real_chown(p, uid, gid, **kw)

        monkeypatch.setattr(os, "chown", linking_chown)
        with pytest.raises(RegistryStartError, match="2 link"):
            RegistryServer(_reg(), path, group=OWN_GROUP, mode=0o660).start()
    finally:
        other.close()


@needs_root
@pytest.mark.parametrize(
    "owner, mode, why",
    [
        (65534, 0o755, "it belongs to uid 65534, not root"),
        (0, 0o777, "its group and every user can write it"),
        (0, 0o775, "its group can write it"),
        (0, 0o757, "every user can write it"),
    ],
)
def test_root_refuses_a_socket_folder_another_user_can_write(folder, owner, mode, why):
    os.chown(folder, owner, -1)
    os.chmod(folder, mode)
    path = os.path.join(folder, "s.sock")
    with pytest.raises(RegistryStartError, match=f"refusing the socket folder {folder}: {why}"):
        RegistryServer(_reg(), path, group=None).start()
    assert not os.path.lexists(path)


@needs_root
def test_root_takes_a_sticky_shared_folder_and_its_own(folder):
    for mode in (0o1777, 0o755, 0o700):
        os.chmod(folder, mode)
        path = os.path.join(folder, "s.sock")
        with RegistryServer(_reg(), path, group=None):
            RegistryClient(path).status()
    with RegistryServer(_reg(), os.path.join(folder, "new", "s.sock"), group=None):
        assert stat.S_IMODE(os.stat(os.path.join(folder, "new")).st_mode) == 0o755
