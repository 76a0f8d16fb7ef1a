"""Simulated BOTS campaigns: each kernel alone on the simulated board under each policy/seed.

Every run goes through the real control loop (``daemon.simrun``); the run record is the one of
DESIGN.md, with the makespan bounds computed from the job's DAG at the board's fastest point.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from bots_bench.reference import measure_reference
from daemon.simrun import run_sim
from platforms import bounds
from platforms.dag import DAG
from platforms.sim.plant import SimJob
from platforms.spec import BoardSpec, load_board


@dataclass(frozen=True)
class SimRunConfig:
    bench: str
    cls: str
    policy: str
    seed: int
    board: str
    deadline_slack: float | None = None
    rep: int = 0
    deadline_s: float | None = None  # absolute deadline (a spec's deadline_s); slack wins
    #: the BOTS build the run stands for (a registry name: omp-tasks, for-omp-tasks, serial
    #: ...); its DAG model is ``bots_bench.dags.model_variant``
    variant: str = "omp-tasks"

    @property
    def key(self) -> tuple:
        return (
            self.bench,
            self.cls,
            self.policy,
            self.seed,
            self.board,
            "sim",
            self.rep,
            self.deadline_slack,
            self.variant,
        )


def makespan_bounds(dag: DAG, spec: BoardSpec) -> tuple[float, float]:
    """(lower, Graham upper) for the job alone with every core at its top frequency.

    A heterogeneous board is bracketed by homogeneous ones: the lower bound takes every core
    as fast as the fastest cluster, Graham's bound every core as slow as the slowest.
    """
    m = spec.ncpus
    fast = max(spec.clusters, key=lambda c: c.capacity * c.fmax_khz)
    slow = min(spec.clusters, key=lambda c: c.capacity * c.fmax_khz)
    lower = bounds.lower_bound(dag, fast.fmax_khz * 1e3, fast.capacity, m)
    upper = bounds.graham_bound(dag, slow.fmax_khz * 1e3, slow.capacity, m)
    return lower, upper


def mix_lower_bound(jobs: list[tuple[float, DAG]], spec: BoardSpec) -> float:
    """A makespan (first release to last finish) no schedule of the mix can beat, with every
    core as fast as the fastest cluster at its top: the larger of each job's own lower bound
    after its release, and, from each release on, the work released from then over all the
    cores. ``jobs``: (release time s, executed DAG)."""
    if not jobs:
        return 0.0
    m = spec.ncpus
    fast = max(spec.clusters, key=lambda c: c.capacity * c.fmax_khz)
    f_hz = fast.fmax_khz * 1e3
    first = min(r for r, _ in jobs)
    own = max(r + bounds.lower_bound(d, f_hz, fast.capacity, m) for r, d in jobs)
    work = sorted((r, d.work_span(f_hz, fast.capacity)[0]) for r, d in jobs)
    later, fill = 0.0, 0.0
    for r, c in reversed(work):  # the work released at r or after, over m cores from r
        later += c
        fill = max(fill, r + later / m)
    return max(own, fill) - first


def run_one(cfg: SimRunConfig, build_policy: Callable) -> dict:
    """One simulated run -> a run record (``ok`` False with ``error`` on failure). The job
    is the DAG model of ``cfg.variant``'s build, and so is its reference profile."""
    from bots_bench.dags import generate, model_variant

    spec = load_board(cfg.board)
    rec = {
        "bench": cfg.bench,
        "class": cfg.cls,
        "policy": cfg.policy,
        "seed": cfg.seed,
        "board": cfg.board,
        "backend": "sim",
        "rep": cfg.rep,
        "makespan_s": None,
        "energy_j": None,
        "cpu_energy_j": None,
        "edp": None,
        "peak_temp_c": None,
        "deadline_s": None,
        "deadline_met": None,
        "lower_bound_s": None,
        "graham_bound_s": None,
        "ok": False,
        "error": None,
    }
    t0 = time.perf_counter()
    try:
        model = model_variant(cfg.bench, cfg.variant)
        dag = generate(cfg.bench, cfg.cls, seed=cfg.seed, variant=model)
        profile = measure_reference(cfg.board, cfg.bench, cfg.cls, cfg.seed, model)
        deadline = (
            cfg.deadline_slack * profile.ref_makespan_s if cfg.deadline_slack else cfg.deadline_s
        )
        job = SimJob(
            dag=dag,
            name=f"{cfg.bench}.{cfg.cls}",
            deadline_s=deadline,
            criticality="lo",
            release_t=0.0,
        )
        policy, stages = build_policy(cfg.policy, spec)
        res = run_sim(
            cfg.board, policy, [(job, profile)], seed=cfg.seed, stages=stages, history_every_s=0.05
        )
        jr = res.jobs[0]
        if jr.finish_t is None:
            raise RuntimeError(f"job did not finish within {res.t_end:.0f} s of simulated time")
        lower, upper = makespan_bounds(res.executed_dags.get(jr.pid, dag), spec)
        energy, cpu_energy = res.jobs_energy()  # to the job's finish, as a native run meters
        rec.update(
            makespan_s=jr.makespan_s,
            energy_j=energy,
            cpu_energy_j=cpu_energy,
            edp=energy * jr.makespan_s,
            peak_temp_c=res.peak_temp_c,
            deadline_s=deadline,
            deadline_met=jr.deadline_met,
            criticality="lo" if deadline is not None else None,  # as the job ran
            lower_bound_s=lower,
            graham_bound_s=upper,
            ok=True,
            ref_makespan_s=profile.ref_makespan_s,
            tasks=dag.n,
            ticks=res.ticks,
            interventions=res.interventions,
            series=res.history,
        )
    except Exception as err:  # noqa: BLE001 - a failed run is recorded, the campaign goes on
        rec["error"] = f"{type(err).__name__}: {err}"
    rec["wall_s"] = time.perf_counter() - t0
    return rec


