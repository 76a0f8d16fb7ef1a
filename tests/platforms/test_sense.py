"""The Sensor: observations from spec + live files, cached discovery, quirks, hotplug."""

from __future__ import annotations

import errno
import logging
import os
import shutil
from collections import Counter
from dataclasses import replace

import pytest

from platforms import paths
from platforms.faketree import inject_read_error, write_fake_tree
from platforms.procstat import UtilTracker, parse_proc_stat
from platforms.sense import Sensor
from platforms.spec import load_board
from platforms.sysfs import DirSysfs, SysfsBackend

TX2, ORIN, RUBIK = load_board("tx2"), load_board("orin-nx"), load_board("rubikpi3")


class Counting(SysfsBackend):
    """Delegates to another backend and counts calls: the Sensor must use only this API."""

    kind = "counting"

    def __init__(self, inner: SysfsBackend):
        self.inner = inner
        self.calls: Counter[str] = Counter()
        self.paths: list[str] = []

    def read(self, path):
        self.calls["read"] += 1
        self.paths.append(path)
        return self.inner.read(path)

    def write(self, path, value):
        self.calls["write"] += 1
        self.inner.write(path, value)

    def list(self, path):
        self.calls["list"] += 1
        return self.inner.list(path)

    def exists(self, path):
        self.calls["exists"] += 1
        return self.inner.exists(path)


@pytest.fixture
def tx2(tmp_path):
    w = write_fake_tree(TX2, tmp_path)
    return w, Sensor(TX2, DirSysfs(tmp_path))


def test_full_tx2_observation(tx2):
    w, sensor = tx2
    w.set_temp("BCPU-therm", 55.5)
    w.set_power("VDD_IN", 5000)
    w.set_power("VDD_SYS_CPU", 1200)
    w.set_cur_freq(0, 1420800)
    obs = sensor.read(12.5)
    assert obs.t == 12.5 and obs.board == "tx2" and obs.jobs == ()
    a57, denver = obs.cluster("a57"), obs.cluster("denver")
    assert a57.cpus == (0, 3, 4, 5) and a57.online == (0, 3, 4, 5)
    assert a57.cur_khz == 1420800 and a57.level == 7
    assert (a57.min_khz, a57.max_khz) == (345600, 2035200)
    assert a57.governor == "schedutil" and "userspace" in a57.governors
    assert a57.freqs_khz == TX2.cluster("a57").freqs_khz
    assert denver.online == (1, 2) and denver.capacity == 1.3
    types = [z.type for z in obs.zones]
    assert "PMIC-Die" not in types  # constant 100 °C: skipped
    assert obs.cluster_temp_c("a57") == 55.5
    bcpu = next(z for z in obs.zones if z.type == "BCPU-therm")
    assert (bcpu.passive_trip_c, bcpu.critical_trip_c) == (85.0, 101.0)
    pll = next(z for z in obs.zones if z.type == "PLL-therm")
    assert pll.temp_c is None  # blank string: unavailable, not 0 °C
    assert any("thermal_zone3/temp" in e and "empty" in e for e in obs.errors)
    assert obs.total_power_w == 5.0 and obs.cpu_power_w == 1.2
    assert [r.name for r in obs.rails] == [r.name for r in TX2.rails]
    assert all(r.power_mw is not None for r in obs.rails)


def test_utilisation_between_ticks(tx2):
    w, sensor = tx2
    first = sensor.read(0.0)
    assert first.cluster("a57").util == (None,) * 4  # no previous sample
    w.advance_stat(1.0, busy={0: 0.25, 3: 1.0, 4: 0.0, 5: 0.5, 1: 0.75, 2: 0.1})
    obs = sensor.read(1.0)
    assert obs.cluster("a57").util == pytest.approx((0.25, 1.0, 0.0, 0.5))
    assert obs.cluster("denver").util == pytest.approx((0.75, 0.1))
    assert obs.cluster("a57").mean_util == pytest.approx(0.4375)
    again = sensor.read(1.0)  # no ticks passed: unavailable, not idle
    assert again.cluster("a57").util == (None,) * 4


