"""Thermal zones and power rails, one test per board quirk (boards.md section 6)."""

from __future__ import annotations

import errno
import os
import re

import pytest

from platforms import paths, power, thermal
from platforms.faketree import inject_read_error, write_fake_tree
from platforms.spec import RailSpec, Trip, load_board
from platforms.sysfs import DirSysfs

TX2, ORIN, RUBIK = load_board("tx2"), load_board("orin-nx"), load_board("rubikpi3")


@pytest.fixture
def tx2(tmp_path):
    w = write_fake_tree(TX2, tmp_path)
    return w, DirSysfs(tmp_path)


@pytest.fixture
def orin(tmp_path):
    w = write_fake_tree(ORIN, tmp_path, seed=5)
    return w, DirSysfs(tmp_path)


def _by_type(s):
    return thermal.zones_by_type(thermal.discover_zones(s))


# -- thermal ----------------------------------------------------------------------------------


def test_zones_discovered_by_type_with_trips(tx2):
    _, s = tx2
    zones = _by_type(s)
    assert list(zones) == [z.type for z in TX2.zones]  # the cooling device is not a zone
    bcpu = zones["BCPU-therm"]
    assert bcpu.trips == (Trip(85000, "passive", 2000), Trip(101000, "critical", 0))
    assert thermal.trip_c(bcpu.trips, "passive") == 85.0
    assert thermal.trip_c(bcpu.trips, "critical") == 101.0
    assert thermal.trip_c(bcpu.trips, "hot") is None


def test_zone_indices_are_not_stable(tx2, tmp_path):
    """Swap two zone folders: readers must follow the type, not the index."""
    w, s = tx2
    w.set_temp("BCPU-therm", 61.5)
    w.set_temp("GPU-therm", 44.0)
    a, b = tmp_path / paths.zone_dir(0), tmp_path / paths.zone_dir(2)
    os.rename(a, tmp_path / "swap")
    os.rename(b, a)
    os.rename(tmp_path / "swap", b)
    zones = _by_type(s)
    assert zones["BCPU-therm"].index == 2 and zones["GPU-therm"].index == 0
    assert thermal.read_temp_c(s, zones["BCPU-therm"].temp_path) == (61.5, None)
    assert thermal.read_temp_c(s, zones["GPU-therm"].temp_path) == (44.0, None)


def test_millicelsius_to_celsius_including_negative(tx2):
    w, s = tx2
    w.set_temp("Tboard_tegra", -5.25)
    path = _by_type(s)["Tboard_tegra"].temp_path
    assert thermal.read_temp_c(s, path) == (-5.25, None)


def test_blank_temp_is_unavailable_not_zero(tx2):
    _, s = tx2
    temp, err = thermal.read_temp_c(s, _by_type(s)["PLL-therm"].temp_path)
    assert temp is None
    assert "empty" in err and "thermal_zone3/temp" in err


@pytest.mark.parametrize("code", [errno.EAGAIN, errno.ENODATA])
def test_eagain_and_enodata_are_unavailable(tx2, monkeypatch, code):
    _, s = tx2
    path = _by_type(s)["GPU-therm"].temp_path
    assert thermal.read_temp_c(s, path)[0] is not None
    inject_read_error(monkeypatch, s, path, code)
    temp, err = thermal.read_temp_c(s, path)
    assert temp is None and errno.errorcode[code] in err and path in err


def test_typeerror_from_text_layer_is_unavailable(tx2, monkeypatch):
    _, s = tx2
    path = _by_type(s)["GPU-therm"].temp_path
    inject_read_error(monkeypatch, s, path, TypeError("can't concat NoneType to bytes"))
    assert thermal.read_temp_c(s, path)[0] is None


def test_garbage_temp_is_unavailable(tx2):
    w, s = tx2
    w.set_temp_raw("GPU-therm", "N/A")
    temp, err = thermal.read_temp_c(s, _by_type(s)["GPU-therm"].temp_path)
    assert temp is None and "N/A" in err


