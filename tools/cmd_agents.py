"""``hidvfs agents train|check|eval|sweep``: train the learned policies in the simulator,
verify the shipped ONNX files, compare policies on held-out job mixes, and sweep fixed
operating points.

The commands parse options, call the layers above and print. The simulated episodes the agents
train and are evaluated on (the glue between ``agents/`` and ``bots_bench`` the layering asks
for) are :mod:`tools.agents_episodes`; the evaluation behind ``eval`` and ``sweep`` is
:mod:`tools.agents_eval`.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import click

from tools.agents_episodes import (
    HOT_START_BELOW_TRIP_C,
    HOT_START_LO,
    TRAIN_HOT_FRACTION,
    EpisodeSpec,
    episode_items,
    make_runner,
)
from tools.agents_eval import (
    ABLATIONS,
    BASE_EVAL,
    RATIO_METRICS,
    build_policy,
    evaluate,
    floor_jobs,
    floor_row,
    mean_std,
    run_row,
)
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
    cfg = TrainConfig.for_board(board, episodes=episodes, period_s=ep.period_s, **overrides)
    # decided on the settings, not on which options were given: a default given explicitly
    # (`--calib-episodes 256`) reproduces the shipped models as well
    reproduces_shipped = (
        seed == 0
        and set(pols) == set(TRAINABLE)
        and n_jobs == DEFAULT_JOBS
        and hot_fraction == TRAIN_HOT_FRACTION
        and cfg == TrainConfig.for_board(board, episodes=DEFAULT_EPISODES, period_s=ep.period_s)
    )
    if out_dir is None and not reproduces_shipped:
        raise click.UsageError(
            f"--out is needed: {out} holds the shipped models, and only the run that "
            f"reproduces them (`hidvfs agents train --board {board}` with every other setting "
            "at its default) writes there by default"
        )
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
    default=None,
    help="board name(s) to check, comma-separated, or all  [default: all; with --models, the "
    "boards the folder holds models for: the board its manifest.json names, or those of its "
    "BOARD subfolders]",
    metavar="BOARDS",
)
@click.option("--models", default=None, help=MODELS_HELP, metavar="ROOT")
@click.option("--json", "as_json", is_flag=True, help="print one report per board as JSON")
def check_cmd(boards, models, as_json) -> None:
    """Verify each ONNX file loads, matches its training-time outputs to 1e-5 (relative where
    an output exceeds 1 in magnitude) and the daemon's observation schema."""
    from agents.learned import check_board, folder_boards

    todo = _boards(boards or "all")
    if models and not os.path.isdir(models):
        # a mistyped path is not a board without models: "run agents train" would mislead
        what = "not a folder" if os.path.exists(models) else "no such folder"
        fail(f"--models {models}: {what}")
    if models and boards is None:
        # a folder `agents train --out DIR` wrote holds one board's models: checking the
        # others failed a folder that is fine. None found (no manifest): every board, each
        # then told what is missing
        held = folder_boards(models)
        todo = [b for b in todo if b in held] or todo
    reports = [check_board(b, models if models else None) for b in todo]
    if as_json:
        emit_json(reports)
    else:
        for r in reports:
            for f in r["files"]:
                if f.get("skipped"):  # a trial folder's policy it never trained
                    click.echo(f"{r['board']:9s} {f['file']:32s} -- {f['skipped']}")
                    continue
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
@click.option(
    "--rt-cover-rules/--no-rt-cover-rules",
    default=False,
    show_default=True,
    help="actuate as the daemon does on a board: no job SCHED_FIFO on every online CPU, nor "
    "the real-time jobs together on all of them; a job that loses SCHED_FIFO so runs "
    "SCHED_OTHER, best-effort jobs on its CPUs niced below it (off: the simulated board runs "
    "each decision as given)",
)
@episode_options
@click.option("--models", default=None, help=MODELS_HELP, metavar="ROOT")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="print run, summary and ratio rows as a JSON list (metrics as [mean, std]; a ratio "
    "row's METRIC_se is the standard error of the mean, METRIC_n its mixes)",
)
@stops_on_signals
def eval_cmd(
    boards,
    policies,
    seeds,
    ablations,
    mixes,
    reserve,
    rt_cover_rules,
    n_jobs,
    slack,
    load,
    hi_fraction,
    hot_fraction,
    models,
    as_json,
) -> None:
    """Held-out mixes: makespan, energy, EDP, miss ratio, peak temperature; ratios; ablations.

    Makespan, energy, EDP, peak temperature and capped time are mean ± std over the mixes (the
    sample standard deviation; one mix has no spread: n=1); the deadline-miss ratio is pooled
    over every deadline job, in all and per criticality (hi, lo), with its Clopper-Pearson
    95 % interval.

    Ratios (hidvfs and its ablations over each baseline) are taken per mix and printed as
    mean ± s.e., the standard error of their mean (std / sqrt(n), the "±" agents/TRAINING.md
    quotes), with their std over the mixes in brackets. In --json every metric is [mean, std];
    a ratio row also holds METRIC_se (the standard error) and METRIC_n (its mixes).

    Energy is metered from the start of a run to its last job's finish (EDP = that energy x
    the makespan, first release to last finish)."""
    from agents.learned import model_dir

    # policy names are case-insensitive (as make_policy takes them): one spelling each, so
    # --models, the ablations and the ratios apply whatever the case
    names = list(dict.fromkeys(p.strip().lower() for p in policies.split(",") if p.strip()))
    if not names:
        fail(f"--policy names no policy (e.g. {','.join(BASE_EVAL)})")
    given = list(names)
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

        learned = [n for n in names if _trained_as(n)]
        for b in todo:
            folder = model_dir(b, models)
            spec = load_board(b)
            for n in learned:
                try:
                    build_policy(n, spec, models)
                except FileNotFoundError as err:
                    # a trial folder (`agents train --policy hidvfs --out DIR`) lacks the
                    # default list's baselines and ablations: say what it holds
                    hint = _untrained_hint(folder, given, names)
                    fail(f"{err}; {hint}" if hint else str(err))
    out = []
    for b in todo:
        recs, summ, rat = evaluate(
            b, names, seeds, ep, models, mixes=mixes, reserve=reserve, rt_cover_rules=rt_cover_rules
        )
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
                recs[p.name].append(run_row(b, p.name, s, res, ep))
                if p.name == "maxfreq":
                    floors.append(episode_energy_floor(spec, floor_jobs(res)))
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
            row["edp_vs_maxfreq"] = mean_std(
                [r["edp"] / c["edp"] for r, c in zip(rs, base) if r["edp"] and c["edp"]]
            )[0]
            row["misses"] = sum(r["misses"] for r in rs)
            row["deadline_jobs"] = sum(r["deadline_jobs"] for r in rs)
            rows.append(row)
        rows.append(floor_row(b, floors, base))
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


