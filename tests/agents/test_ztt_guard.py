"""zTT's thermal guard (ztt-21/zTT Jetson_tx2/agent.py lines 310-334), as the port runs it in
training and evaluation: random lower clocks at or above the target, 30 % exploration towards
higher clocks when progress is behind and the target is >= 5 C away, else the network."""

from __future__ import annotations

from dataclasses import replace
from functools import cache
from types import SimpleNamespace

import numpy as np
import pytest

from agents import ztt
from agents.factory import make_policy
from agents.features import BoardScale
from agents.train import TrainConfig
from agents.ztt import (
    EXPLORE_MARGIN_C,
    EXPLORE_P,
    TARGET_MARGIN_C,
    ZttPolicy,
    cluster_levels,
    grid,
    target_temp_c,
    ztt_guard,
    ztt_reward,
)
from platforms.observation import RailObs
from platforms.spec import load_board
from tests.agents.test_learned import observations

BOARDS = ("tx2", "rubikpi3")


@cache
def base(board: str):
    return observations(board)[0]


def tick(board: str, k: int, temp_c: float | None, level: str | None = None, jobs: bool = True):
    """Observation ``k`` of a synthetic run: every CPU zone at ``temp_c``, the clusters at
    their table's ``level`` ("low", "top"; None: as observed), and the jobs of the base
    observation frozen (no progress between ticks: u = 0) or gone (u = 1)."""
    o = base(board)
    zones = tuple(replace(z, temp_c=temp_c) if z.role == "cpu" else z for z in o.zones)
    clusters = o.clusters
    if level is not None:
        clusters = tuple(
            replace(c, cur_khz=c.freqs_khz[0] if level == "low" else c.freqs_khz[-1])
            for c in o.clusters
        )
    out = replace(o, t=o.t + 0.05 * k, zones=zones, clusters=clusters)
    return out if jobs else out.with_jobs(())


class Fixed:
    """A Q network that always prefers joint action ``a``."""

    def __init__(self, a: int, n: int):
        self.q = np.zeros((1, n), np.float32)
        self.q[0, a] = 1.0

    def __call__(self, x):
        return self.q


def positions(spec, d) -> tuple[int, ...]:
    """Grid positions (0 low .. 2 top) of a decision's per-cluster clocks."""
    out = []
    for cl, lv in zip(spec.clusters, cluster_levels(spec)):
        out.append(lv.index(cl.freqs_khz.index(d.freq_khz[cl.name])))
    return tuple(out)


def policy(board: str, network: str, seed: int = 0) -> ZttPolicy:
    spec = load_board(board)
    n = len(grid(spec))
    pol = ZttPolicy(spec, Fixed(n - 1 if network == "top" else 0, n))
    pol.reset(seed)
    return pol


@pytest.mark.parametrize("board,target", [("tx2", 65.0), ("orin-nx", 79.0), ("rubikpi3", 70.0)])
def test_ztt_target_is_the_lowest_passive_cpu_trip_minus_hidvfs_margin(board, target):
    spec = load_board(board)
    assert TARGET_MARGIN_C == TrainConfig().temp_margin_c  # the budget hidvfs is held to
    assert target_temp_c(spec) == min(BoardScale.of(spec).trips_c) - TARGET_MARGIN_C == target
    assert ZttPolicy(spec, Fixed(0, len(grid(spec)))).t_target_c == target


@pytest.mark.parametrize("board", BOARDS)
def test_ztt_reward_and_guard_share_the_target(board, monkeypatch):
    """train_ztt hands train_dqn a reward and policies on the same, per-board target."""
    spec = load_board(board)
    seen = {}
    monkeypatch.setattr(ztt, "train_dqn", lambda *a, **k: seen.update(make=a[6], reward=a[7]))
    ztt.train_ztt(spec, None, None, 0)
    fake = SimpleNamespace(q=SimpleNamespace(forward=Fixed(0, len(grid(spec)))))
    target = target_temp_c(spec)
    assert seen["make"](fake, [], False).t_target_c == target
    assert seen["make"](fake, [], True).t_target_c == target
    watts = (RailObs("meter", "total", 4000.0),)  # 4 W (rubikpi3 has no monitor)
    prev = replace(tick(board, 0, 40.0), rails=watts)
    below, at = tick(board, 1, target - 0.5), tick(board, 1, target)
    u = ztt.ztt_u(prev, below, 0.05)
    assert seen["reward"](prev, below) == pytest.approx(u + 0.2 * np.tanh(0.5) + 0.5)
    assert seen["reward"](prev, at) == pytest.approx(u - 2.0 + 0.5)
    # 50 C (the published TX2 setting) is no longer "hot" for the reward on these boards
    warm = replace(tick(board, 0, 55.0), rails=watts)
    assert ztt_reward(warm, tick(board, 1, 55.0), 0.05, target) > 0


