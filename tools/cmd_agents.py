"""``hidvfs agents train|check|eval``: train the learned policies in the simulator, verify the
shipped ONNX files, and compare policies on held-out job mixes.

This module is the glue the layering asks for: the learners in ``agents/`` take the episode
runner and the workload generator as arguments; here they are :func:`daemon.simrun.run_sim`
and :func:`bots_bench.workload.default_items`.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

import click

from tools.common import (
    FiniteFloatRange,
    Friendly,
    emit_json,
    ensure_parent,
    fail,
    not_empty,
    require_extra,
    stops_on_signals,
)

BOARDS = ("tx2", "orin-nx", "rubikpi3")


#: kernels whose `test`-class reference makespan (50-500 ms) leaves a 50 ms control loop room
#: to act on a 1.5x deadline; the sub-10 ms kernels (floorplan, knapsack, nqueens, sparselu,
#: strassen) finish before a second decision could be taken
EPISODE_KERNELS = ("fib", "sort", "fft", "health", "uts", "alignment", "concom")


@dataclass(frozen=True)
class EpisodeSpec:
    n_jobs: int = 5
    cls: str = "test"
    load: float = 0.6
    slack: float = 1.5
    deadline_fraction: float = 0.7
    hi_fraction: float = 0.2
    period_s: float = 0.05
    #: share of the mixes that start on a hot board (:func:`thermal_start`); eval's default
    #: is 0 (every board idle at 25 C), training's :data:`TRAIN_HOT_FRACTION`
    hot_fraction: float = 0.0


#: training mixes on a hot board: without them no CPU zone passed 0.4 x its trip (C), the
#: thermal agent's choice was never free, and its network kept its initial weights. 0.1, not
#: 0.25: at 0.25 the orin-nx profiler carried the slowing a hot board rewards over to cold
#: lone jobs (4.3 % slower than maxfreq) and rubikpi3's shield grew (agents/TRAINING-LOG.md)
TRAIN_HOT_FRACTION = 0.1
#: a hot mix: ambient drawn from this range (C), and the board soaked at a temperature drawn
#: from [HOT_START_LO x trip, trip - HOT_START_BELOW_TRIP_C] (trip: the lowest passive trip of
#: the CPU zones), where the thermal agent's "take work / must cool" is its own choice (from
#: 0.7 x trip). The top stays 1 C below the thermal guard's default limit (trip - 5 C): a board
#: soaked above it stays there for the whole episode (its heat sink's time constant is minutes),
#: and the guard caps every policy alike to its lowest OPP, which teaches nothing
HOT_AMBIENT_C = (25.0, 45.0)
HOT_START_LO = 0.65
HOT_START_BELOW_TRIP_C = 6.0
#: the thermal draw's own stream: a mix's jobs are the same whether it starts hot or not
_HOT_STREAM = 0x7E4A1


def thermal_start(board: str, seed: int, hot_fraction: float) -> tuple[float, float] | None:
    """(ambient C, start C) of mix ``seed`` when it starts on a hot board, None when it starts
    idle at the board's ambient. Seeded: the same mix starts the same way every time."""
    import numpy as np

    from agents.features import BoardScale
    from platforms.spec import load_board

    if hot_fraction <= 0.0:
        return None
    rng = np.random.default_rng([seed, _HOT_STREAM])
    if rng.random() >= hot_fraction:
        return None
    trip = min(BoardScale.of(load_board(board)).trips_c)
    ambient = float(rng.uniform(*HOT_AMBIENT_C))
    start = float(rng.uniform(max(ambient, HOT_START_LO * trip), trip - HOT_START_BELOW_TRIP_C))
    return ambient, start


def episode_items(board: str, seed: int, ep: EpisodeSpec) -> list:
    """A random mix of ``n_jobs`` BOTS jobs with deadlines (slack x reference), seeded; for a
    lone-job validation seed (:func:`agents.train.lone_index`), one job alone on the board
    without a deadline, as the main BOTS campaign runs it (kernel by index, task graph by
    seed)."""
    from agents.train import lone_index
    from bots_bench.reference import measure_reference
    from bots_bench.workload import WorkloadSpec, default_items, lone_item
    from platforms.spec import load_board

    spec = load_board(board)
    k = lone_index(seed)
    if k is not None:
        return [lone_item(spec, EPISODE_KERNELS[k % len(EPISODE_KERNELS)], ep.cls, seed)]
    refs = {k: measure_reference(board, k, ep.cls, 0) for k in EPISODE_KERNELS}
    mean_ref = sum(p.ref_makespan_s for p in refs.values()) / len(refs)
    w = WorkloadSpec(
        duration_s=4.0 * ep.n_jobs * mean_ref / max(ep.load, 1e-3),
        load=ep.load,
        cls=ep.cls,
        deadline_fraction=ep.deadline_fraction,
        hi_fraction=ep.hi_fraction,
        slack=ep.slack,
        kernels=EPISODE_KERNELS,
    )
    return default_items(spec, seed, w)[: ep.n_jobs]


