"""sd_notify over a real datagram socket (path and abstract namespace), watchdog timing."""

from __future__ import annotations

import os
import socket
import uuid

import pytest

from daemon import notify
from daemon.notify import Notifier, WatchdogPinger


@pytest.fixture
def receiver(tmp_path):
    path = str(tmp_path / "notify.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(path)
    s.settimeout(2.0)
    yield path, s
    s.close()


def recv(s: socket.socket) -> list[str]:
    return s.recv(4096).decode().split("\n")


def test_ready_status_watchdog_stopping(receiver):
    path, s = receiver
    n = Notifier({"NOTIFY_SOCKET": path})
    assert n.enabled
    assert n.ready("controlling policy0 policy1")
    msg = recv(s)
    assert msg[0] == "READY=1" and f"MAINPID={os.getpid()}" in msg
    assert "STATUS=controlling policy0 policy1" in msg
    assert n.status("policy hidvfs\nticks 10")
    assert recv(s) == ["STATUS=policy hidvfs ticks 10"]  # one line, always
    assert n.watchdog()
    assert recv(s) == ["WATCHDOG=1"]
    assert n.stopping("restoring original settings")
    assert recv(s) == ["STOPPING=1", "STATUS=restoring original settings"]


def test_abstract_namespace():
    name = f"hidvfs-test-{uuid.uuid4().hex}"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(b"\0" + name.encode())
    s.settimeout(2.0)
    try:
        assert Notifier({"NOTIFY_SOCKET": "@" + name}).watchdog()
        assert recv(s) == ["WATCHDOG=1"]
    finally:
        s.close()


def test_noop_outside_systemd():
    n = Notifier({})
    assert not n.enabled
    assert n.ready() is False and n.watchdog() is False and n.status("x") is False
    assert n.watchdog_interval_s() is None


def test_send_failure_is_not_raised(tmp_path):
    n = Notifier({"NOTIFY_SOCKET": str(tmp_path / "gone.sock")})
    assert n.ready() is False


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"WATCHDOG_USEC": "10000000"}, 5.0),
        ({"WATCHDOG_USEC": "3000000", "WATCHDOG_PID": str(os.getpid())}, 1.5),
        ({"WATCHDOG_USEC": "10000000", "WATCHDOG_PID": str(os.getpid() + 1)}, None),
        ({"WATCHDOG_USEC": "soon"}, None),
        ({"WATCHDOG_USEC": "0"}, None),
        ({}, None),
    ],
)
def test_watchdog_interval_is_half_of_watchdog_usec(env, expected):
    assert Notifier(env).watchdog_interval_s() == expected


def test_pinger_pings_at_half_the_interval(receiver):
    path, s = receiver
    t = [100.0]
    pinger = WatchdogPinger(
        Notifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "10000000"}), lambda: t[0]
    )
    sent = []
    for now in (100.0, 102.0, 104.9, 105.0, 107.0, 110.1):
        t[0] = now
        sent.append(pinger.tick())
    assert sent == [True, False, False, True, False, True]
    for _ in range(3):
        assert recv(s) == ["WATCHDOG=1"]


def test_module_functions_use_the_environment(receiver, monkeypatch):
    path, s = receiver
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    monkeypatch.setenv("WATCHDOG_USEC", "4000000")
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    monkeypatch.setattr(notify, "_default", None)
    assert notify.watchdog_interval_s() == 2.0
    assert notify.ready()
    assert recv(s)[0] == "READY=1"
    assert notify.stopping()
    assert recv(s) == ["STOPPING=1"]
    monkeypatch.setattr(notify, "_default", None)


def test_a_period_longer_than_the_watchdog_still_gets_pinged_between_ticks():
    """WatchdogSec=10 with period_ms=15000: pings come from the loop's wait, at most 0.75 x
    WatchdogSec apart, while the ticks stay 15 s apart."""
    from agents.governors import make_governor
    from daemon.loop import ControlLoop
    from platforms.sim import make_sim_platform
    from platforms.spec import load_board

    platform = make_sim_platform(load_board("tx2"), seed=0)
    clock = platform.clock
    pings: list[float] = []

    class Recorder(Notifier):
        def watchdog(self) -> bool:
            pings.append(clock.now())
            return True

    pinger = WatchdogPinger(Recorder({"WATCHDOG_USEC": "10000000"}), clock.now)
    loop = ControlLoop(platform, make_governor("schedutil"), period_s=15.0)
    ticks: list[float] = []
    loop.on_tick.append(lambda res: (ticks.append(res.t), pinger.tick()))
    loop.idle_every_s = pinger.interval_s / 2
    loop.on_idle.append(pinger.tick)
    loop.run(duration_s=60.0)
    assert [round(b - a, 6) for a, b in zip(ticks, ticks[1:])] == [15.0, 15.0, 15.0]
    gaps = [b - a for a, b in zip(pings, pings[1:])]
    assert pings[0] == ticks[0] and max(gaps) <= 7.5 + 1e-9 and len(pings) >= 10


def test_the_loop_still_wakes_when_a_simulated_clock_stops_early():
    """The simulator stops its clock at a job's arrival or end so the loop decides there;
    waiting in chunks for the watchdog must not sleep through that (it did: the held-out
    results moved)."""
    from agents.governors import make_governor
    from daemon.loop import ControlLoop
    from platforms.sim import make_sim_platform
    from platforms.spec import load_board

    for idle in (None, 0.2):
        platform = make_sim_platform(load_board("tx2"), seed=0)
        clock = platform.clock
        real = clock._on_advance
        stops = [0.35]

        def stop_early(target, real=real, stops=stops):
            if stops and stops[0] < target:
                at = stops.pop(0)
                real(at)
                return at
            return real(target)

        clock._on_advance = stop_early
        loop = ControlLoop(platform, make_governor("schedutil"), period_s=1.0)
        loop.idle_every_s = idle
        ticks: list[float] = []
        loop.on_tick.append(lambda res, ticks=ticks: ticks.append(round(res.t, 6)))
        loop.run(duration_s=2.0)
        assert ticks[:2] == [0.0, 0.35], (idle, ticks)


def test_readies_counts_every_ready_announcement_even_outside_systemd(receiver):
    """The CLI tells a refused start from a failure after the start by this count."""
    path, s = receiver
    before = Notifier.readies
    Notifier({}).ready()  # no socket: nothing sent, still the daemon's readiness
    assert Notifier.readies == before + 1
    Notifier({"NOTIFY_SOCKET": path}).status("starting")
    assert Notifier.readies == before + 1
    Notifier({"NOTIFY_SOCKET": path}).ready("controlling tx2")
    assert Notifier.readies == before + 2
