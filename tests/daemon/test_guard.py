"""The thermal guard caps frequency hard at trip minus margin, whatever the policy wants."""

from hypothesis import given
from hypothesis import strategies as st

from agents.policy import Decision
from daemon.guard import ThermalGuard
from platforms.observation import ClusterObs, Observation, ZoneObs

TABLE = (500, 1000, 1500, 2000)


def obs(temp, cur=2000, trip=85.0):
    c = ClusterObs("big", 0, (0, 1), (0, 1), TABLE, 1.0, cur, 500, 2000, "userspace")
    z = ZoneObs("cpu-therm", "cpu", temp, ("big",), passive_trip_c=trip)
    return Observation(0.0, "toy", (c,), (z,), ())


def test_cap_engages_at_trip_minus_margin_and_steps_down():
    g = ThermalGuard(margin_c=5.0, hysteresis_c=3.0)
    d = Decision({"big": 2000})
    assert g.apply(d, obs(79.0)).freq_khz["big"] == 2000  # below 80: untouched
    out = g.apply(d, obs(80.0))
    assert out.freq_khz["big"] == 1500 and out.cap_khz["big"] == 1500 and out.events
    out = g.apply(d, obs(82.0, cur=1500))
    assert out.freq_khz["big"] == 1000  # still hot: one more OPP down


def test_cap_releases_only_below_the_hysteresis_band():
    g = ThermalGuard(margin_c=5.0, hysteresis_c=3.0)
    d = Decision({"big": 2000})
    g.apply(d, obs(81.0))
    assert g.apply(d, obs(78.0, cur=1500)).freq_khz["big"] == 1500  # inside the band: hold
    assert g.apply(d, obs(76.0, cur=1500)).freq_khz["big"] == 2000  # below 77: step back up


def test_unavailable_sensor_never_relaxes_a_cap():
    g = ThermalGuard()
    d = Decision({"big": 2000})
    g.apply(d, obs(90.0))
    assert g.apply(d, obs(None, cur=1500)).freq_khz["big"] == 1500


@given(st.lists(st.floats(20.0, 110.0), min_size=1, max_size=30), st.sampled_from(TABLE))
def test_output_never_exceeds_the_cap_or_leaves_the_table(temps, want):
    g = ThermalGuard(margin_c=5.0)
    cur = 2000
    for t in temps:
        out = g.apply(Decision({"big": want}), obs(t, cur=cur))
        f = out.freq_khz["big"]
        assert f in TABLE and f <= want
        if "big" in out.cap_khz:
            assert f <= out.cap_khz["big"]
        if t >= 80.0:
            assert f < 2000 or want < 2000
        cur = f


def test_a_cap_held_at_the_floor_is_reported_once_not_every_tick():
    g = ThermalGuard(margin_c=5.0)
    d = Decision({"big": 2000})
    events = []
    cur = 2000
    for _ in range(8):  # stays hot: steps down to the floor, then holds it
        out = g.apply(d, obs(95.0, cur=cur))
        cur = out.freq_khz["big"]
        events += out.events
    assert cur == 500
    assert [e.split("cap_khz=")[1] for e in events] == ["1500", "1000", "500"]


def test_an_idle_cluster_is_capped_one_opp_at_a_time_not_at_its_floor():
    """The cap steps down from the cap in force, not from the current frequency: a cluster
    parked at its lowest OPP when the zone crossed the limit had been capped there at once,
    and stayed so, whatever it was asked to run, until the zone cooled below the band."""
    g = ThermalGuard(margin_c=5.0, hysteresis_c=3.0)
    out = g.apply(Decision({"big": 500}), obs(81.0, cur=500))
    assert out.cap_khz["big"] == 1500
    out = g.apply(Decision({"big": 2000}), obs(79.0, cur=500))  # inside the band: held
    assert out.freq_khz["big"] == 1500
    out = g.apply(Decision({"big": 2000}), obs(81.0, cur=1500))
    assert out.freq_khz["big"] == 1000  # hot again: one more OPP down


def obs_zones(zones, cur=2000):
    """One cluster watched by several zones: (temperature, passive trip) each."""
    c = ClusterObs("big", 0, (0, 1), (0, 1), TABLE, 1.0, cur, 500, 2000, "userspace")
    zs = tuple(
        ZoneObs(f"cpu{i}-therm", "cpu", t, ("big",), passive_trip_c=trip)
        for i, (t, trip) in enumerate(zones)
    )
    return Observation(0.0, "toy", (c,), zs, ())


def test_the_hottest_zone_and_the_lowest_trip_set_the_cap():
    d = Decision({"big": 2000})
    # one zone hot against its own trip, another cool: the hot one caps
    assert ThermalGuard().apply(d, obs_zones([(60.0, 95.0), (81.0, 85.0)])).cap_khz == {"big": 1500}
    assert ThermalGuard().apply(d, obs_zones([(81.0, 85.0), (60.0, 95.0)])).cap_khz == {"big": 1500}
    # the hottest reading against the lowest trip, even from different zones (conservative)
    assert ThermalGuard().apply(d, obs_zones([(81.0, 95.0), (40.0, 85.0)])).cap_khz == {"big": 1500}
    assert not ThermalGuard().apply(d, obs_zones([(79.0, 95.0), (40.0, 85.0)])).cap_khz


@given(st.lists(st.floats(20.0, 110.0), min_size=1, max_size=40), st.sampled_from(TABLE))
def test_the_cap_follows_one_opp_per_tick_down_and_up(temps, want):
    """At or above trip - margin the cap drops one OPP a tick; below trip - margin -
    hysteresis it rises one; in between it holds: the level is tracked independently."""
    g = ThermalGuard(margin_c=5.0, hysteresis_c=3.0)
    top = len(TABLE) - 1
    level = top
    cur = want
    for t in temps:
        if t >= 80.0:
            level = max(0, level - 1)
        elif t < 77.0 and level < top:
            level += 1
        out = g.apply(Decision({"big": want}), obs(t, cur=cur))
        assert out.cap_khz.get("big", TABLE[top]) == TABLE[level]
        assert out.freq_khz["big"] == min(want, TABLE[level])
        cur = out.freq_khz["big"]


def test_a_cap_below_a_hi_reservations_need_is_said_as_its_own_event():
    """The guard wins over the reservation; a cap stepped below what a HI job's cluster
    needs put its deadline at risk with only a thermal_cap event to tell."""
    g = ThermalGuard(margin_c=5.0, hysteresis_c=3.0)
    d = Decision(
        {"big": 2000},
        events=[
            "reserve cluster=big pid=42 need_khz=2000",
            "share cluster=big pid=7 rt=40 need_khz=1000",
        ],
    )
    out = g.apply(d, obs(80.0))  # cap 1500: below the reservation's need, above the share's
    assert "hi_need_capped cluster=big pid=42 need_khz=2000 cap_khz=1500" in out.events
    assert not [e for e in out.events if e.startswith("hi_need_capped") and "pid=7" in e]
    cool = g.apply(Decision({"big": 2000}, events=list(d.events)), obs(60.0))
    assert not [e for e in cool.events if e.startswith("hi_need_capped")]
