"""Training of the hidvfs agents in the simulator (numpy PPO-lite), and the shield's predictor.

The learner never imports the simulator or the workloads: ``run_episode(policy, items, seed)``
runs one episode of the real control loop and returns its result (``jobs`` with ``pid``,
``release_t``, ``finish_t``, ``deadline_s``, ``criticality``; ``t_end``, ``energy_j``,
``makespan_s``, ``peak_temp_c``; ``cold=True`` starts the board idle at its ambient whatever
the mix draws), and ``make_mix(seed)`` returns that episode's items. The CLI
(:mod:`tools.cmd_agents`) wires :func:`daemon.simrun.run_sim` and :mod:`bots_bench.workload`.

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
  mixes (agents/TRAINING.md), not from these identities. The CPU rail is the energy DVFS
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
import math
import os
import shutil
import signal
import threading
import time
import zipfile
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

import numpy as np

from agents.features import MAX_CLUSTERS, BoardScale, remaining_bound_s
from agents.hidvfs import (
    COOL_FLOOR,
    CORE_FRACTIONS,
    HEAD,
    HOT_MARGIN_C,
    N_CORES,
    N_LEVELS,
    PRIORITY_IN,
    PRIORITY_SIGMA,
    PROFILER_IN,
    PROFILER_OUT,
    THERMAL_IN,
    HidvfsPolicy,
    Recorder,
    rt_features,
)
from agents.metering import metered
from agents.nn import MLP, Adam, log_softmax, masked_logits, softmax
from agents.policy import Decision
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
#: model selection's validation mixes end where the tuning mixes begin
MAX_VAL_EPISODES = TUNING_SEEDS - VAL_SEEDS
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
    seed: int, episodes: int, val_episodes: int = 4, calib_episodes: int = 256
) -> dict[str, range]:
    """The mix seeds one training run (``--seed``) draws from, per use: what the trainers
    call (geardvfs/ztt: ``TRAIN_SEEDS + TRAIN_STRIDE * seed + episode``, hidvfs a prefix)."""
    t = TRAIN_SEEDS + TRAIN_STRIDE * seed
    return {
        "train": range(t, t + episodes),
        "calibration": range(
            CALIB_SEEDS + SEED_STRIDE * seed, CALIB_SEEDS + SEED_STRIDE * seed + calib_episodes
        ),
        "validation": range(
            VAL_SEEDS + SEED_STRIDE * seed, VAL_SEEDS + SEED_STRIDE * seed + val_episodes
        ),
        "coverage": range(
            COVERAGE_SEEDS + SEED_STRIDE * seed,
            COVERAGE_SEEDS + SEED_STRIDE * seed + calib_episodes,
        ),
    }


#: per-board training settings that differ from :class:`TrainConfig`'s defaults, chosen on
#: tuning and validation mixes (never the held-out ones; the comparisons are in
#: agents/TRAINING.md).
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
    def init(cls, seed: int, hidden: int = 64, prior: float = PRIOR) -> HidvfsNets:
        rng = np.random.default_rng([seed, 7])
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
# Response-time data (for the shield)


class RtCollector:
    """A last decision stage recording (t, pid, RT features) of every deadline job."""

    def __init__(self):
        self.rows: list[tuple[float, int, np.ndarray]] = []

    def __call__(self, decision: Decision, obs: Observation) -> Decision:
        for j in obs.jobs:
            if j.deadline_s is None or j.profile is None:
                continue
            x = rt_features(obs, decision, j.pid)
            if x is not None:
                self.rows.append((obs.t, j.pid, x))
        return decision

    def dataset(self, result) -> tuple[np.ndarray, np.ndarray]:
        """(X, log remaining response time) for the jobs that finished."""
        X, y, _ = self.dataset_with_jobs(result)
        return X, y

    def dataset_with_jobs(self, result) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`dataset` and the pid of each row's job."""
        fin = {j.pid: j.finish_t for j in getattr(result, "jobs", []) if j.finish_t is not None}
        xs, ys, pids = [], [], []
        for t, pid, x in self.rows:
            if pid in fin and fin[pid] > t:
                xs.append(x)
                ys.append(math.log(max(fin[pid] - t, 1e-4)))
                pids.append(pid)
        if not xs:
            return np.zeros((0, 8), np.float32), np.zeros(0), np.zeros(0, np.int64)
        return np.stack(xs), np.array(ys), np.array(pids, np.int64)


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
) -> TrainResult:
    """Train the three agents with PPO-lite; also collects the shield's training data."""
    cfg = cfg or TrainConfig()
    log = log or (lambda s: None)
    nets = HidvfsNets.init(seed, cfg.hidden, cfg.prior)
    opts = make_optimizers(nets, cfg.lr)
    scale = BoardScale.of(spec)
    rng = np.random.default_rng([seed, 11])
    history: list[EpisodeStats] = []
    rt_X, rt_y, rt_ep = [], [], []
    batch = Batch()
    t0 = time.monotonic()
    tag = "hidvfs" if cfg.shaping else "noshaping"  # log prefix: both may run side by side
    p_ref = reference_power(spec, run_episode, make_mix, seed, cfg.energy_rail, cfg.power_ref)
    log(
        f"[{tag} {spec.name}] reference {cfg.energy_rail} power (maxfreq, {cfg.power_ref}) "
        f"{p_ref:.3f} W"
    )
    ranges = seed_ranges(seed, cfg.episodes, cfg.val_episodes, cfg.calib_episodes)
    val_seeds = list(ranges["validation"])

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


