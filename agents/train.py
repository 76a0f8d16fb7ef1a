"""Training of the hidvfs agents in the simulator (numpy PPO-lite).

The learner never imports the simulator or the workloads: ``run_episode(policy, items, seed)``
runs one episode of the real control loop and returns its result (``jobs`` with ``pid``,
``release_t``, ``finish_t``, ``deadline_s``, ``criticality``; ``t_end``, ``energy_j``,
``makespan_s``, ``peak_temp_c``; ``cold=True`` starts the board idle at its ambient whatever
the mix draws), and ``make_mix(seed)`` returns that episode's items. The CLI
(:mod:`tools.agents_episodes`) wires :func:`daemon.simrun.run_sim` and :mod:`bots_bench.workload`.

Reward, per decision tick i (from the observations the policy recorded, Delta t to the next
tick, time in units of :data:`TIME_SCALE_S`):

* time: ``-Delta t`` while jobs are pending (``time_term = "pending"``, busy time), or over
  every tick from the first release to the last finish (``"makespan"``: the sum is the
  episode's makespan, the metric ``agents eval`` reports);
* energy regulariser: ``-lambda_E * Delta E / P_ref`` (trapezoid of the CPU rail by default,
  ``energy_rail``; P_ref that rail's mean power over one ``maxfreq`` episode of the first
  training mix, measured at the start of training: over the whole episode, idle gaps between
  jobs included (``power_ref = "episode"``), or only while a job is pending (``"busy"``)).
  The time term counts only the time with jobs pending, a fraction of the episode (1/2.7 on
  that tx2 mix, 1/2.3 over five training mixes; orin-nx and rubikpi3 1/2.8-1/3.6), so with
  the episode's power lambda_E = 1 weighs a relative energy change 2-3x a relative time
  change: the energy-delay-neutral weight, d log(E T_pending) = 0, is lambda_E = T_pending /
  T_episode, about 0.3-0.45. With the busy time's power and the total rail, lambda_E = 1 is
  that weight for a job alone. The per-board values were chosen on tuning and validation
  mixes (agents/TRAINING-LOG.md), not from these identities. The CPU rail is the energy DVFS
  controls: the
  rest of the board draws power in proportion to time, which the makespan term already charges,
  and on the simulated boards it is 60-75 % of the total, so a total-rail regulariser leaves the
  learner little energy signal. That little is the truth on the Jetsons, where the energy-delay
  product counts the whole board: there the total rail over the busy power is used (the
  agents race a lone job, as maxfreq does, instead of trading board-paid time for CPU
  joules). Power is the simulator's exact meter
  (:func:`agents.metering.metered`: mean plant power per tick, also on the RUBIK Pi 3, which
  has no monitor), as for the baselines' rewards. Per-board values: :data:`BOARD_DEFAULTS`;
* temperature regulariser: ``-lambda_T * max(0, T - T_target) / 10 C * Delta t``;
* terminal: ``-lambda_D`` per missed deadline (2x for hi jobs), added on the last tick;
* shaping (flag): ``F = gamma * Phi(s') - Phi(s)``, ``Phi = -(Graham-style bound of the
  remaining work at the current frequencies) / TIME_SCALE_S``, ``Phi(terminal) = 0``, with the
  learner's gamma (Ng, Harada, Russell 1999: the optimal policy is unchanged).

Learner: PPO-lite (clipped ratio, entropy bonus) over groups of ``batch`` rollouts of the same
job mix and plant seed, with a grouped leave-one-out baseline at equal simulated time
(:func:`grouped_advantages`, the GRPO idea at tick level: the mix's own variance, which a state
value cannot predict because arrivals are not observable, cancels out), all numpy and seeded: the same seed gives the same networks.
Model selection: the greedy policy is scored on a few validation mixes (their own seed range,
disjoint from training, calibration and evaluation) before training and every ``val_every``
episodes; the best-scoring networks are kept (a policy-gradient run on a noisy objective can
drift; the prior itself is a candidate).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np

from agents.features import MAX_CLUSTERS, BoardScale, remaining_bound_s
from agents.hidvfs import (
    CORE_FRACTIONS,
    HEAD,
    N_CORES,
    N_LEVELS,
    PRIORITY_IN,
    PRIORITY_SIGMA,
    PROFILER_IN,
    PROFILER_OUT,
    THERMAL_IN,
    HidvfsPolicy,
    Recorder,
)
from agents.metering import metered
from agents.nn import MLP, Adam, learner_entropy, log_softmax, masked_logits, softmax
from agents.rtmodel import RtCollector
from platforms.observation import Observation
from platforms.spec import BoardSpec

TIME_SCALE_S = 1.0
#: strength of the initial preference for the fast end and all cores (logit ramp +-PRIOR):
#: exploration stays near the prior (p(top level) ~ 0.58, p(all cores) ~ 0.87), so rollouts of
#: one mix differ locally and the grouped baseline sees the effect of small changes
PRIOR = 3.0
#: seed ranges: training episodes, calibration episodes, held-out evaluation (disjoint)
TRAIN_SEEDS = 0
CALIB_SEEDS = 500_000
VAL_SEEDS = 700_000
EVAL_SEEDS = 900_000
#: mixes for choosing training settings (``agents eval --mixes tuning``): inside the validation
#: range, after the ``val_episodes`` (< 100) that model selection draws for any ``--seed``;
#: never a held-out mix
TUNING_SEEDS = VAL_SEEDS + 100
#: model selection also scores one job alone on the board per episode kernel (the main BOTS
#: campaign's case, which 5-job mixes never show): the last of these seeds of each validation
#: block (``TrainConfig.val_lone``; the mix maker tells them by :func:`lone_index`)
LONE_VAL_EPISODES = 7
#: model selection's validation mixes end where the lone-job episodes, then the tuning mixes,
#: begin
MAX_VAL_EPISODES = TUNING_SEEDS - VAL_SEEDS - LONE_VAL_EPISODES
#: the shield's held-out coverage episodes, after every `agents eval` mix
COVERAGE_SEEDS = EVAL_SEEDS + 50_000
#: per training seed: training mixes 10 000 apart, the other ranges 1 000 apart, so one
#: seed's mixes never reach the next seed's
TRAIN_STRIDE = 10_000
SEED_STRIDE = 1_000
#: the largest budget and seeds that keep every range inside its own block (checked by the
#: CLI; tests/agents/test_train.py checks the disjointness over the whole allowed range)
MAX_EPISODES = TRAIN_STRIDE
MAX_SEED = (CALIB_SEEDS - TRAIN_SEEDS) // TRAIN_STRIDE - 1
MAX_EVAL_MIXES = COVERAGE_SEEDS - EVAL_SEEDS
#: tuning mixes stay inside seed 0's validation block
MAX_TUNING_MIXES = VAL_SEEDS + SEED_STRIDE - TUNING_SEEDS

RunEpisode = Callable[..., object]
MakeMix = Callable[[int], list]
Log = Callable[[str], None]


def seed_ranges(
    seed: int, episodes: int, val_episodes: int = 4, calib_episodes: int = 256, restart: int = 0
) -> dict[str, range]:
    """The mix seeds one training run (``--seed``) draws from, per use: what the trainers
    call (geardvfs/ztt: ``TRAIN_SEEDS + TRAIN_STRIDE * seed + restart * episodes + episode``,
    hidvfs a prefix). A restart (``--restarts``) trains on the next ``episodes`` mixes of the
    seed's block and is chosen on the same validation mixes as the others."""
    t = TRAIN_SEEDS + TRAIN_STRIDE * seed + restart * episodes
    return {
        "train": range(t, t + episodes),
        "calibration": range(
            CALIB_SEEDS + SEED_STRIDE * seed, CALIB_SEEDS + SEED_STRIDE * seed + calib_episodes
        ),
        "validation": range(
            VAL_SEEDS + SEED_STRIDE * seed, VAL_SEEDS + SEED_STRIDE * seed + val_episodes
        ),
        "lone": range(
            VAL_SEEDS + SEED_STRIDE * seed + MAX_VAL_EPISODES,
            VAL_SEEDS + SEED_STRIDE * seed + MAX_VAL_EPISODES + LONE_VAL_EPISODES,
        ),
        "coverage": range(
            COVERAGE_SEEDS + SEED_STRIDE * seed,
            COVERAGE_SEEDS + SEED_STRIDE * seed + calib_episodes,
        ),
    }