def _fmt(ms: tuple[float, float], digits: int = 3) -> str:
    """``mean±std``; the mean alone when the spread is undefined (one mix), "-" for none."""
    m, s = ms
    if m is None or not math.isfinite(m):
        return "-"
    if s is None or not math.isfinite(s):
        return f"{m:.{digits}f}"
    return f"{m:.{digits}f}±{s:.{digits}f}"


#: ratios to 4 decimals (agents/TRAINING.md quotes 0.9985, 1.0014)
RATIO_DIGITS = 4


def _fmt_ratio(r: dict, m: str, n: int) -> str:
    """A ratio cell: ``mean±s.e. [std]``; the mean alone for one mix; ``n=K`` when fewer
    than the table's ``n`` mixes gave the ratio (a run that did not finish)."""
    (mean, sd), se, k = r[m], r.get(f"{m}_se"), r.get(f"{m}_n", n)
    if mean is None or not math.isfinite(mean):
        return "-"
    d = RATIO_DIGITS
    text = f"{mean:.{d}f}"
    if se is not None and math.isfinite(se):
        text += f"±{se:.{d}f} [{sd:.{d}f}]"
    if k != n:
        text += f" n={k}"
    return text


def _spread_legend(n: int) -> str:
    if n == 1:
        return "one mix (n=1): its values, no spread"
    return f"mean ± std over {n} mixes"