# --------------------------------------------------------------------------------------------
# The shield's response-time predictor


@dataclass
class RtModel:
    estimator: object
    scores: np.ndarray  # signed calibration residuals (log scale)
    q: float
    alpha: float
    n_train: int
    n_cal: int

    def predict(self, X: np.ndarray) -> np.ndarray:
        return self.estimator.predict(np.asarray(X, np.float32))


def job_scores(scores: np.ndarray, jobs: np.ndarray) -> np.ndarray:
    """Each job's largest residual: its bound holds at every decision iff it holds at that."""
    if len(scores) == 0:
        return np.zeros(0)
    order = np.argsort(jobs, kind="stable")
    _, starts = np.unique(jobs[order], return_index=True)
    return np.maximum.reduceat(np.asarray(scores)[order], starts)


def fit_response_time(
    X: np.ndarray,
    y: np.ndarray,
    X_cal: np.ndarray,
    y_cal: np.ndarray,
    alpha: float,
    seed: int,
    jobs_cal: np.ndarray | None = None,
) -> RtModel:
    """Gradient-boosted trees on log response time; split-conformal q on the calibration set.

    With ``jobs_cal`` (a job id per calibration row) the conformal scores are one per job,
    its largest residual. The rows of one job, tick after tick, are far from exchangeable
    draws (the effective sample is nearer the jobs than the rows, and a row quantile's
    coverage swung 0.87-0.94 from one calibration set to another); jobs are the unit that
    is, and a q from them bounds every decision of a job at once with probability 1 - alpha.
    """
    from sklearn.ensemble import GradientBoostingRegressor

    from agents.shield import SplitConformal

    est = GradientBoostingRegressor(
        n_estimators=120, max_depth=3, learning_rate=0.1, subsample=0.8, random_state=seed
    )
    est.fit(np.asarray(X, np.float32), y)
    pred = est.predict(np.asarray(X_cal, np.float32))
    scores = np.asarray(y_cal) - pred
    if jobs_cal is not None:
        scores = job_scores(scores, np.asarray(jobs_cal))
    cal = SplitConformal(alpha).fit(scores)
    return RtModel(est, cal.scores_, float(cal.q_), alpha, len(y), len(scores))


