"""Training, export and evaluation of the ``higfrl`` placer in the simulated cluster.

Advantage actor-critic (numpy, hand-written backprop, Adam), reproducible from one seed:

- every iteration draws a fresh synthetic trace (training seeds never overlap the held-out
  evaluation seeds) at a random load and runs ``rollouts`` sampled episodes on it;
- **hybrid reward**. The makespan/flow signal per decision k is
  r_k = -(dA_k / A_ref + w_m dt_k / T_ref), with A the integral of the number of tasks in the
  system (its total is the sum of task flow times), t the clock (its total is the makespan)
  and ``A_ref``/``T_ref`` a reference heuristic's totals on the same trace; its return-to-go
  carries the long-term credit. The **topological prior** p (critical-path position of the
  picked task against the horizon, discounted by its finish-time regret; see
  :func:`features.topological_prior`) is an immediate reward added with weight beta;
- advantage = return-to-go - baseline, the baseline being the mean over the rollouts of the
  return-to-go at the same simulated time (input-dependent: every rollout sees the same
  arrivals) averaged with the evaluator's estimate from the global context; the evaluator
  (critic) regresses the return-to-go; the prior's advantage is p - E_pi[p];
- the allocator (actor) starts from imitation: a cross-entropy term towards the edge of a
  per-state mixture of the sjf and heft teachers (:func:`features.teacher_logits`: critical
  chains first as heft, the rest shortest first, every task on its earliest-finish node),
  whose weight decays to zero over the first ``bc_fraction`` of training, after which only
  the reward drives it; entropy bonus and prior weight anneal linearly;
- every ``val_every`` iterations (and at the end) the greedy actor runs on validation traces
  (``VAL_SEEDS``, disjoint from training and evaluation seeds); the checkpoint with the best
  validation score (the worse of the mean makespan ratio and the mean flow ratio against the
  best heuristic of each trace, so a checkpoint must do well on both) is the one returned and
  exported.

``hidvfs coordinator train --seed 0`` trains and exports the shipped model
(``tools`` owns the clock and the file paths; this module only computes).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from agents.nn import Adam
from agents.placement.features import FEATURE_VERSION, N_GLOBAL, N_PAIR, topological_prior
from agents.placement.heuristics import HEURISTICS, make_heuristic
from agents.placement.higfrl import HigfrlPlacer, Trajectory
from agents.placement.onnx_mlp import Mlp, NumpyPolicyModel
from platforms.cluster.simcluster import (
    NodeSpec,
    SimResult,
    Workload,
    capacity,
    parse_nodes_spec,
    simulate,
)
from platforms.cluster.synthetic import SyntheticConfig, synthetic_trace

DEFAULT_NODES = "tx2:4,orin-nx:2,rubikpi3:2"
TRAIN_SEED_BASE = 10_000
#: validation traces pick the exported checkpoint; disjoint from training and evaluation
VAL_SEEDS = (700_001, 700_002)
EVAL_SEEDS = (900_001, 900_002, 900_003)


@dataclass(frozen=True)
class TrainConfig:
    seed: int = 0
    iterations: int = 240
    rollouts: int = 2
    jobs_per_episode: int = 40
    load_range: tuple[float, float] = (0.6, 1.2)
    nodes: str = DEFAULT_NODES
    hidden: tuple[int, ...] = (64, 32)
    critic_hidden: tuple[int, ...] = (32,)
    lr: float = 2e-3
    critic_lr: float = 3e-3
    makespan_weight: float = 2.0
    prior_weight: float = 0.5
    prior_final: float = 0.2
    bc_weight: float = 1.0
    bc_fraction: float = 0.75
    entropy: float = 0.003
    entropy_final: float = 0.0005
    grad_clip: float = 1.0
    reference: str = "sjf"
    val_every: int = 20
    val_jobs: int = 300
    val_loads: tuple[float, ...] = (0.7, 1.0, 1.2)


def _flat(mlp: Mlp) -> list[np.ndarray]:
    return [a for wb in mlp.layers for a in wb]


def episode_workload(seed: int, n_jobs: int, load: float, nodes: Sequence[NodeSpec]) -> Workload:
    cfg = SyntheticConfig(n_jobs=n_jobs, seed=seed, load=load, capacity=capacity(nodes))
    return Workload.from_jobs(synthetic_trace(cfg).jobs)


def rewards(tr: Trajectory, res: SimResult, a_ref: float, t_ref: float, w_mk: float) -> np.ndarray:
    """Makespan and flow-time signal per decision (see the module docstring)."""
    t = np.asarray(tr.t + [float(res.finish.max())])
    area = np.asarray(tr.area + [float((res.finish - res.ready_t).sum())])
    return -(np.diff(area) / a_ref + w_mk * np.diff(t) / t_ref)


def returns_to_go(r: np.ndarray) -> np.ndarray:
    return np.cumsum(r[::-1])[::-1]


def time_baseline(times: list[np.ndarray], rets: list[np.ndarray]) -> list[np.ndarray]:
    """For each rollout, the mean over all rollouts of the return-to-go at the same time."""
    out = []
    for t in times:
        acc = np.zeros(t.size)
        for tj, gj in zip(times, rets):
            i = np.searchsorted(tj, t, side="left")
            acc += np.where(i < gj.size, gj[np.minimum(i, gj.size - 1)], 0.0)
        out.append(acc / len(times))
    return out


def actor_grads(
    model: NumpyPolicyModel,
    xs: list[np.ndarray],
    actions: np.ndarray,
    teacher: np.ndarray,
    adv: np.ndarray,
    beta: float,
    bc: float,
    ent: float,
):
    """Gradients over a batch of decisions of
    -mean[(adv + beta (p_a - E_pi p)) log pi(a)] - bc mean[log pi(teacher)] - ent mean[H]."""
    sizes = np.array([x.shape[0] for x in xs])
    offs = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    seg = np.repeat(np.arange(sizes.size), sizes)
    xcat = np.concatenate(xs)
    xin = ((xcat - model.mean) / model.std).astype(np.float32)
    net = Mlp([(w.astype(np.float32), b.astype(np.float32)) for w, b in model.actor.layers])
    out, acts = net.forward_cache(xin)
    logit = out[:, 0].astype(np.float64)
    mx = np.maximum.reduceat(logit, offs)
    e = np.exp(logit - mx[seg])
    z = np.add.reduceat(e, offs)
    p = e / z[seg]
    logp = np.log(np.maximum(p, 1e-12))
    h = -np.add.reduceat(p * logp, offs)
    prior = topological_prior(xcat)
    prior_adv = prior[offs + actions] - np.add.reduceat(p * prior, offs)
    a_tot = adv + beta * prior_adv
    g = a_tot[seg] * p
    g[offs + actions] -= a_tot
    g += bc * p
    g[offs + teacher] -= bc
    g += ent * p * (logp + h[seg])
    grads = net.backward(acts, (g / sizes.size).astype(np.float32)[:, None])
    stats = {
        "entropy": float(h.mean()),
        "agree_teacher": float(np.mean(actions == teacher)),
        "prior": float(prior[offs + actions].mean()),
    }
    return [a.astype(np.float64) for wb in grads for a in wb], stats


def critic_grads(model: NumpyPolicyModel, ctx: np.ndarray, target: np.ndarray):
    xin = (ctx - model.g_mean) / model.g_std
    out, acts = model.critic.forward_cache(xin)
    err = out[:, 0] - target
    grads = model.critic.backward(acts, (err / err.size)[:, None])
    return [a for wb in grads for a in wb], float((err**2).mean()), out[:, 0]


def _rollout(
    model, w: Workload, nodes, seed: int, greedy: bool = False
) -> tuple[SimResult, Trajectory]:
    placer = HigfrlPlacer(model=model, greedy=greedy, record=True)
    res = simulate(w, nodes, placer, seed=seed)
    return res, placer.trajectory


def _init_model(cfg: TrainConfig, rng: np.random.Generator, nodes) -> NumpyPolicyModel:
    actor = Mlp.init([N_PAIR, *cfg.hidden, 1], rng)
    critic = Mlp.init([N_GLOBAL, *cfg.critic_hidden, 1], rng, out_scale=1.0)
    model = NumpyPolicyModel(
        actor, critic, np.zeros(N_PAIR), np.ones(N_PAIR), np.zeros(N_GLOBAL), np.ones(N_GLOBAL)
    )
    # input statistics from one exploratory episode, then frozen (folded into the export)
    w = episode_workload(
        int(rng.integers(1 << 30)) % 1000 + TRAIN_SEED_BASE // 2,
        cfg.jobs_per_episode,
        float(np.mean(cfg.load_range)),
        nodes,
    )
    _, tr = _rollout(model, w, nodes, seed=int(rng.integers(1 << 30)))
    x = np.concatenate(tr.x).astype(np.float64)
    g = np.asarray(tr.context, dtype=np.float64)
    model.mean, model.std = x.mean(axis=0), np.where(x.std(axis=0) > 1e-3, x.std(axis=0), 1.0)
    model.g_mean, model.g_std = g.mean(axis=0), np.where(g.std(axis=0) > 1e-3, g.std(axis=0), 1.0)
    return model


def _copy_model(m: NumpyPolicyModel) -> NumpyPolicyModel:
    def cp(mlp: Mlp) -> Mlp:
        return Mlp([(w.copy(), b.copy()) for w, b in mlp.layers])

    return NumpyPolicyModel(cp(m.actor), cp(m.critic), m.mean, m.std, m.g_mean, m.g_std)


class Validator:
    """Greedy runs on the validation traces against the best heuristics of each trace."""

    def __init__(self, cfg: TrainConfig, nodes: Sequence[NodeSpec]):
        self.nodes = nodes
        self.cases = []
        for load in cfg.val_loads:
            for seed in VAL_SEEDS:
                w = episode_workload(seed, cfg.val_jobs, load, nodes)
                res = [simulate(w, nodes, make_heuristic(h), seed=seed) for h in HEURISTICS]
                self.cases.append(
                    (w, seed, min(r.makespan for r in res), min(r.mean_flow for r in res))
                )

    def score(self, model) -> dict:
        """``score`` = the worse of the mean makespan ratio and the mean flow ratio (both
        against the best heuristic of each trace); lower is better, and < 1 only when the
        actor beats the best heuristic on both."""
        mk, fl = [], []
        for w, seed, best_mk, best_fl in self.cases:
            res = simulate(w, self.nodes, HigfrlPlacer(model=model), seed=seed)
            mk.append(res.makespan / best_mk)
            fl.append(res.mean_flow / best_fl)
        return {
            "val_score": max(float(np.mean(mk)), float(np.mean(fl))),
            "val_makespan_ratio": float(np.mean(mk)),
            "val_flow_ratio": float(np.mean(fl)),
        }


def train(cfg: TrainConfig, log=None) -> tuple[NumpyPolicyModel, list[dict]]:
    """Train from ``cfg.seed``; returns the best validated model and one log row per
    iteration (validation rows carry ``val_*`` keys)."""
    rng = np.random.default_rng(cfg.seed)
    nodes = parse_nodes_spec(cfg.nodes)
    model = _init_model(cfg, rng, nodes)
    validator = Validator(cfg, nodes) if cfg.val_every > 0 else None
    best: tuple[float, int, NumpyPolicyModel] | None = None
    opt_a = Adam(_flat(model.actor), cfg.lr, clip=cfg.grad_clip)
    opt_c = Adam(_flat(model.critic), cfg.critic_lr, clip=cfg.grad_clip)
    history = []
    for it in range(cfg.iterations):
        frac = it / max(cfg.iterations - 1, 1)
        beta = cfg.prior_weight + (cfg.prior_final - cfg.prior_weight) * frac
        ent = cfg.entropy + (cfg.entropy_final - cfg.entropy) * frac
        bc = cfg.bc_weight * max(0.0, 1.0 - frac / cfg.bc_fraction) if cfg.bc_fraction > 0 else 0.0
        load = float(rng.uniform(*cfg.load_range))
        w = episode_workload(
            TRAIN_SEED_BASE + cfg.seed * 100_000 + it, cfg.jobs_per_episode, load, nodes
        )
        ref = simulate(w, nodes, make_heuristic(cfg.reference))
        a_ref = max(float((ref.finish - ref.ready_t).sum()), 1e-9)
        t_ref = max(ref.makespan, 1e-9)
        runs = [
            _rollout(model, w, nodes, seed=int(rng.integers(1 << 30))) for _ in range(cfg.rollouts)
        ]
        times, rets, ctxs = [], [], []
        for res, tr in runs:
            times.append(np.asarray(tr.t))
            rets.append(returns_to_go(rewards(tr, res, a_ref, t_ref, cfg.makespan_weight)))
            ctxs.append(np.asarray(tr.context, dtype=np.float64))
        base = time_baseline(times, rets)
        g_all = np.concatenate(rets)
        c_grads, c_loss, v_all = critic_grads(model, np.concatenate(ctxs), g_all)
        adv_steps = g_all - 0.5 * (np.concatenate(base) + v_all)
        xs, acts, teach, adv = [], [], [], []
        off = 0
        for (_, tr), g in zip(runs, rets):
            if tr.x:
                xs += tr.x
                acts.append(np.asarray(tr.action))
                teach.append(np.asarray(tr.teacher))
                adv.append(adv_steps[off + np.asarray(tr.step_of_x)])
            off += g.size
        stats = {"entropy": 0.0, "agree_teacher": 0.0, "prior": 0.0}
        if xs:
            adv_a = np.concatenate(adv)
            adv_a = (adv_a - adv_a.mean()) / (adv_a.std() + 1e-8)
            a_grads, stats = actor_grads(
                model, xs, np.concatenate(acts), np.concatenate(teach), adv_a, beta, bc, ent
            )
            opt_a.step(a_grads)
        opt_c.step(c_grads)
        flow = float(np.mean([r.mean_flow for r, _ in runs]))
        mk = float(np.mean([r.makespan for r, _ in runs]))
        row = {
            "iter": it,
            "load": round(load, 3),
            "tasks": w.n_tasks,
            "flow_ratio": flow / ref.mean_flow if ref.mean_flow else 1.0,
            "makespan_ratio": mk / t_ref,
            "return": float(np.mean([g[0] for g in rets])),
            "critic_mse": c_loss,
            "bc": bc,
            **stats,
        }
        last = it == cfg.iterations - 1
        if validator is not None and ((it + 1) % cfg.val_every == 0 or last):
            val = validator.score(model)
            row.update(val)
            if best is None or val["val_score"] < best[0]:
                best = (val["val_score"], it, _copy_model(model))
        history.append(row)
        if log is not None:
            log(row)
    if best is not None:
        best[2].selected = {"iter": best[1], "val_score": best[0]}
        return best[2], history
    return model, history


def export(
    model: NumpyPolicyModel,
    path,
    cfg: TrainConfig,
    command: str,
    date: str,
    history: list[dict],
    extra: dict | None = None,
) -> None:
    """Write the ONNX model with its provenance (seed, command, date, config, summary)."""
    last = history[-20:] if history else []
    meta = {
        "seed": str(cfg.seed),
        "command": command,
        "date": date,
        "feature_version": str(FEATURE_VERSION),
        "train_config": json.dumps(asdict(cfg)),
        "train_summary": json.dumps(
            {
                "iterations": len(history),
                "last20_flow_ratio_vs_ref": float(np.mean([h["flow_ratio"] for h in last]))
                if last
                else None,
                "last20_makespan_ratio_vs_ref": float(np.mean([h["makespan_ratio"] for h in last]))
                if last
                else None,
            }
        ),
    }
    sel = getattr(model, "selected", None)
    if sel:
        meta["selected_checkpoint"] = json.dumps(sel)
    if extra:
        meta.update({k: v if isinstance(v, str) else json.dumps(v) for k, v in extra.items()})
    model.export(path, meta)


# --------------------------------------------------------------------------------------------
# Held-out evaluation


def make_placer(name: str, model_path=None):
    if name == "higfrl":
        return HigfrlPlacer(model_path=model_path)
    return make_heuristic(name)


def evaluate(
    model_path=None,
    n_jobs: int = 500,
    loads: Sequence[float] = (0.7, 1.0),
    seeds: Sequence[int] = EVAL_SEEDS,
    nodes: str = DEFAULT_NODES,
    policies: Sequence[str] = ("higfrl", *HEURISTICS),
) -> list[dict]:
    """Every policy on held-out synthetic traces (seeds disjoint from training): one row per
    (load, seed, policy) with the simulator's metrics."""
    node_specs = parse_nodes_spec(nodes)
    rows = []
    for load in loads:
        for seed in seeds:
            w = episode_workload(seed, n_jobs, load, node_specs)
            for name in policies:
                res = simulate(w, node_specs, make_placer(name, model_path), seed=seed)
                rows.append({"load": load, "seed": seed, **res.metrics()})
    return rows


