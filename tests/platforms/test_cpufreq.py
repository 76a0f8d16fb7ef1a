"""cpufreq readers and writers, on fake trees and on a recording backend."""

from __future__ import annotations

import errno

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from platforms import cpufreq, paths
from platforms.errors import SysfsUnavailable, SysfsWriteError
from platforms.faketree import write_fake_tree
from platforms.spec import load_board
from platforms.sysfs import DirSysfs, SysfsBackend, check_value

TX2 = load_board("tx2")
RUBIK = load_board("rubikpi3")
TABLE = TX2.cluster("a57").freqs_khz


class RecordingSysfs(SysfsBackend):
    """In-memory files. Writes behave like a 4.9 kernel: a limit that would make
    min > max is refused with EINVAL. Every state after a write is recorded."""

    kind = "memory"

    def __init__(self, files: dict[str, str], policy: int = 0):
        self.files = dict(files)
        self.policy = policy
        self.states: list[tuple[int, int]] = []
        self.writes: list[tuple[str, str]] = []
        self.unreadable: set[str] = set()  # files that hold a value the reader cannot see

    def limits(self) -> tuple[int, int]:
        lo = int(self.files[paths.policy_file(self.policy, "scaling_min_freq")])
        hi = int(self.files[paths.policy_file(self.policy, "scaling_max_freq")])
        return lo, hi

    def read(self, path):
        if path in self.unreadable:
            raise SysfsUnavailable(path, "read failed: EAGAIN")
        if path not in self.files:
            raise SysfsUnavailable(path, "no such file")
        return check_value(path, self.files[path])

    def write(self, path, value):
        if path not in self.files:
            raise SysfsWriteError(path, value, errno.ENOENT)
        old = self.files[path]
        self.files[path] = value
        lo, hi = self.limits()
        if lo > hi:
            self.files[path] = old
            raise SysfsWriteError(path, value, errno.EINVAL, "min > max")
        self.writes.append((path, value))
        self.states.append((lo, hi))

    def list(self, path):
        prefix = path.rstrip("/") + "/"
        return sorted({p[len(prefix) :].split("/")[0] for p in self.files if p.startswith(prefix)})

    def exists(self, path):
        return path in self.files or bool(self.list(path))


def _limits_backend(lo: int, hi: int, policy: int = 0) -> RecordingSysfs:
    return RecordingSysfs(
        {
            paths.policy_file(policy, "scaling_min_freq"): str(lo),
            paths.policy_file(policy, "scaling_max_freq"): str(hi),
            paths.policy_file(policy, "cpuinfo_max_freq"): str(TABLE[-1]),
        },
        policy,
    )


pairs = st.tuples(st.sampled_from(TABLE), st.sampled_from(TABLE)).map(lambda t: tuple(sorted(t)))


@settings(max_examples=300, deadline=None)
@given(current=pairs, target=pairs)
def test_set_limits_keeps_min_le_max_after_every_write(current, target):
    s = _limits_backend(*current)
    done = cpufreq.set_limits(s, 0, *target)
    assert all(lo <= hi for lo, hi in s.states), s.states
    assert s.limits() == target
    assert done == s.writes
    assert len(done) <= 2


@settings(max_examples=200, deadline=None)
@given(current=pairs, target=pairs)
def test_set_limits_with_unreadable_current_limits_is_still_safe(current, target):
    s = _limits_backend(*current)
    s.unreadable = {
        paths.policy_file(0, "scaling_min_freq"),
        paths.policy_file(0, "scaling_max_freq"),
    }
    cpufreq.set_limits(s, 0, *target)
    assert s.limits() == target
    assert all(lo <= hi for lo, hi in s.states), s.states
    assert s.writes[0] == (paths.policy_file(0, "scaling_max_freq"), str(TABLE[-1]))


def test_set_limits_order_raise_and_lower():
    s = _limits_backend(TABLE[0], TABLE[2])
    cpufreq.set_limits(s, 0, TABLE[8], TABLE[10])  # raise: max first
    assert [p.rsplit("/", 1)[1] for p, _ in s.writes] == ["scaling_max_freq", "scaling_min_freq"]
    s = _limits_backend(TABLE[8], TABLE[10])
    cpufreq.set_limits(s, 0, TABLE[0], TABLE[2])  # lower: min first
    assert [p.rsplit("/", 1)[1] for p, _ in s.writes] == ["scaling_min_freq", "scaling_max_freq"]


