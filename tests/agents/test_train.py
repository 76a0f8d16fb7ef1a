"""Training: deterministic for a seed, and the learner improves the return on a toy plant."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from agents.features import BoardScale, remaining_bound_s
from agents.train import HidvfsNets, TrainConfig, gae, tick_rewards, train_hidvfs
from platforms.observation import ClusterObs, JobObs, JobProfile, Observation, RailObs, ZoneObs
from platforms.spec import load_board

SPEC = load_board("tx2")
A57 = SPEC.cluster("a57")
DEN = SPEC.cluster("denver")
FMAX = A57.fmax_khz
WORK_S = 3.0
PROFILE = JobProfile("toy", WORK_S, 0.05, 0.0, WORK_S / 4, FMAX, 4)


def _obs(t: float, f: int, progress: float, power_w: float, cpus) -> Observation:
    cl = (
        ClusterObs(
            "a57",
            0,
            A57.cpus,
            A57.cpus,
            A57.freqs_khz,
            1.0,
            f,
            A57.fmin_khz,
            FMAX,
            "userspace",
            (),
            (0.9,) * 4,
        ),
        ClusterObs(
            "denver",
            1,
            DEN.cpus,
            (),
            DEN.freqs_khz,
            1.3,
            DEN.fmin_khz,
            DEN.fmin_khz,
            DEN.fmax_khz,
            "userspace",
            (),
            (None, None),
        ),
    )
    zones = (ZoneObs("BCPU-therm", "cpu", 40.0, ("a57",), 85.0),)
    rails = (RailObs("VDD_IN", "total", power_w * 1000.0),)
    jobs = ()
    if progress < 1.0:
        jobs = (JobObs(1, "toy", "lo", 0.0, t, None, tuple(cpus), 0, PROFILE, progress),)
    return Observation(t, "tx2", cl, zones, rails, jobs)


def toy_episode(policy, items, seed, dt: float = 0.05, cold: bool = False):
    """One job on the A57 cluster: rate = cores x f / f_max, power = 1 + 2 n (f / f_max)^3."""
    policy.reset(seed)
    t, prog, energy, f, n, cpus = 0.0, 0.0, 0.0, A57.fmin_khz, 4, A57.cpus
    power = 1.0
    while prog < 1.0 and t < 10.0:
        obs = _obs(t, f, prog, power, cpus)
        d = policy.decide(obs)
        for st in getattr(policy, "stages", []):
            d = st(d, obs)
        f = d.freq_khz["a57"]
        cpus = tuple(c for c in d.jobs[1].cpus if c in A57.cpus) or A57.cpus[:1]
        n = len(cpus)
        x = f / FMAX
        power = 1.0 + 2.0 * n * x**3
        prog += n * x * dt / WORK_S
        energy += power * dt
        t += dt
    job = SimpleNamespace(pid=1, release_t=0.0, finish_t=t, deadline_s=None, criticality="lo")
    return SimpleNamespace(jobs=[job], t_end=t, energy_j=energy, makespan_s=t, peak_temp_c=40.0)


def _train(seed: int, episodes: int):
    # lambda_E = 5 puts the toy's optimum near 0.5 f_max, far from the prior's top level
    cfg = TrainConfig(
        episodes=episodes,
        batch=4,
        epochs=8,
        lr=3e-3,
        entropy=0.0,
        hidden=32,
        lambda_e=5.0,
        energy_rail="total",  # the toy meters only its total
    )
    return train_hidvfs(SPEC, toy_episode, lambda s: [], seed, cfg)


def test_training_is_deterministic_for_a_seed():
    a = _train(3, 8)
    b = _train(3, 8)
    for wa, wb in zip(a.nets.profiler.params, b.nets.profiler.params):
        np.testing.assert_array_equal(wa, wb)
    assert [h.ret for h in a.history] == [h.ret for h in b.history]
    c = _train(4, 8)
    assert not all(
        np.array_equal(x, y) for x, y in zip(a.nets.profiler.params, c.nets.profiler.params)
    )


def test_training_improves_return_on_toy_plant():
    res = _train(0, 48)
    first = np.mean([h.ret for h in res.history[:8]])
    last = np.mean([h.ret for h in res.history[-8:]])
    assert last > first + 0.1, (first, last)
    scores = [v["score"] for v in res.validation]
    assert scores[0] == res.validation[0]["score"] and max(scores) > scores[0] + 0.3


def test_gae_matches_discounted_returns_with_zero_values():
    r = np.array([1.0, 0.0, 2.0])
    adv = gae(r, np.zeros(3), 0.9, 1.0)
    np.testing.assert_allclose(adv, [1 + 0.81 * 2, 0.9 * 2, 2.0])


def test_shaping_telescopes_to_minus_initial_potential():
    """With gamma = 1 the shaping terms of an episode sum to -Phi(s_0) (Phi(terminal) = 0)."""
    obs = [_obs(0.05 * i, FMAX, min(0.2 * i, 0.99), 5.0, A57.cpus) for i in range(5)]
    res = SimpleNamespace(jobs=[], t_end=0.25)
    scale = BoardScale.of(SPEC)
    on = TrainConfig(gamma=1.0, shaping=True)
    off = TrainConfig(gamma=1.0, shaping=False)
    r_on, parts = tick_rewards(obs, res, scale, on, 5.0)
    r_off, _ = tick_rewards(obs, res, scale, off, 5.0)
    assert parts.shaping == pytest.approx(remaining_bound_s(obs[0]))
    assert r_on.sum() - r_off.sum() == pytest.approx(remaining_bound_s(obs[0]))


def test_energy_regulariser_reads_the_chosen_rail_and_the_meter():
    obs = [_obs(0.0, FMAX, 0.0, 3.0, A57.cpus), _obs(1.0, FMAX, 0.5, 3.0, A57.cpus)]
    job = SimpleNamespace(pid=1, release_t=0.0, finish_t=2.0, deadline_s=None, criticality="lo")
    scale = BoardScale.of(SPEC)
    plain = dict(shaping=False, lambda_t=0.0)
    # a meter that says the CPU drew 1 W and the board 4 W, whatever the sensor sampled
    res = SimpleNamespace(jobs=[job], t_end=2.0, energy_trace=((0.0, 0.0, 0.0), (2.0, 8.0, 2.0)))
    _, cpu = tick_rewards(obs, res, scale, TrainConfig(**plain), p_ref=1.0)
    _, tot = tick_rewards(obs, res, scale, TrainConfig(energy_rail="total", **plain), p_ref=1.0)
    assert cpu.energy == pytest.approx(-2.0) and tot.energy == pytest.approx(-8.0)
    # no meter (a board): the sensor's total rail; this toy has no CPU rail, so no CPU term
    bare = SimpleNamespace(jobs=[job], t_end=2.0)
    _, tot = tick_rewards(obs, bare, scale, TrainConfig(energy_rail="total", **plain), p_ref=1.0)
    _, cpu = tick_rewards(obs, bare, scale, TrainConfig(**plain), p_ref=1.0)
    assert tot.energy == pytest.approx(-6.0) and cpu.energy == 0.0


def test_makespan_time_term_charges_first_release_to_last_finish():
    """Busy time skips the gap between two jobs; the makespan term charges it (so slowing the
    first job into the gap costs nothing), and neither charges before the first release or
    after the last finish."""
    # ticks every 0.5 s to t_end 3.0; job 1 pending on [0.5, 1.0), job 2 on [2.0, 2.5)
    pend = {0.5, 2.0}
    obs = [_obs(0.5 * i, FMAX, 0.5 if 0.5 * i in pend else 1.0, 3.0, A57.cpus) for i in range(6)]
    jobs = [
        SimpleNamespace(pid=1, release_t=0.5, finish_t=1.0, deadline_s=None, criticality="lo"),
        SimpleNamespace(pid=2, release_t=2.0, finish_t=2.5, deadline_s=None, criticality="lo"),
    ]
    res = SimpleNamespace(jobs=jobs, t_end=3.0)
    scale = BoardScale.of(SPEC)
    plain = dict(shaping=False, lambda_t=0.0, lambda_e=0.0)
    _, busy = tick_rewards(obs, res, scale, TrainConfig(**plain), p_ref=1.0)
    _, span = tick_rewards(obs, res, scale, TrainConfig(time_term="makespan", **plain), 1.0)
    assert busy.time == pytest.approx(-1.0)
    assert span.time == pytest.approx(-2.0)  # 2.5 - 0.5: the episode's makespan
    # a first release inside a tick charges only its part of it
    jobs[0].release_t = 0.75
    _, span = tick_rewards(obs, res, scale, TrainConfig(time_term="makespan", **plain), 1.0)
    assert span.time == pytest.approx(-1.75)


@pytest.mark.parametrize("key", ["energy_rail", "time_term", "power_ref"])
def test_config_refuses_an_unknown_rail_or_time_term(key):
    with pytest.raises(ValueError, match=key):
        TrainConfig(**{key: "board"})


def test_busy_intervals_merge_overlaps_and_skip_unfinished_jobs():
    from agents.train import busy_intervals

    jobs = [
        SimpleNamespace(release_t=2.0, finish_t=3.0),
        SimpleNamespace(release_t=0.5, finish_t=1.0),
        SimpleNamespace(release_t=0.8, finish_t=1.5),
        SimpleNamespace(release_t=1.5, finish_t=1.6),  # touches the one before
        SimpleNamespace(release_t=4.0, finish_t=None),
    ]
    assert busy_intervals(jobs) == [(0.5, 1.6), (2.0, 3.0)]
    assert busy_intervals([]) == []


def test_busy_power_is_the_rail_mean_over_the_busy_time_only():
    from agents.train import busy_power

    # 1 W idle, 5 W total / 3 W CPU while busy on [1, 2] and [3, 4]; the trace is cumulative
    trace = [(0.0, 0.0, 0.0), (1.0, 1.0, 0.5), (2.0, 6.0, 3.5), (3.0, 7.0, 4.0), (4.0, 12.0, 7.0)]
    jobs = [
        SimpleNamespace(release_t=1.0, finish_t=2.0),
        SimpleNamespace(release_t=3.0, finish_t=4.0),
    ]
    res = SimpleNamespace(energy_trace=trace, jobs=jobs)
    assert busy_power(res, "total") == pytest.approx(5.0)
    assert busy_power(res, "cpu") == pytest.approx(3.0)
    # the whole episode's mean is lower: the gaps idle
    assert 12.0 / 4.0 < busy_power(res, "total")
    assert busy_power(SimpleNamespace(energy_trace=(), jobs=jobs), "total") is None
    assert busy_power(SimpleNamespace(energy_trace=trace, jobs=[]), "total") is None


def test_forked_jobs_return_in_order_and_report_failures():
    from agents.trainboard import _run_forked

    base = 10
    jobs = [lambda i=i: {"i": i, "x": base + i} for i in range(5)]  # closures: not picklable
    assert [r["x"] for r in _run_forked(jobs, 2)] == [10, 11, 12, 13, 14]

    def boom():
        raise ValueError("bad mix")

    with pytest.raises(RuntimeError, match="bad mix"):
        _run_forked([jobs[0], boom], 2)


def test_parallel_board_training_matches_serial(tmp_path):
    from agents.trainboard import train_board
    from tools.agents_episodes import EpisodeSpec, episode_items, make_runner

    spec = load_board("rubikpi3")
    ep = EpisodeSpec(n_jobs=2)
    outs = {}
    for w in (1, 2):
        out = tmp_path / f"w{w}"
        train_board(
            spec,
            make_runner("rubikpi3", ep),
            lambda s: episode_items("rubikpi3", s, ep),
            0,
            out,
            "test",
            policies=("ztt", "geardvfs"),
            cfg=TrainConfig(episodes=2),
            workers=w,
        )
        with np.load(out / "reference.npz") as z:
            outs[w] = {k: z[k] for k in z.files}
    assert (
        sorted(outs[1])
        == sorted(outs[2])
        == [
            "board",
            "geardvfs_x",
            "geardvfs_y",
            "ztt_x",
            "ztt_y",
        ]
    )
    assert str(outs[1]["board"]) == "rubikpi3"  # the loader checks where the file is from
    for k in outs[1]:
        np.testing.assert_array_equal(outs[1][k], outs[2][k])


def test_board_defaults_apply_before_overrides():
    from agents.train import BOARD_DEFAULTS, TrainConfig

    assert TrainConfig.for_board("a-probed-board") == TrainConfig()  # no defaults of its own
    rubik = TrainConfig.for_board("rubikpi3")
    assert rubik.lambda_e == BOARD_DEFAULTS["rubikpi3"]["lambda_e"] != TrainConfig().lambda_e
    assert TrainConfig.for_board("tx2").val_episodes == 16 != TrainConfig().val_episodes
    orin = TrainConfig.for_board("orin-nx", episodes=8)
    assert (
        (orin.energy_rail, orin.power_ref)
        == ("total", "busy")
        != (
            TrainConfig().energy_rail,
            TrainConfig().power_ref,
        )
    )
    assert orin.episodes == 8 and orin.energy_rail == BOARD_DEFAULTS["orin-nx"]["energy_rail"]
    assert TrainConfig.for_board("orin-nx", lambda_e=2.0).lambda_e == 2.0
    assert TrainConfig.for_board("tx2", power_ref="episode").power_ref == "episode"


def test_seed_ranges_are_disjoint_over_every_allowed_seed():
    """TRAINING.md promises disjoint training, calibration, validation and evaluation mixes:
    over every seed the CLI accepts, at the largest budget and with `agents eval`'s range."""
    from agents.train import (
        EVAL_SEEDS,
        MAX_EPISODES,
        MAX_EVAL_MIXES,
        MAX_SEED,
        MAX_TUNING_MIXES,
        TUNING_SEEDS,
        seed_ranges,
    )

    cfg = TrainConfig()
    use: dict[str, list[range]] = {}
    for seed in range(MAX_SEED + 1):
        for k, r in seed_ranges(seed, MAX_EPISODES, cfg.val_episodes, cfg.calib_episodes).items():
            use.setdefault(k, []).append(r)
    use["eval"] = [range(EVAL_SEEDS, EVAL_SEEDS + MAX_EVAL_MIXES)]
    use["tuning"] = [range(TUNING_SEEDS, TUNING_SEEDS + MAX_TUNING_MIXES)]
    spans = sorted((r.start, r.stop, k) for k, rs in use.items() for r in rs)
    for (_, stop, k), (start, _, k2) in zip(spans, spans[1:]):
        assert stop <= start, (k, k2)  # no two ranges (of any use or seed) overlap
    # the shipped models' seed 0 keeps its mixes (reproducible)
    r0 = seed_ranges(0, 640)
    assert (r0["train"][0], r0["calibration"][0], r0["validation"][0]) == (0, 500_000, 700_000)
    assert r0["coverage"][0] == 950_000
    # the lone-job episodes are told from the mixes by their seed alone
    from agents.train import LONE_VAL_EPISODES, lone_index

    for seed in (0, MAX_SEED):
        r = seed_ranges(seed, 640)
        assert [lone_index(s) for s in r["lone"]] == list(range(LONE_VAL_EPISODES))
        assert all(lone_index(s) is None for s in r["validation"])
    assert lone_index(TUNING_SEEDS) is None and lone_index(EVAL_SEEDS) is None
    # one seed past the bound reaches the calibration block
    assert seed_ranges(MAX_SEED + 1, MAX_EPISODES)["train"].stop > use["calibration"][0].start