def make_runner(board: str, ep: EpisodeSpec, reserve: bool = False, kernel_rates: bool = False):
    """Runs one mix under a policy with its own stages; with ``reserve``, with the stages the
    daemon runs (the policy's planned around the mixed-criticality reservation, then it). The
    plant's seed is the mix's, and so is its thermal start (:func:`thermal_start`; ``cold``:
    idle at the board's ambient whatever the mix draws). Every policy decides every
    ``ep.period_s``; with ``kernel_rates`` a governor that samples the load (``samples_load``)
    decides at its kernel's rate instead: every 50 ms schedutil needed about 13 decisions,
    650 ms, to climb orin-nx's table, and missed 6 x as many deadlines."""
    from agents.mixed import daemon_stages
    from daemon.simrun import run_sim

    def run_episode(policy, items, seed, cold: bool = False):
        stages = list(getattr(policy, "stages", []) or [])
        hot = None if cold else thermal_start(board, seed, ep.hot_fraction)
        period = ep.period_s
        if kernel_rates and getattr(policy, "samples_load", False):
            period = None  # run_sim: the policy's own, as a BOTS campaign runs it (>= 5 ms)
        return run_sim(
            board,
            policy,
            items,
            seed=seed,
            period_s=period,
            stages=daemon_stages(stages) if reserve else stages,
            ambient_c=None if hot is None else hot[0],
            start_c=None if hot is None else hot[1],
        )

    return run_episode


@click.group("agents", cls=Friendly)
def agents() -> None:
    """Train, check and evaluate the learned policies (hidvfs, geardvfs, ztt)."""


def _boards(text: str) -> list[str]:
    """Board names of ``--board`` (or all), each checked first: an unknown one is named."""
    from platforms.spec import board_names

    names = [b.strip() for b in text.split(",") if b.strip()]
    if names == ["all"]:
        return list(BOARDS)
    if not names:
        fail(f"--board names no board; known: {', '.join(BOARDS)} or all")
    known = board_names()
    for b in names:
        if b not in known:
            fail(f"unknown board {b!r}; known boards: {', '.join(known)} (or all)")
    return list(dict.fromkeys(names))


MODELS_HELP = (
    "models root (default agents/models): ROOT/BOARD when ROOT/BOARD/manifest.json exists, "
    "else ROOT itself, which serves only the board its manifest.json names"
)


TRAINABLE = ("hidvfs", "noshaping", "geardvfs", "ztt")
#: the shipped models' training settings (agents/TRAINING.md)
DEFAULT_EPISODES, DEFAULT_JOBS = 640, 5


def train_modules(policies) -> tuple[str, ...]:
    """The optional modules training ``policies`` imports: every policy is exported with
    onnx; hidvfs also fits its shield's response-time trees (scikit-learn) and exports them
    with skl2onnx."""
    if "hidvfs" in policies:
        return ("onnx", "skl2onnx", "sklearn")
    return ("onnx",)