def coverage(
    model: RtModel,
    X: np.ndarray,
    y: np.ndarray,
    q: float | None = None,
    jobs: np.ndarray | None = None,
) -> float:
    """Empirical P(y <= prediction + q) on held-out data: per row, or with ``jobs`` (a job id
    per row) per job, a job covered when every one of its rows is."""
    if len(y) == 0:
        return math.nan
    qq = model.q if q is None else q
    scores = np.asarray(y) - model.predict(X)
    if jobs is not None:
        scores = job_scores(scores, np.asarray(jobs))
    return float(np.mean(scores <= qq))


def collect_rt(
    policy_factory: Callable[[RtCollector], object],
    run_episode: RunEpisode,
    make_mix: MakeMix,
    seeds: list[int],
) -> tuple[np.ndarray, np.ndarray, list]:
    """Run ``policy_factory(collector)`` on the given seeds; RT data and the episode results."""
    X, y, _, results = collect_rt_jobs(policy_factory, run_episode, make_mix, seeds)
    return X, y, results


def collect_rt_jobs(
    policy_factory: Callable[[RtCollector], object],
    run_episode: RunEpisode,
    make_mix: MakeMix,
    seeds: list[int],
    on_episode: Callable[[int], None] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, list]:
    """:func:`collect_rt` and a job id per row (unique across the episodes);
    ``on_episode(k)`` is called after the k-th episode (1-based: progress)."""
    xs, ys, js, results = [], [], [], []
    for k, s in enumerate(seeds):
        coll = RtCollector()
        pol = policy_factory(coll)
        res = run_episode(pol, make_mix(s), s)
        X, y, pids = coll.dataset_with_jobs(res)
        xs.append(X)
        ys.append(y)
        js.append(pids + k * (1 << 32))
        results.append(res)
        if on_episode is not None:
            on_episode(k + 1)
    X = np.concatenate(xs) if xs else np.zeros((0, 8), np.float32)
    y = np.concatenate(ys) if ys else np.zeros(0)
    j = np.concatenate(js) if js else np.zeros(0, np.int64)
    return X, y, j, results


