"""A running daemon's snapshot (daemon.restore.Session): only what hidvfs writes is given
back, and a policy that comes online during the run has its originals on disk before hidvfs
first writes it (boards.md 1.1, 5.1; daemons.md 10)."""

from __future__ import annotations

import json
import logging
import os

import pytest

from agents.policy import Decision
from daemon.actuator import Actuator
from daemon.restore import (
    Session,
    begin_session,
    load_snapshot,
    restore_snapshot,
    snapshot_path,
)
from platforms import paths
from platforms.errors import SysfsUnavailable
from platforms.faketree import write_fake_tree
from platforms.sense import Sensor
from platforms.spec import load_board
from platforms.sysfs import DirSysfs

LOG = logging.getLogger("test.restore.session")
TX2 = load_board("tx2")


class NoProcs:
    def machine_cpus(self):
        return None


def started(tmp_path, mode="all-online"):
    """A fake TX2, a session on it (attached to an actuator) and a way to run one decision."""
    fake = write_fake_tree(TX2, tmp_path / "tree", mode=mode)
    fs, state = fake.sysfs, tmp_path / "state"
    session = Session(fs, begin_session(fs, TX2, state, LOG), state, LOG, TX2)
    act = Actuator(fs, NoProcs())
    session.attach(act)

    def decide(**freqs):
        return act.apply(Decision(dict(freqs)), Sensor(TX2, fs).read(0.0))

    return fake, fs, state, session, decide


def on_disk(state, policy: int) -> dict:
    saved = json.loads(open(snapshot_path(state)).read())
    return next(p for p in saved["policies"] if p["policy"] == policy)


def test_attached_the_snapshot_marks_each_file_before_the_first_write(tmp_path):
    fake, fs, state, session, decide = started(tmp_path)
    assert on_disk(state, 0)["touched"] == []  # nothing written yet
    report = decide(a57=960000)
    assert not report.errors
    assert set(on_disk(state, 0)["touched"]) == {"scaling_governor", "scaling_setspeed"}
    assert on_disk(state, 1)["touched"] == []  # Denver: not decided, not written


def test_a_file_hidvfs_never_wrote_is_left_as_another_tool_set_it(tmp_path):
    fake, fs, state, session, decide = started(tmp_path)
    decide(a57=960000)
    mx = paths.policy_file(0, "scaling_max_freq")
    fs.write(mx, "1420800")  # nvpmodel's new ceiling
    report = restore_snapshot(fs, session.snapshot, LOG, state_dir=state)
    assert report.ok and fs.read(mx) == "1420800"
    assert fs.read(paths.policy_file(0, "scaling_governor")) == "schedutil"
    assert not os.path.exists(snapshot_path(state))


def test_a_policy_that_appears_mid_run_is_snapshotted_before_its_first_write(tmp_path):
    fake, fs, state, session, decide = started(tmp_path, mode="default")
    assert on_disk(state, 1)["governor"] is None  # Denver offline at the start
    fake.set_cpu_online(1, True)
    fake.set_cpu_online(2, True)
    original = fs.read(paths.policy_file(1, "scaling_governor"))
    seen: list[dict] = []
    real_write = fs.write

    def write(path, value):  # the originals must be on disk when the first write happens
        if path.startswith(paths.policy_dir(1) + "/"):
            seen.append(on_disk(state, 1))
        real_write(path, value)

    fs.write = write
    assert not decide(a57=960000, denver=960000).errors
    assert seen and seen[0]["governor"] == original and seen[0]["touched"]
    report = restore_snapshot(fs, session.snapshot, LOG, state_dir=state)
    assert report.ok
    assert fs.read(paths.policy_file(1, "scaling_governor")) == original


def test_a_policy_whose_originals_cannot_be_read_is_not_written(tmp_path):
    fake, fs, state, session, decide = started(tmp_path, mode="default")
    fake.set_cpu_online(1, True)
    gov1 = paths.policy_file(1, "scaling_governor")
    before = fs.read(gov1)
    real_read = fs.read

    def read(path):
        if path == gov1:
            raise SysfsUnavailable(path, "EAGAIN")
        return real_read(path)

    fs.read = read
    report = decide(a57=960000, denver=960000)
    assert any("cannot be read" in e and "policy1" in e for e in report.errors)
    fs.read = real_read
    assert fs.read(gov1) == before  # never written
    assert fs.read(paths.policy_file(0, "scaling_governor")) == "userspace"


def test_a_start_with_an_inactive_policy_folder_left_visible(tmp_path):
    """Some kernels keep ``policyN/`` of a policy whose CPUs are all offline, with files that
    do not read (boards.md 1.1, "verify on board"): the daemon writes nothing there, so the
    start goes on; the originals are read once the CPUs come online."""
    root = tmp_path / "tree"
    fake = write_fake_tree(TX2, root, mode="default")
    fake._write_policy(TX2.cluster("denver"), [], fake._rng)  # policy1/, no CPU online

    class Kernel(DirSysfs):
        def read(self, path):
            if path.startswith(paths.policy_dir(1) + "/"):
                raise SysfsUnavailable(path, "EBUSY")
            return super().read(path)

    snap = begin_session(Kernel(str(root)), TX2, tmp_path / "state", LOG)
    assert snap.policies[1].governor is None and snap.policies[1].cpus == (1, 2)