@agents.command("train")
@click.option("--board", required=True, help="board name (tx2, orin-nx, rubikpi3)", metavar="BOARD")
@click.option(
    "--seed",
    type=click.IntRange(0, 49),
    default=0,
    show_default=True,
    help="training seed; 0-49 keeps the training, calibration, validation and evaluation "
    "mixes disjoint (agents/TRAINING.md)",
)
@click.option(
    "--policy",
    "policies",
    default=",".join(TRAINABLE),
    show_default=True,
    help="which to train: hidvfs, noshaping (ablation), geardvfs, ztt",
    metavar="POLICY",
)
@click.option(
    "--episodes",
    type=click.IntRange(1, 10_000),
    default=DEFAULT_EPISODES,
    show_default=True,
    help="training episodes per policy (at most 10000: one seed's block of training mixes)",
)
@click.option(
    "--jobs",
    "n_jobs",
    type=click.IntRange(1),
    default=DEFAULT_JOBS,
    show_default=True,
    help="jobs per episode",
)
@click.option(
    "--hot-fraction",
    type=FiniteFloatRange(0.0, 1.0),
    default=TRAIN_HOT_FRACTION,
    show_default=True,
    help="share of the training mixes that start on a hot board (soaked near its passive "
    "trip), so the thermal agent learns when to cool (agents/TRAINING.md)",
)
@click.option(
    "--out",
    "out_dir",
    default=None,
    help="output folder; default agents/models/BOARD, the shipped models, but only for the "
    "run that reproduces them (every default setting): any other run needs --out",
    metavar="DIR",
)
@click.option(
    "--calib-episodes",
    type=click.IntRange(20, 1000),
    default=None,
    help="episodes of the shield's conformal calibration, and as many for its held-out "
    "coverage check (default: TrainConfig's 256). Fewer make a quick trial run (with "
    "--episodes 2 --val-mixes 1 --policy hidvfs: about 15 s) whose shield is looser: a "
    "candidate certified at a small alpha needs more calibration jobs than it has",
)
@click.option(
    "--workers",
    type=click.IntRange(1),
    default=None,
    help="policies trained in parallel processes (default: the CPU count); results do not "
    "depend on it",
)
@click.option(
    "--lambda-e",
    type=FiniteFloatRange(0.0),
    default=None,
    help="weight of the energy regulariser (default: the board's, see agents/TRAINING.md)",
)
@click.option(
    "--energy-rail",
    type=click.Choice(["cpu", "total"]),
    default=None,
    help="rail the energy regulariser charges (default: the board's)",
)
@click.option(
    "--power-ref",
    type=click.Choice(["episode", "busy"]),
    default=None,
    help="what the energy term is divided by: the rail's mean maxfreq power over the whole "
    "episode, or only while a job is pending (default: the board's)",
)
@click.option(
    "--time-term",
    type=click.Choice(["pending", "makespan"]),
    default=None,
    help="what the reward's time term charges: busy time, or the makespan that eval reports "
    "(default: the board's)",
)
@click.option(
    "--val-mixes",
    type=click.IntRange(1, 93),
    default=None,
    help="validation mixes (at most 93, the block before the 7 lone-job validation episodes "
    "and the tuning mixes) that choose the exported checkpoint, for every learned policy "
    "alike, with one job alone per episode kernel (default: TrainConfig's)",
)
@click.option(
    "--restarts",
    type=click.IntRange(1, 8),
    default=1,
    show_default=True,
    help="independent training runs per learned policy, each on its own training mixes and "
    "initial weights; the one whose best checkpoint scores highest on the validation mixes is "
    "exported, for every policy alike. Multiplies the training time; restarts x --episodes "
    "at most 10000",
)
def train_cmd(
    board,
    seed,
    policies,
    episodes,
    n_jobs,
    hot_fraction,
    out_dir,
    workers,
    lambda_e,
    energy_rail,
    power_ref,
    time_term,
    val_mixes,
    restarts,
    calib_episodes,
) -> None:
    """Train in the simulator and export ONNX + manifest to agents/models/BOARD (or --out)."""
    from agents.learned import model_dir
    from agents.train import MAX_EPISODES, TrainConfig
    from agents.trainboard import train_board
    from platforms.spec import load_board

    spec = load_board(board)
    pols = tuple(dict.fromkeys(p.strip().lower() for p in policies.split(",") if p.strip()))
    if not pols:
        fail(f"--policy names no policy to train (e.g. {','.join(TRAINABLE)})")
    for p in pols:
        if p not in TRAINABLE:
            fail(f"unknown policy {p!r} to train; known: {', '.join(TRAINABLE)}")
    # checked before any training: the export at the end imports them (minutes in)
    require_extra("hidvfs agents train", "train", train_modules(pols))
    ep = EpisodeSpec(n_jobs=n_jobs, hot_fraction=hot_fraction)
    out = Path(out_dir) if out_dir else model_dir(board)
    command = (
        f"hidvfs agents train --board {board} --seed {seed} --policy {','.join(pols)} "
        f"--episodes {episodes} --jobs {n_jobs} --hot-fraction {hot_fraction:g}"
    )
    overrides = {}
    if lambda_e is not None:
        overrides["lambda_e"] = lambda_e
        command += f" --lambda-e {lambda_e:g}"
    if energy_rail is not None:
        overrides["energy_rail"] = energy_rail
        command += f" --energy-rail {energy_rail}"
    if power_ref is not None:
        overrides["power_ref"] = power_ref
        command += f" --power-ref {power_ref}"
    if time_term is not None:
        overrides["time_term"] = time_term
        command += f" --time-term {time_term}"
    if val_mixes is not None:
        overrides["val_episodes"] = val_mixes
        command += f" --val-mixes {val_mixes}"
    if restarts > 1:
        if restarts * episodes > MAX_EPISODES:
            raise click.BadParameter(
                f"{restarts} x {episodes} episodes is more than the {MAX_EPISODES} training "
                "mixes of a seed's block",
                param_hint="'--restarts'",
            )
        overrides["restarts"] = restarts
        command += f" --restarts {restarts}"
    if calib_episodes is not None:
        overrides["calib_episodes"] = calib_episodes
        command += f" --calib-episodes {calib_episodes}"
    reproduces_shipped = (
        seed == 0
        and set(pols) == set(TRAINABLE)
        and episodes == DEFAULT_EPISODES
        and n_jobs == DEFAULT_JOBS
        and hot_fraction == TRAIN_HOT_FRACTION
        and not overrides
    )
    if out_dir is None and not reproduces_shipped:
        raise click.UsageError(
            f"--out is needed: {out} holds the shipped models, and only the run that "
            f"reproduces them (`hidvfs agents train --board {board}` with every other setting "
            "at its default) writes there by default"
        )
    cfg = TrainConfig.for_board(board, episodes=episodes, period_s=ep.period_s, **overrides)
    if out_dir:  # its parent made (or refused) now; train_board makes the folder itself
        ensure_parent("--out", out_dir, folder=True)
    t0 = time.monotonic()
    from daemon.stopsignals import InterruptOnSignals

    signals = InterruptOnSignals()
    try:
        # SIGTERM and SIGHUP end training as Ctrl-C does: the workers killed, the policies
        # finished so far saved whole, the others' files left as they were
        with signals:
            man = train_board(
                spec,
                make_runner(board, ep),
                lambda s: episode_items(board, s, ep),
                seed,
                out,
                command,
                episodes=episodes,
                policies=pols,
                cfg=cfg,
                log=lambda s: click.echo(s, err=True),
                workers=workers or os.cpu_count() or 1,
            )
    except KeyboardInterrupt:
        click.echo(
            f"hidvfs: training interrupted ({signals.received or 'SIGINT'}): the policies "
            f"finished before it are saved in {out}, the others keep their previous files",
            err=True,
        )
        raise SystemExit(130) from None
    click.echo(f"trained {', '.join(pols)} for {board} in {time.monotonic() - t0:.0f}s -> {out}")
    for p in pols:  # a network the learner never changed (too few episodes)
        warning = ((man.get("policies") or {}).get(p) or {}).get("warning")
        if warning:
            click.echo(warning, err=True)
    if "hidvfs" in pols and "shield" in man:  # this run's calibration, not an earlier one
        sh = man["shield"]
        click.echo(
            f"shield: alpha {sh['alpha']} q {sh['q']:.4f} coverage {sh['coverage_heldout']:.3f}"
        )