def test_default_mode_offline_cluster_is_not_a_crash(tmp_path):
    write_fake_tree(TX2, tmp_path, mode="default")
    obs = Sensor(TX2, DirSysfs(tmp_path)).read(0.0)
    denver = obs.cluster("denver")
    assert denver.online == () and denver.cpus == (1, 2)
    assert (denver.cur_khz, denver.min_khz, denver.max_khz, denver.governor) == (None,) * 4
    assert denver.util == (None, None)
    assert obs.cluster("a57").cur_khz is not None
    assert not any("policy1" in e for e in obs.errors)  # offline is a state, not a failed read


def test_hotplug_rediscovers_and_back(tmp_path):
    w = write_fake_tree(TX2, tmp_path, mode="default")
    sensor = Sensor(TX2, DirSysfs(tmp_path), refresh_s=None)
    assert sensor.read(0.0).cluster("denver").online == ()
    n = sensor.discoveries
    w.set_cpu_online(1, True)
    w.set_cpu_online(2, True)
    w.set_cur_freq(1, 960000)
    obs = sensor.read(1.0)
    denver = obs.cluster("denver")
    assert denver.online == (1, 2) and denver.cur_khz == 960000 and denver.governor == "schedutil"
    w.set_cpu_online(2, False)
    assert sensor.read(2.0).cluster("denver").online == (1,)
    w.set_cpu_online(1, False)
    obs = sensor.read(3.0)
    assert obs.cluster("denver").online == () and obs.cluster("denver").cur_khz is None
    assert not os.path.exists(tmp_path / paths.policy_dir(1))
    assert sensor.discoveries == n  # the online set drove it, not a full rediscovery


def test_cpus_of_no_known_cluster_coming_online_are_said_once(tmp_path, caplog):
    """A probed board whose Denver-like cluster was offline at start has no cluster for it:
    when its CPUs come online they run uncontrolled, which used to go unsaid."""
    w = write_fake_tree(TX2, tmp_path, mode="default")
    probed = replace(TX2, clusters=tuple(c for c in TX2.clusters if c.name == "a57"))
    sensor = Sensor(probed, DirSysfs(tmp_path), refresh_s=None)
    caplog.set_level(logging.WARNING, logger="hidvfs.sense")
    sensor.read(0.0)
    assert not [r for r in caplog.records if "cpus_uncontrolled" in r.getMessage()]
    w.set_cpu_online(1, True)
    w.set_cpu_online(2, True)
    for t in (1.0, 2.0, 3.0):
        sensor.read(t)
    said = [r.getMessage() for r in caplog.records if "cpus_uncontrolled" in r.getMessage()]
    assert len(said) == 1 and "cpus=1,2" in said[0] and "restart hidvfs" in said[0], said
    # the shipped spec names the cluster: nothing to say
    caplog.clear()
    Sensor(TX2, DirSysfs(tmp_path), refresh_s=None).read(4.0)
    assert not [r for r in caplog.records if "cpus_uncontrolled" in r.getMessage()]


def test_policy_vanishing_under_the_sensor(tmp_path):
    """A policy folder disappears while its CPUs still look online (a racing hotplug): once
    rediscovered its files are no longer read, yet each stays reported unavailable (the
    status and the sensor log must not take "not read" for "recovered") until it is back."""
    write_fake_tree(TX2, tmp_path / "tree")
    sysfs = Counting(DirSysfs(tmp_path / "tree"))
    sensor = Sensor(TX2, sysfs, refresh_s=None)
    sensor.read(0.0)
    policy1 = tmp_path / "tree" / paths.policy_dir(1)
    shutil.copytree(policy1, tmp_path / "saved")
    shutil.rmtree(policy1)
    obs = sensor.read(1.0)
    assert obs.cluster("denver").cur_khz is None
    assert any("policy1/scaling_cur_freq" in e for e in obs.errors)
    failing = {e.partition(": ")[0] for e in obs.errors if "policy1" in e}
    assert failing == {
        paths.policy_file(1, n)
        for n in ("scaling_cur_freq", "scaling_min_freq", "scaling_max_freq", "scaling_governor")
    }
    for t in (2.0, 3.0):
        sysfs.paths.clear()
        obs = sensor.read(t)
        assert not any("policy1/" in p for p in sysfs.paths)  # rediscovered: not read again
        assert {e.partition(": ")[0] for e in obs.errors if "policy1" in e} == failing
        assert all("no policy1 folder" in e for e in obs.errors if "policy1" in e)
        assert obs.cluster("denver").cur_khz is None
    shutil.copytree(tmp_path / "saved", policy1)
    sensor.read(4.0)  # seen back: rediscovered
    obs = sensor.read(5.0)
    assert not any("policy1" in e for e in obs.errors)
    assert obs.cluster("denver").cur_khz is not None