def test_set_limits_skips_writes_that_change_nothing():
    s = _limits_backend(TABLE[0], TABLE[-1])
    assert cpufreq.set_limits(s, 0, TABLE[0], TABLE[-1]) == []
    assert cpufreq.set_limits(s, 0, TABLE[0], TABLE[4]) == [
        (paths.policy_file(0, "scaling_max_freq"), str(TABLE[4]))
    ]


def test_set_limits_refuses_min_above_max_before_writing():
    s = _limits_backend(TABLE[0], TABLE[-1])
    with pytest.raises(cpufreq.InvalidLimits, match="min 2035200 kHz > max 345600 kHz"):
        cpufreq.set_limits(s, 0, TABLE[-1], TABLE[0])
    with pytest.raises(ValueError):  # InvalidLimits is a ValueError for the actuator
        cpufreq.set_limits(s, 0, TABLE[-1], TABLE[0])
    assert s.writes == []


@pytest.mark.parametrize("bad", [0, -5, 1.5, "1000", True])
def test_set_limits_rejects_non_frequencies(bad):
    s = _limits_backend(TABLE[0], TABLE[-1])
    with pytest.raises(SysfsWriteError):
        cpufreq.set_limits(s, 0, bad, TABLE[-1])
    assert s.writes == []


def test_set_limits_unreadable_everything_raises_naming_the_file():
    s = RecordingSysfs({paths.policy_file(0, "scaling_max_freq"): "2035200"})
    with pytest.raises(SysfsUnavailable, match="scaling_min_freq"):
        cpufreq.set_limits(s, 0, TABLE[0], TABLE[1])


# -- on fake trees ----------------------------------------------------------------------------


@pytest.fixture
def tx2_default(tmp_path):
    write_fake_tree(TX2, tmp_path, mode="default")
    return DirSysfs(tmp_path)


@pytest.fixture
def rubik(tmp_path):
    write_fake_tree(RUBIK, tmp_path)
    return DirSysfs(tmp_path)


def test_list_policies_and_online_state_in_default_mode(tx2_default):
    s = tx2_default
    assert cpufreq.list_policies(s) == [0]  # Denver's policy1 vanished with its CPUs
    assert cpufreq.online_cpus(s) == (0, 3, 4, 5)
    assert cpufreq.present_cpus(s) == (0, 1, 2, 3, 4, 5)
    assert not s.exists(paths.cpu_online(0))
    assert cpufreq.is_cpu_online(s, 0)  # missing online file => online
    assert not cpufreq.is_cpu_online(s, 1)
    assert cpufreq.is_cpu_online(s, 3)
    assert not cpufreq.is_cpu_online(s, 42)  # no such CPU
    assert not cpufreq.has_cpufreq(s, 1) and cpufreq.has_cpufreq(s, 4)
    with pytest.raises(SysfsUnavailable, match="policy1"):
        cpufreq.read_policy(s, 1)


def test_online_falls_back_to_per_cpu_files(tx2_default, tmp_path):
    (tmp_path / paths.CPU / "online").unlink()
    assert cpufreq.online_cpus(tx2_default) == (0, 3, 4, 5)
    (tmp_path / paths.CPU / "present").unlink()
    assert cpufreq.online_cpus(tx2_default) == (0, 3, 4, 5)


def test_read_policy_state(tx2_default):
    st = cpufreq.read_policy(tx2_default, 0)
    a57 = TX2.cluster("a57")
    assert st.related_cpus == (0, 3, 4, 5) and st.affected_cpus == (0, 3, 4, 5)
    assert st.driver == "tegra186-cpufreq"
    assert st.governor == "schedutil"
    assert st.available_governors == a57.governors
    assert st.available_frequencies == a57.freqs_khz
    assert (st.min_khz, st.max_khz) == (a57.fmin_khz, a57.fmax_khz)
    assert st.cur_khz in a57.freqs_khz
    assert st.setspeed_khz is None  # not userspace
    assert (st.cpuinfo_min_khz, st.cpuinfo_max_khz) == (345600, 2035200)
    assert st.transition_latency_ns == a57.transition_latency_ns
    assert st.errors == ()