@agents.command("check")
@click.option(
    "--board",
    "boards",
    default="all",
    show_default=True,
    help="board name(s) to check, comma-separated, or all",
    metavar="BOARDS",
)
@click.option("--models", default=None, help=MODELS_HELP, metavar="ROOT")
@click.option("--json", "as_json", is_flag=True, help="print one report per board as JSON")
def check_cmd(boards, models, as_json) -> None:
    """Verify each ONNX file loads, matches its training-time outputs to 1e-5 (relative where
    an output exceeds 1 in magnitude) and the daemon's observation schema."""
    from agents.learned import check_board

    todo = _boards(boards)
    if models and not os.path.isdir(models):
        # a mistyped path is not a board without models: "run agents train" would mislead
        what = "not a folder" if os.path.exists(models) else "no such folder"
        fail(f"--models {models}: {what}")
    reports = [check_board(b, models if models else None) for b in todo]
    if as_json:
        emit_json(reports)
    else:
        for r in reports:
            for f in r["files"]:
                line = f"{r['board']:9s} {f['file']:32s} {'ok' if f['ok'] else 'FAIL'}"
                if "max_abs_diff" in f:  # rows that failed before the comparison have none
                    line += f" max|diff| {f['max_abs_diff']:.2e} (tol {f['tolerance']:.1e})"
                if f.get("seed") is not None:
                    line += f" seed {f['seed']} commit {f.get('git_commit') or '?'}"
                if f.get("error"):
                    line += f" {f['error']}"
                click.echo(line)
    bad = [r["board"] for r in reports if not r["ok"]]
    if bad:
        fail(f"model check failed for {', '.join(bad)}", code=1)


# --------------------------------------------------------------------------------------------
# eval

BASE_EVAL = ("hidvfs", "geardvfs", "ztt", "schedutil", "maxfreq")
ABLATIONS = ("hidvfs-noshield", "hidvfs-nogate", "hidvfs-noshaping")
#: energy_j is the whole board (the plant's VDD_IN); cpu_energy_j the CPU rail alone (what DVFS
#: controls; on the RUBIK Pi 3, which has no monitor, the plant's CPU energy)
#: capped_s: time some cluster's frequency was capped for temperature, by the daemon's thermal
#: guard or the kernel's throttling (hot starts)
METRICS = ("makespan_s", "energy_j", "cpu_energy_j", "edp", "peak_temp_c", "capped_s")


def _build(name: str, spec, models):
    from agents.factory import make_policy
    from agents.learned import make_hidvfs

    if name.startswith("hidvfs"):
        opts = {"models": models}
        if name == "hidvfs-noshield":
            opts["shield"] = False
        elif name == "hidvfs-nogate":
            opts["gate"] = False
        elif name == "hidvfs-noshaping":
            opts["variant"] = "noshaping"
        elif name != "hidvfs":
            raise ValueError(f"unknown hidvfs variant {name!r}")
        return make_hidvfs(spec, **opts)
    if name in ("geardvfs", "ztt"):
        return make_policy(name, spec, models=models)
    return make_policy(name, spec)


def _record(board, policy, seed, res, ep: EpisodeSpec, overload=None) -> dict:
    """One run's row; ``overload``: the mix's densest window (platforms.sim.feasibility)."""
    dl = [j for j in res.jobs if j.deadline_s is not None]
    miss = sum(1 for j in dl if not j.deadline_met)
    hi_miss = sum(1 for j in dl if not j.deadline_met and j.criticality == "hi")
    ms = res.makespan_s
    energy, cpu_energy = res.jobs_energy()  # to the last finish: the run's, not its idle tail
    return {
        "kind": "run",
        "bench": "mix",
        "class": ep.cls,
        "policy": policy,
        "seed": seed,
        "board": board,
        "backend": "sim",
        "makespan_s": ms,
        "energy_j": energy,
        "cpu_energy_j": cpu_energy,
        "edp": None if ms is None else energy * ms,
        "peak_temp_c": res.peak_temp_c,
        "capped_s": res.capped_s,
        "deadline_s": None,
        "deadline_met": miss == 0 if dl else None,
        "deadline_jobs": len(dl),
        "hi_jobs": sum(1 for j in dl if j.criticality == "hi"),
        "misses": miss,
        "hi_misses": hi_miss,
        "miss_ratio": miss / len(dl) if dl else None,  # None: no deadline in the mix
        "jobs": len(res.jobs),
        "interventions": res.interventions,
        # the mix's densest window over what the cores can hold: above 1 no policy meets
        # every deadline (a necessary condition; below 1 does not prove they can be met)
        "window_load": None if overload is None else overload.load,
        "deadlines_infeasible": overload is not None and overload.infeasible,
        # no schedule of the mix is shorter; a Graham bound is a single DAG's (bots run)
        "lower_bound_s": _mix_lower_bound(res, board),
        "graham_bound_s": None,
        "ok": ms is not None,
        "error": None if ms is not None else "a job did not finish",
    }


