"""Canned studies (``hidvfs bots study NAME``), each ending in a short table.

- ``deadline-vs-maxfreq``: energy a deadline-aware policy saves against pinning the maximum
  frequency, with every job given a deadline of ``slack x`` its reference makespan; zero misses
  are required (the study fails loudly otherwise).
- ``mixed-criticality``: the HI deadline-miss ratio of a periodic HI job under LO load, with and
  without cluster reservation (Clopper-Pearson 95% intervals).
- ``vs-geardvfs``: speedup and energy of hidvfs against the fair GearDVFS port.

Every comparison is measured side by side, per seed, with mean +- std over seeds.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

from bots_bench.campaign_sim import SimRunConfig, run_one
from bots_bench.report import clopper_pearson

STUDIES = ("deadline-vs-maxfreq", "mixed-criticality", "vs-geardvfs")


@dataclass
class StudyResult:
    name: str
    board: str
    backend: str
    rows: list[dict] = field(default_factory=list)
    summary: dict = field(default_factory=dict)
    ok: bool = True
    problems: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "study": self.name,
            "board": self.board,
            "backend": self.backend,
            "ok": self.ok,
            "problems": self.problems,
            "summary": self.summary,
            "rows": self.rows,
        }


def _mean_std(xs: list[float]) -> tuple[float, float]:
    xs = [x for x in xs if x is not None]
    if not xs:
        return float("nan"), float("nan")
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def _kernels(kernels, every) -> list[str]:
    """None is every kernel; an empty selection is refused (it used to mean every kernel)."""
    if kernels is None:
        return list(every)
    if not kernels:
        raise ValueError("no kernels selected (None selects every kernel)")
    return list(kernels)


def _pair_runs(run: Callable[[str, int, str], dict], kernels, seeds, a: str, b: str):
    """Run policies a and b side by side per kernel and seed; yields (kernel, seed, ra, rb)."""
    for k in kernels:
        for s in range(seeds):
            yield k, s, run(k, s, a), run(k, s, b)


def deadline_vs_maxfreq(
    board: str,
    *,
    policy: str = "hidvfs",
    seeds: int = 3,
    slack: float = 1.5,
    kernels=None,
    cls: str = "small",
    build_policy=None,
    runner=None,
) -> StudyResult:
    from bots_bench.dags import KERNELS

    kernels = _kernels(kernels, KERNELS)
    runner = runner or _sim_runner(board, cls, build_policy, slack)
    res = StudyResult("deadline-vs-maxfreq", board, "sim" if runner.__name__ == "sim" else "native")
    savings, cpu_savings, misses, n = [], [], 0, 0
    for k, s, ra, rb in _pair_runs(runner, kernels, seeds, policy, "maxfreq"):
        for r in (ra, rb):
            if not r["ok"]:
                res.problems.append(f"{k} {r['policy']} seed {s}: {r['error']}")
        # a run's energy is None when its rail read too little of it (unavailable)
        if ra["ok"] and rb["ok"] and rb["energy_j"] and ra.get("energy_j") is not None:
            savings.append(1.0 - ra["energy_j"] / rb["energy_j"])
        if ra["ok"] and rb["ok"] and rb.get("cpu_energy_j") and ra.get("cpu_energy_j") is not None:
            cpu_savings.append(1.0 - ra["cpu_energy_j"] / rb["cpu_energy_j"])
        n += 1
        # a failed run met no deadline: a miss, as in the report (its error is in problems)
        if not (ra["ok"] and ra.get("deadline_met") is True):
            misses += 1
        if ra["ok"] and ra.get("deadline_met") is False:
            res.problems.append(
                f"{k} seed {s}: {policy} missed its deadline ({ra['makespan_s']:.3f} s > {ra['deadline_s']:.3f} s)"
            )
        elif ra["ok"] and ra.get("deadline_met") is None:
            res.problems.append(f"{k} seed {s}: {policy} ran without a deadline (counted a miss)")
        res.rows.append(
            {
                "kernel": k,
                "seed": s,
                "policy_energy_j": ra.get("energy_j"),
                "maxfreq_energy_j": rb.get("energy_j"),
                "policy_cpu_energy_j": ra.get("cpu_energy_j"),
                "maxfreq_cpu_energy_j": rb.get("cpu_energy_j"),
                "policy_makespan_s": ra.get("makespan_s"),
                "maxfreq_makespan_s": rb.get("makespan_s"),
                "deadline_s": ra.get("deadline_s"),
                # the policy's run; a failed one (None here) counts as a miss in the summary
                "deadline_met": ra.get("deadline_met") if ra["ok"] else None,
                "ok": bool(ra["ok"] and rb["ok"]),
            }
        )
    m, sd = _mean_std(savings)
    cm, csd = _mean_std(cpu_savings) if cpu_savings else (None, None)
    lo, hi = clopper_pearson(misses, n) if n else (float("nan"), float("nan"))
    res.summary = {
        "policy": policy,
        "slack": slack,
        "energy_saved_mean": m,
        "energy_saved_std": sd,
        # the CPU rail, the part DVFS controls (None where no run metered it)
        "cpu_energy_saved_mean": cm,
        "cpu_energy_saved_std": csd,
        "misses": misses,
        "jobs": n,
        "miss_ratio_ci95": [lo, hi],
    }
    res.ok = misses == 0 and not res.problems
    return res


def vs_geardvfs(
    board: str, *, seeds: int = 3, kernels=None, cls: str = "small", build_policy=None, runner=None
) -> StudyResult:
    from bots_bench.dags import KERNELS

    kernels = _kernels(kernels, KERNELS)
    runner = runner or _sim_runner(board, cls, build_policy, None)
    res = StudyResult("vs-geardvfs", board, "sim" if runner.__name__ == "sim" else "native")
    speedups, energy = [], []
    for k, s, ra, rb in _pair_runs(runner, kernels, seeds, "hidvfs", "geardvfs"):
        if not (ra["ok"] and rb["ok"]):
            res.problems += [
                f"{k} {r['policy']} seed {s}: {r['error']}" for r in (ra, rb) if not r["ok"]
            ]
            continue
        speedups.append(rb["makespan_s"] / ra["makespan_s"])
        reduction = None  # this pair's own: a pair without energy readings has none
        if ra.get("energy_j") is not None and rb.get("energy_j"):
            reduction = 1.0 - ra["energy_j"] / rb["energy_j"]
            energy.append(reduction)
        res.rows.append(
            {"kernel": k, "seed": s, "speedup": speedups[-1], "energy_reduction": reduction}
        )
    sm, ss = _mean_std(speedups)
    em, es = _mean_std(energy)
    res.summary = {
        "speedup_mean": sm,
        "speedup_std": ss,
        "energy_reduction_mean": em,
        "energy_reduction_std": es,
        "pairs": len(speedups),
    }
    res.ok = not res.problems
    return res


def mixed_criticality(
    board: str, *, seeds: int = 3, n_hi: int = 10, base_policy: str = "schedutil"
) -> StudyResult:
    from agents.factory import make_policy
    from agents.mixed import ClusterReservation
    from bots_bench.dags import generate
    from bots_bench.reference import measure_reference
    from daemon.simrun import run_sim
    from platforms.sim.plant import SimJob
    from platforms.spec import load_board

    spec = load_board(board)
    res = StudyResult("mixed-criticality", board, "sim")
    hi = measure_reference(board, "fib", "test", 0)
    lo = measure_reference(board, "sort", "test", 0)
    counts = {True: [0, 0], False: [0, 0]}
    energy = {True: [], False: []}
    for seed in range(seeds):
        items = [
            (
                SimJob(
                    generate("fib", "test", seed=seed),
                    f"fib#{i}",
                    deadline_s=1.5 * hi.ref_makespan_s,
                    criticality="hi",
                    release_t=i * 2 * hi.ref_makespan_s,
                ),
                hi,
            )
            for i in range(n_hi)
        ]
        items += [
            (
                SimJob(generate("sort", "test", seed=seed * 10 + i), f"sort#{i}", criticality="lo"),
                lo,
            )
            for i in range(4)
        ]
        for reserve in (True, False):
            r = run_sim(
                board,
                make_policy(base_policy, spec),
                items,
                seed=seed,
                stages=[ClusterReservation(reserve)],
            )
            m, n = r.miss_counts()["hi"]
            counts[reserve][0] += m
            counts[reserve][1] += n
            joules = r.jobs_energy()[0]  # to the last finish
            energy[reserve].append(joules)
            res.rows.append(
                {
                    "seed": seed,
                    "reservation": reserve,
                    "hi_misses": m,
                    "hi_jobs": n,
                    "energy_j": joules,
                    "makespan_s": r.makespan_s,
                }
            )
    for reserve in (True, False):
        m, n = counts[reserve]
        lo_ci, hi_ci = clopper_pearson(m, n)
        key = "with_reservation" if reserve else "without_reservation"
        res.summary[key] = {
            "hi_miss_ratio": m / n if n else None,
            "ci95": [lo_ci, hi_ci],
            "hi_misses": m,
            "hi_jobs": n,
            "energy_j_mean": _mean_std(energy[reserve])[0],
        }
    res.ok = counts[True][0] == 0
    if not res.ok:
        res.problems.append(f"HI jobs missed with reservation: {counts[True][0]}")
    return res


def _sim_runner(board, cls, build_policy, slack):
    if build_policy is None:
        from agents.factory import make_policy_stack as build_policy

    def sim(kernel: str, seed: int, policy: str) -> dict:
        return run_one(SimRunConfig(kernel, cls, policy, seed, board, slack), build_policy)

    return sim


def _known(x) -> bool:
    return x is not None and x == x  # NaN (no pair to average) is not a number to print


def _pct(mean, std) -> str:
    """``12.3% +- 4.5%``, or ``unavailable`` where no pair had the reading (a board without
    a power monitor): never ``nan%``."""
    if not _known(mean):
        return "unavailable"
    return f"{100 * mean:.1f}% +- {100 * std:.1f}%" if _known(std) else f"{100 * mean:.1f}%"


def format_study(r: StudyResult) -> str:
    lines = [f"study {r.name} on {r.board} ({r.backend}): {'OK' if r.ok else 'FAILED'}"]
    s = r.summary
    if r.name == "deadline-vs-maxfreq":
        lines.append(
            f"  {s['policy']} vs maxfreq, deadlines at {s['slack']}x reference, {s['jobs']} jobs"
        )
        cpu = s.get("cpu_energy_saved_mean")
        lines.append(
            f"  energy saved: {_pct(s['energy_saved_mean'], s['energy_saved_std'])} (board)"
            + (f", CPU rail {_pct(cpu, s.get('cpu_energy_saved_std'))}" if _known(cpu) else "")
        )
        lo, hi = s["miss_ratio_ci95"]
        ci = f"95% CI {lo:.3f}-{hi:.3f}" if _known(lo) and _known(hi) else "no jobs"
        lines.append(f"  deadline misses: {s['misses']}/{s['jobs']} ({ci})")
    elif r.name == "mixed-criticality":
        for key in ("with_reservation", "without_reservation"):
            v = s[key]
            lo, hi = v["ci95"]
            ratio = f"{v['hi_miss_ratio']:.3f}" if _known(v["hi_miss_ratio"]) else "n/a"
            joules = v["energy_j_mean"]
            lines.append(
                f"  {key.replace('_', ' '):<22} HI misses {v['hi_misses']}/{v['hi_jobs']} "
                f"= {ratio} (95% CI {lo:.3f}-{hi:.3f}), energy "
                + (f"{joules:.1f} J" if _known(joules) else "unavailable")
            )
    elif r.name == "vs-geardvfs":
        sm, ss = s["speedup_mean"], s["speedup_std"]
        lines.append(
            "  speedup of hidvfs over geardvfs: "
            + (f"{sm:.2f}x +- {ss:.2f}" if _known(sm) else "unavailable (no pair ran)")
        )
        lines.append(
            f"  energy reduction: {_pct(s['energy_reduction_mean'], s['energy_reduction_std'])}"
        )
    for p in r.problems[:10]:
        lines.append(f"  problem: {p}")
    return "\n".join(lines)