__all__ = [
    "TrainConfig",
    "HidvfsNets",
    "RewardParts",
    "tick_rewards",
    "gae",
    "RtCollector",
    "ppo_update",
    "train_hidvfs",
    "TrainResult",
    "RtModel",
    "fit_response_time",
    "coverage",
    "collect_rt",
    "collect_rt_jobs",
    "job_scores",
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


# --------------------------------------------------------------------------------------------
# One board: train everything, fit the shield, export the folder


POLICIES = ("hidvfs", "noshaping", "geardvfs", "ztt")


def _ref_inputs(n_in: int, seed: int, n: int = 8) -> np.ndarray:
    return np.random.default_rng([seed, 99]).uniform(-1.0, 2.0, size=(n, n_in)).astype(np.float32)


def _same_net(a: MLP, b: MLP) -> bool:
    return a.sizes == b.sizes and all(np.array_equal(x, y) for x, y in zip(a.params, b.params))


def untrained_warning(pol: str, board: str, tr, seed: int, cfg: TrainConfig) -> str | None:
    """A warning when the networks ``tr`` exports are exactly their seeded initial ones: the
    learner changed nothing (a DQN updates only once its replay holds ``start_samples``
    transitions, zTT 200: a few episodes), so exporting them would ship a random or prior
    network under a trained name. None when they are trained."""
    from agents.geardvfs import BranchDQN

    if pol in ("hidvfs", "noshaping"):
        init = HidvfsNets.init(seed, cfg.hidden, cfg.prior)
        same = [
            k
            for k in ("profiler", "thermal", "priority")
            if _same_net(getattr(tr.nets, k), getattr(init, k))
        ]
        if not same:
            return None
        if len(same) < 3:  # one agent never had a choice: its head was masked to one action
            hint = (
                f" (the thermal agent chooses only between {COOL_FLOOR:g} x a zone's passive "
                f"trip and {HOT_MARGIN_C:g} C below it: train with --hot-fraction above 0)"
                if "thermal" in same
                else ""
            )
            return (
                f"[{pol} {board}] WARNING: the {' and '.join(same)} "
                f"{'network is' if len(same) == 1 else 'networks are'} as initialised after "
                f"{cfg.episodes} episodes: no episode gave {'it' if len(same) == 1 else 'them'} "
                f"a choice{hint}"
            )
        why = "no PPO update changed them"
    else:
        dqn = tr.dqn
        if not _same_net(dqn.q, BranchDQN(dqn.q.sizes[0], dqn.branches, dqn.cfg, seed).q):
            return None
        why = (
            f"{dqn.updates} gradient updates; a DQN learns only once its replay holds "
            f"{dqn.cfg.start_samples} transitions"
        )
    return (
        f"[{pol} {board}] WARNING: the exported network is its untrained initial one after "
        f"{cfg.episodes} episodes ({why}): it learned nothing; retrain with more --episodes"
    )


def _train_one(pol, spec, run_episode, make_mix, seed, cfg, out, command, log, commit) -> dict:
    """Train one policy and write its ONNX files into ``out`` (its staging folder, laid out
    as the board folder); returns its manifest entry, reference input/output pairs (for
    ``agents check`` and the loaders) and the files written, relative to ``out``. Runs in the
    caller or in a forked worker."""
    from agents.geardvfs import GEAR_IN, DqnConfig, Selection, train_geardvfs
    from agents.onnx_export import provenance, save_mlp
    from agents.ztt import ZTT_IN, train_ztt, ztt_config

    t0 = time.monotonic()
    ref: dict[str, np.ndarray] = {}
    shield = None

    def meta(role: str, extra=None):
        return provenance(spec.name, role, seed, command, extra, commit)

    def export(net, path, role, prefix, extra):
        save_mlp(net, path, meta(role, extra))
        x = _ref_inputs(net.sizes[0], seed)
        ref[f"{prefix}_x"], ref[f"{prefix}_y"] = x, net.forward(x)

    if pol in ("hidvfs", "noshaping"):
        c = TrainConfig(**{**asdict(cfg), "shaping": pol == "hidvfs"})
        tr = train_hidvfs(spec, run_episode, make_mix, seed, c, log)
        sub = out if pol == "hidvfs" else out / "noshaping"
        sub.mkdir(parents=True, exist_ok=True)
        prefix = "" if pol == "hidvfs" else "noshaping_"
        for role, net in (
            ("profiler", tr.nets.profiler),
            ("thermal", tr.nets.thermal),
            ("priority", tr.nets.priority),
        ):
            export(net, sub / f"{role}.onnx", role, f"{prefix}{role}", {"sizes": net.sizes})
        entry = {
            "config": tr.config,
            "wall_s": round(tr.wall_s, 1),
            "p_ref_w": tr.p_ref,
            "validation": tr.validation,
            "first_returns": [round(h.ret, 4) for h in tr.history[: cfg.batch]],
            "last_returns": [round(h.ret, 4) for h in tr.history[-cfg.batch :]],
        }
        if pol == "hidvfs":
            shield = _fit_shield(spec, tr, run_episode, make_mix, seed, c, out, meta, ref, log)
            entry["shield"] = shield
    elif pol in ("geardvfs", "ztt"):
        # the baselines get hidvfs's model selection: the same validation mixes, cadence and
        # score (the unshaped hidvfs return: time, energy, temperature, missed deadlines), so
        # every policy's checkpoint is chosen by one measure
        sel = Selection(
            tuple(seed_ranges(seed, cfg.episodes, cfg.val_episodes)["validation"]),
            cfg.val_every,
            selection_score(spec, run_episode, make_mix, seed, cfg),
        )
        if pol == "geardvfs":
            dc = DqnConfig(episodes=cfg.episodes, period_s=cfg.period_s)
            tr = train_geardvfs(spec, run_episode, make_mix, seed, dc, log, sel)
            export(tr.dqn.q, out / "geardvfs.onnx", "geardvfs", "geardvfs", {"n_in": GEAR_IN})
        else:
            dc = ztt_config(cfg.episodes, cfg.period_s)
            tr = train_ztt(spec, run_episode, make_mix, seed, dc, log, sel)
            export(tr.dqn.q, out / "ztt.onnx", "ztt", "ztt", {"n_in": ZTT_IN})
        entry = {
            "config": {**tr.config, "val_seeds": list(sel.seeds), "val_every": sel.every},
            "wall_s": round(tr.wall_s, 1),
            "validation": tr.validation,
        }
    else:
        raise ValueError(f"unknown policy {pol!r} to train; known: {', '.join(POLICIES)}")
    warning = untrained_warning(pol, spec.name, tr, seed, cfg)
    if warning is not None:
        entry["untrained"] = True
        entry["warning"] = warning
        log(warning)
    log(f"[{pol} {spec.name}] trained and exported in {time.monotonic() - t0:.0f}s")
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*.onnx"))
    return {"policy": pol, "entry": entry, "ref": ref, "shield": shield, "files": files}


def _run_forked(
    jobs: list[Callable[[], dict]],
    workers: int,
    on_result: Callable[[int, dict], None] | None = None,
) -> list[dict]:
    """Run ``jobs`` in up to ``workers`` forked processes, results in job order;
    ``on_result(i, result)`` is called in this process as each job's result arrives (a crash
    later keeps what it saved).

    Fork (not spawn): the jobs are closures over the caller's episode runner, which need not be
    picklable; only the results travel back. A worker's exception is re-raised here. Workers
    die with this process: on an exception here (Ctrl-C, or SIGTERM/SIGHUP that the CLI turns
    into one) they are killed, and on Linux the kernel kills them when it dies of anything
    else (``PR_SET_PDEATHSIG``: ``daemon=True`` acts only on a clean interpreter exit).
    """
    import multiprocessing as mp

    from platforms.liveprocs import child_setup

    ctx = mp.get_context("fork")
    results: list[dict | None] = [None] * len(jobs)
    pending = list(range(len(jobs)))
    running: dict[int, tuple] = {}
    die_with_parent = child_setup(False)  # prctl looked up here, called in the worker

    def start(i: int) -> None:
        recv, send = ctx.Pipe(duplex=False)

        def target() -> None:
            if die_with_parent is not None:
                die_with_parent()
            # the parent stops the workers; a signal to the whole group (Ctrl-C, a service
            # stop) ends them quietly instead of as a worker error raced against the parent's
            for sig in _STOP_SIGNALS:
                if signal.getsignal(sig) is signal.SIG_IGN:
                    continue  # ignored by the parent (nohup): ignored here too
                try:
                    signal.signal(sig, signal.SIG_DFL)
                except ValueError:  # not the process's main thread: leave them
                    break
            try:
                send.send(("ok", jobs[i]()))
            except BaseException as exc:  # noqa: BLE001 - reported to the parent
                send.send(("error", f"{type(exc).__name__}: {exc}"))
            finally:
                send.close()

        proc = ctx.Process(target=target, daemon=True)
        proc.start()
        send.close()
        running[i] = (proc, recv)

    from multiprocessing.connection import wait

    try:
        while pending or running:
            while pending and len(running) < workers:
                start(pending.pop(0))
            ready = wait([r for _, r in running.values()])
            for i, (proc, recv) in list(running.items()):
                if recv not in ready:
                    continue
                try:
                    kind, value = recv.recv()
                except EOFError:
                    kind, value = "error", f"worker exited with code {proc.exitcode}"
                proc.join()
                del running[i]
                if kind == "error":
                    raise RuntimeError(f"training job {i} failed: {value}")
                results[i] = value
                if on_result is not None:
                    on_result(i, value)
    finally:
        for proc, _ in running.values():
            proc.kill()
        for proc, _ in running.values():  # gone before the caller removes their folders
            proc.join(5)
    return results  # type: ignore[return-value]


_STOP_SIGNALS = tuple(
    getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n)
)


