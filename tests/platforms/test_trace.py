"""Trace record / replay / info: round trips on a changing fake tree, and every bad input."""

from __future__ import annotations

import gzip
import json
import os
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from platforms import paths
from platforms.clock import VirtualClock
from platforms.errors import SysfsUnavailable, SysfsWriteError, TraceError
from platforms.spec import BoardSpec, RailSpec
from platforms.sysfs import DirSysfs
from platforms.trace import (
    TIME_EPS_S,
    RecordingSysfs,
    ReplaySysfs,
    Sample,
    Trace,
    TraceHeader,
    TraceWriter,
    WriteMismatch,
    compare_writes,
    format_info,
    read_trace,
    record,
    relevant_files,
    trace_info,
)

IIO = "bus/i2c/drivers/ina3221x/0-0041/iio:device1"
HWMON_DEV = "bus/i2c/drivers/ina3221/1-0040"
HWMON = f"{HWMON_DEV}/hwmon/hwmon3"
POLICIES = {0: (0, 1), 2: (2, 3)}
ZONES = {0: "CPU-therm", 1: "GPU-therm", 2: "PLL-therm"}  # zone 2 reads blank (a quirk)


def _put(root: Path, rel: str, text: str) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


def temp_at(zone: int, t: float) -> int:
    return 40000 + 1000 * zone + int(round(t * 1000))


def freq_at(policy: int, t: float) -> int:
    return 300000 + 100000 * policy + 1000 * int(round(t * 10))


def set_dynamic(root: Path, t: float) -> None:
    """The values that change while recording: temps, cur_freq, rail power, proc/stat."""
    for z in (0, 1):
        _put(root, paths.zone_file(z, "temp"), f"{temp_at(z, t)}\n")
    for p in POLICIES:
        _put(root, paths.policy_file(p, "scaling_cur_freq"), f"{freq_at(p, t)}\n")
    _put(root, paths.iio_power(IIO, 0), f"{5000 + int(t * 100)}\n")
    ticks = int(round(t * 100))
    _put(
        root,
        paths.PROC_STAT,
        f"cpu  {ticks} 0 0 {ticks} 0 0 0 0 0 0\ncpu0 {ticks} 0 0 0 0 0 0 0 0 0\n",
    )


def build_tree(root: Path) -> Path:
    """A small two-policy board: 3 zones, an IIO and a hwmon INA3221, proc and device-tree."""
    _put(root, f"{paths.CPU}/online", "0-3\n")
    _put(root, f"{paths.CPU}/present", "0-3\n")
    _put(root, f"{paths.CPU}/possible", "0-3\n")
    (root / paths.CPU / "cpuidle").mkdir(parents=True)
    for cpu in range(1, 4):  # cpu0 has no online file, as on the boards
        _put(root, paths.cpu_online(cpu), "1\n")
    (root / paths.CPU / "cpu0").mkdir(parents=True, exist_ok=True)
    for p, cpus in POLICIES.items():
        for name in paths.POLICY_FILES:
            _put(root, paths.policy_file(p, name), "0\n")
        _put(root, paths.policy_file(p, "related_cpus"), " ".join(map(str, cpus)) + "\n")
        _put(root, paths.policy_file(p, "scaling_governor"), "schedutil\n")
        _put(root, paths.policy_file(p, "scaling_setspeed"), "<unsupported>\n")
        _put(root, paths.policy_file(p, "stats/time_in_state"), "300000 1\n")
    for z, type_ in ZONES.items():
        _put(root, paths.zone_file(z, "type"), type_ + "\n")
        _put(root, paths.zone_file(z, "trip_point_0_temp"), "95000\n")
        _put(root, paths.zone_file(z, "trip_point_0_type"), "passive\n")
        _put(root, paths.zone_file(z, "policy"), "step_wise\n")  # not read by the daemon
    _put(root, paths.zone_file(2, "temp"), "\n")
    for ch, rail in enumerate(("VDD_IN", "VDD_SYS_CPU", "VDD_SYS_DDR")):
        _put(root, paths.iio_rail_name(IIO, ch), rail + "\n")
        _put(root, paths.iio_power(IIO, ch), "1000\n")
        _put(root, f"{IIO}/in_current{ch}_input", "200\n")
        _put(root, f"{IIO}/in_voltage{ch}_input", "5000\n")
        _put(root, f"{IIO}/warn_current_limit_{ch}", "9000\n")
    (root / "bus/iio/devices").mkdir(parents=True)
    os.symlink(root / IIO, root / "bus/iio/devices/iio:device1")
    _put(root, "bus/iio/devices/iio:device5/name", "adc\n")  # an IIO sensor that is no rail
    _put(root, "bus/iio/devices/iio:device5/in_voltage0_input", "12\n")
    _put(root, f"{HWMON}/name", "ina3221\n")
    _put(root, f"{HWMON}/in1_label", "VDD_IN\n")
    _put(root, f"{HWMON}/in1_input", "5000\n")
    _put(root, f"{HWMON}/curr1_input", "800\n")
    _put(root, f"{HWMON}/shunt1_resistor", "5000\n")
    (root / "class/hwmon").mkdir(parents=True)
    os.symlink(root / HWMON, root / "class/hwmon/hwmon3")
    _put(root, "class/hwmon/hwmon0/name", "pwmfan\n")
    _put(root, "class/hwmon/hwmon0/pwm1", "128\n")
    _put(root, paths.DT_COMPATIBLE, "nvidia,p3310\x00nvidia,tegra186\x00")
    _put(root, paths.DT_MODEL, "test board\x00")
    set_dynamic(root, 0.0)
    return root


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return build_tree(tmp_path / "sys")


