"""Campaign report: per-kernel tables and plots, computed from the results store only.

``write_report(db, out_dir)`` writes ``report.md``, ``report.html`` (the same content),
``summary.json`` (the table numbers unrounded) and PNG plots: energy vs makespan per kernel
(Pareto front of the policy means), per-policy bars, and frequency/temperature over time for
chosen runs. Statistics (one definition, stated in the report itself):

- each seed's value is the mean over its successful repetitions; "mean ± std" is over seeds
  (sample std, n-1);
- **L10**: mean makespan of the last 10 successful evaluation runs (highest repetitions) of a
  benchmark under one policy and seed, then mean ± std over seeds;
- speed-up = baseline makespan / policy makespan and energy reduction = 1 - policy energy /
  baseline energy (the whole board, and the CPU rail where it is metered), paired per seed
  (same seed, side by side), with a two-sided 95% Student-t interval over seeds;
- deadline-miss ratio = misses / runs with a deadline (a failed run counts as a miss), with a
  Clopper-Pearson (exact) 95% interval, per policy and criticality.

scipy and matplotlib are imported lazily; without scipy the t and beta quantiles come from a
built-in incomplete-beta inversion, without matplotlib the report says the plots were skipped.
"""

from __future__ import annotations

import html
import json
import math
import os
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bots_bench.registry import DEFAULT_LABEL, DEFAULT_VARIANT, KERNEL_NAMES
from bots_bench.store import Store

#: used as the baseline when none is named, first one present (else the first policy stored)
DEFAULT_BASELINES = ("schedutil", "ondemand", "performance", "maxfreq")
CONFIDENCE = 0.95
L10_WINDOW = 10
MAX_AUTO_TIMESERIES = 6


class ReportError(ValueError):
    """The database holds nothing to report, or the baseline named is not in it."""


# ---------------------------------------------------------------------------------------
# statistics (pure functions)
# ---------------------------------------------------------------------------------------
def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularised incomplete beta (modified Lentz)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 10_000):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta I_x(a, b) for a, b > 0 (no scipy needed)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    lbeta = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
    front = math.exp(lbeta + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def _bisect(f, lo: float, hi: float, target: float) -> float:
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if f(mid) < target:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-15 * max(1.0, abs(mid)):
            break
    return 0.5 * (lo + hi)


def beta_ppf(q: float, a: float, b: float, *, use_scipy: bool = True) -> float:
    """Quantile of the Beta(a, b) distribution."""
    if use_scipy:
        try:
            from scipy.stats import beta
        except ImportError:
            pass
        else:
            return float(beta.ppf(q, a, b))
    return _bisect(lambda x: betainc(a, b, x), 0.0, 1.0, q)


def t_ppf(q: float, df: float, *, use_scipy: bool = True) -> float:
    """Quantile of Student's t with ``df`` degrees of freedom."""
    if use_scipy:
        try:
            from scipy.stats import t
        except ImportError:
            pass
        else:
            return float(t.ppf(q, df))
    if q == 0.5:
        return 0.0
    if q < 0.5:
        return -t_ppf(1.0 - q, df, use_scipy=False)

    def cdf(x: float) -> float:
        return 1.0 - 0.5 * betainc(df / 2.0, 0.5, df / (df + x * x))

    hi = 1.0
    while cdf(hi) < q:
        hi *= 2.0
    return _bisect(cdf, 0.0, hi, q)


def clopper_pearson(
    k: int, n: int, conf: float = CONFIDENCE, *, use_scipy: bool = True
) -> tuple[float, float]:
    """Exact (Clopper-Pearson) interval of a binomial proportion k/n."""
    if n <= 0 or not 0 <= k <= n:
        raise ValueError(f"need 0 <= k <= n and n > 0, got k={k}, n={n}")
    if use_scipy:
        try:
            from scipy.stats import binomtest
        except ImportError:
            pass
        else:
            ci = binomtest(k, n).proportion_ci(confidence_level=conf, method="exact")
            return float(ci.low), float(ci.high)
    alpha = 1.0 - conf
    lo = 0.0 if k == 0 else beta_ppf(alpha / 2, k, n - k + 1, use_scipy=False)
    hi = 1.0 if k == n else beta_ppf(1 - alpha / 2, k + 1, n - k, use_scipy=False)
    return lo, hi


@dataclass(frozen=True)
class Summary:
    """Mean and sample standard deviation over ``n`` values (std is None when n < 2)."""

    mean: float
    std: float | None
    n: int


@dataclass(frozen=True)
class Interval:
    """Mean over ``n`` seeds with a two-sided t interval (lo/hi None when n < 2)."""

    mean: float
    lo: float | None
    hi: float | None
    n: int


def summarize(values: Sequence[float]) -> Summary | None:
    vals = [float(v) for v in values]
    if not vals:
        return None
    n = len(vals)
    mean = math.fsum(vals) / n
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in vals) / (n - 1)) if n > 1 else None
    return Summary(mean, std, n)