def summarize(rows: list[dict]) -> list[dict]:
    """Mean metrics per (load, policy) and ratios to the best heuristic of that load."""
    out = []
    for load in sorted({r["load"] for r in rows}):
        sub = [r for r in rows if r["load"] == load]
        pols = list(dict.fromkeys(r["policy"] for r in sub))
        agg = {}
        for p in pols:
            rs = [r for r in sub if r["policy"] == p]
            agg[p] = {
                k: float(np.mean([r[k] for r in rs]))
                for k in ("makespan_s", "mean_flow_s", "mean_wait_s")
            }
            # per-run ratio to the bound no placement can beat (see makespan_lower_bound)
            vs_lb = [r["makespan_s"] / r["makespan_lb_s"] for r in rs if r["makespan_lb_s"]]
            agg[p]["makespan_vs_lb"] = float(np.mean(vs_lb)) if vs_lb else float("nan")
            agg[p]["runs"] = len(rs)
            agg[p]["tasks"] = int(np.mean([r["tasks"] for r in rs]))
        heur = [p for p in pols if p != "higfrl"] or pols
        best = {
            k: min(agg[p][k] for p in heur) for k in ("makespan_s", "mean_flow_s", "mean_wait_s")
        }
        for p in pols:
            a = agg[p]
            out.append(
                {
                    "load": load,
                    "policy": p,
                    **a,
                    "makespan_vs_best": a["makespan_s"] / best["makespan_s"]
                    if best["makespan_s"]
                    else 1.0,
                    "flow_vs_best": a["mean_flow_s"] / best["mean_flow_s"]
                    if best["mean_flow_s"]
                    else 1.0,
                    "wait_vs_best": a["mean_wait_s"] / best["mean_wait_s"]
                    if best["mean_wait_s"]
                    else 1.0,
                }
            )
    return out