def _mix_lower_bound(res, board: str) -> float | None:
    from bots_bench.campaign_sim import mix_lower_bound
    from platforms.spec import load_board

    if not res.jobs or any(j.pid not in res.executed_dags for j in res.jobs):
        return None
    jobs = [(j.release_t, res.executed_dags[j.pid]) for j in res.jobs]
    return mix_lower_bound(jobs, load_board(board))


def miss_ratios(runs: list[dict]) -> dict:
    """The deadline-miss ratio over every deadline job of ``runs``, per criticality and in
    all, with its Clopper-Pearson 95 % interval (DESIGN.md: pooled over the jobs, not a mean
    of per-mix ratios, where a mix without deadlines would count as 0): ``miss_ratio`` and
    ``miss_ci95`` (None without deadline jobs), and ``hi``/``lo`` objects of misses, jobs,
    ratio and ci95."""
    from bots_bench.report import clopper_pearson

    def one(k: int, n: int) -> tuple[float | None, list[float] | None]:
        return (k / n, list(clopper_pearson(k, n))) if n else (None, None)

    out: dict = {}
    hi_k = sum(r["hi_misses"] for r in runs)
    hi_n = sum(r["hi_jobs"] for r in runs)
    k = sum(r["misses"] for r in runs)
    n = sum(r["deadline_jobs"] for r in runs)
    out["miss_ratio"], out["miss_ci95"] = one(k, n)
    for crit, ck, cn in (("hi", hi_k, hi_n), ("lo", k - hi_k, n - hi_n)):
        ratio, ci = one(ck, cn)
        out[f"{crit}_miss"] = {"misses": ck, "jobs": cn, "ratio": ratio, "ci95": ci}
    return out


def _mean_std(xs: list[float]) -> tuple[float, float]:
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    if not xs:
        return math.nan, math.nan
    m = sum(xs) / len(xs)
    v = sum((x - m) ** 2 for x in xs) / (len(xs) - 1) if len(xs) > 1 else 0.0
    return m, math.sqrt(v)


def evaluate(
    board: str,
    names: list[str],
    seeds: int,
    ep: EpisodeSpec,
    models=None,
    log=None,
    mixes: str = "held-out",
    reserve: bool = False,
):
    """Side-by-side runs of every policy on the same mixes (held-out, or the tuning mixes
    training settings are chosen on); records and summary. ``reserve``: every policy runs
    with the daemon's mixed-criticality reservation (:func:`agents.mixed.daemon_stages`)."""
    from agents.train import EVAL_SEEDS, TUNING_SEEDS
    from platforms.sim.feasibility import worst_window
    from platforms.spec import load_board

    first = TUNING_SEEDS if mixes == "tuning" else EVAL_SEEDS

    spec = load_board(board)
    run = make_runner(board, ep, reserve, kernel_rates=True)
    records = []
    policies = {n: _build(n, spec, models) for n in names}
    for i in range(seeds):
        s = first + i
        items = episode_items(board, s, ep)
        overload = None
        for n, pol in policies.items():
            res = run(pol, items, s)
            if overload is None:  # the executed DAGs are the same under every policy
                overload = worst_window(spec, _floor_jobs(res))
            records.append(_record(board, n, s, res, ep, overload))
            if log:
                r = records[-1]
                log(
                    f"[eval {board}] seed {s} {n:18s} makespan {r['makespan_s']:.3f}s "
                    f"energy {r['energy_j']:.2f}J misses {r['misses']}/{r['deadline_jobs']}"
                )
    summary = []
    by = {n: [r for r in records if r["policy"] == n] for n in names}
    for n in names:
        row = {
            "kind": "summary",
            "board": board,
            "policy": n,
            "seeds": seeds,
            "mixes": mixes,
            "reserve": reserve,
            "hot_fraction": ep.hot_fraction,
        }
        for m in METRICS:
            row[m] = _mean_std([r[m] for r in by[n]])
        tot_dl = sum(r["deadline_jobs"] for r in by[n])
        row["misses_total"] = sum(r["misses"] for r in by[n])
        row["hi_misses_total"] = sum(r["hi_misses"] for r in by[n])
        row["deadline_jobs_total"] = tot_dl
        row["hi_jobs_total"] = sum(r["hi_jobs"] for r in by[n])
        row.update(miss_ratios(by[n]))
        row["infeasible_mixes"] = sum(1 for r in by[n] if r["deadlines_infeasible"])
        row["misses_on_infeasible"] = sum(r["misses"] for r in by[n] if r["deadlines_infeasible"])
        summary.append(row)
    ratios = []
    for n in names:
        if not n.startswith("hidvfs"):
            continue
        for b in names:
            if b == n or b.startswith("hidvfs"):
                continue
            row = {"kind": "ratio", "board": board, "policy": n, "baseline": b}
            for m in ("makespan_s", "energy_j", "cpu_energy_j", "edp"):
                xs = [
                    a[m] / c[m]
                    for a, c in zip(by[n], by[b])
                    if a[m] is not None and c[m] not in (None, 0)
                ]
                row[m] = _mean_std(xs)
            ratios.append(row)
    return records, summary, ratios


