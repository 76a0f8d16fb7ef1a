"""The loop on a fake tree whose sensors fail mid-run: the energy integral keeps what it
had and says what it missed; a failing file is logged when it fails and when it recovers, and
what is unavailable from the start (a power-gated zone) is one INFO line, not a warning each."""

from __future__ import annotations

import errno
import logging
import os
import shutil

import pytest

from agents.governors import make_governor
from daemon.logs import SensorErrorLog
from daemon.loop import ControlLoop
from platforms import paths, power
from platforms.clock import VirtualClock
from platforms.faketree import FakeWriter, inject_read_error, write_fake_tree
from platforms.platform import Platform
from platforms.procs import NoProcesses
from platforms.spec import load_board
from platforms.sysfs import DirSysfs

TX2 = load_board("tx2")


@pytest.fixture
def loop(tmp_path):
    write_fake_tree(TX2, tmp_path)
    sysfs = DirSysfs(tmp_path)
    clock = VirtualClock(0.0)
    lp = ControlLoop(
        Platform(TX2, sysfs, NoProcesses(), clock, kind="fake"),
        make_governor("schedutil"),
        period_s=0.1,
    )
    total = tmp_path / power.find_rail(sysfs, TX2.total_rail).files[0]
    return lp, clock, total


def _ticks(lp, clock, n):
    for _ in range(n):
        lp.tick()
        clock.set(clock.now() + 0.1)


def test_a_failed_total_rail_keeps_the_energy_and_counts_the_gap(loop):
    lp, clock, total = loop
    total.write_text("4000\n")  # 4 W
    _ticks(lp, clock, 11)  # 1 s metered
    assert lp.status()["energy_j"] == pytest.approx(4.0)
    total.write_text("garbage\n")
    _ticks(lp, clock, 5)
    st = lp.status()
    assert st["power_w"]["total"] is None
    assert st["energy_j"] == pytest.approx(4.0)  # not null while the rail is down
    total.write_text("4000\n")
    _ticks(lp, clock, 5)
    st = lp.status()
    # the 0.6 s across the failed readings is missing from the integral, and says so
    assert st["energy_gap_s"] == pytest.approx(0.6)
    assert st["energy_j"] == pytest.approx(4.0 * (2.0 - 0.6))


def test_energy_stays_null_until_the_rail_was_read_once(loop):
    lp, clock, total = loop
    total.write_text("\n")
    _ticks(lp, clock, 3)
    st = lp.status()
    assert st["energy_j"] is None and st["energy_gap_s"] == 0.0


def test_a_failing_file_is_logged_once_when_it_fails_and_when_it_recovers(caplog):
    slog = SensorErrorLog(logging.getLogger("sensor-log-test"))
    err = "class/thermal/thermal_zone0/temp: unavailable (empty file)"
    with caplog.at_level(logging.INFO, logger="sensor-log-test"):
        slog.update([])  # it worked at the start
        for _ in range(5):
            slog.update([err])
        slog.update([])
        slog.update([])
    msgs = [r.getMessage() for r in caplog.records]
    assert msgs == [
        f"event=sensor_unavailable detail={err!r}",
        "event=sensor_recovered file=class/thermal/thermal_zone0/temp",
    ]


def test_the_status_gives_each_clusters_ceiling_with_the_caps_folded_in(tmp_path):
    """The coordinator scores a node's speed by its ceiling now, not its idle frequency."""
    from daemon.guard import ThermalGuard

    write_fake_tree(TX2, tmp_path)
    a57 = TX2.cluster("a57")
    cap = a57.freqs_khz[4]
    lp = ControlLoop(
        Platform(TX2, DirSysfs(tmp_path), NoProcesses(), VirtualClock(0.0), kind="fake"),
        make_governor("schedutil"),
        guard=ThermalGuard(static_khz={"a57": cap}),
    )
    lp.tick()
    got = {c["name"]: c["limit_khz"] for c in lp.status()["clusters"]}
    assert got == {"a57": cap, "denver": TX2.cluster("denver").fmax_khz}


def test_a_burst_of_early_ticks_cannot_push_the_next_decision_past_two_periods(tmp_path):
    """Each tick woken early (a registration) pushed the schedule a period: 300 requests left
    the guard without a decision for 20 s. On a board the lead is capped at two periods."""
    write_fake_tree(TX2, tmp_path)
    stops = [round(0.1 * k, 6) for k in range(1, 10)]  # nine early wakes inside one period

    def stop_early(target):
        if stops and stops[0] < target:
            return stops.pop(0)
        return None

    clock = VirtualClock(0.0, on_advance=stop_early)
    lp = ControlLoop(
        Platform(TX2, DirSysfs(tmp_path), NoProcesses(), clock, kind="fake"),
        make_governor("schedutil"),
        period_s=1.0,
    )
    lp.max_lead_periods = 2.0
    ticks: list[float] = []
    lp.on_tick.append(lambda res: ticks.append(res.t))
    lp.run(duration_s=6.0)
    gaps = [b - a for a, b in zip(ticks, ticks[1:])]
    assert max(gaps) <= 2.0 + 1e-9, ticks


