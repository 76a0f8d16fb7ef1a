"""Save and restore of the original cpufreq settings, on fake trees and a recording backend."""

from __future__ import annotations

import errno
import json
import logging
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from daemon import restore
from daemon.restore import (
    Snapshot,
    SnapshotError,
    begin_session,
    detect_drift,
    load_snapshot,
    ordered_limits,
    recover_stale,
    restore_plan,
    restore_snapshot,
    save_snapshot,
    snapshot_path,
    take_snapshot,
)
from platforms import paths
from platforms.errors import SysfsUnavailable, SysfsWriteError
from platforms.spec import load_board
from platforms.sysfs import DirSysfs, SysfsBackend

LOG = logging.getLogger("test.restore")
TABLE = (345600, 652800, 960000, 1267200, 1574400, 2035200)
GOVS = "userspace ondemand performance schedutil powersave"

# policy -> cpus (a TX2-like layout: policy1 = cpus 1,2)
LAYOUT = {0: (0, 3), 1: (1, 2)}


def _put(root, rel: str, text: str) -> None:
    full = os.path.join(root, rel)
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "w") as f:
        f.write(text + "\n")


def make_tree(root, layout=LAYOUT) -> DirSysfs:
    """A small cpufreq tree built with platforms.paths (values end in a newline, as sysfs)."""
    cpus = sorted(c for cs in layout.values() for c in cs)
    _put(root, f"{paths.CPU}/online", paths.format_cpu_ranges(cpus))
    for cpu in cpus:
        if cpu != 0:  # cpu0 has no online file, like most boards
            _put(root, paths.cpu_online(cpu), "1")
    for p, cs in layout.items():
        files = {
            "related_cpus": " ".join(map(str, cs)),
            "affected_cpus": " ".join(map(str, cs)),
            "scaling_driver": "tegra186-cpufreq",
            "scaling_governor": "schedutil",
            "scaling_available_governors": GOVS,
            "scaling_available_frequencies": " ".join(map(str, TABLE)),
            "scaling_min_freq": str(TABLE[0]),
            "scaling_max_freq": str(TABLE[-1]),
            "scaling_cur_freq": str(TABLE[-1]),
            "scaling_setspeed": "<unsupported>",
            "cpuinfo_min_freq": str(TABLE[0]),
            "cpuinfo_max_freq": str(TABLE[-1]),
        }
        for name, value in files.items():
            _put(root, paths.policy_file(p, name), value)
    return DirSysfs(root)


def read_all(root) -> dict[str, str]:
    """Every file of the tree, except ``scaling_setspeed`` under a non-userspace governor: the
    kernel prints ``<unsupported>`` there by itself, a folder cannot (boards.md 1.1)."""
    out = {}
    for dirpath, _, names in os.walk(root):
        gov_file = os.path.join(dirpath, "scaling_governor")
        userspace = os.path.isfile(gov_file) and open(gov_file).read().strip() == "userspace"
        for n in names:
            if n == "scaling_setspeed" and not userspace:
                continue
            full = os.path.join(dirpath, n)
            with open(full) as f:
                out[os.path.relpath(full, root)] = f.read()
    return out


def mutate(fs: DirSysfs) -> None:
    """What a run does: userspace + setspeed and narrowed limits on policy0, a governor and
    narrowed limits on policy1. (It never takes a CPU offline: ``cpuN/online`` is not the
    daemon's.)"""
    fs.write(paths.policy_file(0, "scaling_governor"), "userspace")
    fs.write(paths.policy_file(0, "scaling_setspeed"), "960000")
    fs.write(paths.policy_file(0, "scaling_min_freq"), "652800")
    fs.write(paths.policy_file(0, "scaling_max_freq"), "1267200")
    fs.write(paths.policy_file(1, "scaling_governor"), "performance")
    fs.write(paths.policy_file(1, "scaling_max_freq"), "960000")
    fs.write(paths.policy_file(1, "scaling_min_freq"), "960000")