def episode_options(f=None, *, hi_note: str = " (see --reserve)"):
    """The mix options eval and sweep share: jobs per mix, offered load, HI share and the
    deadline slack (the defaults are the mixes the agents train and are measured on).
    ``hi_note`` ends the --hi-fraction help (sweep has no --reserve)."""
    if f is None:
        return lambda g: episode_options(g, hi_note=hi_note)
    f = click.option(
        "--hot-fraction",
        type=FiniteFloatRange(0.0, 1.0),
        default=EpisodeSpec.hot_fraction,
        show_default=True,
        help="share of the mixes that start on a hot board (ambient 25-45 C, soaked between "
        f"{HOT_START_LO:g} x and {HOT_START_BELOW_TRIP_C:g} C below its passive trip); 0: idle "
        "at 25 C",
    )(f)
    f = click.option(
        "--hi-fraction",
        type=FiniteFloatRange(0.0, 1.0),
        default=EpisodeSpec.hi_fraction,
        show_default=True,
        help="share of the deadline jobs that are high-criticality" + hi_note,
    )(f)
    f = click.option(
        "--load",
        type=FiniteFloatRange(0.05, 4.0),
        default=EpisodeSpec.load,
        show_default=True,
        help="offered load: the jobs' reference work over the board's capacity while they arrive",
    )(f)
    f = click.option(
        "--slack",
        type=FiniteFloatRange(1.0),
        default=1.5,
        show_default=True,
        help="deadline = SLACK x the job's reference makespan",
    )(f)
    return click.option(
        "--jobs",
        "n_jobs",
        type=click.IntRange(1),
        default=5,
        show_default=True,
        help="jobs per mix",
    )(f)


@agents.command("eval")
@click.option(
    "--board",
    "boards",
    required=True,
    help="board name(s), comma-separated, or all",
    metavar="BOARDS",
)
@click.option(
    "--policy",
    "policies",
    default=",".join(BASE_EVAL),
    show_default=True,
    help="policies compared side by side on the same mixes, comma-separated",
    metavar="POLICIES",
)
@click.option(
    "--seeds",
    type=click.IntRange(1, 50_000),
    default=5,
    show_default=True,
    help="mixes compared (held-out seeds 900000 + i: at most 50000, below the shield's "
    "coverage mixes; tuning seeds 700100 + i: at most 900)",
)
@click.option(
    "--ablations/--no-ablations",
    default=True,
    show_default=True,
    help=f"with hidvfs in --policy, also run {', '.join(ABLATIONS)}",
)
@click.option(
    "--mixes",
    type=click.Choice(["held-out", "tuning"]),
    default="held-out",
    show_default=True,
    help="held-out: the evaluation mixes (900000 + i); tuning: the mixes training settings "
    "are chosen on (700100 + i, never held out)",
)
@click.option(
    "--reserve/--no-reserve",
    default=False,
    show_default=True,
    help="run every policy as the daemon does with mixed_criticality.reserve: its stages plan "
    "around the clusters HI jobs reserve, then the reservation (the agents train without it)",
)
@episode_options
@click.option("--models", default=None, help=MODELS_HELP, metavar="ROOT")
@click.option(
    "--json", "as_json", is_flag=True, help="print run, summary and ratio rows as a JSON list"
)
@stops_on_signals
def eval_cmd(
    boards,
    policies,
    seeds,
    ablations,
    mixes,
    reserve,
    n_jobs,
    slack,
    load,
    hi_fraction,
    hot_fraction,
    models,
    as_json,
) -> None:
    """Held-out mixes: makespan, energy, EDP, miss ratio, peak temperature; ratios; ablations.

    Makespan, energy, EDP and peak temperature are mean ± std over the mixes; the deadline-miss
    ratio is pooled over every deadline job, in all and per criticality (hi, lo), with its
    Clopper-Pearson 95 % interval.

    Energy is metered from the start of a run to its last job's finish (EDP = that energy x
    the makespan, first release to last finish)."""
    from agents.learned import model_dir

    # policy names are case-insensitive (as make_policy takes them): one spelling each, so
    # --models, the ablations and the ratios apply whatever the case
    names = list(dict.fromkeys(p.strip().lower() for p in policies.split(",") if p.strip()))
    if not names:
        fail(f"--policy names no policy (e.g. {','.join(BASE_EVAL)})")
    if ablations and "hidvfs" in names:
        names += [a for a in ABLATIONS if a not in names]
    from agents.train import MAX_TUNING_MIXES, TUNING_SEEDS

    if mixes == "tuning" and seeds > MAX_TUNING_MIXES:
        last = TUNING_SEEDS + MAX_TUNING_MIXES - 1
        fail(
            f"--mixes tuning has {MAX_TUNING_MIXES} mixes ({TUNING_SEEDS}-{last}, the rest of "
            f"seed 0's validation block); --seeds {seeds} asks for more"
        )
    ep = EpisodeSpec(
        n_jobs=n_jobs, slack=slack, load=load, hi_fraction=hi_fraction, hot_fraction=hot_fraction
    )
    todo = _boards(boards)
    if models:  # every board's models first: no board's table before another's refusal
        from platforms.spec import load_board

        learned = [n for n in names if n.startswith("hidvfs") or n in ("geardvfs", "ztt")]
        for b in todo:
            model_dir(b, models)
            spec = load_board(b)
            for n in learned:
                _build(n, spec, models)
    out = []
    for b in todo:
        recs, summ, rat = evaluate(b, names, seeds, ep, models, mixes=mixes, reserve=reserve)
        out.extend(recs + summ + rat)
        if not as_json:
            _print_table(b, summ, rat)
    if as_json:
        emit_json(out)