def test_finished_jobs_are_counted_all_and_kept_only_recently():
    from daemon.jobs import RECENT_OUTCOMES, JobEntry, JobTable

    table = JobTable()
    n = RECENT_OUTCOMES + 500
    for pid in range(n):
        table.register(
            JobEntry(
                pid=pid,
                name="j",
                release_t=0.0,
                deadline_s=1.0,
                criticality="hi" if pid % 2 else "lo",
            )
        )
        table.finish(pid, 2.0 if pid % 3 == 0 else 0.5)  # every third misses
    assert table.done == n and len(table.outcomes) == RECENT_OUTCOMES
    misses = sum(1 for pid in range(n) if pid % 3 == 0)
    assert sum(table.misses().values()) == misses


def test_a_job_unregistered_alive_is_forgotten_by_the_stages_and_the_estimate(tmp_path):
    """A pid registered again is a new job: it must not inherit the old one's progress
    estimate or the shield's bounds (it started at 90 % done)."""
    from daemon.jobs import JobEntry, JobTable

    class Alive(NoProcesses):
        def alive(self, pid):
            return True

        def get_affinity(self, pid):
            return (0,)

    class Stage:
        forgotten: list = []

        def __call__(self, decision, obs):
            return decision

        def forget(self, pid):
            self.forgotten.append(pid)

    write_fake_tree(TX2, tmp_path)
    table = JobTable()
    stage = Stage()
    lp = ControlLoop(
        Platform(TX2, DirSysfs(tmp_path), Alive(), VirtualClock(0.0), kind="fake"),
        make_governor("schedutil"),
        jobs=table,
        stages=[stage],
    )
    table.register(JobEntry(pid=77, name="x", release_t=0.0))
    lp.tick()
    table.unregister(77)
    lp.tick()
    assert stage.forgotten == [77]
    # unregistered and registered again between two ticks (a client changing the deadline):
    # still a new job
    table.unregister(77)
    table.register(JobEntry(pid=77, name="x", release_t=5.0, deadline_s=3.0))
    lp.tick()
    assert stage.forgotten == [77]  # the first registration ended already
    table.register(JobEntry(pid=78, name="y", release_t=6.0))
    lp.tick()
    table.unregister(78)
    table.register(JobEntry(pid=78, name="y", release_t=7.0))
    lp.tick()
    assert stage.forgotten == [77, 78]


def test_a_job_whose_end_is_reported_to_the_registry_is_scored(tmp_path):
    """`hidvfs run` unregisters its command as soon as it exits, before the loop could see
    it end: the outcome is still recorded and the stages still score it."""
    from daemon.jobs import JobTable
    from daemon.registry import JobRegistry

    alive = {77: True}

    class Procs(NoProcesses):
        def alive(self, pid):
            return alive.get(pid, False)

        def get_affinity(self, pid):
            return (0,)

    class Stage:
        done: list = []

        def __call__(self, decision, obs):
            return decision

        def job_done(self, pid, finish_t):
            self.done.append((pid, finish_t))

    write_fake_tree(TX2, tmp_path)
    table = JobTable()
    clock = VirtualClock(0.0)
    lp = ControlLoop(
        Platform(TX2, DirSysfs(tmp_path), Procs(), clock, kind="fake"),
        make_governor("schedutil"),
        jobs=table,
        stages=[Stage()],
    )
    reg = JobRegistry(table, now=clock.now, alive=lambda pid: alive.get(pid, False))
    reg.register(77, 5.0, "hi", "run")
    lp.tick()
    clock.set(1.25)
    alive[77] = False  # it exited; `hidvfs run` reports it at once
    reg.unregister(77)
    assert table.done == 1 and table.misses() == {"hi": 0, "lo": 0}
    clock.set(1.3)
    res = lp.tick()
    assert [o.pid for o in res.finished] == [77] and Stage.done == [(77, 1.25)]
    assert table.done == 1  # counted once