def record_changing(tree: Path, out: Path, *, period_s=0.5, duration_s=5.0) -> int:
    clock = VirtualClock(0.0, on_advance=lambda target: set_dynamic(tree, target))
    return record(
        DirSysfs(tree), clock, out, period_s=period_s, duration_s=duration_s, board="fake"
    )


# --------------------------------------------------------------------------------------------
# discovery


def test_relevant_files_discovers_every_daemon_input_and_nothing_else(tree):
    files = relevant_files(DirSysfs(tree))
    for p in POLICIES:
        for name in paths.POLICY_FILES:
            assert paths.policy_file(p, name) in files
    assert f"{paths.CPU}/online" in files
    assert [f for f in files if re.fullmatch(r".*/cpu\d+/online", f)] == [
        paths.cpu_online(c) for c in (1, 2, 3)
    ]
    for z in ZONES:
        for name in ("type", "temp", "trip_point_0_temp", "trip_point_0_type"):
            assert paths.zone_file(z, name) in files
        assert paths.zone_file(z, "policy") not in files
    for ch in range(3):
        for f in (
            paths.iio_power(IIO, ch),
            paths.iio_rail_name(IIO, ch),
            f"{IIO}/in_current{ch}_input",
        ):
            assert f in files
        assert f"{IIO}/warn_current_limit_{ch}" not in files
        assert f"bus/iio/devices/iio:device1/in_power{ch}_input" in files
    assert not any("iio:device5" in f for f in files)
    for name in ("name", "in1_label", "in1_input", "curr1_input"):
        assert f"{HWMON}/{name}" in files
        assert f"class/hwmon/hwmon3/{name}" in files  # found by name through class/hwmon
    assert f"{HWMON}/shunt1_resistor" not in files
    assert not any(f.startswith("class/hwmon/hwmon0") for f in files)  # pwm fan, not a rail
    assert not any("time_in_state" in f or "cpu0/online" in f for f in files)
    for f in (paths.PROC_STAT, paths.DT_COMPATIBLE, paths.DT_MODEL):
        assert f in files
    assert files == sorted(set(files))


def test_relevant_files_adds_the_rails_a_spec_places_elsewhere(tree):
    iio, hw = "devices/platform/adc/iio:device0", "devices/platform/pm/ina"
    _put(tree, paths.iio_rail_name(iio, 0), "VDD_IN\n")
    _put(tree, paths.iio_power(iio, 0), "4000\n")
    _put(tree, f"{hw}/hwmon/hwmon7/in2_label", "VDD_CPU\n")
    _put(tree, f"{hw}/hwmon/hwmon7/curr2_input", "300\n")
    rails = (
        RailSpec(name="VDD_IN", role="total", driver="iio", device=iio, channel=0),
        RailSpec(name="VDD_CPU", role="cpu", driver="hwmon", device="/" + hw, channel=2),
    )
    spec = BoardSpec(
        name="x", title="x", compatible=(), model=(), clusters=(), zones=(), rails=rails
    )
    assert not any(f.startswith("devices/platform") for f in relevant_files(DirSysfs(tree)))
    extra = [f for f in relevant_files(DirSysfs(tree), spec) if f.startswith("devices/platform")]
    assert extra == [
        paths.iio_power(iio, 0),
        paths.iio_rail_name(iio, 0),
        f"{hw}/hwmon/hwmon7/curr2_input",
        f"{hw}/hwmon/hwmon7/in2_label",
    ]