#: the three measures of the table: makespan, whole-board energy, CPU-rail energy
_MEASURES = (
    ("makespan_s", "time/s", "t", ".3f"),
    ("energy_j", "E/J", "E", ".2f"),
    ("cpu_energy_j", "Ecpu/J", "Ecpu", ".2f"),
)


def _per_seed(rows: list[dict], key: str) -> dict[int, float]:
    """seed -> the mean of ``key`` over that seed's successful runs (its repetitions)."""
    from bots_bench.report import _per_seed as per_seed

    return per_seed(rows, key)


def _paired_ratio(a: dict[int, float], ref: dict[int, float]) -> float | None:
    """Mean over the seeds both have (both runs succeeded) of ``a / ref`` on that seed: seed
    by seed, as the report pairs them; None without such a seed."""
    xs = [a[s] / ref[s] for s in sorted(set(a) & set(ref)) if ref[s]]
    return sum(xs) / len(xs) if xs else None


def ratio_table(records: list[dict], policies: list[str]) -> str:
    """Plain-text table: per kernel and input class, makespan, board energy and CPU-rail
    energy per policy (mean over seeds of each seed's mean), their ratios to the first policy,
    and the geometric mean of each ratio over the rows.

    A ratio pairs the runs seed by seed, over the seeds where both policies succeeded (the
    mean of the per-seed ratios): a seed one policy failed does not move the other's side.
    Input classes are rows of their own, never averaged together.

    Board energy (every rail) is what the wall socket pays while the job runs; the CPU rail
    is the part DVFS controls (a slower policy saves there and pays the rest of the board for
    the extra time). A record without a CPU rail (a native board with no such sensor) shows
    ``-`` there."""
    base = policies[0]
    by: dict[tuple[str, str | None, str], list[dict]] = {}
    for r in records:
        by.setdefault((r["bench"], r.get("class"), r["policy"]), []).append(r)
    rows_keys = sorted(
        {(r["bench"], r.get("class")) for r in records}, key=lambda k: (k[0], k[1] or "")
    )
    row_label = {k: k[0] if k[1] is None else f"{k[0]}/{k[1]}" for k in rows_keys}
    lw = max([10, *(len(v) + 1 for v in row_label.values())])
    w_abs = {"makespan_s": 8, "energy_j": 7, "cpu_energy_j": 7}
    others = policies[1:]
    # a column group is as wide as its measures, or wider so that its label is whole
    # (``performance/schedutil`` used to be cut to ``performance/scheduti``); the measures
    # are right-aligned in it
    natural = sum(w_abs.values()) + len(_MEASURES)
    pw = {p: max(natural, len(p) + 1) for p in policies}
    rw_nat = 7 * len(_MEASURES)
    labels = {p: f"{p}/{base}" for p in others}
    rw = {p: max(rw_nat, len(labels[p]) + 1) for p in others}
    head = f"{'kernel':<{lw}}" + "".join(f" {p:<{pw[p] - 1}}" for p in policies)
    sub = f"{'':<{lw}}" + "".join(
        " " * (pw[p] - natural)
        + "".join(f" {label:>{w_abs[key]}}" for key, label, _, _ in _MEASURES)
        for p in policies
    )
    if others:
        head += " |" + "".join(f" {labels[p]:<{rw[p] - 1}}" for p in others)
        sub += " |" + "".join(
            " " * (rw[p] - rw_nat) + "".join(f" {short:>6}" for _, _, short, _ in _MEASURES)
            for p in others
        )
    lines = [head.rstrip(), sub, "-" * len(sub)]
    logs: dict[tuple[str, str], list[float]] = {}
    for b, cls in rows_keys:
        row = f"{row_label[(b, cls)]:<{lw}}"
        seeds = {
            p: {key: _per_seed(by.get((b, cls, p), []), key) for key, *_ in _MEASURES}
            for p in policies
        }
        for p in policies:
            row += " " * (pw[p] - natural)
            if not seeds[p]["makespan_s"]:
                row += f" {'failed':>{w_abs['makespan_s']}}" + "".join(
                    f" {'-':>{w_abs[k]}}" for k, *_ in _MEASURES[1:]
                )
                continue
            for key, _, _, fmt in _MEASURES:
                v = seeds[p][key]
                mean = sum(v.values()) / len(v) if v else None
                row += (
                    f" {mean:>{w_abs[key]}{fmt}}" if mean is not None else f" {'-':>{w_abs[key]}}"
                )
        if others:
            row += " |"
        for p in others:
            row += " " * (rw[p] - rw_nat)
            for key, *_ in _MEASURES:
                ratio = _paired_ratio(seeds[p][key], seeds[base][key])
                if ratio is None:
                    row += f" {'-':>6}"
                    continue
                row += f" {ratio:>6.3f}"
                logs.setdefault((p, key), []).append(math.log(ratio) if ratio > 0 else -math.inf)
        lines.append(row)
    if others and rows_keys:
        row = f"{'geomean':<{lw}}" + " " * sum(pw.values()) + " |"
        for p in others:
            row += " " * (rw[p] - rw_nat)
            for key, *_ in _MEASURES:
                xs = logs.get((p, key))
                row += f" {math.exp(sum(xs) / len(xs)):>6.3f}" if xs else f" {'-':>6}"
        lines.append(row)
    failed = [r for r in records if not r["ok"]]
    if failed:
        lines.append(f"{len(failed)} failed run(s):")
        lines += [
            f"  {r['bench']}{'/' + r['class'] if r.get('class') else ''} {r['policy']} "
            f"seed {r['seed']}: {r['error']}"
            for r in failed
        ]
    return "\n".join(lines)