def t_interval(values: Sequence[float], conf: float = CONFIDENCE) -> Interval | None:
    s = summarize(values)
    if s is None:
        return None
    if s.n < 2 or s.std is None:
        return Interval(s.mean, None, None, s.n)
    half = t_ppf(0.5 + conf / 2, s.n - 1) * s.std / math.sqrt(s.n)
    return Interval(s.mean, s.mean - half, s.mean + half, s.n)


# ---------------------------------------------------------------------------------------
# aggregation of the stored runs
# ---------------------------------------------------------------------------------------
@dataclass
class PolicyStats:
    policy: str
    seeds: int
    runs: int
    failed: int
    makespan: Summary | None
    l10: Summary | None
    energy: Summary | None
    peak_temp: Summary | None
    speedup: Interval | None = None
    energy_reduction: Interval | None = None
    #: the CPU rail (what DVFS controls); None where the board has no such sensor
    cpu_energy: Summary | None = None
    cpu_energy_reduction: Interval | None = None


@dataclass
class DeadlineStats:
    policy: str
    criticality: str
    misses: int
    n: int
    ratio: float
    lo: float
    hi: float


@dataclass
class OmpEnvUse:
    """One OpenMP environment the kernels of a table ran with (``omp_env`` of a native run
    record), and how many of its runs had it."""

    env: dict[str, str]
    runs: int


@dataclass
class GroupStats:
    """One kernel table: a benchmark and class on one board and backend."""

    board: str
    backend: str
    bench: str
    cls: str
    baseline: str | None
    policies: list[PolicyStats] = field(default_factory=list)
    deadlines: list[DeadlineStats] = field(default_factory=list)
    #: the measured settings the runs share (their spec hash) and how they read
    spec_hash: str = ""
    setting: str = ""
    #: the OpenMP environments its runs were launched with, most runs first (native runs
    #: record one; the simulator's do not), and the runs that recorded none
    omp_env: list[OmpEnvUse] = field(default_factory=list)
    omp_env_unrecorded: int = 0
    #: OpenMP variables of the campaign's shell left out of (or replaced in) the kernels'
    #: environment (``omp_env_ignored``), and in how many runs
    omp_env_ignored: list[str] = field(default_factory=list)
    omp_env_ignored_runs: int = 0

    @property
    def title(self) -> str:
        tail = f"; {self.setting}" if self.setting else ""
        return f"{self.bench} / {self.cls} ({self.board}, {self.backend}{tail})"

    def holds_kernel(self, other: GroupStats) -> bool:
        """Whether ``other`` is a table of the same kernel, class, board and backend."""
        return (self.board, self.backend, self.bench, self.cls) == (
            other.board,
            other.backend,
            other.bench,
            other.cls,
        )

    def holds(self, r: Mapping[str, Any]) -> bool:
        """Whether run record ``r`` is one of this table's."""
        return (r["board"], r["backend"], r["bench"], r["class"], r.get("spec_hash") or "") == (
            self.board,
            self.backend,
            self.bench,
            self.cls,
            self.spec_hash,
        )


def _mean(vals: Iterable[float]) -> float | None:
    vals = list(vals)
    return math.fsum(vals) / len(vals) if vals else None


def _per_seed(rows: list[dict], col: str) -> dict[int, float]:
    """seed -> mean of ``col`` over that seed's successful runs with a value."""
    by_seed: dict[int, list[float]] = defaultdict(list)
    for r in rows:
        if r["ok"] and r.get(col) is not None:
            by_seed[r["seed"]].append(float(r[col]))
    return {s: m for s, v in by_seed.items() if (m := _mean(v)) is not None}


def _l10_per_seed(rows: list[dict]) -> dict[int, float]:
    by_seed: dict[int, list[dict]] = defaultdict(list)
    for r in rows:
        if r["ok"] and r.get("makespan_s") is not None:
            by_seed[r["seed"]].append(r)
    out = {}
    for s, rs in by_seed.items():
        last = sorted(rs, key=lambda r: (r["rep"], r["id"]))[-L10_WINDOW:]
        out[s] = math.fsum(float(r["makespan_s"]) for r in last) / len(last)
    return out


