"""Frequency caps hold whoever picks the frequency: the config's static ceilings
(``thermal.cap_khz``) and the thermal guard's caps, under userspace and kernel governors."""

from __future__ import annotations

import signal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agents.policy import Decision
from daemon.actuator import Actuator
from daemon.config import load_config
from daemon.guard import ThermalGuard, config_guard, static_caps
from platforms import paths
from platforms.errors import SpecError
from platforms.faketree import write_fake_tree
from platforms.observation import ClusterObs, Observation, ZoneObs
from platforms.procs import NoProcesses
from platforms.sense import Sensor
from platforms.spec import load_board
from platforms.sysfs import DirSysfs
from tests.daemon.test_daemon_process import start_daemon, tree_state, wait_for

TABLE = (500, 1000, 1500, 2000)


def obs(temp=40.0, cur=2000, lo=500, hi=2000, gov="userspace", trip=85.0):
    c = ClusterObs("big", 0, (0, 1), (0, 1), TABLE, 1.0, cur, lo, hi, gov, ("userspace", gov))
    z = ZoneObs("cpu-therm", "cpu", temp, ("big",), passive_trip_c=trip)
    return Observation(0.0, "toy", (c,), (z,), ())


def test_static_cap_holds_when_cool_and_the_hotter_cap_wins():
    g = ThermalGuard(static_khz={"big": 1200})
    out = g.apply(Decision({"big": 2000}), obs(40.0))
    assert out.freq_khz["big"] == 1000 and out.cap_khz["big"] == 1000
    assert not g.levels  # a static ceiling is not throttling
    g.apply(Decision({"big": 2000}), obs(82.0, cur=1000))  # hot: one OPP below the ceiling
    assert g.apply(Decision({"big": 2000}), obs(82.0, cur=1000)).cap_khz["big"] < 1000


def test_the_deciders_see_the_ceiling_as_a_limit():
    g = ThermalGuard(static_khz={"big": 1200})
    c = g.view(obs(lo=1500, hi=2000)).clusters[0]
    assert (c.min_khz, c.max_khz) == (1000, 1000)  # min never above max
    c = g.view(obs(lo=500, hi=2000)).clusters[0]
    assert (c.min_khz, c.max_khz) == (500, 1000)
    assert ThermalGuard().view(o := obs()) is o


def test_a_thermal_cap_in_force_is_a_limit_for_the_next_decision():
    g = ThermalGuard(margin_c=5.0)
    g.apply(Decision({"big": 2000}), obs(81.0))  # hot: capped one OPP below
    c = g.view(obs(81.0, cur=1500)).clusters[0]
    assert c.max_khz == 1500 and c.min_khz == 500
    g.apply(Decision({"big": 2000}), obs(70.0, cur=1500))  # cool: the cap lifts
    assert g.view(o := obs(70.0)) is o


@given(st.lists(st.floats(20.0, 110.0), min_size=1, max_size=20), st.sampled_from(TABLE))
def test_output_never_exceeds_the_static_cap(temps, want):
    g = ThermalGuard(static_khz={"big": 1500})
    cur = 2000
    for t in temps:
        f = g.apply(Decision({"big": want}), obs(t, cur=cur)).freq_khz["big"]
        assert f <= 1500 and f in TABLE
        cur = f


def test_caps_are_checked_against_the_board():
    spec = load_board("tx2")
    assert static_caps(spec, {"a57": 1420800}) == {"a57": 1420800}
    with pytest.raises(SpecError, match=r"thermal.cap_khz.big.*a cluster of tx2 \(a57, denver\)"):
        static_caps(spec, {"big": 1000000}, "c.yaml")
    with pytest.raises(SpecError, match="lowest OPP"):
        static_caps(spec, {"a57": 10})