# --------------------------------------------------------------------------------------------


def test_snapshot_records_every_policy_and_online_file(tmp_path):
    fs = make_tree(tmp_path)
    snap = take_snapshot(fs, LAYOUT.keys())
    assert [p.policy for p in snap.policies] == [0, 1]
    p0 = snap.policies[0]
    assert (p0.governor, p0.min_khz, p0.max_khz, p0.setspeed_khz) == (
        "schedutil",
        "345600",
        "2035200",
        None,
    )
    assert snap.online == {1: "1", 2: "1", 3: "1"}  # cpu0 has no online file


def test_snapshot_from_a_board_spec_and_discovery(tmp_path):
    fs = make_tree(tmp_path)
    spec = load_board("tx2")  # policies 0 and 1, like the tree
    assert [p.policy for p in take_snapshot(fs, spec).policies] == [0, 1]
    assert [p.policy for p in take_snapshot(fs, None).policies] == [0, 1]
    # a policy the tree lacks is recorded as unreadable, not invented
    snap = take_snapshot(fs, [0, 1, 7])
    p7 = snap.policies[-1]
    assert p7.policy == 7 and p7.governor is None and p7.min_khz is None


def test_setspeed_recorded_only_under_userspace(tmp_path):
    fs = make_tree(tmp_path)
    fs.write(paths.policy_file(1, "scaling_governor"), "userspace")
    fs.write(paths.policy_file(1, "scaling_setspeed"), "1267200")
    snap = take_snapshot(fs, LAYOUT)
    assert snap.policies[0].setspeed_khz is None
    assert snap.policies[1].setspeed_khz == "1267200"


def test_save_is_atomic_and_round_trips(tmp_path):
    fs = make_tree(tmp_path / "sys")
    state = tmp_path / "state"
    snap = take_snapshot(fs, LAYOUT)
    path = save_snapshot(snap, state)
    assert path == snapshot_path(state) and os.path.basename(path) == "restore.json"
    assert os.listdir(state) == ["restore.json"]  # no temp file left behind
    data = json.loads(open(path).read())
    assert data["format"] == "hidvfs-restore" and data["version"] == 1
    assert load_snapshot(state) == snap
    assert oct(os.stat(state).st_mode & 0o777) == oct(0o700)


def test_restore_puts_every_file_back_and_removes_the_snapshot(tmp_path):
    root = tmp_path / "sys"
    fs = make_tree(root)
    original = read_all(root)
    snap = take_snapshot(fs, LAYOUT)
    save_snapshot(snap, tmp_path / "state")
    mutate(fs)
    assert read_all(root) != original
    report = restore_snapshot(fs, snap, LOG, state_dir=tmp_path / "state")
    assert report.ok, report.failed
    after = read_all(root)
    changed = {k for k in original if original[k].strip() != after[k].strip()}
    assert changed == set()
    assert not os.path.exists(snapshot_path(tmp_path / "state"))
    # restoring again is a no-op: everything is unchanged
    again = restore_snapshot(fs, snap, LOG)
    assert again.ok and again.restored == []


def test_userspace_setspeed_is_restored_after_the_governor(tmp_path):
    fs = make_tree(tmp_path)
    fs.write(paths.policy_file(0, "scaling_governor"), "userspace")
    fs.write(paths.policy_file(0, "scaling_setspeed"), "1267200")
    snap = take_snapshot(fs, LAYOUT)
    fs.write(paths.policy_file(0, "scaling_governor"), "performance")
    fs.write(paths.policy_file(0, "scaling_setspeed"), "<unsupported>")
    plan = [w.path for w in restore_plan(fs, snap)]
    gov, speed = paths.policy_file(0, "scaling_governor"), paths.policy_file(0, "scaling_setspeed")
    assert plan.index(gov) < plan.index(speed)
    assert restore_snapshot(fs, snap, LOG).ok
    assert fs.read(speed) == "1267200" and fs.read(gov) == "userspace"