def lone_index(mix_seed: int) -> int | None:
    """Which lone-job validation episode ``mix_seed`` is (0 .. LONE_VAL_EPISODES - 1), or None
    for a mix of several jobs."""
    off = mix_seed - VAL_SEEDS
    if not 0 <= off < SEED_STRIDE * (MAX_SEED + 1):
        return None
    k = off % SEED_STRIDE - MAX_VAL_EPISODES
    return k if 0 <= k < LONE_VAL_EPISODES else None


def validation_seeds(seed: int, cfg: TrainConfig) -> list[int]:
    """The episodes every policy's checkpoint is chosen on: the validation mixes, then the
    lone-job episodes when ``cfg.val_lone``."""
    r = seed_ranges(seed, cfg.episodes, cfg.val_episodes)
    return list(r["validation"]) + (list(r["lone"]) if cfg.val_lone else [])


#: per-board training settings that differ from :class:`TrainConfig`'s defaults, chosen on
#: tuning and validation mixes (never the held-out ones; the comparisons are in
#: agents/TRAINING-LOG.md).
#: tx2 and orin-nx: the energy term is the whole board's, over the busy time's maxfreq power
#: (stop 29): lambda_E = 1 is then the energy-delay-neutral weight for a job alone, and the
#: rest of the board (most of its power) is charged as it is paid. With the CPU rail over the
#: episode's power, a lone BOTS job on tx2 ran 19.5 % longer than maxfreq for no board energy;
#: now it races as maxfreq does, and the tuning mixes' EDP is no worse (0.998 and 1.000 x
#: maxfreq against 1.002 and 1.004).
#: tx2: 16 validation mixes choose the checkpoint (EDP 0.999 x maxfreq on the 900 tuning
#: mixes against 1.005 with 4); on rubikpi3 16 chose worse (0.906 against 0.901), on orin-nx
#: the same, so they keep 4.
#: rubikpi3: the CPU rail over the episode's power, lambda_E 1.3, chosen on the tuning mixes
#: once the spill lent slower cores (stop 28); the board's energy at lambda_E = 1 gave EDP
#: 1.021 x zTT against 0.986 (stop 29).
BOARD_DEFAULTS: dict[str, dict[str, object]] = {
    "orin-nx": {"energy_rail": "total", "power_ref": "busy"},
    "tx2": {"val_episodes": 16, "energy_rail": "total", "power_ref": "busy"},
    "rubikpi3": {"lambda_e": 1.3},
}