# --------------------------------------------------------------------------------------------
# record -> replay


@pytest.mark.parametrize("name", ["t.jsonl", "t.jsonl.gz"])
def test_replay_serves_what_was_recorded_at_and_between_samples(tree, tmp_path, name):
    out = tmp_path / name
    n = record_changing(tree, out)
    assert n == 10
    trace = read_trace(out)
    assert [s.t for s in trace.samples] == pytest.approx([0.5 * k for k in range(10)])
    temps = [s.r[paths.zone_file(0, "temp")] for s in trace.samples]
    assert len(set(temps)) == 10  # the tree changed under the recorder
    for s in trace.samples:  # and each sample holds the tree's value at its own time
        assert s.r[paths.zone_file(1, "temp")] == str(temp_at(1, s.t))
        assert s.r[paths.policy_file(2, "scaling_cur_freq")] == str(freq_at(2, s.t))
        assert s.r[paths.zone_file(2, "temp")] is None  # blank file -> unavailable
        assert s.r[paths.DT_COMPATIBLE] == "nvidia,p3310\x00nvidia,tegra186"
    clock = VirtualClock(100.0)
    replay = ReplaySysfs(trace, clock)
    for i, s in enumerate(trace.samples):
        for probe in (s.t, s.t + 0.25):
            clock.set(100.0 + probe)
            for path, value in s.r.items():
                if value is None:
                    with pytest.raises(SysfsUnavailable, match="recorded as unavailable"):
                        replay.read(path)
                else:
                    assert replay.read(path) == value, (i, probe, path)
    clock.set(1000.0)  # past the end: the last values stay
    assert replay.read(paths.zone_file(0, "temp")) == temps[-1]
    assert replay.read_int(paths.policy_file(0, "scaling_cur_freq")) == freq_at(
        0, trace.samples[-1].t
    )


def test_replay_on_a_stepped_virtual_clock_sees_each_sample_despite_float_sums(tmp_path):
    out = tmp_path / "s.jsonl"
    with TraceWriter(out, TraceHeader(board="b", period_s=0.1)) as w:
        for k in range(31):
            w.write_sample(k * 0.1, {"x": str(k)})
    clock = VirtualClock(0.0)
    replay = ReplaySysfs(read_trace(out), clock)
    seen = []
    for _ in range(31):
        seen.append(replay.read("x"))
        clock.sleep(0.1)  # 0.1 summed ten times is 0.9999999999999999
    assert seen == [str(k) for k in range(31)]


def test_gz_trace_is_gzip_and_equals_the_plain_one(tree, tmp_path):
    record_changing(tree, tmp_path / "a.jsonl")
    build_tree(tmp_path / "sys2")
    record_changing(tmp_path / "sys2", tmp_path / "b.jsonl.gz")
    assert (tmp_path / "b.jsonl.gz").read_bytes()[:2] == b"\x1f\x8b"
    a, b = read_trace(tmp_path / "a.jsonl"), read_trace(tmp_path / "b.jsonl.gz")
    assert a.samples == b.samples
    assert a.header.files == b.header.files and a.header.board == b.header.board == "fake"


def test_replay_refuses_files_not_in_trace_naming_them(tree, tmp_path):
    record_changing(tree, tmp_path / "t.jsonl")
    clock = VirtualClock(0.0)
    replay = ReplaySysfs(read_trace(tmp_path / "t.jsonl"), clock)
    missing = paths.policy_file(0, "cpuinfo_cur_freq")
    with pytest.raises(SysfsUnavailable, match=f"{missing}: unavailable \\(not in trace\\)"):
        replay.read(missing)
    clock.set(-1.0)  # before the first sample nothing was recorded yet
    with pytest.raises(SysfsUnavailable, match="not in trace at t=-1.000 s"):
        replay.read(paths.zone_file(0, "temp"))


