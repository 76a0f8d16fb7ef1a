"""A fair port of zTT (Kim et al., MobiSys 2021) to CPU clusters running BOTS jobs.

Published design (reference/baselines.md section 3) and what the port does with it:

* **state (7 on TX2: CPU clk, GPU clk, CPU power, GPU power, CPU temp, GPU temp, FPS)**. The
  port has no GPU, so the per-device entries become per-cluster ones: clock index / (n - 1) per
  cluster, CPU-rail power and the rest of the board's power (total - CPU) / P_scale,
  temperature / 100 C per cluster, and u (below) in place of FPS. Padded to 3 clusters: 9
  values (7 on a two-cluster board with the padding dropped in meaning, not in size).
* **action (9): a 3 x 3 grid** of clock indices {3, 7, 11} of the 12 TX2 levels for (CPU, GPU);
  the port uses 3 levels per cluster at the same relative positions of each cluster's table
  (3/11, 7/11, 11/11) and the joint grid over the clusters: 3^2 = 9 actions on TX2 and Orin NX,
  3^3 = 27 on RUBIK Pi 3. zTT controls clocks only: jobs stay on every online CPU.
* **reward r = u + v1 + beta / P** with T_target = 50 C, beta = 2, P the total power (W) and
  v1 = 0.2 tanh(T_target - T) below the target, -2 at or above it (T = hottest CPU zone).
  **u replaces FPS/target FPS** (documented): u = min(1, progress rate / target rate), the
  progress rate the reference work done per second, the target the rate that finishes every
  job on time (deadline jobs: remaining work / remaining deadline; best-effort jobs: work /
  reference makespan, their reference pace); u = 1 with no job.
* DQN as published: a 6-6 MLP, gamma 0.99, replay 500, batch 64, learning starts at 200
  samples, epsilon x 0.95 per training step, samples with r < 0 or r > 1 stored 3 times.
  Before 200 samples nothing is learned: a run of a few episodes (``--episodes`` below ~3-5,
  by the mix) would export the initial network, which ``agents train`` flags
  (:func:`agents.trainboard.untrained_warning`, ``untrained`` in the manifest entry).
  Adam at lr 1e-2 instead of Keras' 0.05 (0.05 diverged in this numpy port). One training step
  per decision, as zTT trains every step; the step is the shared decision period (zTT's 1 s
  step would give it fewer decisions than the other policies).
* **Not ported: zTT's thermal guard** (baselines.md section 3: random lower clocks at or above
  the target temperature; 30 % exploration towards higher clocks below the target with a
  margin of at least 5 C). It never fires on a cold board (the hottest CPU zone stayed at
  29-39 C on the held-out mixes), but on a hot board it would (an audit that wrapped the
  shipped network with it: rubikpi3 EDP 0.865 -> 0.929 x maxfreq and 9 -> 32 misses on 40 hot
  mixes), so the hot-board comparison with zTT favours zTT. Porting it means training with it.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from agents.features import MAX_CLUSTERS, BoardScale, job_remaining
from agents.geardvfs import DqnConfig, Selection, train_dqn, work_done
from agents.policy import Decision, JobSetting, Policy
from platforms.observation import Observation
from platforms.spec import BoardSpec

ZTT_IN = MAX_CLUSTERS * 2 + 3
POSITIONS = (3 / 11, 7 / 11, 1.0)
T_TARGET_C = 50.0
BETA = 2.0


def grid(spec: BoardSpec) -> list[tuple[int, ...]]:
    """Joint actions: per cluster a table index (3 per cluster)."""
    per = []
    for cl in spec.clusters[:MAX_CLUSTERS]:
        n = len(cl.freqs_khz)
        per.append(tuple(int(round(p * (n - 1))) for p in POSITIONS))
    return list(itertools.product(*per))


def target_rate(obs: Observation, period_s: float) -> float:
    rate = 0.0
    for j in obs.jobs:
        p = j.profile
        if p is None:
            continue
        rem = job_remaining(j) * p.work_s
        if j.deadline_s is not None:
            rate += rem / max(j.remaining_s, period_s)
        else:
            rate += p.work_s / p.ref_makespan_s
    return rate


def ztt_state(spec: BoardSpec, scale: BoardScale, obs: Observation, u: float) -> np.ndarray:
    x = np.zeros(ZTT_IN, dtype=np.float32)
    byname = {c.name: c for c in obs.clusters}
    for ci, cl_spec in enumerate(spec.clusters[:MAX_CLUSTERS]):
        cl = byname.get(cl_spec.name)
        if cl is None:
            continue
        lvl = cl.level
        x[ci] = (lvl if lvl is not None else 0) / max(len(cl.freqs_khz) - 1, 1)
        t = obs.cluster_temp_c(cl.name)
        x[MAX_CLUSTERS + 2 + ci] = (t if t is not None else 50.0) / 100.0
    tot, cpu = obs.total_power_w, obs.cpu_power_w
    x[MAX_CLUSTERS] = (cpu or 0.0) / scale.power_w
    x[MAX_CLUSTERS + 1] = max((tot or 0.0) - (cpu or 0.0), 0.0) / scale.power_w
    x[-1] = u
    return x


def ztt_u(prev: Observation | None, cur: Observation, period_s: float) -> float:
    if prev is None or not prev.jobs:
        return 1.0
    dt = cur.t - prev.t
    target = target_rate(prev, period_s)
    if dt <= 0 or target <= 0:
        return 1.0
    return min(1.0, work_done(prev, cur) / dt / target)


def ztt_reward(prev: Observation, cur: Observation, period_s: float) -> float:
    u = ztt_u(prev, cur, period_s)
    t = prev.max_cpu_temp_c
    if t is None:
        v1 = 0.0
    elif t >= T_TARGET_C:
        v1 = -2.0
    else:
        v1 = 0.2 * math.tanh(T_TARGET_C - t)
    p = prev.total_power_w
    return u + v1 + (BETA / p if p and p > 0 else 0.0)


class ZttPolicy(Policy):
    """zTT port: greedy over a Q network (numpy or ONNX); epsilon-greedy while training."""

    name = "ztt"

    def __init__(self, spec: BoardSpec, qnet, *, period_s: float = 0.05, dqn=None, recorder=None):
        self.spec = spec
        self.scale = BoardScale.of(spec)
        self.actions = grid(spec)
        self.qnet = qnet
        self.period_s = period_s
        self.dqn = dqn
        self.recorder = recorder
        self.prev: Observation | None = None
        self.stages: list = []

    def reset(self, seed: int | None = None) -> None:
        self.prev = None
        if self.recorder is not None:
            self.recorder.clear()

    def decide(self, obs: Observation) -> Decision:
        u = ztt_u(self.prev, obs, self.period_s)
        self.prev = obs
        x = ztt_state(self.spec, self.scale, obs, u)
        mask = np.ones(len(self.actions), dtype=bool)
        if self.dqn is not None:
            a = self.dqn.act(x, [mask], explore=True)[0]
        else:
            a = int(np.argmax(self.qnet(x[None, :])[0]))
        if self.recorder is not None:
            self.recorder.append((x, [mask], [a], obs))
        idx = self.actions[a]
        byname = {c.name: c for c in obs.clusters}
        freq = {}
        for ci, cl_spec in enumerate(self.spec.clusters[:MAX_CLUSTERS]):
            cl = byname.get(cl_spec.name)
            if cl is None:
                continue
            f = cl_spec.freqs_khz[idx[ci]]
            if cl.max_khz is not None:
                f = min(f, max((x for x in cl_spec.freqs_khz if x <= cl.max_khz), default=f))
            if cl.min_khz is not None and f < cl.min_khz:
                f = min((x for x in cl_spec.freqs_khz if x >= cl.min_khz), default=f)
            freq[cl.name] = f
        online = tuple(sorted(c for cl in obs.clusters for c in cl.online))
        return Decision(freq, {j.pid: JobSetting(online) for j in obs.jobs})


def ztt_config(episodes: int, period_s: float) -> DqnConfig:
    return DqnConfig(
        episodes=episodes,
        hidden=(6, 6),
        lr=1e-2,
        gamma=0.99,
        replay=500,
        batch=64,
        updates_per_episode=0,
        updates_per_step=1,
        target_sync_episodes=1,
        start_samples=200,
        eps_kind="ztt",
        copies_outside_01=2,
        period_s=period_s,
    )


def train_ztt(
    spec,
    run_episode,
    make_mix,
    seed,
    cfg: DqnConfig | None = None,
    log=None,
    selection: Selection | None = None,
):
    cfg = cfg or ztt_config(160, 0.05)

    def make(dqn, rec, explore):
        return ZttPolicy(
            spec, dqn.q.forward, period_s=cfg.period_s, dqn=dqn if explore else None, recorder=rec
        )

    return train_dqn(
        "ztt",
        spec,
        run_episode,
        make_mix,
        seed,
        cfg,
        make,
        lambda a, b: ztt_reward(a, b, cfg.period_s),
        ZTT_IN,
        [len(grid(spec))],
        log,
        online_updates=True,
        selection=selection,
    )


__all__ = [
    "ZTT_IN",
    "grid",
    "ztt_state",
    "ztt_reward",
    "ztt_u",
    "target_rate",
    "ZttPolicy",
    "ztt_config",
    "train_ztt",
]
