"""Observation schema v1: fixed sizes, bounded values, padding, trends and the work bound."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.features import (
    CLUSTER_FIELDS,
    GLOBAL_FIELDS,
    HI,
    JOB_FIELDS,
    LO,
    MAX_CLUSTERS,
    SCHEMA_VERSION,
    FeatureTracker,
    remaining_bound_s,
    schema,
)
from platforms.observation import ClusterObs, JobObs, JobProfile, Observation, RailObs, ZoneObs
from platforms.spec import load_board

PROFILE = JobProfile("fft.test", 0.4, 0.05, 0.2, 0.11, 2035200, 4)


def make_obs(board: str, t: float, temp, util, level_frac, jobs=(), power=4000.0) -> Observation:
    spec = load_board(board)
    clusters = []
    for cl in spec.clusters:
        n = len(cl.freqs_khz)
        f = cl.freqs_khz[int(round(level_frac * (n - 1)))]
        clusters.append(
            ClusterObs(
                cl.name,
                cl.policy,
                cl.cpus,
                cl.cpus,
                cl.freqs_khz,
                cl.capacity,
                f,
                cl.fmin_khz,
                cl.fmax_khz,
                "userspace",
                (),
                tuple(util for _ in cl.cpus),
            )
        )
    zones = tuple(
        ZoneObs(z.type, z.role, temp, z.clusters, (z.passive_trip_mc or 85000) / 1000.0)
        for z in spec.zones
        if z.role == "cpu"
    )
    return Observation(
        t, board, tuple(clusters), zones, (RailObs("VDD_IN", "total", power),), tuple(jobs)
    )


def job(pid=1, progress=0.5, deadline=0.2, elapsed=0.05, cpus=(0, 3)):
    return JobObs(pid, "fft.test", "hi", 0.0, elapsed, deadline, cpus, 50, PROFILE, progress)


def test_schema_is_versioned_and_documented():
    s = schema()
    assert s["version"] == SCHEMA_VERSION == 1
    assert s["cluster"] == list(CLUSTER_FIELDS) and s["global"] == list(GLOBAL_FIELDS)
    assert s["job"] == list(JOB_FIELDS) and s["max_clusters"] == MAX_CLUSTERS


def test_shapes_and_padding_two_and_three_clusters():
    for board, n in (("tx2", 2), ("rubikpi3", 3)):
        ft = FeatureTracker(load_board(board))
        cl, glob, jobs = ft(make_obs(board, 0.0, 50.0, 0.5, 1.0, [job(), job(2)]))
        assert cl.shape == (MAX_CLUSTERS, len(CLUSTER_FIELDS)) and cl.dtype == np.float32
        assert glob.shape == (len(GLOBAL_FIELDS),) and jobs.shape == (2, len(JOB_FIELDS))
        assert cl[:n, 0].tolist() == [1.0] * n
        assert not cl[n:].any()
        assert cl[0, CLUSTER_FIELDS.index("freq_level")] == 1.0


def test_temperature_trend_sign():
    ft = FeatureTracker(load_board("tx2"))
    i = CLUSTER_FIELDS.index("temp_trend")
    ft(make_obs("tx2", 0.0, 40.0, 0.5, 0.5))
    up = ft(make_obs("tx2", 0.5, 45.0, 0.5, 0.5))[0][0, i]
    assert up > 0
    ft.reset()
    ft(make_obs("tx2", 0.0, 45.0, 0.5, 0.5))
    assert ft(make_obs("tx2", 0.5, 40.0, 0.5, 0.5))[0][0, i] < 0


def test_unavailable_readings_are_neutral_not_zero():
    ft = FeatureTracker(load_board("tx2"))
    o = make_obs("tx2", 0.0, None, None, 0.5, power=None)
    cl, glob, _ = ft(o)
    assert cl[0, CLUSTER_FIELDS.index("temp_ratio")] > 0.0  # never reads as a cold die
    assert glob[GLOBAL_FIELDS.index("power")] == 0.5


def test_a_sensor_that_stops_reading_keeps_its_last_temperature():
    """A hot cluster whose zone stops reading must not look cool (it would be chosen as the
    coolest to take the work the thermal agent sends away from the others)."""
    ft = FeatureTracker(load_board("tx2"))
    i, h = CLUSTER_FIELDS.index("temp_ratio"), CLUSTER_FIELDS.index("headroom")
    hot = ft(make_obs("tx2", 0.0, 84.0, 0.5, 0.5))[0]
    failed = ft(make_obs("tx2", 0.05, None, 0.5, 0.5))[0]
    assert failed[0, i] == hot[0, i] and failed[0, h] == hot[0, h]
    ft.reset()  # a new run knows no earlier reading: neutral
    assert ft(make_obs("tx2", 0.0, None, 0.5, 0.5))[0][0, i] == np.float32(0.6)


@settings(max_examples=60, deadline=None)
@given(
    temp=st.one_of(st.none(), st.floats(-40, 150)),
    util=st.one_of(st.none(), st.floats(0, 1)),
    lvl=st.floats(0, 1),
    progress=st.one_of(st.none(), st.floats(0, 1)),
    deadline=st.one_of(st.none(), st.floats(1e-4, 10)),
    elapsed=st.floats(0, 20),
    board=st.sampled_from(["tx2", "orin-nx", "rubikpi3"]),
)
def test_every_value_is_finite_and_clipped(temp, util, lvl, progress, deadline, elapsed, board):
    ft = FeatureTracker(load_board(board))
    o = make_obs(
        board, 1.0, temp, util, lvl, [job(progress=progress, deadline=deadline, elapsed=elapsed)]
    )
    for arr in ft(o):
        assert np.all(np.isfinite(arr))
        assert arr.min() >= LO and arr.max() <= HI


@settings(max_examples=40, deadline=None)
@given(lo=st.floats(0, 1), hi=st.floats(0, 1), progress=st.floats(0, 0.99))
def test_remaining_bound_is_monotone_in_frequency(lo, hi, progress):
    lo, hi = min(lo, hi), max(lo, hi)
    j = [job(progress=progress)]
    slow = remaining_bound_s(make_obs("rubikpi3", 0.0, 50, 0.5, lo, j))
    fast = remaining_bound_s(make_obs("rubikpi3", 0.0, 50, 0.5, hi, j))
    assert fast <= slow + 1e-12
    assert remaining_bound_s(make_obs("rubikpi3", 0.0, 50, 0.5, hi, [])) == 0.0
