"""The userspace governors follow the kernel's rules on hand-made observations."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.governors import (
    NAMES,
    ClusterView,
    Conservative,
    MaxFreq,
    Ondemand,
    Performance,
    Powersave,
    Schedutil,
    dbs_sampling_rate_s,
    make_governor,
    transition_delay_s,
)
from platforms.observation import ClusterObs, JobObs, Observation
from platforms.spec import load_board

TX2 = (
    345600,
    499200,
    652800,
    806400,
    960000,
    1113600,
    1267200,
    1420800,
    1574400,
    1728000,
    1881600,
    2035200,
)
#: 100 MHz steps up to 2 GHz: 5 % of max is exactly one entry
EVEN = tuple(range(100_000, 2_000_001, 100_000))


def cluster(
    util=(0.5,),
    table=TX2,
    cur=None,
    lo=None,
    hi=None,
    name="a57",
    cpus=None,
    online=None,
    governors=("userspace", "performance", "powersave", "ondemand", "conservative", "schedutil"),
):
    cpus = tuple(cpus) if cpus is not None else tuple(range(len(util)))
    return ClusterObs(
        name=name,
        policy=cpus[0],
        cpus=cpus,
        online=tuple(online) if online is not None else cpus,
        freqs_khz=tuple(table),
        capacity=1.0,
        cur_khz=table[-1] if cur is None else cur,
        min_khz=table[0] if lo is None else lo,
        max_khz=table[-1] if hi is None else hi,
        governor="userspace",
        governors=governors,
        util=tuple(util),
    )


def observe(*clusters, t=0.0, jobs=()):
    return Observation(
        t=t, board="test", clusters=tuple(clusters), zones=(), rails=(), jobs=tuple(jobs)
    )


def job(pid, cpus=(), rt=0):
    return JobObs(
        pid=pid,
        name=f"j{pid}",
        criticality="lo",
        release_t=0.0,
        elapsed_s=0.0,
        deadline_s=None,
        cpus=cpus,
        rt_priority=rt,
    )


def freq(policy, obs, name="a57"):
    return policy.decide(obs).freq_khz[name]


# ---------------------------------------------------------------------------------- schedutil


def test_schedutil_half_util_picks_lowest_entry_at_or_above_125_percent():
    target = 1.25 * 0.5 * 2035200  # 1272000 kHz
    expected = min(f for f in TX2 if f >= target)
    assert expected == 1420800
    assert freq(Schedutil(), observe(cluster(util=(0.5,), cur=2035200))) == expected


def test_schedutil_makes_busy_fraction_frequency_invariant():
    # 50 % busy at 1420.8 MHz is 0.5 * 1420800 / 2035200 of the maximum capacity
    target = 1.25 * 0.5 * 1420800
    expected = min(f for f in TX2 if f >= target)
    assert freq(Schedutil(), observe(cluster(util=(0.5,), cur=1420800))) == expected == 960000
    # a backend that already reports invariant util is used as is
    assert (
        freq(Schedutil(util_is_invariant=True), observe(cluster(util=(0.5,), cur=1420800)))
        == 1420800
    )


def test_schedutil_uses_busiest_cpu_and_respects_limits():
    obs = observe(cluster(util=(0.1, 0.9, 0.2), cur=2035200, hi=1574400))
    assert freq(Schedutil(), obs) == 1574400
    assert freq(Schedutil(), observe(cluster(util=(0.0,), lo=960000))) == 960000


def test_schedutil_rt_job_on_cluster_goes_to_max():
    obs = observe(
        cluster(util=(0.05, 0.05), cur=345600, hi=1881600), jobs=(job(7, cpus=(1,), rt=50),)
    )
    assert freq(Schedutil(), obs) == 1881600
    obs = observe(cluster(util=(0.05, 0.05), cur=345600), jobs=(job(7, cpus=(5,), rt=50),))
    assert freq(Schedutil(), obs) == 345600  # RT job elsewhere


def test_schedutil_rate_limit_holds_until_period_and_limit_change_bypasses():
    gov = Schedutil(period_s=0.01)
    assert freq(gov, observe(cluster(util=(1.0,)), t=0.0)) == 2035200
    assert freq(gov, observe(cluster(util=(0.0,)), t=0.002)) == 2035200  # within the rate limit
    assert freq(gov, observe(cluster(util=(0.0,), hi=1420800), t=0.003)) == 345600  # limits changed
    capped = {"cur": 345600, "hi": 1420800}
    assert freq(gov, observe(cluster(util=(1.0,), **capped), t=0.004)) == 345600  # held again
    assert freq(gov, observe(cluster(util=(1.0,), **capped), t=0.0135)) == 499200  # 1.25*345600


# ---------------------------------------------------------------------------------- ondemand


def test_ondemand_above_threshold_jumps_to_max():
    low80 = Ondemand(up_threshold=80)  # a kernel without idle micro-accounting
    assert freq(low80, observe(cluster(util=(0.81,), cur=345600))) == 2035200
    assert freq(low80, observe(cluster(util=(0.2, 0.95), cur=345600, hi=1728000))) == 1728000
    assert freq(Ondemand(), observe(cluster(util=(0.96,), cur=345600))) == 2035200


def test_ondemand_proportional_uses_cpuinfo_range_and_nearest_entry():
    # load 80 is not above 80: f = 345600 + 80 * (2035200 - 345600) // 100 = 1697280 -> 1728000
    assert freq(Ondemand(up_threshold=80), observe(cluster(util=(0.80,), cur=345600))) == 1728000
    # the default 95 (NO_HZ kernels, the shipped boards'; baselines.md 1.3): a load of 90 is
    # proportional too (it was a jump to max at the old default 80)
    target = 345600 + 90 * (2035200 - 345600) // 100
    expected = min(TX2, key=lambda f: (abs(f - target), f))
    assert expected == 1881600
    assert freq(Ondemand(), observe(cluster(util=(0.90,)))) == expected


def test_ondemand_relation_c_tie_goes_to_lower_entry():
    # 100 + 25 * (300 - 100) // 100 = 150: equidistant from 100 and 200
    assert freq(Ondemand(), observe(cluster(util=(0.25,), table=(100, 200, 300)))) == 100
    assert freq(Ondemand(), observe(cluster(util=(0.26,), table=(100, 200, 300)))) == 200


def test_ondemand_sampling_down_factor_delays_the_next_sample():
    gov = Ondemand(sampling_down_factor=3, period_s=0.01)
    assert freq(gov, observe(cluster(util=(1.0,), cur=345600), t=0.0)) == 2035200
    assert freq(gov, observe(cluster(util=(0.0,), cur=2035200), t=0.01)) == 2035200
    assert freq(gov, observe(cluster(util=(0.0,), cur=2035200), t=0.02)) == 2035200
    assert freq(gov, observe(cluster(util=(0.0,), cur=2035200), t=0.03)) == 345600
    # without the factor the drop comes at the next period
    gov = Ondemand(period_s=0.01)
    freq(gov, observe(cluster(util=(1.0,), cur=345600), t=0.0))
    assert freq(gov, observe(cluster(util=(0.0,), cur=2035200), t=0.01)) == 345600


def test_unavailable_util_keeps_the_frequency_instead_of_dropping():
    for gov in (Ondemand(), Conservative(), Schedutil()):
        obs = observe(cluster(util=(None, None), cur=1420800))
        assert freq(gov, obs) == 1420800


# ---------------------------------------------------------------------------------- conservative


def test_conservative_steps_by_five_percent_of_max():
    gov = Conservative(period_s=0.01)
    seq = [
        freq(
            gov,
            observe(
                cluster(util=(1.0,), table=EVEN, cur=1_000_000 if i == 0 else None), t=0.01 * i
            ),
        )
        for i in range(3)
    ]
    assert seq == [1_100_000, 1_200_000, 1_300_000]
    assert (
        freq(gov, observe(cluster(util=(0.5,), table=EVEN), t=0.03)) == 1_300_000
    )  # between thresholds
    assert freq(gov, observe(cluster(util=(0.1,), table=EVEN), t=0.04)) == 1_200_000  # below 20 %


def test_conservative_tracks_unsnapped_requested_frequency():
    # 5 % of 2035200 = 101760 kHz is smaller than the TX2 OPP spacing (153600): RELATION_H
    # keeps 345600 after the first step, crosses to 499200 after the second and needs two
    # more to reach 652800.
    gov = Conservative(period_s=0.01)
    out = [
        freq(gov, observe(cluster(util=(1.0,), cur=345600 if i == 0 else None), t=0.01 * i))
        for i in range(4)
    ]
    step = 5 * 2035200 // 100
    expected = [max(f for f in TX2 if f <= 345600 + (i + 1) * step) for i in range(4)]
    assert out == expected == [345600, 499200, 499200, 652800]


def test_conservative_freq_step_zero_freezes_and_limits_cap():
    gov = Conservative(freq_step=0)
    assert freq(gov, observe(cluster(util=(1.0,), cur=960000))) == 960000
    gov = Conservative(freq_step=100, period_s=0.01)  # toggles between min and max
    assert freq(gov, observe(cluster(util=(1.0,), cur=345600), t=0.0)) == 2035200
    assert freq(gov, observe(cluster(util=(0.0,)), t=0.01)) == 345600


def test_conservative_sampling_down_factor_slows_decreases():
    gov = Conservative(sampling_down_factor=2, period_s=0.01)
    assert freq(gov, observe(cluster(util=(0.0,), table=EVEN, cur=1_000_000), t=0.0)) == 1_000_000
    assert freq(gov, observe(cluster(util=(0.0,), table=EVEN), t=0.01)) == 900_000
    assert freq(gov, observe(cluster(util=(0.0,), table=EVEN), t=0.02)) == 900_000
    assert freq(gov, observe(cluster(util=(0.0,), table=EVEN), t=0.03)) == 800_000


def test_conservative_idle_periods_drop_one_step_each():
    gov = Conservative(period_s=0.01)
    freq(gov, observe(cluster(util=(0.5,), table=EVEN, cur=1_500_000), t=0.0))
    # 50 ms fully idle: 5 idle periods -> -5 steps, then the decrease of this sample: -6 steps
    assert freq(gov, observe(cluster(util=(0.0,), table=EVEN), t=0.05)) == 900_000


# ---------------------------------------------------------------------------------- static ones


def test_static_governors_respect_limits():
    obs = observe(cluster(util=(0.3,), lo=499200, hi=1881600))
    assert freq(Performance(), obs) == 1881600
    assert freq(Powersave(), obs) == 499200
    assert freq(MaxFreq(), obs) == 1881600
    # a limit between two OPPs: the effective top OPP is the highest entry below it
    obs = observe(cluster(util=(0.3,), hi=1900000, lo=400000))
    assert freq(Performance(), obs) == 1881600
    assert freq(Powersave(), obs) == 499200


def test_every_cluster_gets_a_frequency_and_jobs_get_all_online_cpus():
    a57 = cluster(util=(0.5, 0.5, 0.5, 0.5), cpus=(0, 3, 4, 5))
    denver = cluster(util=(0.0, None), name="denver", cpus=(1, 2), online=(1,))
    obs = observe(a57, denver, jobs=(job(11), job(12, rt=20)))
    for name in NAMES:
        d = make_governor(name).decide(obs)
        assert set(d.freq_khz) == {"a57", "denver"}
        assert all(f in TX2 for f in d.freq_khz.values())
        assert {pid: (s.cpus, s.rt_priority, s.nice) for pid, s in d.jobs.items()} == {
            11: ((0, 1, 3, 4, 5), 0, 0),
            12: ((0, 1, 3, 4, 5), 0, 0),
        }


def test_native_names_the_kernel_governor_when_available():
    obs = observe(
        cluster(), cluster(name="gold", cpus=(4,), governors=("userspace", "performance"))
    )
    d = Conservative(native=True).decide(obs)
    assert d.governor == {"a57": "conservative"}
    assert any("not available on gold" in e for e in d.events)
    assert Performance(native=True).decide(obs).governor == {
        "a57": "performance",
        "gold": "performance",
    }
    assert Schedutil().decide(obs).governor == {}


def test_make_governor_names_periods_and_errors():
    assert NAMES == ("performance", "powersave", "ondemand", "conservative", "schedutil", "maxfreq")
    for name in NAMES:
        assert make_governor(name).name == name
    with pytest.raises(ValueError, match="unknown governor 'turbo'.*performance"):
        make_governor("turbo")
    assert make_governor("schedutil", load_board("tx2")).period_s == pytest.approx(0.010)
    rubik = load_board("rubikpi3")
    assert make_governor("schedutil", rubik).period_s == pytest.approx(0.001)
    assert make_governor("ondemand", rubik).period_s == pytest.approx(0.008)
    assert transition_delay_s(0) == 0.001 and transition_delay_s(2_000) == 0.002
    assert dbs_sampling_rate_s(1_000, tick_hz=100) == pytest.approx(0.02)
    with pytest.raises(ValueError, match="up_threshold"):
        Ondemand(up_threshold=0).decide(observe(cluster()))
    with pytest.raises(ValueError, match="down_threshold"):
        Conservative(up_threshold=20, down_threshold=30).reset()


# ---------------------------------------------------------------------------------- properties

tables = st.lists(st.integers(100_000, 3_000_000), min_size=1, max_size=14, unique=True).map(
    lambda x: tuple(sorted(x))
)


@st.composite
def situations(draw):
    table = draw(tables)
    i = draw(st.integers(0, len(table) - 1))
    j = draw(st.integers(i, len(table) - 1))
    utils = draw(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=4))
    cur = draw(st.sampled_from(table))
    return table, table[i], table[j], utils, cur


@settings(max_examples=150, deadline=None)
@given(situations(), st.lists(st.floats(0.0, 1.0), min_size=1, max_size=6))
def test_outputs_are_table_values_within_limits(sit, later):
    table, lo, hi, utils, cur = sit
    for name in NAMES:
        gov = make_governor(name, period_s=0.01)
        for step, u in enumerate([None, *later]):
            us = utils if u is None else [u] * len(utils)
            obs = observe(cluster(util=us, table=table, cur=cur, lo=lo, hi=hi), t=0.01 * step)
            f = freq(gov, obs)
            assert f in table and lo <= f <= hi, (name, f)
            cur = f


@settings(max_examples=150, deadline=None)
@given(situations(), st.floats(0.0, 1.0), st.floats(0.0, 1.0))
def test_schedutil_and_ondemand_are_monotone_in_util(sit, u1, u2):
    table, lo, hi, _, cur = sit
    u1, u2 = sorted((u1, u2))
    for cls in (Schedutil, Ondemand):
        f1 = freq(cls(), observe(cluster(util=(u1,), table=table, cur=cur, lo=lo, hi=hi)))
        f2 = freq(cls(), observe(cluster(util=(u2,), table=table, cur=cur, lo=lo, hi=hi)))
        assert f1 <= f2, (cls.__name__, u1, u2, f1, f2)


@given(tables, st.floats(0, 4_000_000))
def test_relations_pick_table_entries_on_the_right_side(table, khz):
    view = ClusterView(table, table[0], table[-1], table)
    lo_side, hi_side = view.relation_h(khz), view.relation_l(khz)
    assert lo_side in table and hi_side in table
    if table[0] <= khz <= table[-1]:
        assert lo_side <= khz <= hi_side
        assert view.relation_c(khz) in (lo_side, hi_side)