def test_replay_exists_and_list_answer_from_recorded_paths(tree, tmp_path):
    record_changing(tree, tmp_path / "t.jsonl")
    replay = ReplaySysfs(read_trace(tmp_path / "t.jsonl"), VirtualClock())
    assert replay.list(paths.CPUFREQ) == ["policy0", "policy2"]
    assert replay.list(paths.THERMAL) == ["thermal_zone0", "thermal_zone1", "thermal_zone2"]
    assert replay.list(paths.zone_dir(0)) == [
        "temp",
        "trip_point_0_temp",
        "trip_point_0_type",
        "type",
    ]
    assert replay.exists(paths.CPU) and replay.exists(paths.policy_dir(2) + "/")
    assert replay.exists(paths.zone_file(2, "temp"))  # exists, though it never read
    assert not replay.exists(paths.policy_dir(1)) and not replay.exists(
        paths.zone_file(0, "policy")
    )
    assert replay.list("no/such/dir") == []


def test_replay_keeps_writes_without_changing_reads(tree, tmp_path):
    record_changing(tree, tmp_path / "t.jsonl")
    clock = VirtualClock(10.0)
    replay = ReplaySysfs(read_trace(tmp_path / "t.jsonl"), clock)
    fmax, gov = paths.policy_file(0, "scaling_max_freq"), paths.policy_file(0, "scaling_governor")
    setspeed = paths.policy_file(0, "scaling_setspeed")
    before = replay.read(fmax)
    clock.set(11.0)
    replay.write(fmax, "400000")
    replay.write(gov, "userspace")
    replay.write("/" + setspeed, "400000")  # recorded as unavailable, but the file exists
    assert replay.writes == [
        (1.0, fmax, "400000"),
        (1.0, gov, "userspace"),
        (1.0, setspeed, "400000"),
    ]
    clock.set(11.5)
    assert replay.read(fmax) == before and replay.read(gov) == "schedutil"
    with pytest.raises(
        SysfsUnavailable, match="scaling_setspeed: unavailable \\(recorded as unavailable"
    ):
        replay.read(setspeed)
    with pytest.raises(SysfsWriteError, match="cpuinfo_cur_freq.*ENOENT.*not in trace"):
        replay.write(paths.policy_file(0, "cpuinfo_cur_freq"), "1")


def test_compare_writes_reports_each_differing_tick(tmp_path):
    pol = paths.policy_file(0, "scaling_setspeed")
    trace = Trace(
        TraceHeader(board="b", period_s=1.0),
        [Sample(0.0, {}, {pol: "100"}), Sample(1.0, {}, {}), Sample(2.0, {}, {pol: "300"})],
    )
    assert compare_writes(trace, [(0.1, pol, "50"), (0.2, pol, "100"), (2.5, pol, "300")]) == []
    got = compare_writes(trace, [(0.0, pol, "100"), (1.2, pol, "200"), (2.0, pol, "400")])
    assert got == [WriteMismatch(1.0, pol, None, "200"), WriteMismatch(2.0, pol, "300", "400")]


# --------------------------------------------------------------------------------------------
# the recording wrapper and the recorder loop


def test_recording_sysfs_forwards_and_remembers_since_take(tree):
    rec = RecordingSysfs(DirSysfs(tree))
    temp = paths.zone_file(0, "temp")
    assert rec.read_int(temp) == temp_at(0, 0.0)
    with pytest.raises(SysfsUnavailable, match="empty file"):
        rec.read(paths.zone_file(2, "temp"))
    rec.write(paths.policy_file(0, "scaling_governor"), "userspace")
    with pytest.raises(SysfsWriteError):
        rec.write("no/such/file", "1")
    assert rec.list(paths.CPUFREQ) == ["policy0", "policy2"] and rec.exists(temp)
    reads, writes = rec.take()
    assert reads == {temp: str(temp_at(0, 0.0)), paths.zone_file(2, "temp"): None}
    assert writes == {paths.policy_file(0, "scaling_governor"): "userspace"}
    assert (tree / paths.policy_file(0, "scaling_governor")).read_text() == "userspace"
    assert rec.take() == ({}, {})