@pytest.mark.parametrize("board", BOARDS)
def test_ztt_reward_reads_the_temperature_the_action_led_to(board):
    """zTT's loop computes the reward from the state that comes back after the action: an
    action that heats the die past the target is charged, one that cools it is not (the
    port read the temperature the action was chosen on, one tick late)."""
    target = target_temp_c(load_board(board))
    watts = (RailObs("meter", "total", 4000.0),)
    cool, hot = target - 10.0, target + 1.0
    heated = ztt_reward(
        replace(tick(board, 0, cool), rails=watts), tick(board, 1, hot), 0.05, target
    )
    cooled = ztt_reward(
        replace(tick(board, 0, hot), rails=watts), tick(board, 1, cool), 0.05, target
    )
    assert heated < 0 < cooled


@pytest.mark.parametrize("board", BOARDS)
def test_ztt_guard_cools_a_hot_board_below_the_networks_choice(board):
    """At the target the network (top clocks) is overruled: from the lowest observed level
    the draw 'at or below the current position' can only be the lowest grid clock."""
    spec = load_board(board)
    pol = policy(board, "top")
    target = pol.t_target_c
    top = {cl.name: cl.freqs_khz[lv[-1]] for cl, lv in zip(spec.clusters, cluster_levels(spec))}
    for k in range(20):
        d = pol.decide(tick(board, k, target + (k % 3), level="low"))
        assert all(d.freq_khz[n] < top[n] for n in top), d.freq_khz
        assert positions(spec, d) == (0,) * len(top)
    assert pol.guarded == {"cool": 20, "explore": 0}


@pytest.mark.parametrize("board", BOARDS)
def test_ztt_guard_never_raises_a_clock_while_hot(board):
    """From the top, hot ticks draw at or below the last executed position: never up, and
    down to the bottom within a few ticks (the network keeps asking for the top)."""
    spec = load_board(board)
    pol = policy(board, "top", seed=3)
    prev = None
    seen = []
    for k in range(40):
        d = pol.decide(tick(board, k, pol.t_target_c + 2.0, level="top" if k == 0 else None))
        p = positions(spec, d)
        if prev is not None:
            assert all(a <= b for a, b in zip(p, prev)), (prev, p)
        prev = p
        seen.append(p)
    assert seen[-1] == (0,) * len(p)
    assert any(p != (2,) * len(p) for p in seen[:3])


@pytest.mark.parametrize("board", BOARDS)
def test_ztt_guard_explores_only_upwards_when_behind_with_margin(board):
    """u < 1 and the target >= 5 C away: about 30 % of the decisions draw at or above the
    current position; the rest are the network's (lowest clocks here)."""
    spec = load_board(board)
    pol = policy(board, "low", seed=11)
    temp = pol.t_target_c - EXPLORE_MARGIN_C  # exactly the margin: still explores
    n = 600
    prev = pol.current(tick(board, 0, temp))
    ups = 0
    for k in range(n):
        before = pol.guarded["explore"]
        p = positions(spec, pol.decide(tick(board, k, temp)))
        if pol.guarded["explore"] > before:
            assert all(a >= b for a, b in zip(p, prev)), (prev, p)
            ups += p != (0,) * len(p)
        else:
            assert p == (0,) * len(p)  # the network's choice
        prev = p
    share = pol.guarded["explore"] / n
    sd = (EXPLORE_P * (1 - EXPLORE_P) / n) ** 0.5
    assert abs(share - EXPLORE_P) < 4 * sd, share
    assert ups > 0 and pol.guarded["cool"] == 0


@pytest.mark.parametrize("board", BOARDS)
def test_ztt_guard_leaves_the_network_alone_otherwise(board):
    """Within 5 C of the target, on schedule (u = 1), or with no CPU temperature: the
    network decides every tick."""
    spec = load_board(board)
    for temp, jobs in ((None, True), (50.0, False)):
        pol = policy(board, "low")
        for k in range(200):
            assert positions(spec, pol.decide(tick(board, k, temp, jobs=jobs))) == (0,) * len(
                spec.clusters
            )
        assert pol.guarded == {"cool": 0, "explore": 0}
    pol = policy(board, "low")
    near = pol.t_target_c - EXPLORE_MARGIN_C + 0.1
    for k in range(200):
        pol.decide(tick(board, k, near))
    assert pol.guarded == {"cool": 0, "explore": 0}


