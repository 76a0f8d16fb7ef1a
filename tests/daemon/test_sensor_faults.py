"""The loop on a fake tree whose sensors fail mid-run: the energy integral keeps what it
had and says what it missed; a failing file is logged when it fails and when it recovers."""

from __future__ import annotations

import logging

import pytest

from agents.governors import make_governor
from daemon.loop import ControlLoop, SensorErrorLog
from platforms import power
from platforms.clock import VirtualClock
from platforms.faketree import write_fake_tree
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


def test_two_missing_zones_are_two_log_lines(caplog):
    slog = SensorErrorLog(logging.getLogger("sensor-log-test"))
    a = "class/thermal: no thermal zone of type 'BCPU-therm'"
    b = "class/thermal: no thermal zone of type 'MCPU-therm'"
    with caplog.at_level(logging.INFO, logger="sensor-log-test"):
        slog.update([a])
        slog.update([a, b])
        slog.update([b])
    msgs = [r.getMessage() for r in caplog.records]
    assert len([m for m in msgs if "sensor_unavailable" in m]) == 2
    assert any("sensor_recovered" in m and "BCPU" in m for m in msgs)