class _LeakyBackend(DirSysfs):
    """A backend that lets the raw text-layer error through (not DirSysfs's contract)."""

    def read(self, path):
        if path.endswith("/temp"):
            raise TypeError("can't concat NoneType to bytes")
        return super().read(path)


def test_raw_errors_from_any_backend_are_caught(tmp_path):
    write_fake_tree(TX2, tmp_path)
    s = _LeakyBackend(tmp_path)
    temp, err = thermal.read_temp_c(s, paths.zone_file(0, "temp"))
    assert temp is None and "TypeError" in err


def test_gated_eagain_zone_in_fake_tree_and_ungating(orin):
    w, s = orin
    path = _by_type(s)["cv0-thermal"].temp_path
    assert thermal.read_temp_c(s, path)[0] is None
    w.set_temp("cv0-thermal", 41.0)
    assert thermal.read_temp_c(s, path) == (41.0, None)
    w.gate_zone("cv0-thermal")
    assert thermal.read_temp_c(s, path)[0] is None


def test_quirks_off_gives_plain_readings(tmp_path):
    write_fake_tree(ORIN, tmp_path, quirks=False)
    s = DirSysfs(tmp_path)
    for z in _by_type(s).values():
        temp, err = thermal.read_temp_c(s, z.temp_path)
        assert err is None and 30.0 < temp < 60.0


def test_pmic_zone_stuck_at_100_is_skipped(tx2):
    _, s = tx2
    pmic = _by_type(s)["PMIC-Die"]
    assert thermal.read_temp_c(s, pmic.temp_path) == (100.0, None)  # what the board shows
    assert thermal.skip_reason("PMIC-Die") is not None  # even without a spec
    assert thermal.skip_reason("pmic-die", TX2.zone("PMIC-Die")) is not None


def test_non_temperature_zones_are_skipped(tmp_path):
    write_fake_tree(RUBIK, tmp_path)
    s = DirSysfs(tmp_path)
    zones = _by_type(s)
    for t in ("pm7250b-ibat-lvl0", "pm7250b-ibat-lvl1", "pm7250b-bcl-lvl0"):
        assert t in zones
        assert thermal.skip_reason(t) is not None  # recognised by name alone
        assert thermal.skip_reason(t, RUBIK.zone(t)) is not None
    # the battery-current zone really reads a plausible-looking number: skipping is essential
    assert thermal.read_temp_c(s, zones["pm7250b-ibat-lvl0"].temp_path)[0] > 1.0
    for t in ("cpu0-thermal", "BCPU-therm", "cv0-thermal", "xo-thermal", "sdm-skin-thermal"):
        assert thermal.skip_reason(t) is None


def test_spec_role_ignore_is_skipped():
    assert thermal.skip_reason("whatever", TX2.zone("PMIC-Die")) is not None
    assert thermal.skip_reason("GPU-therm", TX2.zone("GPU-therm")) is None


def test_unreadable_trip_is_left_out(tx2, tmp_path):
    _, s = tx2
    (tmp_path / paths.zone_file(0, "trip_point_0_temp")).write_text("\n")
    assert thermal.read_trips(s, 0) == (Trip(101000, "critical", 0),)


@pytest.mark.parametrize(
    "text, expected", [("45000", 45.0), ("45000 ", 45.0), ("", None), ("x", None), (None, None)]
)
def test_parse_millicelsius(text, expected):
    assert thermal.parse_millicelsius(text) == expected


# -- power: IIO ina3221x (TX2) ----------------------------------------------------------------


def test_iio_rails_discovered_by_rail_name(tx2):
    w, s = tx2
    rails = {r.name: r for r in power.discover_iio_rails(s)}
    assert set(rails) == {r.name for r in TX2.rails}
    w.set_power("VDD_IN", 5123)
    assert power.read_power_mw(s, rails["VDD_IN"]) == 5123.0
    assert rails["VDD_IN"].files == ("bus/i2c/drivers/ina3221x/0-0041/iio:device1/in_power0_input",)