@pytest.mark.parametrize("board", BOARDS)
def test_ztt_guard_is_reproducible_from_the_seed(board):
    def run(seed):
        pol = policy(board, "top", seed)
        temps = [pol.t_target_c + (1.0 if k % 7 < 2 else -10.0) for k in range(300)]
        return [
            tuple(sorted(pol.decide(tick(board, k, t)).freq_khz.items()))
            for k, t in enumerate(temps)
        ], dict(pol.guarded)

    a, b, c = run(5), run(5), run(6)
    assert a == b
    assert a[0] != c[0]
    assert a[1]["cool"] > 0 and a[1]["explore"] > 0
    # reset(seed) restarts the stream: a policy reused for a second run repeats the first
    pol = policy(board, "top", 5)
    first = [pol.decide(tick(board, k, pol.t_target_c + 1)).freq_khz for k in range(30)]
    pol.reset(5)
    assert [pol.decide(tick(board, k, pol.t_target_c + 1)).freq_khz for k in range(30)] == first


def test_ztt_guard_draws_stay_on_the_grid_and_cover_it():
    rng = np.random.default_rng(0)
    lows, highs = {0: set(), 1: set(), 2: set()}, {0: set(), 1: set(), 2: set()}
    for _ in range(3000):
        cur = tuple(int(c) for c in rng.integers(0, 3, size=3))
        kind, pos = ztt_guard(71.0, 70.0, 0.0, cur, rng)
        assert kind == "cool" and all(0 <= p <= c for p, c in zip(pos, cur))
        lows[cur[0]].add(pos[0])
        res = None
        while res is None:
            res = ztt_guard(60.0, 70.0, 0.5, cur, rng)
        assert res[0] == "explore" and all(c <= p <= 2 for p, c in zip(res[1], cur))
        highs[cur[0]].add(res[1][0])
    # uniform over every position at or below / at or above the current one, the current
    # one included (randint is inclusive), as in the TX2 code
    assert lows == {0: {0}, 1: {0, 1}, 2: {0, 1, 2}}
    assert highs == {0: {0, 1, 2}, 1: {1, 2}, 2: {2}}
    assert ztt_guard(None, 70.0, 0.0, (2, 2), rng) is None
    assert all(ztt_guard(66.0, 70.0, 0.0, (0, 0), rng) is None for _ in range(100))
    assert all(ztt_guard(60.0, 70.0, 1.0, (0, 0), rng) is None for _ in range(100))


@pytest.mark.parametrize("board", ["tx2", "orin-nx", "rubikpi3"])
def test_ztt_decisions_stay_on_the_action_grid(board):
    spec = load_board(board)
    pol = make_policy("ztt", spec)
    pol.reset(1)
    allowed = {
        cl.name: {cl.freqs_khz[i] for i in lv}
        for cl, lv in zip(spec.clusters, cluster_levels(spec))
    }
    temps = np.random.default_rng(2).uniform(20.0, 95.0, size=300)
    for k, t in enumerate(temps):
        d = pol.decide(tick(board, k, float(t)))
        assert all(f in allowed[n] for n, f in d.freq_khz.items())
    assert pol.guarded["cool"] > 0 and pol.guarded["explore"] > 0


def test_ztt_records_the_executed_action_for_replay():
    """What train_dqn turns into transitions is the guarded action, not the network's."""
    from agents.geardvfs import BranchDQN

    board = "rubikpi3"
    spec = load_board(board)
    dqn = BranchDQN(ztt.ZTT_IN, [len(grid(spec))], ztt.ztt_config(4, 0.05), 0)
    rec: list = []
    pol = ZttPolicy(spec, dqn.q.forward, dqn=dqn, recorder=rec)
    pol.reset(4)
    greedy = []
    for k in range(30):
        o = tick(board, k, pol.t_target_c + 1.0, level="top" if k == 0 else None)
        x = ztt.ztt_state(spec, pol.scale, o, 0.0)
        greedy.append(dqn.act(x, [np.ones(len(grid(spec)), bool)], explore=False)[0])
        d = pol.decide(o)
        a = rec[-1][2][0]
        assert pol.actions[a] == tuple(
            cl.freqs_khz.index(d.freq_khz[cl.name]) for cl in spec.clusters
        )
    assert pol.guarded["cool"] == 30
    assert any(r[2][0] != g for r, g in zip(rec, greedy))


def test_shipped_ztt_runs_its_guard_on_a_hot_board():
    """The evaluation path (ONNX network from agents/models, run_sim) runs the guard."""
    from daemon.simrun import run_sim
    from tools.agents_episodes import EpisodeSpec, episode_items

    spec = load_board("rubikpi3")
    pol = make_policy("ztt", spec)
    items = episode_items("rubikpi3", 900_001, EpisodeSpec(n_jobs=2))
    run_sim("rubikpi3", pol, items, seed=900_001, period_s=0.05, start_c=pol.t_target_c + 8)
    assert pol.guarded["cool"] > 0