def test_training_draws_its_mixes_from_its_seed_ranges():
    from agents.train import MAX_SEED, seed_ranges

    seen: list[int] = []

    def mix(s):
        seen.append(s)
        return []

    cfg = TrainConfig(episodes=8, batch=4, hidden=8, energy_rail="total")
    train_hidvfs(SPEC, toy_episode, mix, MAX_SEED, cfg)
    r = seed_ranges(MAX_SEED, cfg.episodes, cfg.val_episodes, cfg.calib_episodes)
    assert seen and all(s in r["train"] or s in r["validation"] or s in r["lone"] for s in seen)
    assert set(r["lone"]) <= set(seen)  # model selection scores the lone-job episodes too
    assert {s for s in seen if s in r["train"]} == {r["train"][0], r["train"][1]}


def test_train_cli_bounds_are_the_disjoint_range():
    from click.testing import CliRunner

    from agents.train import MAX_EPISODES, MAX_SEED, MAX_VAL_EPISODES
    from tools.cli import cli

    def run(*a):
        return CliRunner().invoke(
            cli, ["agents", "train", "--board", "tx2", "--out", "/nonexistent/x", *a]
        )

    for args, opt in (
        (("--seed", str(MAX_SEED + 1)), "--seed"),
        (("--seed", "-1"), "--seed"),
        (("--episodes", "0"), "--episodes"),
        (("--episodes", "-3"), "--episodes"),
        (("--episodes", str(MAX_EPISODES + 1)), "--episodes"),
        (("--jobs", "0"), "--jobs"),
        (("--val-mixes", "0"), "--val-mixes"),
        (("--val-mixes", str(MAX_VAL_EPISODES + 1)), "--val-mixes"),
    ):
        r = run(*args)
        assert r.exit_code == 2 and f"Invalid value for '{opt}'" in r.output, (args, r.output)