@dataclass
class TrainConfig:
    episodes: int = 640
    batch: int = 4
    epochs: int = 8
    lr: float = 3e-3
    gamma: float = 0.98
    lam: float = 0.95
    clip: float = 0.2
    entropy: float = 0.01
    value_coef: float = 0.5
    lambda_e: float = 1.0
    #: what the time term charges: "pending" (every tick with a job pending: busy time) or
    #: "makespan" (every tick from the first release to the last finish, the metric eval
    #: reports: a job that ends before the next arrival can run slower at no cost in time)
    time_term: str = "pending"
    #: rail of the energy regulariser: "cpu" (what DVFS controls; the rest of the board costs
    #: energy in proportion to time, which the makespan term already charges) or "total"
    energy_rail: str = "cpu"
    #: where P_ref is the rail's mean maxfreq power: "episode" (the whole episode, idle gaps
    #: between jobs included) or "busy" (only while a job is pending, the time the time term
    #: charges: then lambda_E = 1 on the total rail is the energy-delay-neutral weight for a
    #: job alone, d log(E T) = 0)
    power_ref: str = "episode"
    lambda_t: float = 0.5
    lambda_d: float = 2.0
    temp_margin_c: float = 20.0  # T_target = passive trip - margin
    shaping: bool = True
    period_s: float = 0.05
    hidden: int = 64
    #: initial logit ramp towards the top level and all cores (see :data:`PRIOR`)
    prior: float = PRIOR
    #: shield predictor: calibration episodes (its conformal unit is the job: ~3.4 deadline
    #: jobs an episode, so 256 episodes give ~870 scores) and miscoverage
    calib_episodes: int = 256
    #: model selection: greedy validation episodes, every ``val_every`` training episodes
    val_episodes: int = 4
    val_every: int = 32
    #: independent training runs per policy (``--restarts``), each on its own training mixes
    #: and initial weights; the one whose best checkpoint scores highest on the validation
    #: mixes is exported. Every learned policy gets the same number (the same budget)
    restarts: int = 1
    #: and on one job alone per episode kernel (:data:`LONE_VAL_EPISODES`): a checkpoint whose
    #: mix score is within noise of the best may still run a lone job a step below the top
    #: (stop 34: tx2's ran the main BOTS campaign 4.5 % slower than maxfreq)
    val_lone: bool = True
    alpha: float = 0.1

    def __post_init__(self):
        if self.energy_rail not in ("cpu", "total"):
            raise ValueError(f"energy_rail must be 'cpu' or 'total', not {self.energy_rail!r}")
        if self.power_ref not in ("episode", "busy"):
            raise ValueError(f"power_ref must be 'episode' or 'busy', not {self.power_ref!r}")
        if self.time_term not in ("pending", "makespan"):
            raise ValueError(f"time_term must be 'pending' or 'makespan', not {self.time_term!r}")

    @classmethod
    def for_board(cls, board: str, **overrides) -> TrainConfig:
        """The defaults, then :data:`BOARD_DEFAULTS` for ``board``, then ``overrides``."""
        return cls(**{**BOARD_DEFAULTS.get(board, {}), **overrides})