@contextmanager
def _signals_deferred():
    """Hold SIGINT, SIGTERM and SIGHUP until the block ends, then act on the first one
    received as it would have acted (KeyboardInterrupt, the CLI's handler, or the default):
    a few renames that must happen together are not cut in the middle. Only in the main
    thread (where handlers live); elsewhere the block just runs."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[int] = []
    previous = {sig: signal.signal(sig, lambda n, _f: got.append(n)) for sig in _STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        if got:
            os.kill(os.getpid(), got[0])


STAGING_PREFIX = ".staging-"


def _remove_stale_staging(out) -> None:
    """Staging folders of trainings that died without cleaning up (their pid is gone, or is
    this process's: a pid reused, as PID 1 in a container restarted after a SIGKILL)."""
    for d in out.glob(f"{STAGING_PREFIX}*"):
        try:
            pid = int(d.name[len(STAGING_PREFIX) :])
            if pid == os.getpid():
                raise ProcessLookupError(pid)
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(d, ignore_errors=True)
        except (ValueError, PermissionError, OSError):
            continue


def _fsync_file(path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def commit_policy(out, staged, files: list[str], ref: dict, man: dict) -> None:
    """Put one trained policy in place in the board folder ``out``: its ONNX files (written
    under ``staged`` at their paths relative to ``out``), and the reference.npz and
    manifest.json that describe them with every other policy (``ref``, ``man``).

    Everything is written and fsynced beside the folder first, then renamed into place in one
    short step that signals do not cut (:func:`_signals_deferred`), so the folder holds either
    the policy's old files, reference outputs and manifest entry or its new ones. A crash in
    between (SIGKILL, power) can still leave a mix, which the loaders refuse by comparing each
    network with reference.npz."""
    import json
    from pathlib import Path

    from platforms.atomicfile import fsync_dir, write_text_atomic

    out, staged = Path(out), Path(staged)
    for rel in files:
        _fsync_file(staged / rel)
    ref_tmp = staged.parent / f"{staged.name}.reference.npz"
    with open(ref_tmp, "wb") as f:
        np.savez(f, **ref)
        f.flush()
        os.fsync(f.fileno())
    man_tmp = write_text_atomic(
        staged.parent / f"{staged.name}.manifest.json",
        json.dumps(man, indent=1, sort_keys=True) + "\n",
        mode=0o644,
    )
    dirs = {out}
    with _signals_deferred():
        for rel in files:
            dst = out / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            os.replace(staged / rel, dst)
            dirs.add(dst.parent)
        os.replace(ref_tmp, out / "reference.npz")
        os.replace(man_tmp, out / "manifest.json")
    for d in dirs:
        fsync_dir(d)


def train_board(
    spec: BoardSpec,
    run_episode: RunEpisode,
    make_mix: MakeMix,
    seed: int,
    out_dir,
    command: str,
    *,
    episodes: int = 640,
    policies: tuple[str, ...] = POLICIES,
    cfg: TrainConfig | None = None,
    log: Log | None = None,
    workers: int = 1,
) -> dict:
    """Train the requested policies of one board and export them to ``out_dir``.

    The shield needs the hidvfs run: its predictor is fitted on the training episodes' data,
    calibrated on :data:`CALIB_SEEDS` episodes of the trained policy, and its coverage measured
    on held-out :data:`EVAL_SEEDS` episodes with the shield on. ``workers > 1`` trains the
    policies in parallel forked processes; every policy seeds itself, so the networks are the
    same either way. Returns the manifest.
    """
    import json
    from pathlib import Path

    from agents.features import SCHEMA_VERSION, schema
    from agents.hidvfs import ActionSpace
    from agents.onnx_export import git_commit

    for pol in policies:
        if pol not in POLICIES:
            raise ValueError(f"unknown policy {pol!r} to train; known: {', '.join(POLICIES)}")
    log = log or (lambda s: None)
    cfg = cfg or TrainConfig(episodes=episodes)
    if not 0 <= seed <= MAX_SEED or not 1 <= cfg.episodes <= MAX_EPISODES:
        raise ValueError(
            f"seed {seed} / {cfg.episodes} episodes: the seed must be 0-{MAX_SEED} and the "
            f"episodes 1-{MAX_EPISODES}, or the training mixes overlap the calibration, "
            "validation or evaluation mixes"
        )
    if not 0 <= cfg.val_episodes <= MAX_VAL_EPISODES:
        raise ValueError(
            f"{cfg.val_episodes} validation mixes: at most {MAX_VAL_EPISODES}, or they reach "
            "the tuning mixes"
        )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    man_path = out / "manifest.json"
    man = json.loads(man_path.read_text()) if man_path.is_file() else {}
    if man.get("board", spec.name) != spec.name:  # never mix two boards' files in one folder
        raise ValueError(
            f"{man_path} holds models of board {man['board']!r}, not {spec.name!r}; "
            "train into another folder (--out)"
        )
    ref_path = out / "reference.npz"
    ref: dict[str, np.ndarray] = {}
    if ref_path.is_file():
        try:
            with np.load(ref_path) as z:
                ref = {k: z[k] for k in z.files}
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
            raise ValueError(
                f"{ref_path}: unreadable ({' '.join(str(err).split())}); the other policies' "
                "references are in it: restore it, or train every policy into a new folder"
            ) from None
    ref["board"] = np.array(spec.name)  # the loader checks where the shield calibration is from
    man.update(
        {
            "format": "hidvfs-models",
            "board": spec.name,
            "schema_version": SCHEMA_VERSION,
            "schema": schema(),
            "seed": seed,
            "command": command,
            "period_s": cfg.period_s,
            "action_space": ActionSpace.of(spec).to_json(),
            "seed_ranges": {
                "train": TRAIN_SEEDS,
                "calibration": CALIB_SEEDS,
                "validation": VAL_SEEDS,
                "eval": EVAL_SEEDS,
            },
        }
    )
    man.setdefault("policies", {})

    def save(res: dict) -> None:
        ref.update(res["ref"])
        # which run made this policy's files: the top-level seed/command are the last run's,
        # which may have retrained only some policies (`agents check` compares the files)
        prov = {"seed": seed, "command": command, "git_commit": commit}
        man["policies"][res["policy"]] = {**res["entry"], "provenance": prov}
        if res["shield"] is not None:
            man["shield"] = res["shield"]
        commit_policy(out, staging / res["policy"], res["files"], ref, man)

    commit = git_commit()  # the code that trains, before any output is written

    def job(pol: str) -> Callable[[], dict]:
        return lambda: _train_one(
            pol, spec, run_episode, make_mix, seed, cfg, staging / pol, command, log, commit
        )

    # every policy is written into its own staging folder and moved into the board folder
    # with its reference outputs and manifest entry once it is complete (commit_policy): an
    # interrupted or failed run leaves the finished policies consistent and the rest as
    # they were
    _remove_stale_staging(out)
    staging = out / f"{STAGING_PREFIX}{os.getpid()}"
    staging.mkdir()
    try:
        if workers <= 1 or len(policies) <= 1:
            for pol in policies:  # saved as each finishes: a crash keeps the finished ones
                save(job(pol)())
        else:
            # the slowest first, so the pool drains evenly; each saved as it arrives
            order = sorted(policies, key=lambda p: -_COST.get(p, 1.0))
            _run_forked([job(p) for p in order], workers, lambda _i, res: save(res))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return man


#: relative wall time of each trainer (measured), for ordering parallel work
_COST = {"geardvfs": 2.4, "hidvfs": 2.2, "noshaping": 1.3, "ztt": 1.0}
#: the shield's fit logs its progress every this many calibration / coverage episodes
SHIELD_LOG_EVERY = 32


def _fit_shield(spec, tr: TrainResult, run_episode, make_mix, seed, cfg, out, meta, ref, log):
    from agents.hidvfs import N_RT, RT_FIELDS, ShieldStage
    from agents.onnx_export import save_sklearn
    from agents.runtime import OnnxModel
    from agents.shield import Shield, SplitConformal

    # calibration: the TRAINED policy (greedy, gate on, no shield) on calibration seeds
    def greedy(coll, shield=None):
        return tr.nets.policy(
            spec, gate=True, shield=shield, period_s=cfg.period_s, extra_stages=[coll]
        )

    ranges = seed_ranges(seed, cfg.episodes, cfg.val_episodes, cfg.calib_episodes)
    cal_seeds = list(ranges["calibration"])
    ev_seeds = list(ranges["coverage"])
    n_all = len(cal_seeds) + len(ev_seeds)
    t0 = time.monotonic()

    def progress(phase: str, n: int, before: int) -> Callable[[int], None]:
        """Every SHIELD_LOG_EVERY episodes of a phase: where it is, and the shield's ETA."""

        def tick(k: int) -> None:
            if k % SHIELD_LOG_EVERY and k != n:
                return
            done = before + k
            eta = (time.monotonic() - t0) / done * (n_all - done)
            log(f"[shield {spec.name}] {phase} episode {k}/{n} ETA {eta:.0f}s")

        return tick

    Xc, yc, jc, _ = collect_rt_jobs(
        greedy, run_episode, make_mix, cal_seeds, progress("calibration", len(cal_seeds), 0)
    )
    # the predictor is fitted on the training episodes only: calibration rows stay disjoint;
    # the conformal scores are one per job (see fit_response_time)
    model = fit_response_time(tr.rt_X, tr.rt_y, Xc, yc, cfg.alpha, seed, jobs_cal=jc)
    path = save_sklearn(
        model.estimator,
        N_RT,
        out / "response_time.onnx",
        meta("response_time", {"fields": list(RT_FIELDS), "target": "log remaining response s"}),
    )
    rt = OnnxModel(path, spec.name, "response_time")
    x = tr.rt_X[:16] if len(tr.rt_X) >= 16 else _ref_inputs(N_RT, seed)
    ref["response_time_x"] = x.astype(np.float32)
    ref["response_time_y"] = model.predict(x).astype(np.float32)
    ref["cal_scores"] = model.scores
    # held-out coverage, with the shield on (the executed, certified actions)
    cal = SplitConformal(cfg.alpha).fit(model.scores)

    def pred(z):
        return rt(z).reshape(-1)

    def shielded(coll):
        return greedy(coll, ShieldStage(pred, Shield(pred, cal)))

    Xe, ye, je, _ = collect_rt_jobs(
        shielded,
        run_episode,
        make_mix,
        ev_seeds,
        progress("held-out coverage", len(ev_seeds), len(cal_seeds)),
    )
    cov = coverage(model, Xe, ye)
    cov_jobs = coverage(model, Xe, ye, jobs=je)
    cov_train = coverage(model, Xc, yc, jobs=jc)
    log(
        f"[shield {spec.name}] n_train {model.n_train} n_cal {model.n_cal} jobs q {model.q:.4f} "
        f"(log s) coverage held-out {cov:.3f} of {len(ye)} decisions, {cov_jobs:.3f} of "
        f"{len(np.unique(je))} jobs (target >= {1 - cfg.alpha:.2f})"
    )
    return {
        "alpha": cfg.alpha,
        "q": model.q,
        "q_scale": "log seconds (bound = prediction * exp(q))",
        "n_train": model.n_train,
        "n_cal": model.n_cal,
        "cal_unit": "job",
        "coverage_heldout": cov,
        "n_heldout": int(len(ye)),
        "coverage_heldout_jobs": cov_jobs,
        "n_heldout_jobs": int(len(np.unique(je))),
        "coverage_calibration": cov_train,
        "fields": list(RT_FIELDS),
    }