def test_zone_reindexed_is_followed_after_one_tick(tx2, tmp_path):
    w, sensor = tx2
    w.set_temp("GPU-therm", 47.0)
    assert sensor.zone_paths["GPU-therm"] == paths.zone_file(2, "temp")
    os.rename(tmp_path / paths.zone_dir(2), tmp_path / paths.zone_dir(12))
    obs = sensor.read(0.0)
    assert next(z for z in obs.zones if z.type == "GPU-therm").temp_c is None
    obs = sensor.read(1.0)
    assert next(z for z in obs.zones if z.type == "GPU-therm").temp_c == 47.0
    assert sensor.zone_paths["GPU-therm"] == paths.zone_file(12, "temp")


def test_missing_zone_is_looked_for_again_within_a_second(tmp_path):
    """A zone not registered yet (or re-registering) is searched for every second, not only
    on the refresh: the guard must not stay blind to it for 30 s."""
    write_fake_tree(TX2, tmp_path)
    hidden = tmp_path / "hidden-zone"
    os.rename(tmp_path / paths.zone_dir(7), hidden)  # thermal-fan-est not registered yet
    sensor = Sensor(TX2, DirSysfs(tmp_path), refresh_s=30.0)
    obs = sensor.read(0.0)
    assert any("no thermal zone of type 'thermal-fan-est'" in e for e in obs.errors)
    n = sensor.discoveries
    sensor.read(0.5)
    assert sensor.discoveries == n  # not every tick
    os.rename(hidden, tmp_path / paths.zone_dir(9))  # back under another index
    (tmp_path / paths.zone_file(9, "temp")).write_text("39000\n")
    assert next(z for z in sensor.read(0.9).zones if z.type == "thermal-fan-est").temp_c is None
    obs = sensor.read(1.0)
    assert next(z for z in obs.zones if z.type == "thermal-fan-est").temp_c == 39.0
    n = sensor.discoveries
    sensor.read(2.5)
    assert sensor.discoveries == n  # nothing missing: no more searching


def test_a_lowered_trip_moves_the_zone_within_seconds(tmp_path):
    write_fake_tree(ORIN, tmp_path)
    sensor = Sensor(ORIN, DirSysfs(tmp_path), refresh_s=30.0)
    zone = next(z for z in sensor.read(0.0).zones if z.passive_trip_c is not None)
    idx = int(sensor.zone_paths[zone.type].split("thermal_zone")[1].split("/")[0])
    k = next(
        int(f.name.split("_")[2])
        for f in (tmp_path / paths.zone_dir(idx)).iterdir()
        if f.name.endswith("_type") and f.read_text().strip() == "passive"
    )
    (tmp_path / paths.zone_file(idx, f"trip_point_{k}_temp")).write_text("40000\n")
    assert next(z for z in sensor.read(4.0).zones if z.type == zone.type).passive_trip_c == (
        zone.passive_trip_c
    )
    assert next(z for z in sensor.read(5.0).zones if z.type == zone.type).passive_trip_c == 40.0