@dataclass
class HidvfsNets:
    profiler: MLP
    thermal: MLP
    priority: MLP
    value: MLP

    @classmethod
    def init(
        cls, seed: int, hidden: int = 64, prior: float = PRIOR, restart: int = 0
    ) -> HidvfsNets:
        rng = np.random.default_rng(learner_entropy(seed, 7, restart))
        prof = MLP.init([PROFILER_IN, hidden, hidden, PROFILER_OUT], rng)
        # prior: start near the fast end (race-to-idle is a safe start for deadlines) with all
        # cores; the learner moves away from it where energy pays
        for ci in range(MAX_CLUSTERS):
            b = prof.biases[-1]
            b[ci * HEAD : ci * HEAD + N_LEVELS] = np.linspace(-prior, prior, N_LEVELS)
            b[ci * HEAD + N_LEVELS : (ci + 1) * HEAD] = np.linspace(-prior, prior, N_CORES)
        therm = MLP.init([THERMAL_IN, 32, 32, 2], rng)
        therm.biases[-1][:] = (1.0, -1.0)  # prior: take work
        prio = MLP.init([PRIORITY_IN, 32, 32, 1], rng)
        value = MLP.init([PROFILER_IN, hidden, hidden, 1], rng, out_scale=1.0)
        return cls(prof, therm, prio, value)

    def policy(self, spec: BoardSpec, **kw) -> HidvfsPolicy:
        return HidvfsPolicy(
            spec, self.profiler.forward, self.thermal.forward, self.priority.forward, **kw
        )


# --------------------------------------------------------------------------------------------
# Rewards


@dataclass
class RewardParts:
    time: float = 0.0
    energy: float = 0.0
    temp: float = 0.0
    deadline: float = 0.0
    shaping: float = 0.0


def _rail_w(o: Observation, rail: str) -> float:
    w = o.total_power_w if rail == "total" else o.cpu_power_w
    return np.nan if w is None else w


def tick_rewards(
    obs: list[Observation],
    result,
    scale: BoardScale,
    cfg: TrainConfig,
    p_ref: float | None = None,
) -> tuple[np.ndarray, RewardParts]:
    """Per-tick rewards of one episode (see the module docstring) and their totals."""
    n = len(obs)
    r = np.zeros(n)
    parts = RewardParts()
    if n == 0:
        return r, parts
    ts = np.array([o.t for o in obs])
    t_end = float(getattr(result, "t_end", ts[-1]))
    nxt = np.append(ts[1:], max(t_end, ts[-1]))
    dt = np.maximum(nxt - ts, 0.0)
    obs = metered(obs, result)  # the exact meter in the simulator; sensors elsewhere
    power = np.array([_rail_w(o, cfg.energy_rail) for o in obs])
    if np.isnan(power).all():
        power[:] = 0.0
    else:
        power = np.where(np.isnan(power), np.nanmean(power), power)
    p_next = np.append(power[1:], power[-1])
    if cfg.time_term == "makespan":  # each tick's overlap with [first release, last finish]
        jobs = getattr(result, "jobs", [])
        t0 = min((j.release_t for j in jobs), default=float(ts[0]))
        ends = [j.finish_t for j in jobs]
        t1 = t_end if not ends or None in ends else max(ends)
        charged = np.maximum(np.minimum(nxt, t1) - np.maximum(ts, t0), 0.0)
    else:
        charged = dt * np.array([1.0 if o.jobs else 0.0 for o in obs])
    trip = min(scale.trips_c) if scale.trips_c else 85.0
    t_target = trip - cfg.temp_margin_c
    temps = np.array([o.max_cpu_temp_c if o.max_cpu_temp_c is not None else 0.0 for o in obs])
    r_time = -charged / TIME_SCALE_S
    p_norm = p_ref if p_ref and p_ref > 0 else scale.power_w
    r_energy = -cfg.lambda_e * 0.5 * (power + p_next) * dt / (p_norm * TIME_SCALE_S)
    r_temp = -cfg.lambda_t * np.maximum(temps - t_target, 0.0) / 10.0 * dt / TIME_SCALE_S
    r = r_time + r_energy + r_temp
    misses = 0.0
    for j in getattr(result, "jobs", []):
        if j.deadline_s is None:
            continue
        met = j.finish_t is not None and j.finish_t - j.release_t <= j.deadline_s + 1e-9
        if not met:
            misses += 2.0 if j.criticality == "hi" else 1.0
    r[-1] -= cfg.lambda_d * misses
    shaping = np.zeros(n)
    if cfg.shaping:
        phi = np.array([-remaining_bound_s(o) / TIME_SCALE_S for o in obs])
        phi_next = np.append(phi[1:], 0.0)  # Phi(terminal) = 0
        shaping = cfg.gamma * phi_next - phi
        r = r + shaping
    parts = RewardParts(
        float(r_time.sum()),
        float(r_energy.sum()),
        float(r_temp.sum()),
        -cfg.lambda_d * misses,
        float(shaping.sum()),
    )
    return r, parts


def gae(rewards: np.ndarray, values: np.ndarray, gamma: float, lam: float) -> np.ndarray:
    """Generalised advantage estimates of one episode (terminal value 0)."""
    n = len(rewards)
    adv = np.zeros(n)
    last = 0.0
    for i in range(n - 1, -1, -1):
        v_next = values[i + 1] if i + 1 < n else 0.0
        delta = rewards[i] + gamma * v_next - values[i]
        last = delta + gamma * lam * last
        adv[i] = last
    return adv


