"""Interventions reach the log when they start and end, not at every tick they hold for."""

from __future__ import annotations

import logging

from agents.governors import make_governor
from daemon.loop import ControlLoop
from platforms.clock import VirtualClock
from platforms.faketree import write_fake_tree
from platforms.platform import Platform
from platforms.procs import NoProcesses
from platforms.spec import load_board
from platforms.sysfs import DirSysfs


def loop_with_events(tmp_path, per_tick: list[list[str]]) -> ControlLoop:
    """A loop on a fake TX2 whose k-th tick's decision carries ``per_tick[k]`` as events."""
    spec = load_board("tx2")
    write_fake_tree(spec, tmp_path / "tree")
    script = iter(per_tick)

    def inject(decision, obs):
        decision.events.extend(next(script))
        return decision

    return ControlLoop(
        Platform(spec, DirSysfs(tmp_path / "tree"), NoProcesses(), VirtualClock(0.0), kind="fake"),
        make_governor("performance", native=True),
        period_s=0.1,
        stages=[inject],
    )


def run_logged(tmp_path, caplog, ticks: list[list[str]]) -> tuple[ControlLoop, list[str]]:
    """Run one tick per entry of ``ticks``; the loop and the intervention lines it logged."""
    loop = loop_with_events(tmp_path, ticks)
    with caplog.at_level(logging.INFO, logger="hidvfs.loop"):
        for _ in ticks:
            loop.tick()
    return loop, [r.getMessage() for r in caplog.records if "intervention" in r.getMessage()]


def test_a_held_intervention_is_logged_at_its_start_and_end(tmp_path, caplog):
    reserve = "reserve cluster=a57 pid=7 need_khz=2035200"
    ticks = [[reserve]] * 30 + [[]] * 2 + [[reserve]]
    loop, lines = run_logged(tmp_path, caplog, ticks)
    assert lines == [
        f"event=intervention {reserve}",
        f"event=intervention_ended {reserve} ticks=30",
        f"event=intervention {reserve}",  # back after a pause: a new one
    ]
    assert loop.events_total == 31  # the status still counts every tick's interventions


def test_changing_and_one_tick_interventions_are_each_logged_once(tmp_path, caplog):
    a, b = "gate: a57 345600 -> 2035200 kHz", "gate: a57 1267200 -> 2035200 kHz"
    ticks = [[a], [b], [a, a], [a, b], []]
    _, lines = run_logged(tmp_path, caplog, ticks)
    assert lines == [
        f"event=intervention {a}",
        f"event=intervention {b}",
        f"event=intervention {a}",  # a duplicate within one tick is one line
        f"event=intervention {b}",
        f"event=intervention_ended {a} ticks=2",
    ]


def test_a_deadline_counting_down_is_one_held_intervention(tmp_path, caplog):
    """A job no core count can save is reported with its remaining time, which moves every
    tick: it was logged as a new intervention on every tick (ten lines a second at 100 ms)."""

    def missing(d: float) -> str:
        return (
            "gate: no feasible assignment (pid 7472: no core count meets "
            f"D={d:.4g} s on a57 at 2035200 kHz); safest point taken"
        )

    other = "gate: no feasible assignment (pid 7473: no core count meets D=0.5 s on a57)"
    ticks = [[missing(0.21 - 0.1 * k)] for k in range(6)] + [[missing(-0.39), other], []]
    loop, lines = run_logged(tmp_path, caplog, ticks)
    assert lines == [
        f"event=intervention {missing(0.21)}",
        f"event=intervention {other}",  # another pid: another intervention
        f"event=intervention_ended {missing(-0.39)} ticks=7",  # its latest text
    ]
    assert loop.events_total == 8


def test_whole_numbers_tell_interventions_apart_and_decimals_do_not():
    from daemon.loop import intervention_key

    assert intervention_key("thermal_cap cluster=a57 temp_c=81.3 limit_c=80.0 cap_khz=1996800") == (
        intervention_key("thermal_cap cluster=a57 temp_c=82.0 limit_c=80.0 cap_khz=1996800")
    )
    assert intervention_key("pid 7 no core count meets D=12 s") == intervention_key(
        "pid 7 no core count meets D=1.5e-05 s"
    )
    assert intervention_key("shield: cheapest certified candidate 2 (U=1204 s)") == (
        intervention_key("shield: cheapest certified candidate 2 (U=1.3e+04 s)")
    )
    assert intervention_key("gate: pid 7 cores [0] -> [0, 1]") != intervention_key(
        "gate: pid 8 cores [0] -> [0, 1]"
    )
    assert intervention_key("gate: a57 345600 -> 2035200 kHz") != intervention_key(
        "gate: a57 1267200 -> 2035200 kHz"
    )