def resolve_baseline(policies: Iterable[str], baseline: str | None) -> str | None:
    """The policy the ratios are taken against: ``baseline`` if named (it must have runs),
    else the first of :data:`DEFAULT_BASELINES` with runs, else the first policy stored, so
    a campaign of other policies still gets its ratios (None only without any policy)."""
    present = list(dict.fromkeys(policies))
    if baseline is not None:
        if baseline not in present:
            raise ReportError(
                f"baseline policy {baseline!r} has no runs in the database; "
                f"policies present: {', '.join(sorted(present))}"
            )
        return baseline
    return next((p for p in DEFAULT_BASELINES if p in present), present[0] if present else None)


def _bench_order(bench: str) -> tuple[int, str]:
    return (KERNEL_NAMES.index(bench) if bench in KERNEL_NAMES else len(KERNEL_NAMES), bench)


def compute_stats(
    rows: Sequence[Mapping[str, Any]], baseline: str | None = None
) -> list[GroupStats]:
    """The numbers of the report, from run records (as :meth:`Store.runs` returns them)."""
    if not rows:
        raise ReportError("no runs to report")
    base = resolve_baseline((r["policy"] for r in rows), baseline)
    # one table per kernel and class on a board, and per measured setting: runs with another
    # deadline slack, thread count or variant (another spec hash) are other measurements
    groups: dict[tuple, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    labels: dict[tuple, str] = {}
    for r in rows:
        gkey = (r["board"], r["backend"], r["bench"], r["class"], r.get("spec_hash") or "")
        groups[gkey][r["policy"]].append(dict(r))
        labels.setdefault(gkey, setting_label(r.get("config") or {}))
    shared = defaultdict(set)  # settings that read alike in one table (a cool-down alone)
    for k, lab in labels.items():
        shared[(k[:4], lab)].add(k[4])
    out = []
    for gkey in sorted(groups, key=lambda k: (k[0], k[1], _bench_order(k[2]), k[3], labels[k])):
        by_policy = groups[gkey]
        label = labels[gkey]
        if len(shared[(gkey[:4], label)]) > 1:  # e.g. two cool-downs: the hash tells apart
            label = ", ".join(x for x in (label, f"spec {gkey[4]}") if x)
        g = GroupStats(
            *gkey[:4],
            baseline=base if base in by_policy else None,
            spec_hash=gkey[4],
            setting=label,
        )
        base_ms = _per_seed(by_policy[g.baseline], "makespan_s") if g.baseline else {}
        base_e = _per_seed(by_policy[g.baseline], "energy_j") if g.baseline else {}
        base_c = _per_seed(by_policy[g.baseline], "cpu_energy_j") if g.baseline else {}
        for policy in sorted(by_policy, key=lambda p: (p != g.baseline, p)):
            rs = by_policy[policy]
            ms = _per_seed(rs, "makespan_s")
            en = _per_seed(rs, "energy_j")
            ce = _per_seed(rs, "cpu_energy_j")
            ps = PolicyStats(
                policy=policy,
                seeds=len({r["seed"] for r in rs}),
                runs=len(rs),
                failed=sum(1 for r in rs if not r["ok"]),
                makespan=summarize([ms[s] for s in sorted(ms)]),
                l10=summarize([v for _, v in sorted(_l10_per_seed(rs).items())]),
                energy=summarize([en[s] for s in sorted(en)]),
                peak_temp=summarize([v for _, v in sorted(_per_seed(rs, "peak_temp_c").items())]),
                cpu_energy=summarize([ce[s] for s in sorted(ce)]),
            )
            if g.baseline:
                paired = sorted(set(ms) & set(base_ms))
                ps.speedup = t_interval([base_ms[s] / ms[s] for s in paired if ms[s] > 0])
                paired_e = sorted(set(en) & set(base_e))
                ps.energy_reduction = t_interval(
                    [1.0 - en[s] / base_e[s] for s in paired_e if base_e[s] > 0]
                )
                paired_c = sorted(set(ce) & set(base_c))
                ps.cpu_energy_reduction = t_interval(
                    [1.0 - ce[s] / base_c[s] for s in paired_c if base_c[s] > 0]
                )
            g.policies.append(ps)
            g.deadlines += _deadline_stats(policy, rs)
        _omp_env_stats(g, [r for rs in by_policy.values() for r in rs])
        out.append(g)
    return out


def _omp_env_stats(g: GroupStats, rows: list[dict]) -> None:
    """What OpenMP environment the table's runs had: a table's setting names a thread count
    only when the spec gave one, and a shell variable left out is worth knowing."""
    envs: dict[tuple, int] = defaultdict(int)
    ignored: set[str] = set()
    for r in rows:
        env = r.get("omp_env")
        if not isinstance(env, Mapping):
            g.omp_env_unrecorded += 1
            continue
        envs[tuple(sorted((str(k), str(v)) for k, v in env.items()))] += 1
        left = r.get("omp_env_ignored") or []
        if left:
            ignored.update(str(k) for k in left)
            g.omp_env_ignored_runs += 1
    if not envs:  # a simulated table: nothing to say
        g.omp_env_unrecorded = 0
        return
    g.omp_env = [
        OmpEnvUse(dict(env), n) for env, n in sorted(envs.items(), key=lambda e: (-e[1], e[0]))
    ]
    g.omp_env_ignored = sorted(ignored)


def _runs(n: int) -> str:
    return f"{n} run{'' if n == 1 else 's'}"


def omp_env_text(g: GroupStats) -> str | None:
    """The table's OpenMP environment in a sentence (None when no run recorded one), e.g.
    "OpenMP environment of the kernels: `OMP_NUM_THREADS=2`." and, when the campaign's
    shell had OpenMP variables of its own, which ones were not passed on."""
    if not g.omp_env:
        return None
    uses = [(" ".join(f"{k}={v}" for k, v in u.env.items()) or "none", u.runs) for u in g.omp_env]
    if len(uses) == 1 and not g.omp_env_unrecorded:
        text = f"`{uses[0][0]}`"
    else:  # the table's runs did not all run alike: say how many ran with what
        parts = [f"`{env}` ({_runs(n)})" for env, n in uses]
        if g.omp_env_unrecorded:
            parts.append(f"not recorded ({_runs(g.omp_env_unrecorded)})")
        text = "; ".join(parts)
    text = f"OpenMP environment of the kernels: {text}."
    if g.omp_env_ignored:
        recorded = sum(n for _, n in uses)
        where = (
            "every run"
            if g.omp_env_ignored_runs == recorded
            else f"{g.omp_env_ignored_runs} of {_runs(recorded)}"
        )
        names = ", ".join(f"`{k}`" for k in g.omp_env_ignored)
        text += f" Left out or replaced from the campaign's shell ({where}): {names}."
    return text


#: the settings of a run's config that change what is measured, with the default a table
#: does not name (see RunConfig.spec_hash)
_SETTINGS = (
    ("deadline_slack", None, "deadline slack {}x"),
    ("threads", None, "{} thread{s}"),
    ("variant", None, "variant {}"),
    ("label", None, "build {}"),
    ("check", None, "check {}"),
)


def setting_label(config: Mapping[str, Any]) -> str:
    """What sets a run's measurement apart, in words ("deadline slack 1.5x, 4 threads"); ''
    for the defaults. The variant and build are named only when not the registry's default;
    a native run on a fake tree or without frequency control says so."""
    defaults = {"variant": DEFAULT_VARIANT, "label": DEFAULT_LABEL}
    parts = []
    for key, default, fmt in _SETTINGS:
        v = config.get(key, default)
        if v is None or v == defaults.get(key, default):
            continue
        text = str(v).lower() if isinstance(v, bool) else f"{v:g}" if isinstance(v, float) else v
        parts.append(fmt.format(text, s="" if v == 1 and not isinstance(v, bool) else "s"))
    # where a native run measured (bots_bench.spec.MeasuredOn): named when it is not the
    # board itself with its frequencies set; another build of the binary is another table
    # of the same words, told apart by its spec hash
    on = config.get("measured_on") or {}
    if on.get("sysfs_root", "/") != "/":
        parts.append(f"tree {on['sysfs_root']}")
    if on.get("frequency_control") is False:
        parts.append("no frequency control (affinity and priority only)")
    return ", ".join(parts)


def _deadline_stats(policy: str, rows: list[dict]) -> list[DeadlineStats]:
    by_crit: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        if r.get("deadline_s") is not None:
            by_crit[r.get("criticality") or "all"].append(r)
    out = []
    for crit in sorted(by_crit):
        rs = by_crit[crit]
        n = len(rs)
        k = sum(1 for r in rs if not (r["ok"] and r.get("deadline_met") is True))
        lo, hi = clopper_pearson(k, n)
        out.append(DeadlineStats(policy, crit, k, n, k / n, lo, hi))
    return out


# ---------------------------------------------------------------------------------------
# formatting
# ---------------------------------------------------------------------------------------
def fmt(x: float | None) -> str:
    """Four significant digits; ``n/a`` for a missing value."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "n/a"
    return f"{x:.4g}"


def fmt_summary(s: Summary | None) -> str:
    if s is None:
        return "n/a"
    return f"{fmt(s.mean)} ± {fmt(s.std)}" if s.std is not None else f"{fmt(s.mean)} ± n/a"


def fmt_interval(iv: Interval | None, *, percent: bool = False) -> str:
    if iv is None:
        return "n/a"
    k = 100.0 if percent else 1.0
    unit = "%" if percent else "×"
    ci = f" [{fmt(iv.lo * k)}, {fmt(iv.hi * k)}]" if iv.lo is not None else " [n/a]"
    return f"{fmt(iv.mean * k)}{unit}{ci}"


KERNEL_HEADER = (
    "policy",
    "seeds",
    "runs (failed)",
    "makespan s",
    "L10 s",
    "energy J",
    "CPU energy J",
    "peak °C",
    "speed-up vs baseline [95% CI]",
    "energy reduction vs baseline [95% CI]",
    "CPU energy reduction [95% CI]",
)
DEADLINE_HEADER = ("policy", "criticality", "misses / runs", "miss ratio", "Clopper-Pearson 95%")


def _kernel_rows(g: GroupStats) -> list[list[str]]:
    rows = []
    for p in g.policies:
        is_base = p.policy == g.baseline
        rows.append(
            [
                p.policy + (" (baseline)" if is_base else ""),
                str(p.seeds),
                f"{p.runs} ({p.failed})",
                fmt_summary(p.makespan),
                fmt_summary(p.l10),
                fmt_summary(p.energy),
                fmt_summary(p.cpu_energy),
                fmt_summary(p.peak_temp),
                fmt_interval(p.speedup),
                fmt_interval(p.energy_reduction, percent=True),
                fmt_interval(p.cpu_energy_reduction, percent=True),
            ]
        )
    return rows


def _deadline_rows(g: GroupStats) -> list[list[str]]:
    return [
        [
            d.policy,
            d.criticality,
            f"{d.misses} / {d.n}",
            fmt(d.ratio),
            f"[{fmt(d.lo)}, {fmt(d.hi)}]",
        ]
        for d in g.deadlines
    ]


# a tiny document model rendered twice, so report.md and report.html hold the same numbers
Block = tuple


def _render_md(blocks: list[Block]) -> str:
    out = []
    for b in blocks:
        kind = b[0]
        if kind in ("h1", "h2", "h3"):
            out.append("#" * int(kind[1]) + " " + b[1])
        elif kind == "p":
            out.append(b[1])
        elif kind == "ul":
            out.append("\n".join(f"- {item}" for item in b[1]))
        elif kind == "table":
            header, rows = b[1], b[2]
            cell = [[c.replace("|", "\\|") for c in r] for r in [list(header), *rows]]
            out.append("| " + " | ".join(cell[0]) + " |")
            out[-1] += "\n|" + "|".join("---" for _ in header) + "|"
            out[-1] += "".join("\n| " + " | ".join(r) + " |" for r in cell[1:])
        elif kind == "img":
            out.append(f"![{b[2]}]({b[1]})")
    return "\n\n".join(out) + "\n"


def _md_inline_to_html(text: str) -> str:
    t = html.escape(text)
    t = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", t)
    return re.sub(r"`(.+?)`", r"<code>\1</code>", t)


def _render_html(blocks: list[Block], title: str) -> str:
    body = []
    for b in blocks:
        kind = b[0]
        if kind in ("h1", "h2", "h3"):
            body.append(f"<{kind}>{html.escape(b[1])}</{kind}>")
        elif kind == "p":
            body.append(f"<p>{_md_inline_to_html(b[1])}</p>")
        elif kind == "ul":
            body.append(
                "<ul>" + "".join(f"<li>{_md_inline_to_html(i)}</li>" for i in b[1]) + "</ul>"
            )
        elif kind == "table":
            head = "".join(f"<th>{html.escape(c)}</th>" for c in b[1])
            rows = "".join(
                "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in b[2]
            )
            body.append(f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>")
        elif kind == "img":
            body.append(
                f'<figure><img src="{html.escape(b[1])}" alt="{html.escape(b[2])}">'
                f"<figcaption>{html.escape(b[2])}</figcaption></figure>"
            )
    style = (
        "body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em}"
        "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #bbb;"
        "padding:.25em .5em;text-align:right}td:first-child,th:first-child{text-align:left}"
        "img{max-width:100%}"
    )
    return (
        '<!DOCTYPE html>\n<html><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{style}</style></head><body>\n"
        + "\n".join(body)
        + "\n</body></html>\n"
    )


# ---------------------------------------------------------------------------------------
# plots (matplotlib, lazily, without pyplot's global state)
# ---------------------------------------------------------------------------------------
def _slug(*parts: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", "_".join(parts)).strip("-")


def _figure(**kw):
    from matplotlib.figure import Figure

    return Figure(**kw)


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats on both makespan and energy (both minimised)."""
    idx = []
    for i, (x, y) in enumerate(points):
        dominated = any(
            (x2 <= x and y2 <= y) and (x2 < x or y2 < y)
            for j, (x2, y2) in enumerate(points)
            if j != i
        )
        if not dominated:
            idx.append(i)
    return sorted(idx, key=lambda i: points[i][0])


def _plot_pareto(g: GroupStats, rows: list[dict], path: Path, colors: dict[str, str]) -> bool:
    pts = [p for p in g.policies if p.makespan and p.energy]
    if not pts:
        return False
    fig = _figure(figsize=(6.4, 4.8), dpi=100)
    ax = fig.subplots()
    for p in pts:
        color = colors[p.policy]
        mine = [r for r in rows if r["policy"] == p.policy and r["ok"]]
        xs = [
            r["makespan_s"]
            for r in mine
            if r["makespan_s"] is not None and r["energy_j"] is not None
        ]
        ys = [
            r["energy_j"] for r in mine if r["makespan_s"] is not None and r["energy_j"] is not None
        ]
        ax.scatter(xs, ys, s=12, alpha=0.35, color=color)
        ax.errorbar(
            p.makespan.mean,
            p.energy.mean,
            xerr=p.makespan.std or 0.0,
            yerr=p.energy.std or 0.0,
            fmt="o",
            color=color,
            capsize=3,
            label=p.policy,
        )
    means = [(p.makespan.mean, p.energy.mean) for p in pts]
    front = pareto_front(means)
    ax.plot(
        [means[i][0] for i in front],
        [means[i][1] for i in front],
        "k--",
        lw=1,
        marker="s",
        ms=12,
        mfc="none",
        label="Pareto front",
    )
    ax.set_xlabel("makespan (s)")
    ax.set_ylabel("energy (J)")
    ax.set_title(f"{g.title}: energy vs makespan")
    ax.legend(fontsize="small")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    return True


def _plot_bars(groups: list[GroupStats], path: Path, colors: dict[str, str]) -> bool:
    if not groups:
        return False
    policies = [p for p in colors if any(ps.policy == p for g in groups for ps in g.policies)]
    has_energy = any(p.energy for g in groups for p in g.policies)
    fig = _figure(
        figsize=(max(6.4, 1.2 * len(groups) + 3), 4.8 if not has_energy else 7.2), dpi=100
    )
    axes = fig.subplots(2 if has_energy else 1, 1, squeeze=False)[:, 0]
    width = 0.8 / max(len(policies), 1)
    for ax, metric, unit in zip(axes, ("makespan", "energy"), ("s", "J")):
        normalise = all(g.baseline for g in groups)
        for j, pol in enumerate(policies):
            xs, hs, es = [], [], []
            for i, g in enumerate(groups):
                ps = next((p for p in g.policies if p.policy == pol), None)
                s = getattr(ps, metric) if ps else None
                if s is None:
                    continue
                ref = 1.0
                if normalise:
                    bs = next((p for p in g.policies if p.policy == g.baseline), None)
                    base = getattr(bs, metric) if bs else None
                    if base is None or base.mean <= 0:
                        continue
                    ref = base.mean
                xs.append(i + (j - (len(policies) - 1) / 2) * width)
                hs.append(s.mean / ref)
                es.append((s.std or 0.0) / ref)
            ax.bar(xs, hs, width, yerr=es, capsize=2, label=pol, color=colors[pol])
        ax.set_xticks(range(len(groups)))
        ax.set_xticklabels(
            [f"{g.bench}\n{g.cls}" + (f"\n{g.setting}" if g.setting else "") for g in groups],
            fontsize="small",
        )
        ax.set_ylabel(f"{metric} / baseline" if normalise else f"{metric} ({unit})")
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize="small", ncol=min(len(policies), 4))
    axes[0].set_title("per-policy means (error bars: std over seeds)")
    fig.tight_layout()
    fig.savefig(path)
    return True