def test_a_vanished_policy_stays_unavailable_in_the_log_and_the_status(loop, tmp_path, caplog):
    """A policy folder removed mid-run is no longer read once rediscovered: its files must
    not be logged as recovered nor leave the status while they are missing."""
    lp, clock, _ = loop
    logger = logging.getLogger("sensor-log-test.policy")
    slog = SensorErrorLog(logger)
    lp.on_tick.append(lambda res: slog.update(res.obs.errors))
    gone = [
        paths.policy_file(1, n)
        for n in ("scaling_cur_freq", "scaling_min_freq", "scaling_max_freq", "scaling_governor")
    ]
    with caplog.at_level(logging.INFO, logger=logger.name):
        _ticks(lp, clock, 3)
        shutil.rmtree(tmp_path / paths.policy_dir(1))
        _ticks(lp, clock, 10)
    msgs = [r.getMessage() for r in caplog.records if r.name == logger.name]
    assert not [m for m in msgs if "sensor_recovered" in m]
    assert sorted(m for m in msgs if "sensor_unavailable" in m) == sorted(
        f"event=sensor_unavailable detail={f + ': unavailable (no such file)'!r}" for f in gone
    )
    unavailable = lp.status()["unavailable"]
    assert {e.partition(": ")[0] for e in unavailable} >= set(gone)


def test_two_missing_zones_are_two_log_lines(caplog):
    slog = SensorErrorLog(logging.getLogger("sensor-log-test"))
    a = "class/thermal: no thermal zone of type 'BCPU-therm'"
    b = "class/thermal: no thermal zone of type 'MCPU-therm'"
    with caplog.at_level(logging.INFO, logger="sensor-log-test"):
        slog.update([])
        slog.update([a])
        slog.update([a, b])
        slog.update([b])
    msgs = [r.getMessage() for r in caplog.records]
    assert len([m for m in msgs if "sensor_unavailable" in m]) == 2
    assert any("sensor_recovered" in m and "BCPU" in m for m in msgs)


ORIN = load_board("orin-nx")
#: the zones the Orin NX spec marks as power-gated (boards.md 3.6: EAGAIN while DLA/PVA are off)
GATED = [z.type for z in ORIN.zones if z.quirk == "eagain"]


def test_the_orin_spec_marks_the_cv_zones_gated():
    assert GATED == ["cv0-thermal", "cv1-thermal", "cv2-thermal"]


def _temp_file(writer):
    return lambda zone: paths.zone_file(writer.zone_index(zone), "temp")


@pytest.fixture
def orin(tmp_path, monkeypatch, caplog):
    """The daemon's sensor log on an Orin NX fake tree whose cv zones are gated, as on a board
    with the DLA/PVA off: cv0 reads EAGAIN, cv1 ENODATA (the real errnos, injected at the
    DirSysfs boundary), cv2's temp cannot be read at all (the fake tree's gating)."""
    write_fake_tree(ORIN, tmp_path)
    sysfs = DirSysfs(tmp_path)
    writer = FakeWriter(ORIN, tmp_path)
    inject_read_error(monkeypatch, sysfs, _temp_file(writer)("cv0-thermal"), errno.EAGAIN)
    inject_read_error(monkeypatch, sysfs, _temp_file(writer)("cv1-thermal"), errno.ENODATA)
    clock = VirtualClock(0.0)
    lp = ControlLoop(
        Platform(ORIN, sysfs, NoProcesses(), clock, kind="fake"),
        make_governor("schedutil"),
        period_s=0.1,
    )
    logger = logging.getLogger("sensor-log-test.orin")
    slog = SensorErrorLog(logger)
    lp.on_tick.append(lambda res: slog.update(res.obs.errors))
    caplog.set_level(logging.INFO, logger=logger.name)

    def records():
        out = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == logger.name]
        caplog.clear()
        return out

    return lp, clock, writer, tmp_path, records


def test_sensors_unavailable_from_the_start_are_one_info_line(orin):
    lp, clock, writer, root, records = orin
    temp = _temp_file(writer)
    _ticks(lp, clock, 25)  # 2.5 s: the missing-sensor retry ran twice
    got = records()
    assert [lvl for lvl, _ in got] == [logging.INFO], got
    line = got[0][1]
    assert line.startswith("event=sensors_unavailable_at_start count=3 ")
    for zone in GATED:
        assert temp(zone) in line
    assert "EAGAIN" in line and "ENODATA" in line
    st = lp.status()
    assert not set(GATED) & set(st["temp_c"])  # unavailable, never 0 °C
    assert len(st["unavailable"]) == 3