def test_setspeed_read_only_under_userspace(tx2_default):
    s = tx2_default
    s.write(paths.policy_file(0, "scaling_governor"), "userspace")
    assert cpufreq.read_policy(s, 0).setspeed_khz is None  # still reads <unsupported>
    s.write(paths.policy_file(0, "scaling_setspeed"), "960000")
    assert cpufreq.read_policy(s, 0).setspeed_khz == 960000


def test_unreadable_policy_file_is_none_and_listed(tx2_default, tmp_path):
    (tmp_path / paths.policy_file(0, "scaling_cur_freq")).write_text("\n")
    st = cpufreq.read_policy(tx2_default, 0)
    assert st.cur_khz is None
    assert any("scaling_cur_freq" in e for e in st.errors)


def test_table_less_driver_gets_a_100mhz_grid_between_the_cpuinfo_bounds(tx2_default, tmp_path):
    """intel_pstate, amd-pstate and cppc have no table but take any kHz between their bounds:
    the bounds alone floored every target to the minimum or the maximum."""
    (tmp_path / paths.policy_file(0, "scaling_available_frequencies")).unlink()
    st = cpufreq.read_policy(tx2_default, 0)
    assert st.available_frequencies is None and st.synthesized
    assert st.freq_table == (345600, *range(400000, 2000001, 100000), 2035200)


def test_table_less_grid_widens_its_step_for_an_absurd_range_and_keeps_both_ends():
    assert cpufreq.frequency_grid(400000, 4700000) == tuple(range(400000, 4700001, 100000))
    grid = cpufreq.frequency_grid(399999, 90_000_000)
    assert grid[0] == 399999 and grid[-1] == 90_000_000 and len(grid) <= cpufreq.GRID_MAX_OPPS
    assert list(grid) == sorted(set(grid)) and all(f % 100000 == 0 for f in grid[1:-1])
    assert cpufreq.frequency_grid(400000, 400001) == (400000, 400001)


def test_table_less_driver_without_bounds_keeps_what_it_has(tx2_default, tmp_path):
    for name in ("scaling_available_frequencies", "cpuinfo_max_freq"):
        (tmp_path / paths.policy_file(0, name)).unlink()
    st = cpufreq.read_policy(tx2_default, 0)
    assert not st.synthesized and st.freq_table == (345600,)


def test_set_governor_refuses_modular_governor_with_hint(rubik):
    with pytest.raises(SysfsWriteError) as exc:
        cpufreq.set_governor(rubik, 4, "powersave")
    e = exc.value
    assert e.errno == errno.EINVAL
    msg = str(e)
    assert "governor 'powersave' not available on policy4" in msg
    assert "available: userspace, ondemand, schedutil, performance" in msg
    assert "modprobe cpufreq_powersave" in msg
    assert rubik.read(paths.policy_file(4, "scaling_governor")) == "performance"


def test_set_governor_and_setspeed(rubik):
    with pytest.raises(SysfsWriteError, match="needs 'userspace'"):
        cpufreq.set_setspeed(rubik, 7, 1516800)
    cpufreq.set_governor(rubik, 7, "userspace")
    assert rubik.read(paths.policy_file(7, "scaling_governor")) == "userspace"
    cpufreq.set_setspeed(rubik, 7, 1516800)
    assert rubik.read(paths.policy_file(7, "scaling_setspeed")) == "1516800"
    with pytest.raises(SysfsWriteError):
        cpufreq.set_setspeed(rubik, 7, 0)


def test_write_to_vanished_policy_names_file(tx2_default):
    with pytest.raises(SysfsWriteError) as exc:
        cpufreq.set_setspeed(tx2_default, 1, 345600, check_governor=False)
    assert exc.value.errno == errno.ENOENT and "policy1/scaling_setspeed" in str(exc.value)


def test_set_limits_on_a_fake_tree(tx2_default):
    done = cpufreq.set_limits(tx2_default, 0, 960000, 1420800)
    assert cpufreq.read_limits(tx2_default, 0) == (960000, 1420800)
    assert [p for p, _ in done] == [
        paths.policy_file(0, "scaling_max_freq"),
        paths.policy_file(0, "scaling_min_freq"),
    ]