def test_iio_device_numbering_varies(tx2, tmp_path):
    w, s = tx2
    w.set_power("VDD_IN", 4321)
    base = tmp_path / "bus/i2c/drivers/ina3221x/0-0041"
    os.rename(base / "iio:device1", base / "iio:device3")  # a different boot
    spec_rail = TX2.total_rail
    src = power.find_rail(s, spec_rail)
    assert src is not None and src.folder.endswith("iio:device3")
    assert power.read_power_mw(s, src) == 4321.0


def test_iio_rail_found_even_under_another_address(tx2, tmp_path):
    _, s = tx2
    moved = RailSpec("VDD_SYS_GPU", "sub", "iio", "bus/i2c/drivers/ina3221x/0-0042/iio:device5", 0)
    src = power.find_rail(s, moved)
    assert src is not None and "0-0040" in src.folder


def test_iio_bus_fallback(tx2, tmp_path):
    _, s = tx2
    os.rename(tmp_path / "bus/i2c/drivers/ina3221x", tmp_path / "hidden")
    # The bus view's relative links dangle now; point them at the moved devices.
    for dev in ("0-0040/iio:device0", "0-0041/iio:device1"):
        link = tmp_path / "bus/iio/devices" / dev.split("/")[1]
        link.unlink()
        link.symlink_to(tmp_path / "hidden" / dev)
    names = {r.name for r in power.discover_iio_rails(s)}
    assert names == {r.name for r in TX2.rails}


def test_unit_suffix_is_parsed(tx2, tmp_path):
    _, s = tx2
    src = power.find_rail(s, TX2.total_rail)
    (tmp_path / src.files[0]).write_text("32760 mw\n")
    assert power.read_power_mw(s, src) == 32760.0


def test_unreadable_rail_is_none(tx2, tmp_path):
    _, s = tx2
    src = power.find_rail(s, TX2.cpu_rail)
    (tmp_path / src.files[0]).write_text("\n")
    assert power.read_power_mw_or_none(s, src) is None
    assert power.read_power_mw_or_none(s, None) is None


# -- power: hwmon ina3221 (Orin) --------------------------------------------------------------


def _hwmon_dirs(tmp_path):
    return sorted(os.listdir(tmp_path / "bus/i2c/drivers/ina3221/1-0040/hwmon"))


def test_hwmon_number_is_not_zero_and_varies_with_seed(tmp_path):
    numbers = set()
    for seed in range(4):
        root = tmp_path / f"t{seed}"
        write_fake_tree(ORIN, root, seed=seed)
        (d,) = _hwmon_dirs(root)
        assert d != "hwmon0"
        numbers.add(d)
        assert (root / "class/hwmon" / d / "name").read_text() == "ina3221\n"
    assert len(numbers) > 1


def test_hwmon_power_is_mv_times_ma(orin):
    w, s = orin
    rails = {r.name: r for r in power.discover_hwmon_rails(s)}
    assert set(rails) == {"VDD_IN", "VDD_CPU_GPU_CV", "VDD_SOC"}  # in7 sum channel skipped
    assert rails["VDD_IN"].device == "bus/i2c/drivers/ina3221/1-0040"
    w.set_power("VDD_IN", 4824)
    folder = rails["VDD_IN"].folder
    mv = int(s.read(f"{folder}/in1_input"))
    ma = int(s.read(f"{folder}/curr1_input"))
    assert power.read_power_mw(s, rails["VDD_IN"]) == mv * ma / 1000
    assert abs(power.read_power_mw(s, rails["VDD_IN"]) - 4824) <= mv / 1000


def test_hwmon_renumbered_between_boots(orin, tmp_path):
    w, s = orin
    w.set_power("VDD_SOC", 1475)
    (d,) = _hwmon_dirs(tmp_path)
    hw = tmp_path / "bus/i2c/drivers/ina3221/1-0040/hwmon"
    os.rename(hw / d, hw / "hwmon9")
    src = power.find_rail(s, ORIN.rails[2])
    assert src is not None and src.folder.endswith("hwmon9")
    assert abs(power.read_power_mw(s, src) - 1475) < 6


