"""Mixes that start on a hot board: the only episodes in which the thermal agent chooses."""

from __future__ import annotations

import numpy as np
import pytest

import agents.hidvfs as hidvfs_mod
from agents.features import BoardScale
from daemon.guard import ThermalGuard
from platforms.spec import load_board
from tools.agents_episodes import (
    HOT_AMBIENT_C,
    HOT_START_BELOW_TRIP_C,
    HOT_START_LO,
    EpisodeSpec,
    episode_items,
    make_runner,
    thermal_start,
)

BOARDS = ("tx2", "orin-nx", "rubikpi3")


@pytest.mark.parametrize("board", BOARDS)
def test_hot_starts_lie_in_the_thermal_agents_band_and_are_seeded(board):
    trip = min(BoardScale.of(load_board(board)).trips_c)
    draws = [thermal_start(board, s, 1.0) for s in range(300)]
    assert all(d is not None for d in draws)
    amb = np.array([d[0] for d in draws])
    start = np.array([d[1] for d in draws])
    assert amb.min() >= HOT_AMBIENT_C[0] and amb.max() <= HOT_AMBIENT_C[1]
    assert start.min() >= HOT_START_LO * trip
    assert start.max() <= trip - HOT_START_BELOW_TRIP_C < trip - ThermalGuard().margin_c
    assert np.all(start >= amb)
    assert start.std() > 3.0  # spread over the band, not one point
    assert draws == [thermal_start(board, s, 1.0) for s in range(300)]  # reproducible


def test_the_hot_share_is_the_fraction_asked_and_none_by_default():
    assert all(thermal_start("tx2", s, 0.0) is None for s in range(200))
    hot = sum(thermal_start("tx2", s, 0.25) is not None for s in range(4000))
    assert 0.22 < hot / 4000 < 0.28
    # a mix hot at a lower fraction stays hot, at the same temperatures, at a higher one
    for s in range(200):
        lo = thermal_start("tx2", s, 0.25)
        if lo is not None:
            assert thermal_start("tx2", s, 0.5) == lo


def test_a_hot_start_changes_the_board_not_the_jobs():
    cold, hot = EpisodeSpec(), EpisodeSpec(hot_fraction=1.0)
    a, b = episode_items("orin-nx", 900003, cold), episode_items("orin-nx", 900003, hot)
    assert [(j.name, j.release_t, j.deadline_s) for j, _ in a] == [
        (j.name, j.release_t, j.deadline_s) for j, _ in b
    ]


def test_the_thermal_head_is_free_on_a_hot_start_and_never_on_a_cold_one(monkeypatch):
    """Cold, no CPU zone comes within 0.7 x its trip, so "must cool" is masked out on every
    tick and the thermal network gets no gradient; on a hot start both choices are open."""
    from agents.factory import make_policy

    free = {"cold": 0, "hot": 0}
    phase = ["cold"]
    build = hidvfs_mod.build_inputs

    def counting(feats, obs, space):
        inp = build(feats, obs, space)
        free[phase[0]] += int(inp.therm_mask.all(axis=1).sum())
        return inp

    monkeypatch.setattr(hidvfs_mod, "build_inputs", counting)
    spec = load_board("tx2")
    for name, frac in (("cold", 0.0), ("hot", 1.0)):
        phase[0] = name
        ep = EpisodeSpec(hot_fraction=frac)
        pol = make_policy("hidvfs", spec)
        make_runner("tx2", ep)(pol, episode_items("tx2", 5, ep), 5)
    assert free["cold"] == 0
    assert free["hot"] > 10


@pytest.mark.parametrize(("temp", "forced"), [(81.5, False), (82.0, True), (82.5, True)])
def test_must_cool_is_forced_from_exactly_hot_margin_below_the_trip(temp, forced):
    """tx2 reads in 0.5 C steps and its trip is 85 C: 82.0 C is 3 C below, and must cool
    (through float32 features the headroom had read 3.00000004 C, and was left free)."""
    from agents.features import FeatureTracker
    from agents.hidvfs import HOT_MARGIN_C, ActionSpace, build_inputs
    from tests.agents.test_features import make_obs

    assert HOT_MARGIN_C == 3.0
    spec = load_board("tx2")
    obs = make_obs("tx2", 0.0, temp, 0.5, 0.5)
    inp = build_inputs(FeatureTracker(spec)(obs), obs, ActionSpace.of(spec))
    assert inp.therm_mask[0].tolist() == ([False, True] if forced else [True, True])