@agents.command("sweep")
@click.option(
    "--board",
    "boards",
    required=True,
    help="board name(s), comma-separated, or all",
    metavar="BOARDS",
)
@click.option(
    "--fractions",
    default="1.0,0.9,0.8,0.7,0.6,0.5",
    show_default=True,
    help="fixed operating points, as fractions of each busy cluster's table maximum",
    callback=not_empty,
)
@click.option(
    "--seeds",
    type=click.IntRange(1, 50_000),
    default=5,
    show_default=True,
    help="held-out mixes (900000 + i: at most 50000, below the shield's coverage mixes)",
)
@episode_options(hi_note=" (sweep runs without the daemon's cluster reservation)")
@click.option("--json", "as_json", is_flag=True, help="print the rows as JSON")
@stops_on_signals
def sweep_cmd(
    boards, fractions, seeds, n_jobs, slack, load, hi_fraction, hot_fraction, as_json
) -> None:
    """What a frequency policy can save: fixed operating points against maxfreq, same mixes,
    and the floor no policy that meets every deadline can go below
    (platforms/sim/energy_floor.py; per mix, from maxfreq's executed jobs)."""
    from agents.governors import make_governor
    from agents.static import StaticFraction
    from agents.train import EVAL_SEEDS
    from platforms.sim.energy_floor import episode_energy_floor
    from platforms.spec import load_board

    try:
        xs = [float(x) for x in fractions.split(",") if x.strip()]
        pols = [make_governor("maxfreq")]
        for x in xs:  # one row per point: records are keyed by the name it prints as
            p = StaticFraction(x)
            if all(q.name != p.name for q in pols):
                pols.append(p)
    except ValueError as exc:
        fail(f"bad --fractions {fractions!r}: {exc}")
    ep = EpisodeSpec(
        n_jobs=n_jobs, slack=slack, load=load, hi_fraction=hi_fraction, hot_fraction=hot_fraction
    )
    rows = []
    for b in _boards(boards):
        run = make_runner(b, ep)
        spec = load_board(b)
        recs: dict[str, list[dict]] = {p.name: [] for p in pols}
        floors = []
        for i in range(seeds):
            s = EVAL_SEEDS + i
            items = episode_items(b, s, ep)
            for p in pols:
                res = run(p, items, s)
                recs[p.name].append(_record(b, p.name, s, res, ep))
                if p.name == "maxfreq":
                    floors.append(episode_energy_floor(spec, _floor_jobs(res)))
        base = recs["maxfreq"]
        for p in pols:
            rs = recs[p.name]
            row = {"board": b, "policy": p.name, "seeds": seeds}
            for m in ("makespan_s", "energy_j", "cpu_energy_j", "edp"):
                row[m] = sum(r[m] for r in rs) / len(rs)
            row["energy_vs_maxfreq"] = row["energy_j"] / (sum(r["energy_j"] for r in base) / seeds)
            row["cpu_energy_vs_maxfreq"] = row["cpu_energy_j"] / (
                sum(r["cpu_energy_j"] for r in base) / seeds
            )
            # per mix, then the mean, as agents eval's ratio rows
            row["edp_vs_maxfreq"] = _mean_std(
                [r["edp"] / c["edp"] for r, c in zip(rs, base) if r["edp"] and c["edp"]]
            )[0]
            row["misses"] = sum(r["misses"] for r in rs)
            row["deadline_jobs"] = sum(r["deadline_jobs"] for r in rs)
            rows.append(row)
        rows.append(_floor_row(b, floors, base))
    if as_json:
        emit_json(rows)
        return
    for r in rows:
        if r["policy"] == "floor":
            click.echo(
                f"{r['board']:9s} {'floor':12s} episode >= {r['episode_min_s']:.3f}s "
                f"energy >= {r['energy_j']:.2f}J ({r['energy_vs_maxfreq'] - 1:+.1%}) "
                f"CPU >= {r['cpu_energy_j']:.2f}J ({r['cpu_energy_vs_maxfreq'] - 1:+.1%}) "
                f"(no policy meeting every deadline spends less; at most saved per mix: board "
                f"{r['board_ceiling_min']:.1%}-{r['board_ceiling_max']:.1%}, CPU "
                f"{r['cpu_ceiling_min']:.1%}-{r['cpu_ceiling_max']:.1%})"
            )
            continue
        click.echo(
            f"{r['board']:9s} {r['policy']:12s} makespan {r['makespan_s']:.3f}s "
            f"energy {r['energy_j']:.2f}J ({r['energy_vs_maxfreq'] - 1:+.1%}) "
            f"CPU {r['cpu_energy_j']:.2f}J ({r['cpu_energy_vs_maxfreq'] - 1:+.1%}) "
            f"EDP x{r['edp_vs_maxfreq']:.3f} misses {r['misses']}/{r['deadline_jobs']}"
        )