@pytest.mark.parametrize("breakage", ["removed", "directory"])
def test_one_failing_item_does_not_stop_the_others(tmp_path, breakage):
    root = tmp_path / "sys"
    fs = make_tree(root)
    original = read_all(root)
    snap = take_snapshot(fs, LAYOUT)
    state = tmp_path / "state"
    save_snapshot(snap, state)
    mutate(fs)
    broken = paths.policy_file(1, "scaling_governor")
    os.unlink(os.path.join(root, broken))
    if breakage == "directory":
        os.mkdir(os.path.join(root, broken))
    report = restore_snapshot(fs, snap, LOG, state_dir=state)
    assert not report.ok
    assert [p for p, _ in report.failed] == [broken]
    assert broken in report.failed[0][1]  # the reason names the file
    after = read_all(root)
    for rel, text in original.items():
        if rel != broken:
            assert after[rel].strip() == text.strip(), rel
    # the snapshot survives an incomplete restore: it still holds the originals
    assert load_snapshot(state) == snap


def test_online_state_is_not_the_daemon_s_to_give_back(tmp_path):
    """nvpmodel takes cores offline and brings them back (boards.md 5.1); the daemon never
    writes ``cpuN/online``, so a restore leaves the online set as it finds it."""
    fs = make_tree(tmp_path)
    snap = take_snapshot(fs, LAYOUT)
    fs.write(paths.cpu_online(3), "0")  # an nvpmodel mode change during the run
    fs.write(paths.policy_file(0, "scaling_governor"), "userspace")
    fs.write(paths.policy_file(1, "scaling_governor"), "userspace")
    plan = [w.path for w in restore_plan(fs, snap)]
    assert paths.cpu_online(3) not in plan
    assert restore_snapshot(fs, snap, LOG).ok
    assert fs.read(paths.cpu_online(3)) == "0"
    assert fs.read(paths.policy_file(0, "scaling_governor")) == "schedutil"
    # policies in reverse order: the last one changed is undone first
    assert plan.index(paths.policy_file(1, "scaling_governor")) < plan.index(
        paths.policy_file(0, "scaling_governor")
    )


def test_a_policy_whose_cpus_are_all_offline_is_woken_for_its_writes_only(tmp_path):
    """An offline policy has no cpufreq files (boards.md 1.1): one of its CPUs comes online
    for the writes, and goes offline again after them."""
    fs = make_tree(tmp_path)
    snap = take_snapshot(fs, LAYOUT)
    assert snap.policies[1].cpus == (1, 2)
    fs.write(paths.policy_file(1, "scaling_governor"), "userspace")
    for cpu in (1, 2):  # nvpmodel takes policy1's cores offline after hidvfs wrote it
        fs.write(paths.cpu_online(cpu), "0")
    fs.write(f"{paths.CPU}/online", "0,3")
    plan = [(w.path, w.value) for w in restore_plan(fs, snap)]
    gov = paths.policy_file(1, "scaling_governor")
    assert plan[0] == (paths.cpu_online(1), "1")
    assert plan[-1] == (paths.cpu_online(1), "0")
    assert (gov, "schedutil") in plan and paths.cpu_online(2) not in dict(plan)


# -- min <= max at every step -------------------------------------------------------------