def test_hwmon_not_ina3221_is_ignored(orin, tmp_path):
    _, s = orin
    (d,) = _hwmon_dirs(tmp_path)
    (tmp_path / "bus/i2c/drivers/ina3221/1-0040/hwmon" / d / "name").write_text("pwm-fan\n")
    assert power.discover_hwmon_rails(s) == []
    assert power.find_rail(s, ORIN.total_rail) is None


def test_hwmon_nc_labels_are_skipped(orin, tmp_path):
    _, s = orin
    (d,) = _hwmon_dirs(tmp_path)
    (tmp_path / "bus/i2c/drivers/ina3221/1-0040/hwmon" / d / "in3_label").write_text("NC\n")
    names = [r.name for r in power.discover_hwmon_rails(s)]
    assert names == ["VDD_IN", "VDD_CPU_GPU_CV"]
    assert power.is_not_connected("NC") and power.is_not_connected("VDD_NC_2")
    assert not power.is_not_connected("VDD_SYNC") and not power.is_not_connected("VDD_IN")


def test_hwmon_class_fallback(orin, tmp_path):
    _, s = orin
    os.rename(tmp_path / "bus/i2c/drivers/ina3221", tmp_path / "elsewhere")
    (d,) = os.listdir(tmp_path / "elsewhere/1-0040/hwmon")
    link = tmp_path / "class/hwmon" / d
    link.unlink()
    link.symlink_to(tmp_path / "elsewhere/1-0040/hwmon" / d)
    rails = power.discover_hwmon_rails(s)
    assert [r.name for r in rails] == ["VDD_IN", "VDD_CPU_GPU_CV", "VDD_SOC"]
    assert power.read_power_mw(s, rails[0]) > 0


def test_rubik_has_no_power_monitor(tmp_path):
    write_fake_tree(RUBIK, tmp_path)
    assert power.discover_rails(DirSysfs(tmp_path)) == []


@pytest.mark.parametrize(
    "name, taken, role",
    [
        ("VDD_IN", False, "total"),
        ("VDD_SYS_CPU", False, "cpu"),
        ("VDD_CPU_GPU_CV", True, "sub"),
        ("VDD_SOC", False, "sub"),
    ],
)
def test_guess_role(name, taken, role):
    assert power.guess_role(name, taken_cpu=taken) == role


# -- implausible readings -------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw, why",
    [
        ("-60000", "implausible -60 °C"),
        ("1000000000", "implausible 1e\\+06 °C"),
        ("95", "95 is likely °C"),
        ("-150", "-150 is likely °C"),
    ],
)
def test_a_temperature_no_die_can_read_is_unavailable(tx2, tmp_path, raw, why):
    """A glitch (-60 °C, 1e6 °C) or a zone in the wrong unit ("95" = 0.095 °C) is never a
    temperature to act on: a -5 °C glitch used to lift a thermal cap."""
    _, s = tx2
    path = _by_type(s)["BCPU-therm"].temp_path
    (tmp_path / path).write_text(raw + "\n")
    temp, err = thermal.read_temp_c(s, path)
    assert temp is None and err.startswith(path)
    assert re.search(why, err), err


@pytest.mark.parametrize("raw", ["-5000", "0", "149000"])
def test_plausible_temperatures_still_read(tx2, tmp_path, raw):
    _, s = tx2
    path = _by_type(s)["BCPU-therm"].temp_path
    (tmp_path / path).write_text(raw + "\n")
    assert thermal.read_temp_c(s, path) == (int(raw) / 1000.0, None)


@pytest.mark.parametrize("raw", ["-4000", "999999999999"])
def test_an_iio_power_no_rail_can_draw_is_unavailable(tx2, tmp_path, raw):
    """A negative or kilowatt rail reading must never reach the energy integral."""
    _, s = tx2
    src = power.find_rail(s, TX2.total_rail)
    (tmp_path / src.files[0]).write_text(raw + "\n")
    assert power.read_power_mw_or_none(s, src) is None
    with pytest.raises(power.SysfsUnavailable, match="implausible power"):
        power.read_power_mw(s, src)