def reward_to_go(r: np.ndarray, gamma: float) -> np.ndarray:
    g = np.zeros(len(r))
    acc = 0.0
    for i in range(len(r) - 1, -1, -1):
        acc = r[i] + gamma * acc
        g[i] = acc
    return g


def grouped_advantages(group, gamma: float):
    """Advantages with a grouped (leave-one-out) baseline over rollouts of the SAME mix.

    For tick t of rollout i: A = G_i(t) - mean_{j != i} G_j(t'), G the discounted reward-to-go
    and t' the first tick of rollout j at or after the same simulated time (0 past its end).
    Arrivals are exogenous and the plant seed is shared, so the baseline carries the future
    of the mix that no state-value estimate can see; what is left is the policy's effect.
    A single rollout falls back to G minus its mean. Yields (recorder, advantages, returns).
    """
    gs = [reward_to_go(r, gamma) for _, _, r in group]
    for i, (rec, ts, _) in enumerate(group):
        others = [j for j in range(len(group)) if j != i]
        if not others:
            yield rec, gs[i] - gs[i].mean(), gs[i]
            continue
        base = np.zeros(len(ts))
        for j in others:
            tj = group[j][1]
            k = np.searchsorted(tj, ts - 1e-9)
            gj = np.append(gs[j], 0.0)
            base += gj[np.minimum(k, len(tj))]
        base /= len(others)
        yield rec, gs[i] - base, gs[i]


# --------------------------------------------------------------------------------------------
# PPO-lite


@dataclass
class Batch:
    prof_x: list = field(default_factory=list)
    prof_mf: list = field(default_factory=list)
    prof_mc: list = field(default_factory=list)
    levels: list = field(default_factory=list)
    cores: list = field(default_factory=list)
    therm_x: list = field(default_factory=list)
    therm_m: list = field(default_factory=list)
    therm_a: list = field(default_factory=list)
    prio_x: list = field(default_factory=list)
    prio_a: list = field(default_factory=list)
    prio_tick: list = field(default_factory=list)
    logp: list = field(default_factory=list)
    adv: list = field(default_factory=list)
    ret: list = field(default_factory=list)

    def add_episode(self, rec: Recorder, adv: np.ndarray, ret: np.ndarray) -> None:
        base = len(self.prof_x)
        for i, (inp, ch) in enumerate(zip(rec.inputs, rec.choices)):
            self.prof_x.append(inp.prof_x)
            self.prof_mf.append(inp.prof_mask_f)
            self.prof_mc.append(inp.prof_mask_c)
            self.levels.append(ch.levels)
            self.cores.append(ch.cores)
            self.therm_x.append(inp.therm_x)
            self.therm_m.append(inp.therm_mask)
            self.therm_a.append(ch.therm)
            for k in range(inp.prio_x.shape[0]):
                self.prio_x.append(inp.prio_x[k])
                self.prio_a.append(ch.prio[k])
                self.prio_tick.append(base + i)
            self.logp.append(ch.logp)
        self.adv.extend(adv.tolist())
        self.ret.extend(ret.tolist())

    def arrays(self) -> dict[str, np.ndarray]:
        n_in = PRIORITY_IN
        return {
            "prof_x": np.array(self.prof_x, np.float32),
            "prof_mf": np.array(self.prof_mf, bool),
            "prof_mc": np.array(self.prof_mc, bool),
            "levels": np.array(self.levels, np.int64),
            "cores": np.array(self.cores, np.int64),
            "therm_x": np.array(self.therm_x, np.float32),
            "therm_m": np.array(self.therm_m, bool),
            "therm_a": np.array(self.therm_a, np.int64),
            "prio_x": np.array(self.prio_x, np.float32).reshape(-1, n_in),
            "prio_a": np.array(self.prio_a, np.float64),
            "prio_tick": np.array(self.prio_tick, np.int64),
            "logp": np.array(self.logp),
            "adv": np.array(self.adv),
            "ret": np.array(self.ret),
        }


def _cat_logp(z: np.ndarray, mask: np.ndarray, a: np.ndarray):
    """Row-wise log pi(a) of masked heads z [N, K], probabilities, and entropy [N]."""
    zz = masked_logits(z, mask).astype(np.float64)
    lp = log_softmax(zz)
    p = softmax(zz)
    single = mask.sum(axis=1) <= 1
    la = lp[np.arange(len(a)), a]
    la = np.where(single, 0.0, la)
    ent = -(np.where(mask, p * lp, 0.0)).sum(axis=1)
    return la, p, ent, single


def _cat_grad(p, mask, a, coef, ent_coef, lp_ent_terms):
    """d loss / d z for loss = -coef * log pi(a) - ent_coef * H (masked rows zeroed)."""
    zz_lp = lp_ent_terms
    g = p.copy()
    g[np.arange(len(a)), a] -= 1.0
    g *= coef[:, None]
    h = -(np.where(mask, p * zz_lp, 0.0)).sum(axis=1, keepdims=True)
    g += ent_coef * p * (zz_lp + h)  # -(dH/dz) * ent_coef
    g = np.where(mask, g, 0.0)
    g[mask.sum(axis=1) <= 1] = 0.0
    return g.astype(np.float32)