class MemSysfs(SysfsBackend):
    """In-memory cpufreq that behaves like the kernel where restore cares, and records writes.

    It refuses unknown files and governors, refuses setspeed outside userspace, and records
    every (min, max) pair after each write so a test can assert min <= max held throughout.
    """

    kind = "mem"

    def __init__(self, files: dict[str, str]):
        self.files = dict(files)
        self.writes: list[tuple[str, str]] = []
        self.ranges: list[tuple[int, int, int]] = []

    def read(self, path):
        if path not in self.files:
            raise SysfsUnavailable(path, "no such file")
        v = self.files[path].strip()
        if v in ("", "<unsupported>"):
            raise SysfsUnavailable(path, v or "empty")
        return v

    def write(self, path, value):
        if path not in self.files:
            raise SysfsWriteError(path, value, errno.ENOENT)
        policy_dir, _, name = path.rpartition("/")
        if (
            name == "scaling_governor"
            and value not in self.files[f"{policy_dir}/scaling_available_governors"].split()
        ):
            raise SysfsWriteError(path, value, errno.EINVAL)
        if (
            name == "scaling_setspeed"
            and self.files[f"{policy_dir}/scaling_governor"] != "userspace"
        ):
            raise SysfsWriteError(path, value, errno.EINVAL)
        self.files[path] = value
        self.writes.append((path, value))
        if name in ("scaling_min_freq", "scaling_max_freq"):
            p = int(policy_dir.rsplit("policy", 1)[1])
            self.ranges.append(
                (
                    p,
                    int(self.files[f"{policy_dir}/scaling_min_freq"]),
                    int(self.files[f"{policy_dir}/scaling_max_freq"]),
                )
            )

    def list(self, path):
        prefix = path.rstrip("/") + "/"
        return sorted({k[len(prefix) :].split("/")[0] for k in self.files if k.startswith(prefix)})

    def exists(self, path):
        return path in self.files or bool(self.list(path))


def mem_tree(limits: dict[int, tuple[int, int]]) -> MemSysfs:
    files = {}
    for p, (mn, mx) in limits.items():
        files[paths.policy_file(p, "scaling_governor")] = "schedutil"
        files[paths.policy_file(p, "scaling_available_governors")] = GOVS
        files[paths.policy_file(p, "scaling_min_freq")] = str(mn)
        files[paths.policy_file(p, "scaling_max_freq")] = str(mx)
        files[paths.policy_file(p, "scaling_setspeed")] = "<unsupported>"
    return MemSysfs(files)


_range = st.tuples(st.sampled_from(TABLE), st.sampled_from(TABLE)).map(lambda t: (min(t), max(t)))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(_range, _range), min_size=1, max_size=3))
def test_min_never_exceeds_max_during_restore(pairs):
    original = {p: orig for p, (orig, _) in enumerate(pairs)}
    fs = mem_tree(original)
    snap = take_snapshot(fs, original)
    for p, (_, now) in enumerate(pairs):  # the run moved the limits (validly) elsewhere
        fs.files[paths.policy_file(p, "scaling_min_freq")] = str(now[0])
        fs.files[paths.policy_file(p, "scaling_max_freq")] = str(now[1])
    report = restore_snapshot(fs, snap, LOG)
    assert report.ok, report.failed
    for p, mn, mx in fs.ranges:
        assert mn <= mx, (p, mn, mx, fs.writes)
    for p, (mn, mx) in original.items():
        assert fs.read(paths.policy_file(p, "scaling_min_freq")) == str(mn)
        assert fs.read(paths.policy_file(p, "scaling_max_freq")) == str(mx)


@given(_range, _range)
def test_ordered_limits_keeps_min_le_max(cur, new):
    order = ordered_limits(cur[0], cur[1], new[0], new[1])
    assert sorted(order) == ["scaling_max_freq", "scaling_min_freq"]
    mn, mx = cur
    for name in order:
        if name == "scaling_min_freq":
            mn = new[0]
        else:
            mx = new[1]
        assert mn <= mx


def test_ordered_limits_refuses_an_inverted_target():
    with pytest.raises(ValueError):
        ordered_limits(1, 2, 5, 3)


# -- stale snapshots ----------------------------------------------------------------------