def _plot_timeseries(run: dict, path: Path) -> bool:
    ts = run.get("timeseries") or {}
    t = ts.get("t")
    if not t:
        return False
    freq = {k: v for k, v in (ts.get("freq_khz") or {}).items() if len(v) == len(t)}
    temp = {k: v for k, v in (ts.get("temp_c") or {}).items() if len(v) == len(t)}
    if not freq and not temp:
        return False
    fig = _figure(figsize=(7.2, 5.4), dpi=100)
    ax_f, ax_t = fig.subplots(2, 1, sharex=True)
    for name, v in sorted(freq.items()):
        ax_f.step(
            t, [x / 1000.0 if x is not None else float("nan") for x in v], where="post", label=name
        )
    for name, v in sorted(temp.items()):
        ax_t.plot(t, [x if x is not None else float("nan") for x in v], label=name)
    ax_f.set_ylabel("frequency (MHz)")
    ax_t.set_ylabel("temperature (°C)")
    ax_t.set_xlabel("time (s)")
    for ax in (ax_f, ax_t):
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small")
    ax_f.set_title(
        f"run {run['id']}: {run['bench']}/{run['class']} {run['policy']} seed {run['seed']} rep {run['rep']}"
    )
    fig.tight_layout()
    fig.savefig(path)
    return True