def ppo_update(nets: HidvfsNets, opts: dict, data: dict, cfg: TrainConfig, rng) -> dict:
    """Several epochs of the clipped PPO objective on one batch; returns diagnostics."""
    adv = data["adv"]
    adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    n = len(adv)
    n_cl = MAX_CLUSTERS
    stats = {}
    for _ in range(cfg.epochs):
        # forward all heads
        pz, pacts = nets.profiler.forward_cache(data["prof_x"])
        tx = data["therm_x"].reshape(-1, THERMAL_IN)
        tz, tacts = nets.thermal.forward_cache(tx)
        logp = np.zeros(n)
        grads_prof = np.zeros_like(pz)
        heads = []
        for ci in range(n_cl):
            zf = pz[:, ci * HEAD : ci * HEAD + N_LEVELS]
            zc = pz[:, ci * HEAD + N_LEVELS : (ci + 1) * HEAD]
            for z, m, a, off in (
                (zf, data["prof_mf"][:, ci], data["levels"][:, ci], ci * HEAD),
                (zc, data["prof_mc"][:, ci], data["cores"][:, ci], ci * HEAD + N_LEVELS),
            ):
                la, p, ent, _ = _cat_logp(z, m, a)
                logp += la
                heads.append((z, m, a, off, p))
        tm = data["therm_m"].reshape(-1, 2)
        ta = data["therm_a"].reshape(-1)
        tla, tp, tent, _ = _cat_logp(tz, tm, ta)
        logp += tla.reshape(n, n_cl).sum(axis=1)
        px = data["prio_x"]
        if len(px):
            sz, sacts = nets.priority.forward_cache(px)
            mu = sz[:, 0].astype(np.float64)
            eps = (data["prio_a"] - mu) / PRIORITY_SIGMA
            np.add.at(logp, data["prio_tick"], -0.5 * eps**2)
        ratio = np.exp(np.clip(logp - data["logp"], -20, 20))
        clipped = ((adv > 0) & (ratio > 1 + cfg.clip)) | ((adv < 0) & (ratio < 1 - cfg.clip))
        coef = adv * ratio * (~clipped) / n  # loss = -mean(coef * logp) locally
        # profiler grads
        for z, m, a, off, p in heads:
            zz = masked_logits(z, m).astype(np.float64)
            lp = log_softmax(zz)
            grads_prof[:, off : off + z.shape[1]] = _cat_grad(p, m, a, coef, cfg.entropy / n, lp)
        gp = nets.profiler.backward(pacts, grads_prof)
        zz = masked_logits(tz, tm).astype(np.float64)
        gt_z = _cat_grad(tp, tm, ta, np.repeat(coef, n_cl), cfg.entropy / n, log_softmax(zz))
        gt = nets.thermal.backward(tacts, gt_z)
        if len(px):
            gs = -(coef[data["prio_tick"]] * eps / PRIORITY_SIGMA)[:, None].astype(np.float32)
            gpr = nets.priority.backward(sacts, gs)
            opts["priority"].step(gpr)
        opts["profiler"].step(gp)
        opts["thermal"].step(gt)
        v, vacts = nets.value.forward_cache(data["prof_x"])
        gv = (cfg.value_coef * (v[:, 0] - data["ret"]) / n)[:, None].astype(np.float32)
        opts["value"].step(nets.value.backward(vacts, gv))
        stats = {
            "ratio_mean": float(ratio.mean()),
            "clip_frac": float(clipped.mean()),
            "value_mse": float(((v[:, 0] - data["ret"]) ** 2).mean()),
        }
    return stats


def make_optimizers(nets: HidvfsNets, lr: float) -> dict:
    return {
        "profiler": Adam(nets.profiler.params, lr),
        "thermal": Adam(nets.thermal.params, lr),
        "priority": Adam(nets.priority.params, lr),
        "value": Adam(nets.value.params, lr),
    }


# --------------------------------------------------------------------------------------------
# The training run


@dataclass
class EpisodeStats:
    episode: int
    ret: float
    makespan_s: float | None
    energy_j: float
    peak_temp_c: float
    misses: int
    parts: dict


@dataclass
class TrainResult:
    nets: HidvfsNets
    history: list[EpisodeStats]
    rt_X: np.ndarray
    rt_y: np.ndarray
    rt_episode: np.ndarray
    config: dict
    wall_s: float
    p_ref: float = 0.0
    validation: list = field(default_factory=list)


def _misses(result) -> int:
    return sum(
        1
        for j in getattr(result, "jobs", [])
        if j.deadline_s is not None
        and not (j.finish_t is not None and j.finish_t - j.release_t <= j.deadline_s + 1e-9)
    )