def _ratio_ci(ratio: float | None, ci: list[float] | None) -> str:
    if ratio is None or ci is None:
        return "no deadlines"
    return f"{ratio:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]"


def _print_table(board, summary, ratios) -> None:
    n = summary[0]["seeds"] if summary else 0
    click.echo(f"\n== {board} ==")
    click.echo(
        f"makespan, energy, EDP, peak C, capped s: {_spread_legend(n)}; misses: pooled over "
        "every deadline job"
    )
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
    if summary and summary[0].get("rt_cover_rules"):
        off = ", ".join(
            f"{r['policy']} {r['cover_jobs_total']} ({r['cover_hi_jobs_total']} HI)"
            for r in summary
        )
        click.echo(
            "with the board's real-time cover rules (--rt-cover-rules); jobs run SCHED_OTHER "
            f"though decided SCHED_FIFO: {off}"
        )
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
    if not ratios:  # no hidvfs variant in --policy
        return
    if n == 1:
        click.echo("ratios (policy / baseline) on one mix (n=1): no spread")
    else:
        click.echo(
            f"ratios (per mix, policy / baseline): mean±s.e. [std] over {n} mixes; s.e. is the "
            "standard error of the mean (std / sqrt(n))"
        )
    w = 3 * (2 + RATIO_DIGITS) + 4  # 1.0061±0.0006 [0.0060]
    labels = {"makespan_s": "makespan", "energy_j": "energy", "cpu_energy_j": "CPU energy"}
    click.echo(
        f"  {'policy':18s} / {'baseline':10s} "
        + " ".join(f"{labels.get(m, m.upper()):{w}s}" for m in RATIO_METRICS).rstrip()
    )
    for r in ratios:
        click.echo(
            f"  {r['policy']:18s} / {r['baseline']:10s} "
            + " ".join(f"{_fmt_ratio(r, m, n):{w}s}" for m in RATIO_METRICS).rstrip()
        )


def _trained_as(name: str) -> str | None:
    """The trained policy (agents train --policy) an eval policy's models come from; None for
    the ones without models (governors, fixed points)."""
    if name == "hidvfs-noshaping":
        return "noshaping"
    if name.startswith("hidvfs"):
        return "hidvfs"
    return name if name in ("geardvfs", "ztt") else None


def _untrained_hint(folder: Path, given: list[str], names: list[str]) -> str | None:
    """What to run instead when eval's policies ask for models ``folder`` never trained (its
    manifest's ``policies``): --policy naming what it holds, --no-ablations. None when every
    policy's models are listed (the missing file is another fault) or the manifest is
    unreadable or lists no policies (the loader says what is wrong)."""
    import json

    try:
        pols = json.loads((folder / "manifest.json").read_text()).get("policies")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(pols, dict):  # a manifest from before per-policy entries: unknown
        return None
    held = set(pols)
    missing = [n for n in names if _trained_as(n) and _trained_as(n) not in held]
    if not missing:
        return None
    asked = [n for n in missing if n in given]  # the rest: ablations --ablations added
    keep = [n for n in given if n not in asked]
    if not keep:
        keep = [p for p in ("hidvfs", "geardvfs", "ztt") if p in held] + ["maxfreq"]
    fix = []
    if asked:
        fix.append(f"--policy {','.join(keep)}")
    if "hidvfs" in keep and any(n in ABLATIONS and n not in given for n in missing):
        fix.append("--no-ablations")
    lacks = ", ".join(dict.fromkeys(_trained_as(n) for n in missing))
    holds = ", ".join(p for p in TRAINABLE if p in held) or "no policy"
    return (
        f"{folder} holds the models of {holds} only (its manifest's policies), not {lacks}: "
        f"run with {' '.join(fix)}"
    )


COMMAND = agents