def test_eagain_zones_on_orin(tmp_path, monkeypatch):
    w = write_fake_tree(ORIN, tmp_path)
    s = DirSysfs(tmp_path)
    sensor = Sensor(ORIN, s)
    obs = sensor.read(0.0)
    for t in ("cv0-thermal", "cv1-thermal", "cv2-thermal"):
        assert next(z for z in obs.zones if z.type == t).temp_c is None
    w.set_temp("cv1-thermal", 42.0)
    w.set_temp("cpu-thermal", 50.0)
    inject_read_error(monkeypatch, s, sensor.zone_paths["cpu-thermal"], errno.EAGAIN)
    obs = sensor.read(1.0)
    assert next(z for z in obs.zones if z.type == "cv1-thermal").temp_c == 42.0
    assert next(z for z in obs.zones if z.type == "cpu-thermal").temp_c is None
    assert obs.max_cpu_temp_c is None  # the only cpu zone failed: unavailable, not 0
    assert any("EAGAIN" in e and "temp" in e for e in obs.errors)
    monkeypatch.undo()
    assert sensor.read(2.0).max_cpu_temp_c == 50.0


def test_orin_hwmon_rails(tmp_path):
    w = write_fake_tree(ORIN, tmp_path, seed=7)
    w.set_power("VDD_IN", 7000)
    obs = Sensor(ORIN, DirSysfs(tmp_path)).read(0.0)
    assert obs.total_power_w == pytest.approx(7.0, abs=0.01)
    assert obs.rail("sub").name == "VDD_SOC"


def test_rail_vanishing_and_returning(tmp_path):
    write_fake_tree(ORIN, tmp_path, seed=1)
    sensor = Sensor(ORIN, DirSysfs(tmp_path))
    hw = tmp_path / "bus/i2c/drivers/ina3221/1-0040/hwmon"
    (old,) = os.listdir(hw)
    os.rename(hw / old, hw / "hwmon11")  # the driver re-bound under a new number
    obs = sensor.read(0.0)
    assert obs.total_power_w is None
    assert any("in1_input" in e for e in obs.errors)
    assert sensor.read(1.0).total_power_w is not None


def test_rubik_skips_non_temperature_zones_and_has_no_rails(tmp_path):
    write_fake_tree(RUBIK, tmp_path)
    obs = Sensor(RUBIK, DirSysfs(tmp_path)).read(0.0)
    types = {z.type for z in obs.zones}
    assert not any(t.startswith("pm7250b") for t in types)
    assert "cpu0-thermal" in types and len(obs.zones) == 17
    assert obs.rails == () and obs.total_power_w is None
    assert [c.name for c in obs.clusters] == ["silver", "gold", "prime"]
    assert obs.cluster("prime").governor == "performance"
    assert obs.errors == ()


def test_live_trips_win_over_spec(tmp_path):
    write_fake_tree(TX2, tmp_path)
    (tmp_path / paths.zone_file(0, "trip_point_0_temp")).write_text("80000\n")
    obs = Sensor(TX2, DirSysfs(tmp_path)).read(0.0)
    assert next(z for z in obs.zones if z.type == "BCPU-therm").passive_trip_c == 80.0


def test_steady_state_tick_reads_only_what_changes(tmp_path):
    write_fake_tree(TX2, tmp_path)
    s = Counting(DirSysfs(tmp_path))
    sensor = Sensor(TX2, s, refresh_s=None)
    sensor.read(0.0)
    s.calls.clear()
    s.paths.clear()
    sensor.read(1.0)
    # online + proc/stat + 2 clusters x 4 + 7 temperature zones + 6 IIO rails
    assert s.calls["read"] == 1 + 1 + 8 + 7 + 6
    assert s.calls["list"] == 0
    assert s.calls["exists"] == 1  # only for the one failing (blank) zone
    assert s.calls["write"] == 0
    assert not any(p.endswith("/type") or "trip_point" in p for p in s.paths)


def test_proc_stat_unreadable_gives_none_util(tx2, tmp_path):
    _, sensor = tx2
    (tmp_path / paths.PROC_STAT).unlink()
    obs = sensor.read(0.0)
    assert obs.cluster("a57").util == (None,) * 4
    assert any("proc/stat" in e for e in obs.errors)


def test_online_file_missing_falls_back_to_per_cpu(tmp_path):
    write_fake_tree(TX2, tmp_path, mode="default")
    (tmp_path / paths.CPU / "online").unlink()
    obs = Sensor(TX2, DirSysfs(tmp_path)).read(0.0)
    assert obs.cluster("a57").online == (0, 3, 4, 5) and obs.cluster("denver").online == ()