def test_recording_sysfs_output_replays(tree, tmp_path):
    """What the daemon would do: wrap, read/write per tick, write samples; the replay agrees."""
    rec = RecordingSysfs(DirSysfs(tree))
    temp, gov = paths.zone_file(0, "temp"), paths.policy_file(0, "scaling_governor")
    out = tmp_path / "d.jsonl"
    with TraceWriter(out, TraceHeader(board="fake", period_s=0.1, files=[temp, gov])) as w:
        for k in range(3):
            set_dynamic(tree, k * 0.1)
            rec.read(temp)
            rec.write(gov, f"g{k}")
            w.write_sample(k * 0.1, *rec.take())
    trace = read_trace(out)
    replay = ReplaySysfs(trace, VirtualClock(0.0), t0=0.0)
    assert compare_writes(trace, [(k * 0.1, gov, f"g{k}") for k in range(3)]) == []
    replay.clock.set(0.2)
    assert replay.read(temp) == str(temp_at(0, 0.2))


def test_record_stops_on_interrupt_when_open_ended_and_keeps_the_trace(tree, tmp_path):
    def stop_after_three(count, t):
        if count == 3:
            raise KeyboardInterrupt

    out = tmp_path / "t.jsonl.gz"
    n = record(
        DirSysfs(tree),
        VirtualClock(),
        out,
        period_s=1.0,
        duration_s=None,
        board=None,
        on_sample=stop_after_three,
    )
    assert n == 3 and len(read_trace(out).samples) == 3


def test_record_skips_grid_points_it_overran(tree, tmp_path):
    clock = VirtualClock()
    slow = {2}  # the third sample takes 2.5 periods

    def on_sample(count, t):
        if count in slow:
            clock.set(clock.now() + 2.5)

    n = record(
        DirSysfs(tree),
        clock,
        tmp_path / "t.jsonl",
        period_s=1.0,
        duration_s=8.0,
        board="b",
        files=[paths.PROC_STAT],
        on_sample=on_sample,
    )
    times = read_trace(tmp_path / "t.jsonl").times
    assert times == [0.0, 1.0, 4.0, 5.0, 6.0, 7.0] and n == 6


def test_record_validates_its_arguments(tree, tmp_path):
    with pytest.raises(ValueError, match="period_s must be > 0 seconds, got 0"):
        record(
            DirSysfs(tree),
            VirtualClock(),
            tmp_path / "x.jsonl",
            period_s=0,
            duration_s=1,
            board=None,
        )
    with pytest.raises(ValueError, match="duration_s"):
        record(
            DirSysfs(tree),
            VirtualClock(),
            tmp_path / "x.jsonl",
            period_s=1,
            duration_s=-1,
            board=None,
        )


def test_writer_refuses_what_the_reader_would_refuse(tmp_path):
    with TraceWriter(tmp_path / "w.jsonl", TraceHeader(board=None, period_s=1.0)) as w:
        w.write_sample(1.0, {"a": "1"})
        with pytest.raises(ValueError, match="earlier than the previous"):
            w.write_sample(0.5, {})
        with pytest.raises(ValueError, match="sample time must be 0 to"):
            w.write_sample(float("nan"), {})
        with pytest.raises(ValueError, match="sample time must be 0 to"):
            w.write_sample(1e308, {})
        with pytest.raises(TypeError, match="read of a: expected text or None, got 5"):
            w.write_sample(2.0, {"a": 5})
    with pytest.raises(RuntimeError, match="closed"):
        w.write_sample(3.0, {})
    assert len(read_trace(tmp_path / "w.jsonl").samples) == 1
    with pytest.raises(ValueError, match="period_s must be"):
        TraceWriter(tmp_path / "p.jsonl", TraceHeader(board=None, period_s=1e-9)).open()


def test_crashed_gz_recording_loses_at_most_the_last_line(tmp_path):
    out = tmp_path / "c.jsonl.gz"
    w = TraceWriter(out, TraceHeader(board="b", period_s=1.0)).open()
    for k in range(3):
        w.write_sample(k, {"x": str(k)})
    crashed = tmp_path / "crashed.jsonl.gz"
    crashed.write_bytes(out.read_bytes())  # the bytes on disk, without the gzip trailer
    w.close()
    with pytest.raises(
        TraceError, match=r"crashed.jsonl.gz: line 5: truncated: the gzip stream is cut short"
    ):
        read_trace(crashed)
    salvaged = read_trace(crashed, allow_truncated=True)
    assert [s.r["x"] for s in salvaged.samples] == ["0", "1", "2"]
    assert "line 5" in salvaged.truncated and "TRUNCATED line 5" in format_info(
        trace_info(salvaged)
    )


