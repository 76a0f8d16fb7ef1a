"""The GearDVFS and zTT ports: action spaces, rewards as documented, DQN learning, ONNX parity."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from agents.factory import make_policy
from agents.features import BoardScale
from agents.geardvfs import (
    GEAR_IN,
    N_W,
    BranchDQN,
    DqnConfig,
    GearDvfsPolicy,
    GearState,
    Selection,
    branch_sizes,
    gear_reward,
    work_done,
)
from agents.hidvfs import ActionSpace
from agents.ztt import BETA, ZttPolicy, grid, target_temp_c, ztt_reward, ztt_u
from platforms.spec import load_board
from tests.agents.test_learned import observations


@pytest.mark.parametrize("board,n", [("tx2", 9), ("orin-nx", 9), ("rubikpi3", 27)])
def test_ztt_grid_is_3_per_cluster(board, n):
    g = grid(load_board(board))
    assert len(g) == n
    spec = load_board(board)
    if board == "tx2":  # the published {3, 7, 11} of the 12 TX2 levels
        assert sorted({a[0] for a in g}) == [3, 7, 11]
    for a in g:
        for ci, idx in enumerate(a):
            assert 0 <= idx < len(spec.clusters[ci].freqs_khz)


def test_geardvfs_action_space_is_the_profilers():
    spec = load_board("rubikpi3")
    space = ActionSpace.of(spec)
    assert branch_sizes() == [8, 4] * 3
    assert all(len(lv) <= 8 for lv in space.levels)


def test_gear_window_has_n_w_readings():
    spec = load_board("tx2")
    st = GearState(spec)
    obs = observations("tx2")
    for i, o in enumerate(obs[:15]):
        x, _ = st(o)
        assert x.shape == (GEAR_IN,)
        filled = min(i + 1, N_W)
        per = GEAR_IN // N_W
        assert np.count_nonzero(np.abs(x[: (N_W - filled) * per])) == 0


def test_rewards_follow_their_definitions():
    spec = load_board("tx2")
    obs = observations("tx2")
    a, b = obs[0], obs[1]
    assert work_done(a, b) >= 0
    r = gear_reward(spec, BoardScale.of(spec), a, b)
    assert np.isfinite(r) and r >= 0  # jobs running: performance per watt
    target = target_temp_c(spec)  # lowest passive CPU trip - 20 C, the guard's too
    z = ztt_reward(a, b, 0.05, target)
    u = ztt_u(a, b, 0.05)
    assert 0.0 <= u <= 1.0
    t = b.max_cpu_temp_c  # after the action, as zTT's loop reads it
    v1 = -2.0 if t >= target else 0.2 * np.tanh(target - t)
    assert z == pytest.approx(u + v1 + BETA / a.total_power_w)
    idle = a.with_jobs(())
    assert gear_reward(spec, BoardScale.of(spec), idle, b) < 0  # idle: only power counts


def test_branch_dqn_learns_a_bandit():
    """Two branches, reward 1 only for (2, 0): the greedy action converges to it."""
    cfg = DqnConfig(hidden=(16,), lr=1e-2, replay=2000, batch=64, start_samples=32, gamma=0.0)
    dqn = BranchDQN(3, [3, 2], cfg, seed=0)
    rng = np.random.default_rng(0)
    masks = [np.ones(3, bool), np.ones(2, bool)]
    x = np.ones(3, np.float32)
    for _ in range(600):
        a = [int(rng.integers(3)), int(rng.integers(2))]
        r = float(a[0] == 2) + float(a[1] == 0)
        dqn.remember(x, masks, a, r, x, masks, True)
        dqn.update()
    assert dqn.act(x, masks, explore=False) == [2, 0]


def test_masked_branch_actions_are_never_taken():
    cfg = DqnConfig(hidden=(8,))
    dqn = BranchDQN(2, [4], cfg, seed=1)
    m = [np.array([False, True, False, True])]
    for _ in range(50):
        assert dqn.act(np.zeros(2, np.float32), m, explore=True)[0] in (1, 3)


@pytest.mark.parametrize("name,cls", [("geardvfs", GearDvfsPolicy), ("ztt", ZttPolicy)])
@pytest.mark.parametrize("board", ["tx2", "orin-nx", "rubikpi3"])
def test_shipped_baselines_decide_valid(board, name, cls):
    spec = load_board(board)
    pol = make_policy(name, spec)
    assert isinstance(pol, cls) and pol.stages == []
    tables = {c.name: set(c.freqs_khz) for c in spec.clusters}
    pol.reset(0)
    for o in observations(board)[:30]:
        d = pol.decide(o)
        assert all(f in tables[n] for n, f in d.freq_khz.items())
        assert set(d.jobs) == {j.pid for j in o.jobs}


@pytest.mark.parametrize("kind", ["geardvfs", "ztt"])
def test_baseline_training_keeps_its_best_validated_network(kind):
    """The baselines get hidvfs's model selection: the exported network is the one that
    scored best on the validation mixes (greedy, here by its own reward per tick), not the last
    one."""
    from agents.geardvfs import metered, train_geardvfs
    from agents.ztt import train_ztt, ztt_config
    from tools.agents_episodes import EpisodeSpec, episode_items, make_runner

    spec = load_board("rubikpi3")
    ep = EpisodeSpec(n_jobs=2)
    run, mix = make_runner("rubikpi3", ep), (lambda s: episode_items("rubikpi3", s, ep))
    scale = BoardScale.of(spec)

    def per_tick(obs, res):
        seen = metered(obs, res)
        r = [
            gear_reward(spec, scale, a, b)
            if kind == "geardvfs"
            else ztt_reward(a, b, 0.05, target_temp_c(spec))
            for a, b in zip(seen, seen[1:])
        ]
        return sum(r) / len(r)

    if kind == "geardvfs":
        cfg = DqnConfig(episodes=4, start_samples=32)
        tr = train_geardvfs(spec, run, mix, 0, cfg, selection=Selection((700000,), 1, per_tick))
        pol = GearDvfsPolicy
    else:
        cfg = replace(ztt_config(4, 0.05), start_samples=16)
        tr = train_ztt(spec, run, mix, 0, cfg, selection=Selection((700000,), 1, per_tick))
        pol = ZttPolicy

    assert [v["after_episode"] for v in tr.validation] == [0, 1, 2, 3, 4]
    scores = [v["score"] for v in tr.validation]
    # the best trained checkpoint is not the last one here: keeping the last would fail
    # below; the untrained network (after 0 episodes) is scored but never kept
    trained = scores[1:]
    assert max(trained) > trained[-1]
    rec: list = []
    res = run(pol(spec, tr.dqn.q.forward, recorder=rec), mix(700000), 700000)
    again = per_tick([r[3] for r in rec], res)
    assert again == pytest.approx(max(trained), abs=1e-9)


def test_baseline_selection_follows_the_score_it_is_given():
    """The board trainer hands the baselines hidvfs's yardstick; any score is followed."""
    from agents.ztt import train_ztt, ztt_config
    from tools.agents_episodes import EpisodeSpec, episode_items, make_runner

    spec = load_board("rubikpi3")
    ep = EpisodeSpec(n_jobs=2)
    run, mix = make_runner("rubikpi3", ep), (lambda s: episode_items("rubikpi3", s, ep))
    seen: list[float] = []

    def energy_saved(obs, res):
        seen.append(-res.energy_j)
        return -res.energy_j

    cfg = replace(ztt_config(4, 0.05), start_samples=16)
    tr = train_ztt(spec, run, mix, 0, cfg, selection=Selection((700000,), 1, energy_saved))
    assert [v["score"] for v in tr.validation] == seen
    res = run(ZttPolicy(spec, tr.dqn.q.forward), mix(700000), 700000)
    assert -res.energy_j == pytest.approx(max(seen[1:]), abs=1e-12)
    assert len(set(seen)) > 1