def _floor_jobs(res) -> list:
    """The episode's jobs as the energy floor wants them: executed DAGs, absolute deadlines."""
    from platforms.sim.energy_floor import FloorJob

    return [
        FloorJob(
            j.release_t,
            res.executed_dags[j.pid],
            None if j.deadline_s is None else j.release_t + j.deadline_s,
        )
        for j in res.jobs
    ]


def _floor_row(board: str, floors: list, base: list[dict]) -> dict:
    """The sweep's "floor" row: mean floors over the mixes and the per-mix saving ceilings
    against maxfreq (its ratios are of the means, as the other rows')."""
    n = len(floors)
    ceil = [f.saving_ceiling(r["energy_j"], r["cpu_energy_j"]) for f, r in zip(floors, base)]
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    return {
        "board": board,
        "policy": "floor",
        "seeds": n,
        "makespan_s": None,
        "episode_min_s": mean([f.t_min_s for f in floors]),
        "energy_j": mean([f.total_j for f in floors]),
        "cpu_energy_j": mean([f.cpu_j for f in floors]),
        "edp": None,
        "energy_vs_maxfreq": mean([f.total_j for f in floors])
        / mean([r["energy_j"] for r in base]),
        "cpu_energy_vs_maxfreq": mean([f.cpu_j for f in floors])
        / mean([r["cpu_energy_j"] for r in base]),
        "board_ceiling_min": min(c[0] for c in ceil),
        "board_ceiling_max": max(c[0] for c in ceil),
        "cpu_ceiling_min": min(c[1] for c in ceil),
        "cpu_ceiling_max": max(c[1] for c in ceil),
        "deadlines_assumed_met": all(f.deadlines for f in floors),
        "misses": 0,
        "deadline_jobs": sum(r["deadline_jobs"] for r in base),
    }


def _fmt(ms: tuple[float, float], digits: int = 3) -> str:
    m, s = ms
    return f"{m:.{digits}f}±{s:.{digits}f}"


def _ratio_ci(ratio: float | None, ci: list[float] | None) -> str:
    if ratio is None or ci is None:
        return "no deadlines"
    return f"{ratio:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]"


def _print_table(board, summary, ratios) -> None:
    click.echo(f"\n== {board} ==")
    click.echo(
        f"{'policy':18s} {'makespan s':>14s} {'energy J':>14s} {'CPU energy J':>14s} "
        f"{'EDP J·s':>14s} "
        f"{'misses':>9s} {'miss ratio [95% CI]':>22s} {'HI misses':>10s} {'peak C':>12s} "
        f"{'capped s':>10s}"
    )
    for r in summary:
        misses = f"{r['misses_total']}/{r['deadline_jobs_total']}"
        hi = f"{r['hi_misses_total']}/{r['hi_jobs_total']}"
        click.echo(
            f"{r['policy']:18s} {_fmt(r['makespan_s']):>14s} {_fmt(r['energy_j'], 2):>14s} "
            f"{_fmt(r['cpu_energy_j'], 2):>14s} {_fmt(r['edp'], 2):>14s} "
            f"{misses:>9s} {_ratio_ci(r['miss_ratio'], r['miss_ci95']):>22s} {hi:>10s} "
            f"{_fmt(r['peak_temp_c'], 1):>12s} {_fmt(r['capped_s'], 2):>10s}"
        )
    if summary and summary[0].get("reserve"):
        click.echo("with the daemon's mixed-criticality reservation (--reserve)")
    if summary and summary[0].get("hot_fraction"):
        click.echo(
            f"{summary[0]['hot_fraction']:.0%} of the mixes start on a hot board (--hot-fraction)"
        )
    if summary and summary[0]["infeasible_mixes"]:
        k, n = summary[0]["infeasible_mixes"], summary[0]["seeds"]
        avoidable = ", ".join(
            f"{r['policy']} {r['misses_total'] - r['misses_on_infeasible']}" for r in summary
        )
        click.echo(
            f"{k} of {n} mixes overload a window: no policy meets every deadline there "
            f"(platforms/sim/feasibility.py). Misses on the other mixes: {avoidable}"
        )
    click.echo("ratios (per seed, policy / baseline):")
    for r in ratios:
        click.echo(
            f"  {r['policy']:18s} / {r['baseline']:10s} makespan {_fmt(r['makespan_s'])} "
            f"energy {_fmt(r['energy_j'])} CPU energy {_fmt(r['cpu_energy_j'])} "
            f"EDP {_fmt(r['edp'])}"
        )


COMMAND = agents