def test_stale_snapshot_is_restored_before_a_new_one_is_taken(tmp_path):
    root, state = tmp_path / "sys", tmp_path / "state"
    fs = make_tree(root)
    original = read_all(root)
    save_snapshot(take_snapshot(fs, LAYOUT), state)  # run 1 saved the originals ...
    mutate(fs)  # ... changed things, then crashed
    snap = begin_session(fs, LAYOUT, state, LOG)  # run 2
    assert {k: v.strip() for k, v in read_all(root).items()} == {
        k: v.strip() for k, v in original.items()
    }
    # run 2's snapshot is the true originals, not run 1's leftovers
    assert snap.policies[0].governor == "schedutil" and snap.policies[1].max_khz == str(TABLE[-1])
    assert load_snapshot(state) == snap


def test_recover_stale_without_a_file_does_nothing(tmp_path):
    fs = make_tree(tmp_path / "sys")
    assert recover_stale(fs, tmp_path / "state", LOG) is None


def test_partially_restored_stale_snapshot_is_adopted(tmp_path):
    root, state = tmp_path / "sys", tmp_path / "state"
    fs = make_tree(root)
    first = take_snapshot(fs, LAYOUT)
    save_snapshot(first, state)
    mutate(fs)
    os.unlink(os.path.join(root, paths.policy_file(1, "scaling_governor")))  # cannot be restored
    snap = begin_session(fs, LAYOUT, state, LOG)
    assert snap == first  # the originals, not the half-restored tree
    assert load_snapshot(state) == first


def test_a_corrupt_snapshot_refuses_the_start_and_stays(tmp_path):
    """It held the originals of a run that crashed: moved aside, the start used to snapshot
    the crashed run's settings (governors 'userspace') as the originals and "restore" them
    at the end, exit 0. Now the start is refused with what to do, and the file stays."""
    fs = make_tree(tmp_path / "sys")
    state = tmp_path / "state"
    state.mkdir()
    (state / "restore.json").write_text("{not json")
    before = {p: fs.read(p) for p in (paths.policy_file(0, "scaling_governor"),)}
    for _ in range(2):  # every start, until someone acts
        with pytest.raises(SnapshotError, match=r"Set them back by hand .*\(mv .*restore\.json"):
            begin_session(fs, LAYOUT, state, LOG)
    assert (state / "restore.json").read_text() == "{not json"
    assert not (state / "restore.json.corrupt").exists()
    assert {p: fs.read(p) for p in before} == before


def test_a_corrupt_snapshot_from_an_earlier_boot_is_moved_aside(tmp_path, monkeypatch):
    """On the live tree a reboot reset what the file described: it goes aside, the start goes on."""
    fs = make_tree(tmp_path / "sys")
    state = tmp_path / "state"
    state.mkdir()
    (state / "restore.json").write_text("{not json")
    monkeypatch.setattr(restore, "tree_root", lambda sysfs: restore.LIVE_ROOT)
    os.utime(state / "restore.json", (1.0, 1.0))  # 1970: before any boot
    assert recover_stale(fs, state, LOG) is None
    assert (state / "restore.json.corrupt").exists() and not (state / "restore.json").exists()
    (state / "restore.json").write_text("{not json")  # written now: this boot's, refused
    with pytest.raises(SnapshotError, match="Set them back by hand"):
        recover_stale(fs, state, LOG)