# -- proc/stat parsing ------------------------------------------------------------------------

STAT = """cpu  100 0 50 800 50 0 0 0 0 0
cpu0 60 0 20 400 20 0 0 0 0 0
cpu3 40 0 30 400 30 0 0 0 0 0
intr 12345
cpu9 1 1 1 1
"""


def test_parse_proc_stat_lines():
    t = parse_proc_stat(STAT)
    assert set(t) == {0, 3}  # aggregate skipped; parsing stops after the cpu block
    assert t[0].total == 500 and t[0].busy == 80


def test_parse_proc_stat_skips_malformed_lines():
    assert parse_proc_stat("cpu0 1 2 x 4\ncpu1 1 2\ncpu2 1 1 1 1\n").keys() == {2}


def test_util_tracker_edge_cases():
    tr = UtilTracker()
    assert tr.update(parse_proc_stat(STAT)) == {0: None, 3: None}
    nxt = STAT.replace("cpu0 60 0 20 400", "cpu0 110 0 20 450")
    out = tr.update(parse_proc_stat(nxt.replace("cpu3 40 0 30 400 30 0 0 0 0 0\n", "")))
    assert out == {0: pytest.approx(0.5)}  # cpu3 went offline: no line, no value
    out = tr.update(parse_proc_stat(STAT))  # counters went backwards (reset)
    assert out[0] is None and out[3] is None


def test_refresh_picks_up_a_modprobed_governor(tmp_path):
    w = write_fake_tree(RUBIK, tmp_path)
    sensor = Sensor(RUBIK, DirSysfs(tmp_path), refresh_s=30.0)
    assert "powersave" not in sensor.read(0.0).cluster("gold").governors
    w.set_governor_list(4, ["userspace", "ondemand", "schedutil", "performance", "powersave"])
    assert "powersave" not in sensor.read(29.0).cluster("gold").governors  # cached
    assert "powersave" in sensor.read(30.0).cluster("gold").governors


def test_clock_restart_does_not_stop_refreshing(tx2):
    _, sensor = tx2
    sensor.read(100.0)
    n = sensor.discoveries
    sensor.read(0.0)  # a replay started again from the top
    sensor.read(31.0)
    assert sensor.discoveries == n + 1


@pytest.mark.parametrize("raw", ["0", "-5", "99999999999"])
def test_a_frequency_no_policy_can_run_at_is_unavailable(tmp_path, raw):
    """scaling_cur_freq of 0, negative or 10x the table is a broken read, not a frequency
    (the observation says unavailable, never 0)."""
    write_fake_tree(TX2, tmp_path)
    (tmp_path / paths.policy_file(0, "scaling_cur_freq")).write_text(raw + "\n")
    obs = Sensor(TX2, DirSysfs(tmp_path)).read(0.0)
    assert obs.cluster("a57").cur_khz is None
    assert any("scaling_cur_freq: unavailable (implausible" in e for e in obs.errors)


# -- the other BSPs' names (boards.md sections 2.7, 3.6 and 4.5) -------------------------------


def test_tx2_rails_in_l4t28_iio_device_folders(tmp_path):
    """L4T 28 names the ina3221x channel folder ``iio_device`` (what zTT reads), and the IIO
    bus view may be absent: the rails are still found by ``rail_name_N``."""
    w = write_fake_tree(TX2, tmp_path)
    w.set_power("VDD_IN", 5000)
    w.set_power("VDD_SYS_CPU", 1200)
    drv = tmp_path / "bus/i2c/drivers/ina3221x"
    for addr, dev in (("0-0041", "iio:device1"), ("0-0040", "iio:device0")):
        os.rename(drv / addr / dev, drv / addr / "iio_device")
    shutil.rmtree(tmp_path / "bus/iio")
    sensor = Sensor(TX2, DirSysfs(tmp_path))
    obs = sensor.read(0.0)
    assert obs.total_power_w == 5.0 and obs.cpu_power_w == 1.2
    assert all(src is not None for src in sensor.rail_sources.values())
    assert sensor.rail_sources["VDD_IN"].folder == "bus/i2c/drivers/ina3221x/0-0041/iio_device"
    assert not any("channel labelled" in e for e in obs.errors)