def test_iio_noise_below_zero_reads_as_zero(tx2, tmp_path):
    _, s = tx2
    src = power.find_rail(s, TX2.total_rail)
    (tmp_path / src.files[0]).write_text("-40\n")
    assert power.read_power_mw(s, src) == 0.0


@pytest.mark.parametrize(
    "mv, ma, ok",
    [
        ("5000", "-800", False),
        ("-5000", "-800", False),
        ("5000", "-20", True),
        ("5000", "800", True),
    ],
)
def test_hwmon_voltage_and_current_must_be_a_rail_reading(tmp_path, mv, ma, ok):
    """-5 V x -0.8 A passed as +4 W; a negative bus voltage or a current past the noise is a
    broken channel."""
    write_fake_tree(ORIN, tmp_path, seed=5)
    s = DirSysfs(tmp_path)
    src = power.find_rail(s, ORIN.total_rail)
    (tmp_path / f"{src.folder}/in{src.channel}_input").write_text(mv + "\n")
    (tmp_path / f"{src.folder}/curr{src.channel}_input").write_text(ma + "\n")
    got = power.read_power_mw_or_none(s, src)
    assert (got is not None) == ok
    if ok:
        assert got == int(mv) * max(int(ma), 0) / 1000.0


@pytest.mark.parametrize("temp", ["-274000", "0", "-5000", "250000"])
def test_a_trip_no_sensor_can_mean_is_left_out(tx2, tmp_path, temp):
    """The kernel shows a disabled trip as -274000 (THERMAL_TEMP_INVALID): read as a passive
    trip it would cap the board at room temperature for good."""
    _, s = tx2
    (tmp_path / paths.zone_file(0, "trip_point_0_temp")).write_text(temp + "\n")
    assert thermal.read_trips(s, 0) == (Trip(101000, "critical", 0),)


def test_a_trip_type_the_kernel_does_not_define_is_left_out_and_an_unreadable_one_is_passive(
    tx2, tmp_path
):
    """A vendor's ``configurable_lo`` threshold at 45 °C is a userspace engine's, and read as
    passive it throttled the board from 40 °C; a type that cannot be read still caps."""
    _, s = tx2
    zone = tmp_path / paths.zone_dir(0)
    (zone / "trip_point_2_temp").write_text("45000\n")
    (zone / "trip_point_2_type").write_text("configurable_lo\n")
    (zone / "trip_point_2_hyst").write_text("0\n")
    assert [t.type for t in thermal.read_trips(s, 0)] == ["passive", "critical"]
    (zone / "trip_point_2_type").write_text("\n")
    assert thermal.read_trips(s, 0)[2] == Trip(45000, "passive", 0)


@pytest.mark.parametrize(
    "name, ok",
    [
        ("iio:device0", True),
        ("iio:device12", True),
        ("iio_device", True),  # L4T 28 (boards.md section 2.7)
        ("iio:device", False),
        ("iio_device0", False),
        ("iio:devices", False),
        ("hwmon3", False),
        ("name", False),
    ],
)
def test_iio_folder_names(name, ok):
    assert power.is_iio_folder(name) is ok


def test_l4t28_iio_device_folders_are_discovered(tx2, tmp_path):
    w, s = tx2
    w.set_power("VDD_SYS_GPU", 777)
    drv = tmp_path / "bus/i2c/drivers/ina3221x"
    for addr, dev in (("0-0041", "iio:device1"), ("0-0040", "iio:device0")):
        os.rename(drv / addr / dev, drv / addr / "iio_device")
    rails = {r.name: r for r in power.discover_iio_rails(s)}
    assert set(rails) == {r.name for r in TX2.rails}
    assert all(r.folder.endswith("/iio_device") for r in rails.values())
    src = power.find_rail(s, next(r for r in TX2.rails if r.name == "VDD_SYS_GPU"))
    assert src is not None and power.read_power_mw(s, src) == 777.0