# --------------------------------------------------------------------------------------------
# bad input: every message names the line and the cause

HEADER = json.dumps(
    {
        "format": "hidvfs-trace",
        "version": 1,
        "board": "b",
        "period_s": 0.5,
        "started": "2024-05-01T10:00:00+00:00",
        "files": [],
    }
)


def _header(**kw) -> str:
    h = json.loads(HEADER)
    h.update(kw)
    return json.dumps(h)


@pytest.mark.parametrize(
    ("text", "line", "cause"),
    [
        ("", 1, "empty file"),
        ("\n\n", 1, "empty file"),
        ("{not json\n", 1, "header: not JSON"),
        ("[1, 2]\n", 1, "header: expected a JSON object, got list"),
        (_header(format="csv") + "\n", 1, "not a hidvfs trace: header 'format' is 'csv'"),
        ('{"t": 0, "r": {}}\n', 1, "not a hidvfs trace: header 'format' is None"),
        (
            _header(version=7) + "\n",
            1,
            r"trace version 7 is newer than this hidvfs understands \(1\); upgrade hidvfs",
        ),
        (_header(version=0) + "\n", 1, "trace version 0 is unknown"),
        (_header(version="1") + "\n", 1, "header 'version' must be an integer, got '1'"),
        (_header(period_s=0) + "\n", 1, "'period_s' must be a number of seconds from 0.001"),
        # a period no recorder samples at would make a replay tick forever
        (_header(period_s=1e-9) + "\n", 1, "'period_s' must be .* got 1e-09"),
        (_header(started="yesterday") + "\n", 1, "'started' must be an ISO-8601 time"),
        (_header(board=3) + "\n", 1, "'board' must be a string or null"),
        (_header(files="a") + "\n", 1, "'files' must be a list"),
        (HEADER + '\n{"t": 0, "r": {}}\n{"t": 1, "r": {\n{"t": 2}\n', 3, "corrupt line: not JSON"),
        (HEADER + '\n{"r": {"a": "1"}, "w": {}}\n', 2, "corrupt line: sample has no 't'"),
        (
            HEADER + '\n{"t": "0.5", "r": {}}\n',
            2,
            "corrupt line: 't' must be a number of seconds from 0 to 1e\\+09, got '0.5'",
        ),
        (HEADER + '\n{"t": true}\n', 2, "'t' must be a number of seconds"),
        (HEADER + '\n{"t": NaN}\n', 2, "'t' must be a number of seconds"),
        # past 1e9 s a float time no longer advances by a period: a replay would never end
        (HEADER + '\n{"t": 1e308}\n', 2, "'t' must be a number of seconds from 0 to 1e\\+09"),
        (HEADER + '\n{"t": -1}\n', 2, "'t' must be a number of seconds from 0"),
        (HEADER + "\n" + "[" * 100000 + "]" * 100000 + "\n", 2, "nested too deeply"),
        (HEADER + '\n{"t": 0, "r": []}\n', 2, "corrupt line: 'r' must be an object"),
        (
            HEADER + '\n{"t": 0, "r": {"a": 5}}\n',
            2,
            "corrupt line: 'r' value of 'a' must be text or null, got 5",
        ),
        (
            HEADER + '\n{"t": 0, "w": {"a": null}}\n',
            2,
            "corrupt line: 'w' value of 'a' must be text",
        ),
        (HEADER + "\n[0]\n", 2, "corrupt line: a sample must be a JSON object, got list"),
        (
            HEADER + '\n{"t": 0}\n{"t": 2}\n{"t": 1.5}\n',
            4,
            r"time goes backwards: t=1.5 after t=2.0",
        ),
        (HEADER + '\n{"t": 0}\n{"t": 1, "r": {"a": "x', 3, "truncated last line"),
        (HEADER[:30], 1, "truncated last line"),
    ],
)
def test_bad_traces_are_refused_naming_line_and_cause(tmp_path, text, line, cause):
    p = tmp_path / "bad.jsonl"
    p.write_text(text)
    with pytest.raises(TraceError, match=f"bad.jsonl: line {line}: .*{cause}") as err:
        read_trace(p)
    assert err.value.line == line and err.value.file == str(p)


def test_last_line_without_newline_that_parses_is_kept(tmp_path):
    p = tmp_path / "ok.jsonl"
    p.write_text(HEADER + '\n{"t": 0, "r": {"a": "1"}}\n\n{"t": 0.5, "r": {"a": "2"}}')
    trace = read_trace(p)
    assert [s.r["a"] for s in trace.samples] == ["1", "2"] and trace.truncated is None