def _rename_zones(w, spec, names: dict[str, str]) -> None:
    """Give the fake tree's zones another BSP's ``type`` (the faketree writes spec order)."""
    for i, z in enumerate(spec.zones):
        if z.type in names:
            w.put(paths.zone_file(i, "type"), names[z.type], 0o444)


def _set_trip(w, zone_type: str, k: int, temp_mc: int) -> None:
    w.put(paths.zone_file(w.zone_index(zone_type), f"trip_point_{k}_temp"), str(temp_mc))


_JP5_ORIN = {"cpu-thermal": "CPU-therm", "gpu-thermal": "GPU-therm", "soc0-thermal": "SOC0-therm"}
#: downstream Qualcomm names; cpu-1-0..3-usr are the ones boards.md section 4.5 lists
_DOWNSTREAM_RUBIK = {f"cpu{i}-thermal": f"cpu-1-{i - 4}-usr" for i in range(4, 8)}


@pytest.mark.parametrize(
    "spec, names, hot, cluster",
    [
        (ORIN, _JP5_ORIN, "CPU-therm", "a78ae_1"),
        (RUBIK, _DOWNSTREAM_RUBIK, "cpu-1-2-usr", "gold"),
    ],
    ids=["orin-nx-jetpack5", "rubikpi3-downstream"],
)
def test_cpu_temperature_under_the_other_bsp_zone_names(tmp_path, spec, names, hot, cluster):
    """A spec zone is found by its ``aliases`` when the BSP names it otherwise; its trips are
    the found zone's, not the spec's estimates."""
    w = write_fake_tree(spec, tmp_path)
    _rename_zones(w, spec, names)
    w.set_temp(hot, 93.0)
    _set_trip(w, hot, 0, 81000)  # trip 0 is passive on both boards
    obs = Sensor(spec, w.sysfs).read(0.0)
    assert obs.max_cpu_temp_c == 93.0
    assert obs.cluster_temp_c(cluster) == 93.0
    zone = next(z for z in obs.zones if z.temp_c == 93.0)
    assert zone.role == "cpu" and zone.passive_trip_c == 81.0
    assert not any("no thermal zone" in e for e in obs.errors)


def test_a_zone_found_by_its_alias_never_trips_later_than_the_spec_says(tmp_path):
    """Downstream ``-usr`` zones carry trips for a userspace thermal governor (115 C): the
    guard caps from the lower of those and the spec's, also after the trips are re-read."""
    w = write_fake_tree(RUBIK, tmp_path)
    _rename_zones(w, RUBIK, _DOWNSTREAM_RUBIK)
    _set_trip(w, "cpu-1-2-usr", 0, 115000)
    spec_trip = RUBIK.zone("cpu6-thermal").trips[0].temp_mc / 1000
    assert spec_trip < 115.0
    sensor = Sensor(RUBIK, w.sysfs)
    for t in (0.0, 60.0):  # the discovery, then a later re-read of the trips
        zone = next(z for z in sensor.read(t).zones if z.type == "cpu6-thermal")
        assert zone.passive_trip_c == spec_trip


def test_a_missing_zone_names_its_aliases(tmp_path):
    write_fake_tree(ORIN, tmp_path)
    os.rename(tmp_path / paths.zone_dir(0), tmp_path / "gone")  # cpu-thermal
    obs = Sensor(ORIN, DirSysfs(tmp_path)).read(0.0)
    assert "class/thermal: no thermal zone of type 'cpu-thermal' (nor 'CPU-therm')" in obs.errors


def _without_aliases(spec):
    """The spec as a board file written before ``aliases`` existed."""
    return replace(spec, zones=tuple(replace(z, aliases=()) for z in spec.zones))