def test_an_original_that_does_not_decode_refuses_the_start(tmp_path):
    """A governor with a byte that is not UTF-8 would be given back as U+FFFD's bytes: it is
    no readable original, so the start is refused naming it, with nothing written or saved.
    Sensing still reads it (leniently), without an error."""
    from daemon.restore import SnapshotError

    fake = write_fake_tree(TX2, tmp_path / "tree")
    gov = paths.policy_file(0, "scaling_governor")
    raw = b"sched\xffutil\n"
    (tmp_path / "tree" / gov).write_bytes(raw)
    with pytest.raises(SnapshotError, match=f"cannot read the original value of {gov}"):
        begin_session(fake.sysfs, TX2, tmp_path / "state", LOG)
    assert (tmp_path / "tree" / gov).read_bytes() == raw
    assert not os.path.exists(snapshot_path(tmp_path / "state"))
    obs = Sensor(TX2, fake.sysfs).read(0.0)
    assert obs.cluster("a57").governor == "sched\ufffdutil"
    assert not any("policy0" in e for e in obs.errors)


def test_an_adopted_snapshot_keeps_giving_back_every_file(tmp_path):
    """A crashed run's snapshot whose restore failed is adopted (it holds the true originals):
    attaching does not narrow it to what this run writes."""
    fake = write_fake_tree(TX2, tmp_path / "tree")
    state = tmp_path / "state"
    snap = begin_session(fake.sysfs, TX2, state, LOG)
    adopted = type(snap)(snap.policies, snap.online, snap.taken, snap.pid + 1, snap.root)
    session = Session(fake.sysfs, adopted, state, LOG, TX2)
    act = Actuator(fake.sysfs, NoProcs())
    session.attach(act)
    act.apply(Decision({"a57": 960000}), Sensor(TX2, fake.sysfs).read(0.0))
    assert all(p.touched is None for p in session.snapshot.policies)


@pytest.mark.parametrize("touched", [None, ["scaling_governor"]])
def test_touched_round_trips_and_bad_names_are_refused(tmp_path, touched):
    fake = write_fake_tree(TX2, tmp_path / "tree")
    state = tmp_path / "state"
    begin_session(fake.sysfs, TX2, state, LOG)
    data = json.loads(open(snapshot_path(state)).read())
    if touched is None:
        data["policies"][0].pop("touched", None)
    else:
        data["policies"][0]["touched"] = touched
    open(snapshot_path(state), "w").write(json.dumps(data))
    got = load_snapshot(state).policies[0].touched
    assert got == (None if touched is None else tuple(touched))
    data["policies"][0]["touched"] = ["cpu1/online"]
    open(snapshot_path(state), "w").write(json.dumps(data))
    with pytest.raises(Exception, match="touched file"):
        load_snapshot(state)


def test_a_live_snapshot_from_an_earlier_boot_is_dropped_not_restored(tmp_path, monkeypatch):
    """A power cut leaves restore.json behind; the reboot reset cpufreq and nvpmodel.service
    set the new boot's mode. Writing the last boot's values would undo it."""
    from daemon import restore

    fake = write_fake_tree(TX2, tmp_path / "tree")
    fs, state = fake.sysfs, tmp_path / "state"
    monkeypatch.setattr(restore, "tree_root", lambda sysfs: restore.LIVE_ROOT)
    boot = ["boot-a"]
    monkeypatch.setattr(restore, "boot_id", lambda: boot[0])
    snap = begin_session(fs, TX2, state, LOG)
    assert snap.boot_id == "boot-a" and load_snapshot(state).boot_id == "boot-a"
    gov = paths.policy_file(0, "scaling_governor")
    fs.write(gov, "performance")  # the new boot's own setting
    boot[0] = "boot-b"
    assert restore.recover_stale(fs, state, LOG) is None
    assert fs.read(gov) == "performance" and not os.path.exists(snapshot_path(state))
    # the same boot (a crash, a watchdog kill): restored as before
    begin_session(fs, TX2, state, LOG)
    fs.write(gov, "userspace")
    report = restore.recover_stale(fs, state, LOG)
    assert report is not None and report.ok and fs.read(gov) == "performance"