def test_truncated_last_line_can_be_salvaged(tmp_path):
    p = tmp_path / "cut.jsonl"
    p.write_text(HEADER + '\n{"t": 0, "r": {"a": "1"}}\n{"t": 1, "r": {"a"')
    trace = read_trace(p, allow_truncated=True)
    assert len(trace.samples) == 1 and trace.truncated.startswith("line 3: truncated last line")


def test_gz_cut_short_names_the_line(tmp_path):
    plain = (
        HEADER
        + "\n"
        + "".join(json.dumps({"t": k, "r": {"a": "x" * 50 + str(k)}}) + "\n" for k in range(200))
    ).encode()
    p = tmp_path / "cut.jsonl.gz"
    p.write_bytes(gzip.compress(plain)[:-40])
    with pytest.raises(
        TraceError, match=r"cut.jsonl.gz: line \d+: truncated: the gzip stream is cut short"
    ) as err:
        read_trace(p)
    assert 1 < err.value.line <= 202
    p.write_bytes(b"\x1f\x8b" + b"garbage" * 10)
    with pytest.raises(TraceError, match="line 1: corrupt gzip data"):
        read_trace(p)


def test_missing_file_is_a_trace_error(tmp_path):
    with pytest.raises(TraceError, match="nope.jsonl: line 0: cannot open"):
        read_trace(tmp_path / "nope.jsonl")


# --------------------------------------------------------------------------------------------
# info


def test_trace_info_numbers_on_a_known_trace(tmp_path):
    z0, z1 = paths.zone_dir(0), paths.zone_dir(1)
    f0, f4 = paths.policy_file(0, "scaling_cur_freq"), paths.policy_file(4, "scaling_cur_freq")
    rows = [
        {
            "t": 0.0,
            "r": {
                f"{z0}/type": "CPU-therm",
                f"{z0}/temp": "41000",
                f"{z1}/type": "GPU-therm",
                f"{z1}/temp": None,
                f0: "729600",
                f4: "1113600",
            },
            "w": {},
        },
        {
            "t": 0.5,
            "r": {f"{z0}/temp": "45500", f"{z1}/temp": "39000", f0: "1984000", f4: "<bad>"},
            "w": {paths.policy_file(0, "scaling_setspeed"): "1984000"},
        },
        {
            "t": 1.0,
            "r": {f"{z0}/temp": "43000", f"{z1}/temp": "40250", f0: "1190400", f4: "2035200"},
            "w": {
                paths.policy_file(0, "scaling_setspeed"): "1190400",
                paths.policy_file(4, "scaling_setspeed"): "2035200",
            },
        },
        {"t": 2.0, "r": {f"{z0}/temp": "42000"}, "w": {}},
    ]
    p = tmp_path / "k.jsonl"
    p.write_text(
        _header(board="orin-nx", files=[f"{z0}/temp"])
        + "\n"
        + "".join(json.dumps(r) + "\n" for r in rows)
    )
    info = trace_info(read_trace(p))
    assert info["board"] == "orin-nx" and info["samples"] == 4
    assert info["duration_s"] == 2.0 and info["rate_hz"] == pytest.approx(1.5)
    assert info["files"] == 8  # 6 read + 2 setspeed written
    assert info["zones_c"] == {
        "CPU-therm": {"min": 41.0, "max": 45.5},
        "GPU-therm": {"min": 39.0, "max": 40.25},
    }
    assert info["policies_khz"] == {
        "policy0": {"min": 729600, "max": 1984000},
        "policy4": {"min": 1113600, "max": 2035200},
    }
    assert info["writes"] == 3 and info["unavailable_reads"] == 1
    text = format_info(info)
    assert "orin-nx" in text and "4 over 2.000 s, mean rate 1.50 Hz" in text
    assert "CPU-therm  41.0 .. 45.5 °C" in text and "policy4   1113600 .. 2035200 kHz" in text
    assert "write entries 3" in text