def test_unnamed_cpu_zones_watch_the_clusters_left_without_one(tmp_path, caplog):
    """A spec that does not know the BSP's names (a user file without aliases): the zones
    whose type reads as a CPU sensor watch every uncovered cluster, with their own trips,
    logged once however often zones are rediscovered."""
    spec = _without_aliases(ORIN)
    w = write_fake_tree(spec, tmp_path)
    _rename_zones(w, spec, _JP5_ORIN)
    w.set_temp("CPU-therm", 91.0)
    _set_trip(w, "CPU-therm", 0, 82000)
    sensor = Sensor(spec, w.sysfs, refresh_s=30.0)
    with caplog.at_level(logging.WARNING, logger="hidvfs.sense"):
        for t in (0.0, 1.0, 2.0, 31.0):  # missing-zone retries and a full refresh
            obs = sensor.read(t)
    assert obs.max_cpu_temp_c == 91.0
    assert obs.cluster_temp_c("a78ae_0") == obs.cluster_temp_c("a78ae_1") == 91.0
    fallback = next(z for z in obs.zones if z.type == "CPU-therm")
    assert fallback.role == "cpu" and fallback.passive_trip_c == 82.0
    assert fallback.clusters == ("a78ae_0", "a78ae_1")
    logged = [r for r in caplog.records if "cpu_zone_fallback" in r.getMessage()]
    assert len(logged) == 1 and "CPU-therm" in logged[0].getMessage()


def test_the_fallback_line_quotes_a_zone_type_that_would_break_its_fields(tmp_path, caplog):
    """A zone type is the tree's text: a quote, backslash or space in it was logged bare,
    so a log reader split the line's key=value fields in the wrong places."""
    spec = _without_aliases(ORIN)
    w = write_fake_tree(spec, tmp_path)
    _rename_zones(w, spec, {**_JP5_ORIN, "cpu-thermal": 'CPU "x\\y z'})
    with caplog.at_level(logging.WARNING, logger="hidvfs.sense"):
        Sensor(spec, w.sysfs).read(0.0)
    (line,) = [r.getMessage() for r in caplog.records if "cpu_zone_fallback" in r.getMessage()]
    assert "zones='CPU \"x\\\\y z'" in line, line
    assert "clusters=a78ae_0,a78ae_1 " in line  # plain fields stay bare


def test_the_fallback_watches_only_the_uncovered_clusters(tmp_path):
    """RUBIK Pi with the gold and prime zones found and the silver ones under names the spec
    does not list: only silver is watched by the stand-ins."""
    w = write_fake_tree(RUBIK, tmp_path)
    _rename_zones(w, RUBIK, {f"cpu{i}-thermal": f"cpu-0-{i}-step" for i in range(4)})
    w.set_temp("cpu-0-1-step", 92.0)
    obs = Sensor(RUBIK, w.sysfs).read(0.0)
    stand_ins = [z for z in obs.zones if z.type.endswith("-step")]
    assert [z.type for z in stand_ins] == [f"cpu-0-{i}-step" for i in range(4)]
    assert all(z.clusters == ("silver",) for z in stand_ins)
    assert obs.cluster_temp_c("silver") == 92.0
    assert obs.cluster_temp_c("gold") != 92.0


def test_no_fallback_when_the_spec_zones_are_found(tmp_path, caplog):
    w = write_fake_tree(RUBIK, tmp_path)
    with caplog.at_level(logging.WARNING, logger="hidvfs.sense"):
        obs = Sensor(RUBIK, w.sysfs).read(0.0)
    assert [z.type for z in obs.zones] == [
        z.type for z in RUBIK.zones if z.is_temperature and z.quirk != "stuck100"
    ]
    assert not caplog.records


def test_a_stand_in_without_trips_takes_the_spec_estimate(tmp_path):
    """A zone with no readable trip would never cap: the uncovered clusters' spec CPU zones
    give the estimate (Orin: 99 C passive)."""
    spec = _without_aliases(ORIN)
    w = write_fake_tree(spec, tmp_path)
    _rename_zones(w, spec, {"cpu-thermal": "CPU-therm"})
    idx = w.zone_index("CPU-therm")
    for f in (tmp_path / paths.zone_dir(idx)).glob("trip_point_*"):
        f.unlink()
    zone = next(z for z in Sensor(spec, w.sysfs).read(0.0).zones if z.type == "CPU-therm")
    assert zone.passive_trip_c == 99.0 and zone.critical_trip_c == 104.5