def test_config_guard_carries_margin_and_caps(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("thermal: {margin_c: 7, cap_khz: {denver: 1500000}}\n")
    g = config_guard(load_board("tx2"), load_config(p))
    assert g.margin_c == 7.0 and g.static_khz == {"denver": 1500000}
    assert config_guard(load_board("tx2"), None) == ThermalGuard()


@pytest.fixture
def tx2_tree(tmp_path):
    spec = load_board("tx2")
    write_fake_tree(spec, tmp_path / "tree")
    return spec, DirSysfs(tmp_path / "tree")


def limits(sysfs, policy):
    return tuple(
        sysfs.read_int(paths.policy_file(policy, n))
        for n in ("scaling_min_freq", "scaling_max_freq")
    )


def cluster_obs(spec, sysfs, name):
    """The cluster as the daemon's own sensor reads it from the tree."""
    return next(c for c in Sensor(spec, sysfs).read(0.0).clusters if c.name == name)


def test_kernel_governor_is_capped_by_max_freq_and_the_limits_come_back(tx2_tree):
    spec, sysfs = tx2_tree
    a57 = spec.cluster("a57")
    before = limits(sysfs, a57.policy)
    act = Actuator(sysfs, NoProcesses())
    cap = a57.freqs_khz[5]

    def tick(cap_khz):
        c = cluster_obs(spec, sysfs, "a57")
        o = Observation(0.0, "tx2", (c,), (), ())
        d = Decision({}, governor={"a57": "performance"}, cap_khz=cap_khz)
        return act.apply(d, o)

    rep = tick({"a57": cap + 1})  # between two OPPs: the lower one
    assert sysfs.read(paths.policy_file(a57.policy, "scaling_governor")).strip() == "performance"
    lo, hi = limits(sysfs, a57.policy)
    assert hi == cap and lo <= hi and not rep.errors
    assert tick({"a57": cap + 1}).writes == []  # nothing to redo
    tick({})  # the cap lifts: the limits it replaced come back
    assert limits(sysfs, a57.policy) == before


def test_cap_below_the_min_lowers_both_and_dry_run_only_plans(tx2_tree):
    spec, sysfs = tx2_tree
    a57 = spec.cluster("a57")
    c = cluster_obs(spec, sysfs, "a57")
    o = Observation(0.0, "tx2", (c,), (), ())
    low = a57.freqs_khz[0]
    d = Decision({}, governor={"a57": "powersave"}, cap_khz={"a57": low})
    dry = Actuator(sysfs, NoProcesses(), dry_run=True)
    before = limits(sysfs, a57.policy)
    dry.apply(d, o)
    dry.apply(d, o)
    planned = [w for w in dry.planned if "scaling_m" in w[0]]
    assert planned and limits(sysfs, a57.policy) == before  # planned once, not written
    real = Actuator(sysfs, NoProcesses()).apply(d, o)
    assert limits(sysfs, a57.policy) == (low, low)
    assert planned == [w for w in real.writes if "scaling_m" in w[0]]  # what a real run writes


@pytest.mark.parametrize("policy", ["maxfreq", "performance"])
def test_daemon_honours_the_config_cap_and_restores_on_stop(tmp_path, policy):
    spec = load_board("tx2")
    tree, state = tmp_path / "tree", tmp_path / "state"
    write_fake_tree(spec, tree)
    state.mkdir()
    a57 = spec.cluster("a57")
    cap = a57.freqs_khz[4]
    cfg = tmp_path / "config.yaml"
    cfg.write_text(f"thermal: {{cap_khz: {{a57: {cap}}}}}\n")
    original = tree_state(tree, spec)
    proc, log = start_daemon(tree, state, "--config", str(cfg), policy=policy)
    try:
        # both run through userspace on a board (the governors are emulated there; a kernel
        # governor handed the cluster is capped by scaling_max_freq, tested above)
        f = tree / paths.policy_file(a57.policy, "scaling_setspeed")
        wait_for(lambda: f.read_text().strip() == str(cap), what=f"{f.name} at the cap")
        denver = tree / paths.policy_file(spec.cluster("denver").policy, "scaling_max_freq")
        assert denver.read_text().strip() == original[str(denver.relative_to(tree))]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    assert proc.returncode == 0, log.read_text()
    assert tree_state(tree, spec) == original


def test_loop_with_a_kernel_governor_writes_the_ceiling_as_max_freq(tx2_tree):
    from agents.governors import make_governor
    from daemon.loop import ControlLoop
    from platforms.clock import VirtualClock
    from platforms.platform import Platform

    spec, sysfs = tx2_tree
    a57, denver = spec.cluster("a57"), spec.cluster("denver")
    before = {c.name: limits(sysfs, c.policy) for c in spec.clusters}
    cap = a57.freqs_khz[7]
    loop = ControlLoop(
        Platform(spec, sysfs, NoProcesses(), VirtualClock(0.0), kind="fake"),
        make_governor("performance", native=True),
        period_s=0.1,
        guard=ThermalGuard(static_khz={"a57": cap}),
    )
    for _ in range(3):
        loop.tick()
    gov = sysfs.read(paths.policy_file(a57.policy, "scaling_governor")).strip()
    assert gov == "performance"
    assert limits(sysfs, a57.policy) == (before["a57"][0], cap)
    assert limits(sysfs, denver.policy) == before["denver"]  # uncapped cluster untouched


def test_leaving_a_capped_kernel_governor_gives_the_limits_back(tx2_tree):
    spec, sysfs = tx2_tree
    a57 = spec.cluster("a57")
    before = limits(sysfs, a57.policy)
    act = Actuator(sysfs, NoProcesses())

    def tick(decision):
        c = cluster_obs(spec, sysfs, "a57")
        return act.apply(decision, Observation(0.0, "tx2", (c,), (), ()))

    tick(Decision({}, governor={"a57": "performance"}, cap_khz={"a57": a57.freqs_khz[3]}))
    assert limits(sysfs, a57.policy)[1] == a57.freqs_khz[3]
    tick(Decision({"a57": a57.fmax_khz}))  # userspace from now on: the kernel cap must go
    assert limits(sysfs, a57.policy) == before