def busy_intervals(jobs) -> list[tuple[float, float]]:
    """The union of the jobs' [release, finish] intervals, in time order (jobs that never
    finished are left out)."""
    out: list[list[float]] = []
    for a, b in sorted((j.release_t, j.finish_t) for j in jobs if j.finish_t is not None):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def busy_power(result, rail: str) -> float | None:
    """Mean power (W) of ``rail`` over the time a job of ``result`` was pending, from the
    plant's energy trace; None without a trace or busy time."""
    trace = getattr(result, "energy_trace", ()) or ()
    spans = busy_intervals(getattr(result, "jobs", ()))
    if len(trace) < 2 or not spans:
        return None
    tr = np.asarray(trace, dtype=np.float64)
    col = 2 if rail == "cpu" else 1
    edges = np.asarray(spans, dtype=np.float64)
    e = np.interp(edges[:, 1], tr[:, 0], tr[:, col]) - np.interp(edges[:, 0], tr[:, 0], tr[:, col])
    t = float((edges[:, 1] - edges[:, 0]).sum())
    return float(e.sum()) / t if t > 0 and e.sum() > 0 else None


def reference_power(
    spec: BoardSpec,
    run_episode: RunEpisode,
    make_mix: MakeMix,
    seed: int,
    rail: str = "total",
    over: str = "episode",
) -> float:
    """Mean power (W) of ``rail`` ("total" or "cpu") over one ``maxfreq`` episode on the first
    training mix, on a cold board: over the whole episode, or (``over="busy"``) while a job was
    pending. Cold whatever the mix draws: a hot start's leakage had scaled the energy weight
    down by 3-10 % for the seeds whose first mix starts hot."""
    from agents.governors import make_governor

    s = seed_ranges(seed, 1)["train"][0]
    res = run_episode(make_governor("maxfreq"), make_mix(s), s, cold=True)
    if over == "busy":
        p = busy_power(res, rail)
        return p if p else BoardScale.of(spec).power_w
    t = float(getattr(res, "t_end", 0.0))
    e = float(getattr(res, "cpu_energy_j" if rail == "cpu" else "energy_j", 0.0))
    return e / t if t > 0 and e > 0 else BoardScale.of(spec).power_w


def unshaped_return(
    spec: BoardSpec, cfg: TrainConfig, p_ref: float
) -> Callable[[list[Observation], object], float]:
    """One episode's unshaped hidvfs return from its observations and result: the measure
    every policy's checkpoint is chosen by."""
    scale = BoardScale.of(spec)
    plain = TrainConfig(**{**asdict(cfg), "shaping": False})

    def score(obs: list[Observation], result) -> float:
        return float(tick_rewards(obs, result, scale, plain, p_ref)[0].sum())

    return score


def selection_score(
    spec: BoardSpec, run_episode: RunEpisode, make_mix: MakeMix, seed: int, cfg: TrainConfig
) -> Callable[[list[Observation], object], float]:
    """One episode's score for model selection, for any policy: :func:`unshaped_return` at
    the board's reference power (what :func:`validation_score` gives the hidvfs agents)."""
    return unshaped_return(
        spec,
        cfg,
        reference_power(spec, run_episode, make_mix, seed, cfg.energy_rail, cfg.power_ref),
    )


def validation_score(
    spec: BoardSpec,
    nets: HidvfsNets,
    run_episode: RunEpisode,
    make_mix: MakeMix,
    seeds: list[int],
    cfg: TrainConfig,
    p_ref: float,
) -> float:
    """Mean unshaped return of the greedy policy (gate on) on validation mixes."""
    score = unshaped_return(spec, cfg, p_ref)
    total = 0.0
    for s in seeds:
        rec = Recorder()
        pol = nets.policy(spec, gate=True, shield=None, period_s=cfg.period_s, recorder=rec)
        total += score(rec.obs, run_episode(pol, make_mix(s), s))
    return total / max(len(seeds), 1)