def test_unknown_snapshot_version_is_refused(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    (state / "restore.json").write_text(
        json.dumps({"format": "hidvfs-restore", "version": 99, "policies": []})
    )
    with pytest.raises(SnapshotError, match="version 99"):
        load_snapshot(state)
    # it may hold a crashed run's originals, readable to the version that wrote it: the start
    # is refused and the file stays where that version looks for it
    fs = make_tree(tmp_path / "sys")
    with pytest.raises(SnapshotError, match="start that version to give them back"):
        recover_stale(fs, state, LOG)
    assert (state / "restore.json").exists() and not (state / "restore.json.corrupt").exists()


# -- drift --------------------------------------------------------------------------------


def test_detect_drift_names_path_and_values(tmp_path):
    root = tmp_path / "sys"
    fs = make_tree(root)
    expected = {
        paths.policy_file(0, "scaling_max_freq"): "2035200",
        paths.policy_file(0, "scaling_governor"): "schedutil",
        paths.policy_file(1, "scaling_min_freq"): "0345600",  # numbers compare as numbers
    }
    assert detect_drift(fs, expected) == []
    fs.write(paths.policy_file(0, "scaling_max_freq"), "1267200")  # nvpmodel lowered the ceiling
    os.unlink(os.path.join(root, paths.policy_file(0, "scaling_governor")))
    drift = detect_drift(fs, expected)
    assert [path for path, _ in drift] == [
        paths.policy_file(0, "scaling_governor"),
        paths.policy_file(0, "scaling_max_freq"),
    ]
    assert "unavailable" in drift[0][1]
    assert "'2035200'" in drift[1][1] and "'1267200'" in drift[1][1]


def test_expected_from_snapshot_matches_the_tree(tmp_path):
    fs = make_tree(tmp_path)
    snap = take_snapshot(fs, LAYOUT)
    expected = restore.expected_from_snapshot(snap)
    assert paths.cpu_online(3) in expected and detect_drift(fs, expected) == []
    mutate(fs)
    assert len(detect_drift(fs, expected)) >= 5
    assert Snapshot.from_json(snap.to_json()) == snap


def test_a_snapshot_with_min_above_max_is_not_originals(tmp_path):
    """The kernel never holds min > max, so such a file is corrupt: never written back (that
    would invert the limits); the start is refused as for any corrupt file."""
    fs = make_tree(tmp_path / "sys")
    state = tmp_path / "state"
    state.mkdir()
    (state / "restore.json").write_text(
        json.dumps(
            {
                "format": "hidvfs-restore",
                "version": 1,
                "policies": [
                    {"policy": 0, "governor": "ondemand", "min_khz": "1420800", "max_khz": "652800"}
                ],
            }
        )
    )
    with pytest.raises(SnapshotError, match="min_khz 1420800 > max_khz 652800"):
        load_snapshot(state)
    before = {p: fs.read(p) for p in (paths.policy_file(0, "scaling_min_freq"),)}
    with pytest.raises(SnapshotError, match="min_khz 1420800 > max_khz 652800"):
        recover_stale(fs, state, LOG)
    assert (state / "restore.json").exists()
    assert {p: fs.read(p) for p in before} == before


def test_an_inverted_min_found_at_start_is_reported_not_restored(tmp_path, caplog):
    """A tree that showed min > max (no kernel does; a fake or broken one): the run pinned
    min = max, and the restore writes back the maximum only (that pair would be refused). The
    minimum is counted as skipped with a line naming the policy and values, not as unchanged."""
    from dataclasses import replace

    fs = make_tree(tmp_path)
    mn, mx = paths.policy_file(0, "scaling_min_freq"), paths.policy_file(0, "scaling_max_freq")
    fs.write(mn, str(TABLE[4]))
    fs.write(mx, str(TABLE[3]))
    snap = take_snapshot(fs, LAYOUT)
    touched = ("scaling_min_freq", "scaling_max_freq")
    snap = replace(snap, policies=tuple(replace(p, touched=touched) for p in snap.policies))
    fs.write(mn, str(TABLE[1]))  # the run's min = max pin
    fs.write(mx, str(TABLE[1]))
    caplog.set_level("INFO", logger=LOG.name)
    report = restore_snapshot(fs, snap, LOG)
    assert (fs.read(mn), fs.read(mx)) == (str(TABLE[1]), str(TABLE[3]))  # never inverted
    assert report.ok and report.restored == [mx]
    assert [path for path, _ in report.skipped] == [mn] and mn not in report.unchanged
    assert "skipped=1" in report.summary()
    said = [r.getMessage() for r in caplog.records if "restore_skipped" in r.getMessage()]
    assert said and f"policy=0 min_khz={TABLE[4]} max_khz={TABLE[3]}" in said[0], said
    # a minimum the run never wrote is left alone without a word
    snap = replace(snap, policies=tuple(replace(p, touched=()) for p in snap.policies))
    assert restore_snapshot(fs, snap, LOG).skipped == []


def test_a_tree_showing_min_above_max_is_refused_before_any_write(tmp_path):
    """Such a pair cannot be given back (kernels refuse it), and the snapshot saved of it was
    refused by the restart after a crash ("not a snapshot of a board"), leaving the
    overwritten minimum for good: the session refuses to start instead, writing nothing."""
    fs = make_tree(tmp_path / "tree")
    fs.write(paths.policy_file(0, "scaling_min_freq"), str(TABLE[4]))
    fs.write(paths.policy_file(0, "scaling_max_freq"), str(TABLE[3]))
    before = read_all(tmp_path / "tree")
    state = tmp_path / "state"
    with pytest.raises(SnapshotError, match=r"policy0 shows scaling_min_freq \d+ > scaling_max"):
        begin_session(fs, LAYOUT, state, LOG)
    assert read_all(tmp_path / "tree") == before and not (state / "restore.json").exists()


def test_a_snapshot_is_given_back_to_its_own_tree_only(tmp_path):
    """A crash on a fake tree with the default state dir, then a start on the board: the fake
    tree's originals must never be written to the board (nor the file lost)."""
    fake, board = make_tree(tmp_path / "fake"), make_tree(tmp_path / "board")
    state = tmp_path / "state"
    snap = take_snapshot(fake, LAYOUT)
    assert snap.root == os.path.realpath(tmp_path / "fake")
    save_snapshot(snap, state)
    mutate(board)
    before = read_all(tmp_path / "board")
    with pytest.raises(SnapshotError, match="start once with --sysfs-root .*fake"):
        recover_stale(board, state, LOG)
    assert read_all(tmp_path / "board") == before and (state / "restore.json").exists()
    mutate(fake)
    report = recover_stale(fake, state, LOG)  # its own tree: given back, file gone
    assert report.ok and not (state / "restore.json").exists()
    assert load_snapshot(state) is None
    # a file written before the root was recorded restores as it did
    old = {k: v for k, v in snap.to_json().items() if k != "root"}
    (state / "restore.json").write_text(json.dumps(old))
    assert recover_stale(board, state, LOG).ok


def test_a_damaged_snapshot_whose_boot_id_reads_is_judged_by_it_not_the_clock(
    tmp_path, monkeypatch
):
    """A board without a battery-backed clock writes the file before NTP steps the clock
    forward: by its mtime the file of this boot looked older than the boot, went aside, and
    the crashed run's settings were taken as the originals. Its boot_id, when the damage left
    it readable, says which boot wrote it."""
    from platforms.liveprocs import boot_id

    here = boot_id()
    if here is None:
        pytest.skip("no /proc/sys/kernel/random/boot_id")
    fs = make_tree(tmp_path / "sys")
    state = tmp_path / "state"
    state.mkdir()
    monkeypatch.setattr(restore, "tree_root", lambda sysfs: restore.LIVE_ROOT)
    damaged = '{"format": "hidvfs-restore", "boot_id": "%s", "policies": [{"pol'
    (state / "restore.json").write_text(damaged % here)
    os.utime(state / "restore.json", (1.0, 1.0))  # the clock said 1970 when it was written
    with pytest.raises(SnapshotError, match="Set them back by hand"):
        recover_stale(fs, state, LOG)
    assert (state / "restore.json").exists()
    other = "00000000-0000-0000-0000-000000000000"
    (state / "restore.json").write_text(damaged % other)  # written now, by another boot
    assert recover_stale(fs, state, LOG) is None
    assert (state / "restore.json.corrupt").exists()