def _auto_timeseries(store: Store, rows: list[dict]) -> list[int]:
    """One run per policy of the first kernel table whose runs carry a time series."""
    with_ts = set(store.ids_with_timeseries())
    if not with_ts:
        return []
    first = min((r for r in rows if r["id"] in with_ts), key=lambda r: r["id"])
    chosen: dict[str, int] = {}
    for r in sorted(rows, key=lambda r: (r["seed"], r["rep"], r["id"])):
        same = all(r[k] == first[k] for k in ("board", "backend", "bench", "class"))
        if same and r["id"] in with_ts:
            chosen.setdefault(r["policy"], r["id"])
    return sorted(chosen.values())[:MAX_AUTO_TIMESERIES]


# ---------------------------------------------------------------------------------------
# the report
# ---------------------------------------------------------------------------------------
@dataclass
class ReportFiles:
    markdown: Path
    html: Path
    summary: Path
    plots: list[Path]
    groups: list[GroupStats]
    #: False when matplotlib is not installed: the report was written without plots
    plotting: bool = True


def _definitions(baseline: str | None, n_runs: int, n_failed: int) -> list[Block]:
    base_txt = (
        f"The baseline policy is **{baseline}**."
        if baseline
        else "No baseline policy was named or found (tried " + ", ".join(DEFAULT_BASELINES) + "), "
        "so speed-ups and energy reductions are not computed."
    )
    return [
        ("p", f"{n_runs} runs in the database, {n_failed} of them failed. {base_txt}"),
        ("h2", "Definitions"),
        (
            "ul",
            [
                "**makespan**: wall time from a job's launch to its exit (BOTS `Time Program` is "
                "stored beside it); **energy**: integral of the board's total input rail; "
                "**CPU energy**: the CPU rail alone, the part DVFS controls (n/a where the board "
                "has no power monitor or no CPU rail).",
                "Each seed's value is the mean over its successful repetitions; **mean ± std** is "
                "over seeds (sample standard deviation, n-1; n/a with one seed).",
                f"**L10**: mean makespan of the last {L10_WINDOW} successful evaluation runs "
                "(highest repetition numbers) of a benchmark under one policy and seed; the table "
                "gives mean ± std of that over seeds.",
                "**speed-up** = baseline makespan / policy makespan and **energy reduction** = "
                "1 - policy energy / baseline energy (board and CPU rail), paired per seed "
                "(measured side by side), "
                "mean over seeds with a two-sided 95% **Student-t interval** over seeds "
                "(n/a with one seed).",
                "**deadline-miss ratio** = misses / runs with a deadline, per policy and "
                "criticality; a failed run counts as a miss; 95% **Clopper-Pearson** (exact) "
                "interval.",
                "runs (failed): all runs stored for the policy, and how many failed (crash, "
                "timeout, failed verification); failed runs enter no mean.",
            ],
        ),
    ]