def train_hidvfs(
    spec: BoardSpec,
    run_episode: RunEpisode,
    make_mix: MakeMix,
    seed: int,
    cfg: TrainConfig | None = None,
    log: Log | None = None,
    restart: int = 0,
) -> TrainResult:
    """Train the three agents with PPO-lite; also collects the shield's training data.
    ``restart`` k > 0: another run of the same seed (its own training mixes and initial
    weights, the same reward reference and validation mixes)."""
    cfg = cfg or TrainConfig()
    log = log or (lambda s: None)
    nets = HidvfsNets.init(seed, cfg.hidden, cfg.prior, restart)
    opts = make_optimizers(nets, cfg.lr)
    scale = BoardScale.of(spec)
    rng = np.random.default_rng(learner_entropy(seed, 11, restart))
    history: list[EpisodeStats] = []
    rt_X, rt_y, rt_ep = [], [], []
    batch = Batch()
    t0 = time.monotonic()
    tag = "hidvfs" if cfg.shaping else "noshaping"  # log prefix: both may run side by side
    tag += f" restart {restart}" if restart else ""
    p_ref = reference_power(spec, run_episode, make_mix, seed, cfg.energy_rail, cfg.power_ref)
    log(
        f"[{tag} {spec.name}] reference {cfg.energy_rail} power (maxfreq, {cfg.power_ref}) "
        f"{p_ref:.3f} W"
    )
    ranges = seed_ranges(seed, cfg.episodes, cfg.val_episodes, cfg.calib_episodes, restart)
    val_seeds = validation_seeds(seed, cfg)

    def validate(after: int) -> None:
        if not val_seeds:
            return
        score = validation_score(spec, nets, run_episode, make_mix, val_seeds, cfg, p_ref)
        validation.append({"after_episode": after, "score": score})
        # the untrained prior is scored for reference, never exported: the shipped agents
        # are always ones the learner produced
        if after > 0 and (best[0] is None or score > best[0]):
            best[0], best[1] = score, copy.deepcopy(nets)
        log(
            f"[{tag} {spec.name}] validation after {after} episodes: {score:+.4f} "
            f"(best {'-' if best[0] is None else format(best[0], '+.4f')})"
        )

    validation: list[dict] = []
    best: list = [None, None]
    validate(0)
    group: list[tuple[Recorder, np.ndarray, np.ndarray]] = []
    for ep in range(cfg.episodes):
        # one mix (and plant seed) per group of ``batch`` rollouts: the grouped baseline
        ep_seed = ranges["train"][ep // cfg.batch]
        rec = Recorder()
        coll = RtCollector()
        pol = nets.policy(
            spec,
            gate=True,
            shield=None,
            period_s=cfg.period_s,
            explore_seed=int(rng.integers(1 << 31)),
            recorder=rec,
            extra_stages=[coll],
        )
        items = make_mix(ep_seed)
        res = run_episode(pol, items, ep_seed)
        r, parts = tick_rewards(rec.obs, res, scale, cfg, p_ref)
        if len(r):
            group.append((rec, np.array([o.t for o in rec.obs]), r))
        X, y = coll.dataset(res)
        if len(y):
            rt_X.append(X)
            rt_y.append(y)
            rt_ep.append(np.full(len(y), ep))
        st = EpisodeStats(
            ep,
            float(r.sum()) - float(parts.shaping),
            getattr(res, "makespan_s", None),
            float(getattr(res, "energy_j", 0.0)),
            float(getattr(res, "peak_temp_c", 0.0)),
            _misses(res),
            asdict(parts),
        )
        history.append(st)
        if (ep + 1) % cfg.batch == 0 or ep + 1 == cfg.episodes:
            for rec_i, adv_i, ret_i in grouped_advantages(group, cfg.gamma):
                batch.add_episode(rec_i, adv_i, ret_i)
            group = []
            diag = ppo_update(nets, opts, batch.arrays(), cfg, rng) if batch.adv else {}
            batch = Batch()
            recent = history[-cfg.batch :]
            el = time.monotonic() - t0
            eta = el / (ep + 1) * (cfg.episodes - ep - 1)
            ms = [h.makespan_s for h in recent if h.makespan_s is not None]
            log(
                f"[{tag} {spec.name}] episode {ep + 1}/{cfg.episodes} "
                f"return {np.mean([h.ret for h in recent]):+.3f} "
                f"makespan {np.mean(ms) if ms else float('nan'):.3f}s "
                f"energy {np.mean([h.energy_j for h in recent]):.2f}J "
                f"misses {sum(h.misses for h in recent)} "
                f"clip {diag.get('clip_frac', 0):.2f} ETA {eta:.0f}s"
            )
            if (ep + 1) % cfg.val_every == 0 or ep + 1 == cfg.episodes:
                validate(ep + 1)
    if best[1] is not None:
        nets = best[1]

    def cat(xs, d):
        return np.concatenate(xs) if xs else np.zeros((0,) + d)

    return TrainResult(
        nets,
        history,
        cat(rt_X, (8,)).astype(np.float32),
        cat(rt_y, ()),
        cat(rt_ep, ()).astype(np.int64),
        asdict(cfg),
        time.monotonic() - t0,
        p_ref,
        validation,
    )


__all__ = [
    "TrainConfig",
    "HidvfsNets",
    "RewardParts",
    "tick_rewards",
    "gae",
    "ppo_update",
    "train_hidvfs",
    "TrainResult",
    "TRAIN_SEEDS",
    "CALIB_SEEDS",
    "EVAL_SEEDS",
    "COVERAGE_SEEDS",
    "MAX_SEED",
    "MAX_EPISODES",
    "MAX_EVAL_MIXES",
    "TUNING_SEEDS",
    "MAX_TUNING_MIXES",
    "MAX_VAL_EPISODES",
    "seed_ranges",
    "CORE_FRACTIONS",
]
