"""A state dir another user made (under /tmp, where anyone can make one first) is refused
before root reads a record from it or writes into it: records there named the processes a
native campaign killed, and a planted symlink took root's write."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from daemon.statelock import StateLock
from platforms.liveprocs import kill_orphaned_jobs, record_job
from platforms.privatedir import StateDirUnsafe, check_private_dir, private_dir

NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown to another user")


def _victim() -> subprocess.Popen:
    return subprocess.Popen(["sleep", "30"], start_new_session=True)


def _start_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    return int(stat[stat.rindex(b")") + 2 :].split()[19])


def _plant(folder, pid: int, start: int) -> None:
    with open("/proc/sys/kernel/random/boot_id") as f:
        boot = f.read().strip()
    rec = {"pid": pid, "start": start, "owner": 999999, "owner_start": 1, "boot_id": boot}
    (folder / "kernel-999999.json").write_text(json.dumps(rec))


@needs_root
def test_records_in_another_users_folder_kill_nothing(tmp_path):
    folder = tmp_path / "hidvfs-native-0-x"
    folder.mkdir(mode=0o700)
    victim = _victim()
    try:
        _plant(folder, victim.pid, 0)
        os.chown(folder, NOBODY, NOBODY)
        with pytest.raises(StateDirUnsafe, match="belongs to uid 65534"):
            kill_orphaned_jobs(str(folder))
        time.sleep(0.1)
        assert victim.poll() is None  # still alive
    finally:
        victim.kill()
        victim.wait()


def test_a_record_of_this_users_folder_still_kills_what_a_dead_campaign_left(tmp_path):
    folder = private_dir(str(tmp_path / "state"))
    victim = _victim()
    try:
        _plant(tmp_path / "state", victim.pid, _start_ticks(victim.pid))
        assert kill_orphaned_jobs(folder) == [victim.pid]
        assert victim.wait(timeout=5) == -9
    finally:
        if victim.poll() is None:
            victim.kill()


@needs_root
def test_root_does_not_write_through_a_planted_symlink(tmp_path):
    folder = tmp_path / "state"
    folder.mkdir(mode=0o700)
    target = tmp_path / "precious"
    target.write_text("keep me")
    (folder / f"kernel-{os.getpid()}.json.tmp").symlink_to(target)
    os.chown(folder, NOBODY, NOBODY)
    with pytest.raises(StateDirUnsafe):
        record_job(str(folder), os.getpid())
    os.chown(folder, 0, 0)  # this user's own folder: the write goes to a fresh name
    record_job(str(folder), os.getpid())
    assert target.read_text() == "keep me"
    assert json.loads((folder / f"kernel-{os.getpid()}.json").read_text())["pid"] == os.getpid()


def test_a_folder_others_can_write_or_a_symlink_is_refused(tmp_path):
    open_ = tmp_path / "open"
    open_.mkdir()
    open_.chmod(0o777)
    with pytest.raises(StateDirUnsafe, match="writable by others"):
        check_private_dir(str(open_))
    with pytest.raises(StateDirUnsafe, match="writable by others"):
        StateLock(str(open_)).acquire()
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    with pytest.raises(StateDirUnsafe, match="a symlink"):
        check_private_dir(str(link))
    assert private_dir(str(tmp_path / "new")) and (tmp_path / "new").stat().st_mode & 0o777 == 0o700