def write_report(
    db_path: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    baseline: str | None = None,
    runs_for_timeseries: Iterable[int] | None = None,
    *,
    title: str = "hidvfs BOTS campaign report",
) -> ReportFiles:
    """Write report.md, report.html, summary.json and the PNG plots into ``out_dir``.

    ``runs_for_timeseries`` lists the run ids whose frequency and temperature are plotted
    over time; ``None`` picks one run per policy of the first kernel with a time series.
    """
    out = Path(out_dir)
    if not Path(db_path).exists():
        raise ReportError(f"{db_path}: no such results database")
    with Store(db_path, readonly=True) as store:  # a report never writes into the file
        rows = store.runs(with_stdout=False, with_timeseries=False)
        if not rows:
            raise ReportError(f"{db_path}: the results database holds no runs")
        out.mkdir(parents=True, exist_ok=True)  # only once there is something to report
        groups = compute_stats(rows, baseline)
        ts_ids = (
            _auto_timeseries(store, rows)
            if runs_for_timeseries is None
            else [int(i) for i in runs_for_timeseries]
        )
        ts_runs = [store.get(i) for i in ts_ids]
    base = resolve_baseline((r["policy"] for r in rows), baseline)

    try:
        import matplotlib  # noqa: F401
    except ImportError:
        plotting = False
    else:
        plotting = True
    plots: list[Path] = []
    # one colour per policy across every plot, the baseline first
    order = sorted({r["policy"] for r in rows}, key=lambda p: (p != base, p))
    colors = {p: f"C{i % 10}" for i, p in enumerate(order)}

    blocks: list[Block] = [("h1", title)]
    blocks += _definitions(base, len(rows), sum(1 for r in rows if not r["ok"]))
    if not plotting:
        blocks.append(
            ("p", "Plots skipped: matplotlib is not installed (pip install 'hidvfs[report]').")
        )

    for g in groups:
        blocks.append(("h2", g.title))
        if env_text := omp_env_text(g):
            blocks.append(("p", env_text))
        if g.baseline is None and base is not None:
            blocks.append(("p", f"The baseline {base} has no runs in this table: no ratios."))
        blocks.append(("table", KERNEL_HEADER, _kernel_rows(g)))
        if g.deadlines:
            blocks.append(("h3", "Deadline misses"))
            blocks.append(("table", DEADLINE_HEADER, _deadline_rows(g)))
        if plotting:
            grows = [r for r in rows if g.holds(r)]
            # the spec hash only where one kernel has tables of other settings too
            parts = [g.board, g.backend, g.bench, g.cls]
            if sum(1 for h in groups if h.holds_kernel(g)) > 1:
                parts.append(g.spec_hash)
            png = out / f"pareto_{_slug(*parts)}.png"
            if _plot_pareto(g, grows, png, colors):
                plots.append(png)
                blocks.append(("img", png.name, f"{g.title}: energy vs makespan"))
            else:
                blocks.append(("p", "No energy measured in this table: no energy-makespan plot."))

    if plotting:
        by_board: dict[tuple[str, str], list[GroupStats]] = defaultdict(list)
        for g in groups:
            by_board[(g.board, g.backend)].append(g)
        blocks.append(("h2", "Per-policy comparison"))
        for (board, backend), gs in sorted(by_board.items()):
            png = out / f"policy_bars_{_slug(board, backend)}.png"
            if _plot_bars(gs, png, colors):
                plots.append(png)
                blocks.append(
                    ("img", png.name, f"per-policy makespan and energy ({board}, {backend})")
                )
        if ts_runs:
            blocks.append(("h2", "Frequency and temperature over time"))
        for run in ts_runs:
            png = out / f"timeseries_run{run['id']}.png"
            if _plot_timeseries(run, png):
                plots.append(png)
                blocks.append(("img", png.name, f"run {run['id']}: frequency and temperature"))
            else:
                blocks.append(("p", f"Run {run['id']} has no stored frequency/temperature series."))

    md = out / "report.md"
    md.write_text(_render_md(blocks), encoding="utf-8")
    page = out / "report.html"
    page.write_text(_render_html(blocks, title), encoding="utf-8")
    summary = out / "summary.json"
    summary.write_text(
        json.dumps({"baseline": base, "groups": [asdict(g) for g in groups]}, indent=1) + "\n",
        encoding="utf-8",
    )
    return ReportFiles(md, page, summary, plots, groups, plotting)