def test_a_sensor_that_worked_and_then_fails_still_warns_and_recovery_is_logged(orin):
    lp, clock, writer, root, records = orin
    temp = _temp_file(writer)
    _ticks(lp, clock, 3)
    records()  # the start summary
    writer.set_temp("cpu-thermal", None)  # a working zone goes blank
    _ticks(lp, clock, 3)
    got = records()
    assert [lvl for lvl, _ in got] == [logging.WARNING]
    assert "sensor_unavailable" in got[0][1] and temp("cpu-thermal") in got[0][1]
    writer.set_temp("cpu-thermal", 45.0)
    _ticks(lp, clock, 2)
    assert records() == [(logging.INFO, f"event=sensor_recovered file={temp('cpu-thermal')}")]
    # a gated zone that comes up (the DLA starts) is logged as recovered, and gated again
    # after it worked it is a warning like any other failure
    os.rmdir(root / temp("cv2-thermal"))
    writer.set_temp("cv2-thermal", 41.0)
    _ticks(lp, clock, 2)
    assert records() == [(logging.INFO, f"event=sensor_recovered file={temp('cv2-thermal')}")]
    assert lp.status()["temp_c"]["cv2-thermal"] == 41.0
    writer.gate_zone("cv2-thermal")
    _ticks(lp, clock, 2)
    got = records()
    assert [lvl for lvl, _ in got] == [logging.WARNING] and temp("cv2-thermal") in got[0][1]


def test_a_rail_missing_at_start_is_in_the_summary_and_found_by_the_retry(tmp_path, caplog):
    """A power monitor probing after the daemon started: listed once at INFO, looked for again
    every second, logged when found; no warning."""
    import shutil

    write_fake_tree(TX2, tmp_path)
    sysfs = DirSysfs(tmp_path)
    rail_dir = power.find_rail(sysfs, TX2.total_rail).files[0].rsplit("/", 1)[0]
    saved = tmp_path.parent / (tmp_path.name + "-rail")
    shutil.copytree(tmp_path / rail_dir, saved)
    shutil.rmtree(tmp_path / rail_dir)
    clock = VirtualClock(0.0)
    lp = ControlLoop(
        Platform(TX2, sysfs, NoProcesses(), clock, kind="fake"),
        make_governor("schedutil"),
        period_s=0.1,
    )
    slog = SensorErrorLog(logging.getLogger("sensor-log-test.rails"))
    lp.on_tick.append(lambda res: slog.update(res.obs.errors))
    with caplog.at_level(logging.INFO, logger="sensor-log-test.rails"):
        _ticks(lp, clock, 3)
        shutil.copytree(saved, tmp_path / rail_dir)
        _ticks(lp, clock, 12)  # past the 1 s retry
    got = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "sensor-log-test.rails"]
    assert all(lvl == logging.INFO for lvl, _ in got), got
    assert got[0][1].startswith("event=sensors_unavailable_at_start")
    assert "channel labelled" in got[0][1]
    assert any("sensor_recovered" in m and "channel labelled" in m for _, m in got[1:])
    assert lp.status()["power_w"]["total"] is not None


def test_no_cpu_temperature_at_start_is_a_warning_not_part_of_the_quiet_summary(tmp_path, caplog):
    """Every CPU zone unreadable from the start: the guard cannot act, so the summary of
    normally-gated sensors must not be the only word of it; a cpufreq file failing at start
    is no gated sensor either."""
    writer = write_fake_tree(TX2, tmp_path)
    for zone in TX2.zones:
        if zone.role == "cpu":
            writer.set_temp(zone.type, None)
    (tmp_path / paths.policy_file(0, "scaling_governor")).write_text("")
    clock = VirtualClock(0.0)
    lp = ControlLoop(
        Platform(TX2, DirSysfs(tmp_path), NoProcesses(), clock, kind="fake"),
        make_governor("schedutil"),
        period_s=0.1,
    )
    logger = logging.getLogger("sensor-log-test.cpu")
    slog = SensorErrorLog(logger)
    lp.on_tick.append(
        lambda res: slog.update(res.obs.errors, cpu_temp=res.obs.max_cpu_temp_c is not None)
    )
    with caplog.at_level(logging.INFO, logger=logger.name):
        _ticks(lp, clock, 5)
        for zone in TX2.zones:
            if zone.role == "cpu":
                writer.set_temp(zone.type, 40.0)
        _ticks(lp, clock, 2)
    got = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == logger.name]
    warned = [m for lvl, m in got if lvl == logging.WARNING]
    assert any(m.startswith("event=no_cpu_temperature") for m in warned)
    assert any("scaling_governor" in m for m in warned)
    assert (logging.INFO, "event=cpu_temperature_back") in got
    assert sum(m.startswith("event=no_cpu_temperature") for m in warned) == 1
