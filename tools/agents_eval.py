"""Side-by-side evaluation of policies on the same simulated mixes, behind ``hidvfs agents
eval`` and ``sweep``: the policies built by name (with the hidvfs ablations), one row per run,
the pooled deadline-miss ratios, mean ± std summaries, per-mix ratios (mean, std and the
standard error of the mean), and the energy floor's row.

It stands apart from the commands (:mod:`tools.cmd_agents`), which parse options and print
these rows, so the numbers are computed (and tested) without click. It runs the episodes of
:mod:`tools.agents_episodes`, which never imports it.
"""

from __future__ import annotations

import math

from tools.agents_episodes import EpisodeSpec, episode_items, make_runner

BASE_EVAL = ("hidvfs", "geardvfs", "ztt", "schedutil", "maxfreq")
ABLATIONS = ("hidvfs-noshield", "hidvfs-nogate", "hidvfs-noshaping")
#: energy_j is the whole board (the plant's VDD_IN); cpu_energy_j the CPU rail alone (what DVFS
#: controls; on the RUBIK Pi 3, which has no monitor, the plant's CPU energy)
#: capped_s: time some cluster's frequency was capped for temperature, by the daemon's thermal
#: guard or the kernel's throttling (hot starts)
METRICS = ("makespan_s", "energy_j", "cpu_energy_j", "edp", "peak_temp_c", "capped_s")
#: the per-mix ratios of a hidvfs variant over each baseline: in JSON each is [mean, std over
#: the mixes] with METRIC_se (the standard error of the mean) and METRIC_n (the mixes) beside
RATIO_METRICS = ("makespan_s", "energy_j", "cpu_energy_j", "edp")


def build_policy(name: str, spec, models):
    """The policy ``name`` of eval's list (an ablation is hidvfs with one stage off), with
    the learned ones loaded from ``models``."""
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


def run_row(board, policy, seed, res, ep: EpisodeSpec, overload=None) -> dict:
    """One run's row; ``overload``: the mix's densest window (platforms.sim.feasibility)."""
    dl = [j for j in res.jobs if j.deadline_s is not None]
    miss = sum(1 for j in dl if not j.deadline_met)
    hi_miss = sum(1 for j in dl if not j.deadline_met and j.criticality == "hi")
    ms = res.makespan_s
    dropped = set(res.fifo_dropped_jobs)
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
        # the board's real-time cover rules (--rt-cover-rules): ticks in which a job the
        # decision gave SCHED_FIFO ran SCHED_OTHER, such jobs (HI ones apart), and the
        # best-effort jobs niced below one; all 0 without the rules
        "cover_ticks": res.fifo_dropped_ticks,
        "cover_jobs": len(res.fifo_dropped_jobs),
        "cover_hi_jobs": sum(1 for j in res.jobs if j.pid in dropped and j.criticality == "hi"),
        "cover_niced_jobs": len(res.niced_below_jobs),
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


def mean_std(xs: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (ddof 1) of the finite values: NaN, NaN when none,
    and a NaN standard deviation for one value (undefined; it was 0.0, printed "±0.000")."""
    m, sd, _, _ = mean_std_se(xs)
    return m, sd


def mean_std_se(xs: list[float]) -> tuple[float, float, float, int]:
    """Mean, sample standard deviation, standard error of the mean (std / sqrt(n)) and n of
    the finite values; the spreads are NaN below two values."""
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    n = len(xs)
    if not n:
        return math.nan, math.nan, math.nan, 0
    m = sum(xs) / n
    if n < 2:
        return m, math.nan, math.nan, n
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1))
    return m, sd, sd / math.sqrt(n), n


def evaluate(
    board: str,
    names: list[str],
    seeds: int,
    ep: EpisodeSpec,
    models=None,
    log=None,
    mixes: str = "held-out",
    reserve: bool = False,
    rt_cover_rules: bool = False,
):
    """Side-by-side runs of every policy on the same mixes (held-out, or the tuning mixes
    training settings are chosen on); records and summary. ``reserve``: every policy runs
    with the daemon's mixed-criticality reservation (:func:`agents.mixed.daemon_stages`).
    ``rt_cover_rules``: the decisions are actuated under the real-time cover rules the daemon
    applies on a board (:func:`daemon.simrun.run_sim`)."""
    from agents.train import EVAL_SEEDS, TUNING_SEEDS
    from platforms.sim.feasibility import worst_window
    from platforms.spec import load_board

    first = TUNING_SEEDS if mixes == "tuning" else EVAL_SEEDS

    spec = load_board(board)
    run = make_runner(board, ep, reserve, kernel_rates=True, rt_cover_rules=rt_cover_rules)
    records = []
    policies = {n: build_policy(n, spec, models) for n in names}
    for i in range(seeds):
        s = first + i
        items = episode_items(board, s, ep)
        overload = None
        for n, pol in policies.items():
            res = run(pol, items, s)
            if overload is None:  # the executed DAGs are the same under every policy
                overload = worst_window(spec, floor_jobs(res))
            records.append(run_row(board, n, s, res, ep, overload))
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
            "rt_cover_rules": rt_cover_rules,
            "hot_fraction": ep.hot_fraction,
        }
        for m in METRICS:
            row[m] = mean_std([r[m] for r in by[n]])
        tot_dl = sum(r["deadline_jobs"] for r in by[n])
        row["misses_total"] = sum(r["misses"] for r in by[n])
        row["hi_misses_total"] = sum(r["hi_misses"] for r in by[n])
        row["deadline_jobs_total"] = tot_dl
        row["hi_jobs_total"] = sum(r["hi_jobs"] for r in by[n])
        row.update(miss_ratios(by[n]))
        for k in ("cover_ticks", "cover_jobs", "cover_hi_jobs", "cover_niced_jobs"):
            row[f"{k}_total"] = sum(r[k] for r in by[n])
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
            for m in RATIO_METRICS:
                xs = [
                    a[m] / c[m]
                    for a, c in zip(by[n], by[b])
                    if a[m] is not None and c[m] not in (None, 0)
                ]
                mean, sd, se, k = mean_std_se(xs)
                # [mean, std over the mixes] (as the summary rows), and apart the standard
                # error of the mean, the "±" the docs quote, and the mixes it is over
                row[m] = (mean, sd)
                row[f"{m}_se"] = se
                row[f"{m}_n"] = k
            ratios.append(row)
    return records, summary, ratios


def floor_jobs(res) -> list:
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


def floor_row(board: str, floors: list, base: list[dict]) -> dict:
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
