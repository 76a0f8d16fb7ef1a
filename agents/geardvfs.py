"""A fair port of GearDVFS (Lin et al., MobiCom 2023) for CPU clusters, plus the DQN it shares
with the zTT port.

What the port keeps from the published design (reference/baselines.md section 2):

* **action branching DQN** (``DQN_AB``): a shared trunk and one Q-head per DVFS domain; the port
  gives every cluster two branches, its frequency level and its active core count, i.e. the
  SAME action space as the hidvfs profiler (:class:`agents.hidvfs.ActionSpace`: <= 8 levels of
  the cluster's table, 25/50/75/100 % of its online cores). Summed Huber loss over branches,
  replay 12000, batch 100, 20 updates per round (= episode), target sync every 30 rounds,
  epsilon = 0.2 + 0.79 exp(-step / 1000) as in the public code.
* **a window of N_W = 10 hardware readings** as the workload context: each reading is, per
  cluster, frequency level, mean and max utilisation and temperature / trip, plus total and CPU
  power. Deviation (documented): the VRNN context encoder is replaced by feeding the flattened
  window to the trunk (the VRNN only compresses this same window); perf counters (IPC, stalls)
  are not part of what the daemon observes, so they are absent for every policy alike.
* **reward = energy efficiency**, the paper's objective: performance per watt while jobs run,
  ``(reference work done per second / total power) / (board throughput at f_max / P_scale)``,
  and ``-P / P_scale`` while the board idles (no job: efficiency is 0, only power counts).
  No makespan or deadline term is added: that would not be GearDVFS. A per-tick ratio paid on
  every busy tick rewards stretching the same work over more ticks (tx2, fixed points: 0.5 of
  the top earns 26 % more reward than 0.7, which does more work per joule); an additive
  ``work / thr_max - E / P_scale`` ranks them as work per joule does. Retrained with it
  (an audit, seed 0), hidvfs / GearDVFS EDP on tx2 was 0.958 against 0.963 for a control
  retrain (+- 0.006): within noise, so the shipped reward stays, documented here.
* gamma = 0.99 instead of the code's 1.0 (a bootstrapped 1-step target on a non-terminating
  stream diverges at 1.0); Adam instead of RMSprop (same role).

Placement: every job on the union of the clusters' active cores, SCHED_OTHER (GearDVFS leaves
scheduling to the kernel). Same period, thermal guard, episodes, seeds and budget as hidvfs.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np

from agents.features import MAX_CLUSTERS, BoardScale, FeatureTracker, job_remaining
from agents.hidvfs import CORE_FRACTIONS, HEAD, N_CORES, N_LEVELS, ActionSpace, build_inputs
from agents.metering import metered
from agents.nn import MLP, Adam, learner_entropy
from agents.policy import Decision, JobSetting, Policy
from platforms.observation import Observation
from platforms.spec import BoardSpec

N_W = 10
READING = MAX_CLUSTERS * 4 + 2
GEAR_IN = N_W * READING
GEAR_OUT = MAX_CLUSTERS * HEAD

Net = Callable[[np.ndarray], np.ndarray]


# --------------------------------------------------------------------------------------------
# Work accounting shared by the baselines' rewards


def work_done(prev: Observation, cur: Observation) -> float:
    """Reference work (s) completed between two observations (finished jobs count fully)."""
    now = {j.pid: j for j in cur.jobs}
    done = 0.0
    for j in prev.jobs:
        if j.profile is None:
            continue
        r0 = job_remaining(j)
        k = now.get(j.pid)
        r1 = job_remaining(k) if k is not None else 0.0
        done += max(r0 - r1, 0.0) * j.profile.work_s
    return done


def max_throughput(spec: BoardSpec, obs: Observation) -> float:
    """Reference-core equivalents of the online cores at f_max (ref-seconds per second)."""
    ref = max(c.fmax_khz * c.capacity for c in spec.clusters)
    for j in obs.jobs:
        if j.profile is not None:
            ref = j.profile.ref_khz
            break
    return sum(len(c.online) * c.capacity * (c.freqs_khz or (1,))[-1] for c in obs.clusters) / ref


# --------------------------------------------------------------------------------------------
# Branching DQN (numpy)


@dataclass
class DqnConfig:
    episodes: int = 160
    hidden: tuple[int, ...] = (64, 64)
    lr: float = 1e-3
    gamma: float = 0.99
    replay: int = 12000
    batch: int = 100
    updates_per_episode: int = 20
    updates_per_step: int = 0
    target_sync_episodes: int = 30
    start_samples: int = 100
    eps_kind: str = "gear"  # "gear": 0.2 + 0.79 exp(-t/1000); "ztt": 0.95^updates
    copies_outside_01: int = 0  # zTT: extra copies of samples with r < 0 or r > 1
    period_s: float = 0.05


class BranchDQN:
    """Q network [N, in] -> [N, sum(branch sizes)] with per-branch masks and a target copy."""

    def __init__(self, n_in: int, branches: list[int], cfg: DqnConfig, seed: int, restart: int = 0):
        self.branches = list(branches)
        self.offsets = np.cumsum([0] + self.branches[:-1]).tolist()
        self.cfg = cfg
        rng = np.random.default_rng(learner_entropy(seed, 13, restart))
        self.q = MLP.init([n_in, *cfg.hidden, sum(self.branches)], rng, out_scale=0.1)
        self.target = self.q.copy()
        self.opt = Adam(self.q.params, cfg.lr, clip=10.0)
        self.rng = rng
        self.mem: deque = deque(maxlen=cfg.replay)
        self.steps = 0
        self.updates = 0

    def epsilon(self) -> float:
        if self.cfg.eps_kind == "ztt":
            return max(0.95**self.updates, 0.01)
        return 0.2 + 0.79 * math.exp(-self.steps / 1000.0)

    def act(self, x: np.ndarray, masks: list[np.ndarray], explore: bool) -> list[int]:
        qv = self.q.forward(x[None, :])[0]
        out = []
        eps = self.epsilon() if explore else 0.0
        for b, (off, n) in enumerate(zip(self.offsets, self.branches)):
            m = masks[b]
            if explore and self.rng.random() < eps:
                out.append(int(self.rng.choice(np.flatnonzero(m))))
            else:
                out.append(int(np.argmax(np.where(m, qv[off : off + n], -np.inf))))
        if explore:
            self.steps += 1
        return out

    def remember(self, s, masks, a, r, s2, masks2, done) -> None:
        item = (s, np.concatenate(masks), np.array(a), float(r), s2, np.concatenate(masks2), done)
        self.mem.append(item)
        for _ in range(self.cfg.copies_outside_01 if (r < 0 or r > 1) else 0):
            self.mem.append(item)

    def update(self) -> float | None:
        cfg = self.cfg
        if len(self.mem) < max(cfg.start_samples, 1):
            return None
        idx = self.rng.integers(len(self.mem), size=min(cfg.batch, len(self.mem)))
        S = np.stack([self.mem[i][0] for i in idx])
        M2 = np.stack([self.mem[i][5] for i in idx])
        A = np.stack([self.mem[i][2] for i in idx])
        R = np.array([self.mem[i][3] for i in idx])
        S2 = np.stack([self.mem[i][4] for i in idx])
        D = np.array([self.mem[i][6] for i in idx], dtype=float)
        qv, acts = self.q.forward_cache(S)
        qn = self.target.forward(S2)
        g = np.zeros_like(qv)
        loss = 0.0
        for b, (off, n) in enumerate(zip(self.offsets, self.branches)):
            nxt = np.where(M2[:, off : off + n], qn[:, off : off + n], -np.inf).max(axis=1)
            nxt = np.where(np.isfinite(nxt), nxt, 0.0)
            y = R + cfg.gamma * (1.0 - D) * nxt
            pred = qv[np.arange(len(idx)), off + A[:, b]]
            err = pred - y
            hub = np.where(np.abs(err) <= 1.0, err, np.sign(err))
            loss += float(np.where(np.abs(err) <= 1, 0.5 * err**2, np.abs(err) - 0.5).mean())
            g[np.arange(len(idx)), off + A[:, b]] = hub / len(idx)
        self.opt.step(self.q.backward(acts, g.astype(np.float32)))
        self.updates += 1
        return loss

    def sync(self) -> None:
        self.target = self.q.copy()


# --------------------------------------------------------------------------------------------
# GearDVFS state, action, reward


class GearState:
    """The N_W-reading window (oldest first, zero-padded at the start of a run)."""

    def __init__(self, spec: BoardSpec):
        self.tracker = FeatureTracker(spec)
        self.scale = BoardScale.of(spec)
        self.win: deque[np.ndarray] = deque(maxlen=N_W)

    def reset(self) -> None:
        self.tracker.reset()
        self.win.clear()

    def __call__(self, obs: Observation):
        feats = self.tracker(obs)
        cl, glob, _ = feats
        cpu = obs.cpu_power_w
        reading = np.concatenate(
            [
                cl[:, [3, 1, 2, 4]].reshape(-1),
                [glob[0], (cpu / self.scale.power_w) if cpu is not None else 0.5],
            ]
        ).astype(np.float32)
        self.win.append(reading)
        pad = [np.zeros(READING, np.float32)] * (N_W - len(self.win))
        return np.concatenate(pad + list(self.win)).astype(np.float32), feats


def gear_masks(inp) -> list[np.ndarray]:
    out = []
    for ci in range(MAX_CLUSTERS):
        out.append(inp.prof_mask_f[ci].copy())
        out.append(inp.prof_mask_c[ci].copy())
    return out


def branch_sizes() -> list[int]:
    return [N_LEVELS, N_CORES] * MAX_CLUSTERS


def gear_decision(obs: Observation, space: ActionSpace, acts: list[int]) -> Decision:
    byname = {c.name: c for c in obs.clusters}
    freq: dict[str, int] = {}
    cpus: list[int] = []
    for ci, name in enumerate(space.clusters):
        cl = byname.get(name)
        if cl is None:
            continue
        f = space.khz(ci, acts[2 * ci])
        if cl.max_khz is not None and f > cl.max_khz:
            f = max((x for x in space.tables[ci] if x <= cl.max_khz), default=space.tables[ci][0])
        if cl.min_khz is not None and f < cl.min_khz:
            f = min((x for x in space.tables[ci] if x >= cl.min_khz), default=space.tables[ci][-1])
        freq[name] = f
        online = tuple(sorted(cl.online))
        if online:
            n = max(1, int(round(CORE_FRACTIONS[acts[2 * ci + 1]] * len(online))))
            cpus.extend(online[:n])
    if not cpus:
        cpus = sorted(c for cl in obs.clusters for c in cl.online)
    setting = JobSetting(tuple(sorted(cpus)))
    return Decision(freq, {j.pid: setting for j in obs.jobs})


def gear_reward(spec: BoardSpec, scale: BoardScale, prev: Observation, cur: Observation) -> float:
    dt = cur.t - prev.t
    p = prev.total_power_w
    if p is None or p <= 0 or dt <= 0:
        return 0.0
    if not prev.jobs:
        return -p / scale.power_w
    rate = work_done(prev, cur) / dt
    ref = max_throughput(spec, prev) / scale.power_w
    return (rate / p) / max(ref, 1e-9)


class GearDvfsPolicy(Policy):
    """GearDVFS port: greedy over a Q network (numpy or ONNX), epsilon-greedy when training."""

    name = "geardvfs"

    def __init__(
        self,
        spec: BoardSpec,
        qnet: Net,
        *,
        period_s: float = 0.05,
        dqn: BranchDQN | None = None,
        recorder: list | None = None,
    ):
        self.spec = spec
        self.space = ActionSpace.of(spec)
        self.state = GearState(spec)
        self.qnet = qnet
        self.period_s = period_s
        self.dqn = dqn
        self.recorder = recorder
        self.stages: list = []

    def reset(self, seed: int | None = None) -> None:
        self.state.reset()
        if self.recorder is not None:
            self.recorder.clear()

    def decide(self, obs: Observation) -> Decision:
        x, feats = self.state(obs)
        inp = build_inputs(feats, obs, self.space)
        masks = gear_masks(inp)
        if self.dqn is not None:
            acts = self.dqn.act(x, masks, explore=True)
        else:
            qv = self.qnet(x[None, :])[0]
            acts, off = [], 0
            for m, n in zip(masks, branch_sizes()):
                acts.append(int(np.argmax(np.where(m, qv[off : off + n], -np.inf))))
                off += n
        if self.recorder is not None:
            self.recorder.append((x, masks, acts, obs))
        return gear_decision(obs, self.space, acts)


# --------------------------------------------------------------------------------------------
# Training (shared by the zTT port)


@dataclass(frozen=True)
class Selection:
    """Model selection: the validation mixes, how often (episodes) the greedy network is
    scored on them, and the score of one episode, ``score(observations, result)``."""

    seeds: tuple[int, ...]
    every: int
    score: Callable[[list[Observation], object], float]


@dataclass
class DqnResult:
    dqn: BranchDQN
    history: list[dict]
    config: dict
    wall_s: float
    #: model selection: [{"after_episode", "score"}]; ``dqn.q`` holds the best-scoring one
    validation: list[dict] = field(default_factory=list)


def train_dqn(
    kind: str,
    spec: BoardSpec,
    run_episode,
    make_mix,
    seed: int,
    cfg: DqnConfig,
    make_policy: Callable[[BranchDQN, list, bool], Policy],
    reward: Callable[[Observation, Observation], float],
    n_in: int,
    branches: list[int],
    log=None,
    seed_base: int = 0,
    online_updates: bool = False,
    selection: Selection | None = None,
    restart: int = 0,
) -> DqnResult:
    """Episodes of the real loop; transitions (s, a, r, s') from the recorded ticks.

    ``make_policy(dqn, recorder, explore)``. With a ``selection``, the greedy network is
    scored on its mixes before training (for reference), every ``selection.every`` episodes
    and at the end, and the best trained one is kept: the model selection hidvfs gets, on the
    same mixes at the same cadence. The board trainer passes hidvfs's own yardstick as the
    score, so every policy is chosen by the same measure (agents/TRAINING-LOG.md says why not
    the ports' own rewards)."""
    log = log or (lambda s: None)
    dqn = BranchDQN(n_in, branches, cfg, seed, restart)
    kind += f" restart {restart}" if restart else ""  # log prefix
    history = []
    validation: list[dict] = []
    best: list = [None, None]
    t0 = time.monotonic()

    def transitions(rec, res):
        # rewards read power from metered observations (the plant's exact meter), exactly as
        # hidvfs's do; the states recorded in ``rec`` (what the policy saw) are untouched
        seen = metered([r[3] for r in rec], res)
        rec = [(s, m, a, o) for (s, m, a, _), o in zip(rec, seen)]
        for i in range(len(rec)):
            s, m, a, o = rec[i]
            if i + 1 < len(rec):
                s2, m2, _, o2 = rec[i + 1]
                yield s, m, a, reward(o, o2), s2, m2, False
            else:
                yield s, m, a, 0.0, s, m, True

    def validate(after: int) -> None:
        if selection is None or not selection.seeds:
            return
        total = 0.0
        for vs in selection.seeds:
            rec: list = []
            res = run_episode(make_policy(dqn, rec, False), make_mix(vs), vs)
            total += selection.score([r[3] for r in rec], res)
        score = total / len(selection.seeds)
        validation.append({"after_episode": after, "score": score})
        if after > 0 and (best[0] is None or score > best[0]):  # the initial net: reference only
            best[0], best[1] = score, dqn.q.copy()
        log(
            f"[{kind} {spec.name}] validation after {after} episodes: {score:+.4f} "
            f"(best {'-' if best[0] is None else format(best[0], '+.4f')})"
        )

    validate(0)
    for ep in range(cfg.episodes):
        ep_seed = seed_base + seed * 10_000 + restart * cfg.episodes + ep
        rec: list = []
        pol = make_policy(dqn, rec, True)
        res = run_episode(pol, make_mix(ep_seed), ep_seed)
        ret = 0.0
        for s, m, a, r, s2, m2, done in transitions(rec, res):
            if done:
                # the episode's end is where the simulator stops, not a terminal state: both
                # papers run continuously, and a terminal value of 0 after rewards that are
                # positive every tick would teach the network to put off finishing the jobs
                # (time-limit truncation: the last tick bootstraps from the state it reached)
                continue
            ret += r
            dqn.remember(s, m, a, r, s2, m2, done)
            if online_updates:
                for _ in range(cfg.updates_per_step):
                    dqn.update()
        for _ in range(cfg.updates_per_episode):
            dqn.update()
        if (ep + 1) % cfg.target_sync_episodes == 0:
            dqn.sync()
        history.append(
            {
                "episode": ep,
                "return": ret,
                "makespan_s": getattr(res, "makespan_s", None),
                "energy_j": float(getattr(res, "energy_j", 0.0)),
            }
        )
        if (ep + 1) % 8 == 0 or ep + 1 == cfg.episodes:
            recent = history[-8:]
            el = time.monotonic() - t0
            eta = el / (ep + 1) * (cfg.episodes - ep - 1)
            ms = [h["makespan_s"] for h in recent if h["makespan_s"] is not None]
            log(
                f"[{kind} {spec.name}] episode {ep + 1}/{cfg.episodes} "
                f"return {np.mean([h['return'] for h in recent]):+.3f} "
                f"makespan {np.mean(ms) if ms else float('nan'):.3f}s "
                f"energy {np.mean([h['energy_j'] for h in recent]):.2f}J "
                f"eps {dqn.epsilon():.2f} ETA {eta:.0f}s"
            )
        if selection is not None and ((ep + 1) % selection.every == 0 or ep + 1 == cfg.episodes):
            validate(ep + 1)
    if best[1] is not None:
        dqn.q = best[1]
    return DqnResult(dqn, history, asdict(cfg), time.monotonic() - t0, validation)


def train_geardvfs(
    spec,
    run_episode,
    make_mix,
    seed,
    cfg: DqnConfig | None = None,
    log=None,
    selection: Selection | None = None,
    restart: int = 0,
):
    cfg = cfg or DqnConfig()
    scale = BoardScale.of(spec)

    def make(dqn, rec, explore):
        return GearDvfsPolicy(
            spec,
            dqn.q.forward,
            period_s=cfg.period_s,
            dqn=dqn if explore else None,
            recorder=rec,
        )

    return train_dqn(
        "geardvfs",
        spec,
        run_episode,
        make_mix,
        seed,
        cfg,
        make,
        lambda a, b: gear_reward(spec, scale, a, b),
        GEAR_IN,
        branch_sizes(),
        log,
        selection=selection,
        restart=restart,
    )


__all__ = [
    "N_W",
    "GEAR_IN",
    "GEAR_OUT",
    "DqnConfig",
    "Selection",
    "BranchDQN",
    "GearState",
    "GearDvfsPolicy",
    "gear_reward",
    "work_done",
    "max_throughput",
    "train_dqn",
    "train_geardvfs",
    "branch_sizes",
]