def test_the_reward_reference_power_is_measured_on_a_cold_board():
    """tx2 seed 0's first training mix starts hot: its leakage had raised P_ref by 7.6 % and
    scaled the energy weight down by as much."""
    from agents.train import reference_power, seed_ranges

    spec = load_board("tx2")
    first = seed_ranges(0, 1)["train"][0]
    assert thermal_start("tx2", first, 0.25) is not None  # the case this guards

    def ref(ep):
        return reference_power(
            spec, make_runner("tx2", ep), lambda s: episode_items("tx2", s, ep), 0, "total", "busy"
        )

    hot_ep = EpisodeSpec(hot_fraction=1.0)
    assert ref(hot_ep) == ref(EpisodeSpec())
    # and the hot start would have moved it
    from agents.governors import make_governor
    from agents.train import busy_power

    items = episode_items("tx2", first, hot_ep)
    hot = busy_power(make_runner("tx2", hot_ep)(make_governor("maxfreq"), items, first), "total")
    assert hot > 1.02 * ref(EpisodeSpec())


def test_capped_time_counts_the_guards_caps():
    """On a board soaked above the guard's limit every tick runs capped; cold, none does."""
    from agents.governors import make_governor
    from daemon.simrun import run_sim

    items = episode_items("tx2", 11, EpisodeSpec())
    trip = min(BoardScale.of(load_board("tx2")).trips_c)
    cold = run_sim("tx2", make_governor("maxfreq"), items, seed=11, period_s=0.05)
    assert cold.capped_s == 0.0
    hot = run_sim(
        "tx2", make_governor("maxfreq"), items, seed=11, period_s=0.05, start_c=trip - 2.0
    )
    assert hot.capped_s == pytest.approx(hot.t_end, abs=0.06)  # from the first tick on
    assert hot.makespan_s > 1.2 * cold.makespan_s  # and the caps bound


@pytest.mark.parametrize("board", BOARDS)
def test_no_shipped_hidvfs_network_is_its_initial_one(board):
    """Until stop 32 every board's thermal.onnx was its seeded initial network: its head had
    never been free in a training mix. The reference outputs recorded at training time must
    differ from the initial network's on the same inputs, for each of the three agents."""
    import json

    from agents.learned import MODELS_DIR
    from agents.train import HidvfsNets, TrainConfig

    folder = MODELS_DIR / board
    man = json.loads((folder / "manifest.json").read_text())
    seed = man["policies"]["hidvfs"]["provenance"]["seed"]
    cfg = TrainConfig()
    init = HidvfsNets.init(seed, cfg.hidden, cfg.prior)
    with np.load(folder / "reference.npz") as ref:
        for role in ("profiler", "thermal", "priority"):
            x, y = ref[f"{role}_x"], ref[f"{role}_y"]
            assert not np.allclose(getattr(init, role).forward(x), y, atol=1e-5), role


def test_the_coolest_online_cluster_takes_the_work_when_the_others_are_offline():
    """TX2's default power mode takes Denver offline. With the A57s past the trip, "must cool"
    is forced on them; the offline Denver counted as a cluster that takes work, so no online
    cluster was left to take it (the decision then fell back to all A57s at the lowest OPP)."""
    from dataclasses import replace

    from agents.features import FeatureTracker
    from agents.hidvfs import ActionSpace, build_inputs, choose
    from agents.learned import make_hidvfs
    from tests.agents.test_features import make_obs

    spec = load_board("tx2")
    obs = make_obs("tx2", 0.0, 84.0, 0.5, 0.5)
    obs = replace(
        obs,
        clusters=tuple(replace(c, online=()) if c.name == "denver" else c for c in obs.clusters),
    )
    space = ActionSpace.of(spec)
    inp = build_inputs(FeatureTracker(spec)(obs), obs, space)
    a57, denver = space.clusters.index("a57"), space.clusters.index("denver")
    assert inp.therm_mask[a57].tolist() == [False, True]  # forced to cool
    nets = make_hidvfs(spec).nets
    ch = choose(inp, nets, None, len(space.clusters))
    assert ch.therm[a57] == 0  # the only online cluster takes the work
    assert ch.therm[denver] == 0