def test_train_board_refuses_seeds_outside_the_disjoint_range(tmp_path):
    from agents.train import MAX_SEED
    from agents.trainboard import train_board

    for seed, cfg in ((MAX_SEED + 1, TrainConfig(episodes=1)), (0, TrainConfig(episodes=0))):
        with pytest.raises(ValueError, match="overlap"):
            train_board(SPEC, None, None, seed, tmp_path, "t", policies=("ztt",), cfg=cfg)
    assert not any(tmp_path.iterdir())  # nothing exported


def test_the_untrained_prior_is_scored_but_never_exported():
    res = _train(5, 4)
    assert [v["after_episode"] for v in res.validation] == [0, 4]
    prior = HidvfsNets.init(5, 32)
    assert not all(
        np.array_equal(a, b) for a, b in zip(res.nets.profiler.params, prior.profiler.params)
    )


def test_the_shield_is_calibrated_per_job_on_its_largest_residual():
    """One conformal score per job, its worst decision: a job's bound then holds at every
    tick at once, and jobs, not a job's correlated ticks, are the exchangeable draws."""
    from agents.rtmodel import coverage, fit_response_time, job_scores

    s = np.array([0.1, 0.5, -0.2, 0.3, 0.0, 0.2])
    j = np.array([7, 7, 3, 3, 3, 9])
    assert sorted(job_scores(s, j).tolist()) == [0.2, 0.3, 0.5]
    rng = np.random.default_rng(0)
    X = rng.normal(size=(400, 8)).astype(np.float32)
    y = X[:, 0] + 0.1 * rng.normal(size=400)
    jobs = np.repeat(np.arange(100), 4)  # 100 jobs of 4 decisions
    per_row = fit_response_time(X, y, X, y, 0.1, 0)
    per_job = fit_response_time(X, y, X, y, 0.1, 0, jobs_cal=jobs)
    assert per_job.n_cal == 100 and per_row.n_cal == 400
    assert per_job.q > per_row.q  # the worst of four decisions needs more room
    assert coverage(per_job, X, y, jobs=jobs) >= 0.9  # every decision of 90 % of the jobs
    assert coverage(per_job, X, y) >= coverage(per_job, X, y, jobs=jobs)


def test_a_lone_job_validation_episode_is_one_job_alone_without_a_deadline():
    """The main BOTS campaign's case, which 5-job mixes never show: every episode kernel
    once, released at once, no deadline."""
    from agents.train import TrainConfig, seed_ranges, validation_seeds
    from tools.agents_episodes import EPISODE_KERNELS, EpisodeSpec, episode_items

    r = seed_ranges(0, 640)
    jobs = [episode_items("tx2", s, EpisodeSpec()) for s in r["lone"]]
    assert all(len(items) == 1 for items in jobs)
    assert sorted(items[0][0].name.split(".")[0] for items in jobs) == sorted(EPISODE_KERNELS)
    assert all(items[0][0].deadline_s is None and items[0][0].release_t == 0.0 for items in jobs)
    assert len(episode_items("tx2", r["validation"][0], EpisodeSpec())) == 5
    assert validation_seeds(0, TrainConfig(val_lone=False)) == list(r["validation"])