def test_a_read_only_state_dir_after_a_crash_still_gives_the_board_back(tmp_path, monkeypatch):
    """A disk remounted read-only after errors: the next start still locks the dir (a
    read-only flock), restores the crashed run's snapshot, and is then refused with a clear
    reason instead of leaving the dead run's settings on the board."""
    import errno

    from daemon.restore import SnapshotError
    from daemon.statelock import StateDirBusy, StateLock

    fake = write_fake_tree(TX2, tmp_path / "tree")
    fs, state = fake.sysfs, tmp_path / "state"
    lock = StateLock(state).acquire()
    begin_session(fs, TX2, state, LOG)  # the crashed run's originals ...
    gov = paths.policy_file(0, "scaling_governor")
    fs.write(gov, "userspace")  # ... and its leftovers
    lock.release()

    real_open = os.open

    def ro_open(path, flags, *a):
        if str(path).startswith(str(state)) and flags & (os.O_CREAT | os.O_WRONLY | os.O_RDWR):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_open(path, flags, *a)

    real_unlink = os.unlink

    def ro_unlink(path, *a, **k):
        if str(path).startswith(str(state)):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_unlink(path, *a, **k)

    monkeypatch.setattr(os, "open", ro_open)  # the state dir's file system only
    monkeypatch.setattr(os, "unlink", ro_unlink)
    lock = StateLock(state).acquire()
    try:
        with pytest.raises(StateDirBusy):  # the read-only lock is a real lock
            StateLock(state).acquire()
        with pytest.raises(SnapshotError, match="cannot save the original settings"):
            begin_session(fs, TX2, state, LOG)
    finally:
        lock.release()
    assert fs.read(gov) == "schedutil"  # given back before the refusal
    assert os.path.exists(snapshot_path(state))  # kept: the next start restores it again


def test_a_write_whose_mark_cannot_be_saved_does_not_happen(tmp_path, monkeypatch):
    """A full disk mid-run: the file cannot be marked in restore.json, so it is not written
    (a crash could not give it back), and the loop goes on with an error, not a crash."""
    import errno

    from daemon import restore

    fake, fs, state, session, decide = started(tmp_path)

    def full(snapshot, state_dir):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(restore, "save_snapshot", full)
    report = decide(a57=960000)
    assert any("cannot record policy0" in e for e in report.errors)
    assert fs.read(paths.policy_file(0, "scaling_governor")) == "schedutil"
    assert all(p.touched == () for p in session.snapshot.policies)
    monkeypatch.undo()
    assert not decide(a57=960000).errors  # room again: marked, then written
    assert fs.read(paths.policy_file(0, "scaling_governor")) == "userspace"


def test_a_policy_coming_online_with_min_above_max_is_not_taken(tmp_path):
    """begin_session refuses such a pair for the policies there at start; one that came online
    later had it saved by cover(), and after a crash the next start refused the whole file
    (no policy given back). Now hidvfs does not write that policy, and the file stays whole."""
    fake, fs, state, session, decide = started(tmp_path, mode="default")  # Denver offline
    fake.set_cpu_online(1, True)
    fake.set_cpu_online(2, True)
    fs.write(paths.policy_file(1, "scaling_min_freq"), str(TX2.cluster("denver").freqs_khz[-1]))
    fs.write(paths.policy_file(1, "scaling_max_freq"), str(TX2.cluster("denver").freqs_khz[0]))
    with pytest.raises(SysfsUnavailable, match="policy1 shows scaling_min_freq"):
        session.cover(1, ["scaling_min_freq", "scaling_max_freq"])
    saved = {p.policy: p for p in load_snapshot(state).policies}  # loads: not refused whole
    assert 1 not in saved or (saved[1].min_khz, saved[1].max_khz) != (
        str(TX2.cluster("denver").freqs_khz[-1]),
        str(TX2.cluster("denver").freqs_khz[0]),
    )
    session.cover(0, ["scaling_governor"])  # the others as before
    assert "scaling_governor" in on_disk(state, 0)["touched"]


def test_a_policy_not_taken_is_said_as_not_written_not_as_a_fallback_to_bounds(tmp_path):
    """The actuator logged the refusal above as "userspace governor refused (...); using
    min/max bounds" though it then wrote no bound either: the policy is not driven at all."""
    fake, fs, state, session, decide = started(tmp_path, mode="default")  # Denver offline
    fake.set_cpu_online(1, True)
    fake.set_cpu_online(2, True)
    denver = TX2.cluster("denver").freqs_khz
    fs.write(paths.policy_file(1, "scaling_min_freq"), str(denver[-1]))
    fs.write(paths.policy_file(1, "scaling_max_freq"), str(denver[0]))
    report = decide(a57=960000, denver=denver[3])
    assert len(report.errors) == 1, report.errors
    assert "policy1 shows scaling_min_freq" in report.errors[0]
    assert "does not write this policy" in report.errors[0]
    assert "using min/max bounds" not in report.errors[0]
    assert not [w for w in report.writes if "/policy1/" in w[0]]
    assert fs.read(paths.policy_file(1, "scaling_min_freq")) == str(denver[-1])  # untouched
    assert fs.read(paths.policy_file(0, "scaling_governor")) == "userspace"  # the others driven