def test_trace_info_on_an_empty_trace_and_duplicate_zone_types(tmp_path):
    z = [paths.zone_dir(i) for i in range(2)]
    p = tmp_path / "e.jsonl"
    p.write_text(HEADER + "\n")
    info = trace_info(read_trace(p))
    assert info["samples"] == 0 and info["rate_hz"] is None and info["duration_s"] == 0
    assert "mean rate n/a" in format_info(info)
    row = {
        "t": 0,
        "r": {
            f"{z[0]}/type": "soc",
            f"{z[0]}/temp": "1000",
            f"{z[1]}/type": "soc",
            f"{z[1]}/temp": None,
        },
    }
    p.write_text(HEADER + "\n" + json.dumps(row) + "\n")
    info = trace_info(read_trace(p))
    assert info["zones_c"] == {
        "soc": {"min": 1.0, "max": 1.0},
        "soc (thermal_zone1)": {"min": None, "max": None},
    }
    assert "soc (thermal_zone1)  unavailable" in format_info(info)


# --------------------------------------------------------------------------------------------
# invariants

_paths = st.sampled_from(["a/x", "a/y", "b/z", "c"])
_values = st.one_of(st.none(), st.text(max_size=8))
_samples = st.lists(
    st.tuples(
        st.floats(0, 5, allow_nan=False).map(lambda x: round(x, 3)),
        st.dictionaries(_paths, _values, max_size=4),
    ),
    max_size=12,
).map(lambda rows: sorted(rows, key=lambda r: r[0]))


@settings(max_examples=60, deadline=None)
@given(
    rows=_samples, probes=st.lists(st.floats(-1, 6, allow_nan=False), max_size=10), gz=st.booleans()
)
def test_roundtrip_and_replay_match_a_linear_scan(tmp_path_factory, rows, probes, gz):
    out = tmp_path_factory.mktemp("h") / ("t.jsonl.gz" if gz else "t.jsonl")
    with TraceWriter(out, TraceHeader(board="b", period_s=0.1)) as w:
        for t, r in rows:
            w.write_sample(t, r, {})
    trace = read_trace(out)
    assert [(s.t, s.r) for s in trace.samples] == rows
    clock = VirtualClock(0.0)
    replay = ReplaySysfs(trace, clock)
    for now in probes:
        clock.set(now)
        for path in ("a/x", "a/y", "b/z", "c"):
            seen = [r[path] for t, r in rows if t <= now + TIME_EPS_S and path in r]
            if not seen or seen[-1] is None:
                with pytest.raises(SysfsUnavailable):
                    replay.read(path)
            else:
                assert replay.read(path) == seen[-1]
    recorded = {p for _, r in rows for p in r}
    assert replay.exists("a") == any(p.startswith("a/") for p in recorded)
    assert replay.list("") == sorted({p.split("/")[0] for p in recorded})


def test_record_stops_when_told_with_a_complete_gz_trace(tree, tmp_path):
    """A stop (what a SIGTERM handler sets) ends a long recording at once, even in the middle
    of a period, and the .gz is closed with its trailer: it reads back whole."""
    import threading
    import time

    from platforms.clock import MonotonicClock

    stop = threading.Event()

    def stop_after_one(count, t):
        if count == 1:
            threading.Timer(0.2, stop.set).start()  # during the 30 s wait for the second

    out = tmp_path / "t.jsonl.gz"
    started = time.monotonic()
    n = record(
        DirSysfs(tree),
        MonotonicClock(),
        out,
        period_s=30.0,
        duration_s=600.0,
        board="fake",
        on_sample=stop_after_one,
        stop=stop,
    )
    assert n == 1 and time.monotonic() - started < 10
    with gzip.open(out, "rb") as f:
        f.read()  # no EOFError: the gzip stream is complete
    assert len(read_trace(out).samples) == 1
    stop.set()  # already set before the first sample: the header alone
    assert (
        record(
            DirSysfs(tree),
            MonotonicClock(),
            out,
            period_s=1.0,
            duration_s=5.0,
            board="fake",
            stop=stop,
        )
        == 0
    )
    assert read_trace(out).samples == []


def test_relevant_files_finds_l4t28_rails_in_an_iio_device_folder(tree):
    """L4T 28 names the ina3221x channel folder ``iio_device`` (boards.md 2.7): a trace
    recorded there keeps the rails."""
    old = tree / IIO
    new = old.parent / "iio_device"
    os.rename(old, new)
    files = relevant_files(DirSysfs(tree))
    rel = str(new.relative_to(tree))
    assert all(f"{rel}/in_power{ch}_input" in files for ch in range(3))
