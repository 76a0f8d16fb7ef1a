"""Campaign report: numbers re-computed from the database, plots that open, the statistics."""

from __future__ import annotations

import html
import json
import re
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import special, stats

from bots_bench.report import (
    ReportError,
    betainc,
    clopper_pearson,
    compute_stats,
    pareto_front,
    t_interval,
    t_ppf,
    write_report,
)
from bots_bench.store import Store

POLICIES = {"schedutil": 1.0, "hidvfs": 0.7, "performance": 0.8}  # relative makespan
SEEDS = (1, 2, 3)
REPS = 12  # more than 10, so L10 differs from the plain mean
DEADLINE = 2.1


def _campaign(db):
    rng = np.random.default_rng(7)
    with Store(db) as s:
        for bench, has_energy in (("fib", True), ("sort", False)):
            for seed in SEEDS:
                for rep in range(REPS):
                    for policy, speed in POLICIES.items():
                        failed = policy == "hidvfs" and seed == 2 and rep == 5
                        ms = 2.0 * speed * (1 + 0.05 * seed) * (1 + 0.1 * rng.random()) + 0.01 * rep
                        energy = (
                            ms
                            * (5.0 if policy == "performance" else 3.5)
                            * (1 + 0.05 * rng.random())
                        )
                        ts = None
                        if bench == "fib" and rep == 0:
                            t = [i * 0.1 for i in range(20)]
                            ts = {
                                "t": t,
                                "freq_khz": {"a57": [345600 + 80000 * (i % 5) for i in range(20)]},
                                "temp_c": {"cpu": [40 + 0.5 * i for i in range(20)]},
                            }
                        s.add(
                            {
                                "bench": bench,
                                "class": "test",
                                "policy": policy,
                                "seed": seed,
                                "board": "tx2",
                                "backend": "sim",
                                "rep": rep,
                                "makespan_s": None if failed else ms,
                                "energy_j": energy if has_energy and not failed else None,
                                "cpu_energy_j": (
                                    0.4 * energy * (0.8 if policy == "hidvfs" else 1.0)
                                    if has_energy and not failed
                                    else None
                                ),
                                "peak_temp_c": 50 + 10 * speed + rng.random(),
                                "deadline_s": DEADLINE if bench == "fib" else None,
                                "deadline_met": None if failed else bool(ms <= DEADLINE),
                                "criticality": "hi" if rep % 2 else "lo",
                                "ok": not failed,
                                "error": "RuntimeError: died" if failed else None,
                                "timeseries": ts,
                            }
                        )


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    d = tmp_path_factory.mktemp("report")
    db = d / "results.sqlite"
    _campaign(db)
    files = write_report(db, d / "out", baseline="schedutil")
    with Store(db) as s:
        rows = s.runs(with_stdout=False, with_timeseries=False)
    return files, rows, db


# -- independent recomputation from the rows ---------------------------------------------------
def _seed_means(rows, bench, policy, col):
    out = {}
    for seed in SEEDS:
        v = [
            r[col]
            for r in rows
            if r["bench"] == bench
            and r["policy"] == policy
            and r["seed"] == seed
            and r["ok"]
            and r[col] is not None
        ]
        if v:
            out[seed] = float(np.mean(v))
    return out


def _l10(rows, bench, policy):
    out = []
    for seed in SEEDS:
        rs = sorted(
            (
                r
                for r in rows
                if r["bench"] == bench and r["policy"] == policy and r["seed"] == seed and r["ok"]
            ),
            key=lambda r: r["rep"],
        )
        out.append(np.mean([r["makespan_s"] for r in rs[-10:]]))
    return out


def _tint(vals):
    vals = np.asarray(vals)
    m = vals.mean()
    if np.ptp(vals) == 0:  # the baseline against itself
        return m, m, m
    lo, hi = stats.t.interval(0.95, len(vals) - 1, loc=m, scale=stats.sem(vals))
    return m, lo, hi


def _nums(cell):
    return [float(x) for x in re.findall(r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?", cell)]


def _tables(md):
    """section title -> list of tables (each a list of rows of cells)."""
    out, title, table = {}, None, None
    for line in md.splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip()
            out.setdefault(title, [])
            table = None
        elif line.startswith("|---"):
            continue
        elif line.startswith("|"):
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            if table is None:
                table = []
                out[title].append(table)
            table.append(cells)
        else:
            table = None
    return out


def _close(got, want):
    assert got == pytest.approx(want, rel=6e-4, abs=1e-9), (got, want)


def test_numbers_match_the_database(report):
    files, rows, _ = report
    tables = _tables(files.markdown.read_text())
    for bench in ("fib", "sort"):
        main = tables[f"{bench} / test (tx2, sim)"][0]
        header, body = main[0], {r[0].split(" ")[0]: r for r in main[1:]}
        assert header[3] == "makespan s" and header[4] == "L10 s"
        assert header[5] == "energy J" and header[6] == "CPU energy J"
        assert set(body) == set(POLICIES)
        assert body["schedutil"][0] == "schedutil (baseline)"
        base_ms = _seed_means(rows, bench, "schedutil", "makespan_s")
        base_e = _seed_means(rows, bench, "schedutil", "energy_j")
        base_c = _seed_means(rows, bench, "schedutil", "cpu_energy_j")
        for policy, row in body.items():
            n_runs = sum(1 for r in rows if r["bench"] == bench and r["policy"] == policy)
            n_fail = sum(
                1 for r in rows if r["bench"] == bench and r["policy"] == policy and not r["ok"]
            )
            assert row[1] == "3" and row[2] == f"{n_runs} ({n_fail})"
            ms = _seed_means(rows, bench, policy, "makespan_s")
            mean, std = _nums(row[3])
            _close(mean, np.mean(list(ms.values())))
            _close(std, np.std(list(ms.values()), ddof=1))
            l10 = _l10(rows, bench, policy)
            _close(_nums(row[4])[0], np.mean(l10))
            _close(_nums(row[4])[1], np.std(l10, ddof=1))
            temp = _seed_means(rows, bench, policy, "peak_temp_c")
            _close(_nums(row[7])[0], np.mean(list(temp.values())))
            speed = _tint([base_ms[s] / ms[s] for s in SEEDS])
            for got, want in zip(_nums(row[8]), speed):
                _close(got, want)
            if bench == "fib":
                for col, red_col, key, base in (
                    (5, 9, "energy_j", base_e),
                    (6, 10, "cpu_energy_j", base_c),
                ):
                    en = _seed_means(rows, bench, policy, key)
                    _close(_nums(row[col])[0], np.mean(list(en.values())))
                    red = _tint([100 * (1 - en[s] / base[s]) for s in SEEDS])
                    for got, want in zip(_nums(row[red_col]), red):
                        _close(got, want)
            else:  # no power monitor
                assert row[5] == row[6] == row[9] == row[10] == "n/a"
    # L10 really is the last ten: differs from the all-runs mean here (makespan grows with rep)
    fib_sched = tables["fib / test (tx2, sim)"][0][1]
    assert _nums(fib_sched[4])[0] > _nums(fib_sched[3])[0]


def test_deadline_misses_match_the_database(report):
    files, rows, _ = report
    dl = _tables(files.markdown.read_text())["Deadline misses"]
    assert len(dl) == 1  # only fib has deadlines; its table follows the fib section
    body = dl[0][1:]
    assert len(body) == len(POLICIES) * 2
    for policy, crit, frac, ratio, ci in body:
        rs = [
            r
            for r in rows
            if r["bench"] == "fib" and r["policy"] == policy and r["criticality"] == crit
        ]
        k = sum(1 for r in rs if not (r["ok"] and r["deadline_met"]))
        assert frac == f"{k} / {len(rs)}"
        _close(float(ratio), k / len(rs))
        want = stats.binomtest(k, len(rs)).proportion_ci(method="exact")
        lo, hi = _nums(ci)
        _close(lo, want.low)
        _close(hi, want.high)


def test_summary_and_html_hold_the_same_numbers(report):
    files, rows, _ = report
    summary = json.loads(files.summary.read_text())
    assert summary["baseline"] == "schedutil"
    groups = compute_stats(rows, "schedutil")
    assert [g["bench"] for g in summary["groups"]] == [g.bench for g in groups] == ["fib", "sort"]
    fib = summary["groups"][0]["policies"]
    assert fib[0]["policy"] == "schedutil" and fib[0]["speedup"]["mean"] == pytest.approx(1.0)
    page = files.html.read_text()
    for title, tables in _tables(files.markdown.read_text()).items():
        assert html.escape(title) in page
        for table in tables:
            for row in table:
                for cell in row:
                    assert f">{html.escape(cell)}<" in page, cell
    md = files.markdown.read_text()
    assert "L10" in md and "last 10 successful evaluation runs" in md
    assert "Student-t interval" in md and "Clopper-Pearson" in md


def test_plots_exist_and_open(report):
    import matplotlib.image as mpimg

    files, _, _ = report
    names = sorted(p.name for p in files.plots)
    assert "pareto_tx2_sim_fib_test.png" in names
    assert "pareto_tx2_sim_sort_test.png" not in names  # no energy measured for sort
    assert "policy_bars_tx2_sim.png" in names
    ts = [n for n in names if n.startswith("timeseries_run")]
    assert len(ts) == len(POLICIES)  # one run per policy, chosen automatically
    md = files.markdown.read_text()
    for p in files.plots:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        img = mpimg.imread(p)
        assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100
        assert img.std() > 0  # not a blank canvas
        assert f"]({p.name})" in md


def test_chosen_runs_and_no_baseline(report, tmp_path):
    _, rows, db = report
    ids = [r["id"] for r in rows if r["bench"] == "fib" and r["rep"] == 0][:2]
    files = write_report(db, tmp_path / "o", baseline=None, runs_for_timeseries=ids)
    assert sorted(p.name for p in files.plots if p.name.startswith("timeseries")) == sorted(
        f"timeseries_run{i}.png" for i in ids
    )
    assert "The baseline policy is **schedutil**" in files.markdown.read_text()  # the default
    none = write_report(db, tmp_path / "n", runs_for_timeseries=[])
    assert not any(p.name.startswith("timeseries") for p in none.plots)


def test_errors(report, tmp_path):
    _, _, db = report
    with pytest.raises(ReportError, match="baseline policy 'geardvfs' has no runs"):
        write_report(db, tmp_path / "x", baseline="geardvfs")
    with pytest.raises(ReportError, match="no such results database"):
        write_report(tmp_path / "missing.sqlite", tmp_path / "y")
    Store(tmp_path / "empty.sqlite").close()
    with pytest.raises(ReportError, match="holds no runs"):
        write_report(tmp_path / "empty.sqlite", tmp_path / "y")
    assert not (tmp_path / "y").exists()  # no empty report folder left behind


def test_without_matplotlib(report, tmp_path, monkeypatch):
    _, _, db = report
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    files = write_report(db, tmp_path / "o")
    assert (
        files.plots == []
        and "Plots skipped: matplotlib is not installed" in files.markdown.read_text()
    )


# -- statistics ---------------------------------------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(a=st.floats(0.05, 200), b=st.floats(0.05, 200), x=st.floats(0, 1))
def test_betainc_matches_scipy(a, b, x):
    assert betainc(a, b, x) == pytest.approx(special.betainc(a, b, x), rel=1e-8, abs=1e-12)


@settings(max_examples=100, deadline=None)
@given(q=st.floats(0.001, 0.999), df=st.integers(1, 200))
def test_t_quantile_fallback(q, df):
    assert t_ppf(q, df, use_scipy=False) == pytest.approx(stats.t.ppf(q, df), rel=1e-7, abs=1e-6)


@settings(max_examples=150, deadline=None)
@given(n=st.integers(1, 400), data=st.data())
def test_clopper_pearson_fallback(n, data):
    k = data.draw(st.integers(0, n))
    lo, hi = clopper_pearson(k, n, use_scipy=False)
    want = stats.binomtest(k, n).proportion_ci(method="exact")
    assert lo == pytest.approx(want.low, abs=1e-9) and hi == pytest.approx(want.high, abs=1e-9)
    assert 0 <= lo <= k / n <= hi <= 1
    assert clopper_pearson(k, n) == pytest.approx((want.low, want.high))


def test_interval_edge_cases():
    assert t_interval([]) is None
    one = t_interval([2.0])
    assert (one.mean, one.lo, one.hi, one.n) == (2.0, None, None, 1)
    with pytest.raises(ValueError):
        clopper_pearson(3, 2)


@given(st.lists(st.tuples(st.floats(0, 100), st.floats(0, 100)), min_size=1, max_size=30))
def test_pareto_front(points):
    front = pareto_front(points)
    assert front
    for i in front:  # nothing beats a front point on both axes
        x, y = points[i]
        assert not any((x2 <= x and y2 <= y and (x2 < x or y2 < y)) for x2, y2 in points)
    for j in set(range(len(points))) - set(front):  # every other point is dominated
        x, y = points[j]
        assert any(
            points[i][0] <= x and points[i][1] <= y and points[i] != (x, y) for i in front
        ) or any(points[i] == (x, y) for i in front)


def test_runs_of_other_settings_are_other_tables_not_averaged_together(tmp_path):
    """The same kernel, policy and seed run without and with a deadline slack are two
    measurements: two tables, each titled by its setting, never one "runs 2" row."""
    from bots_bench.spec import RunConfig

    db = tmp_path / "r.sqlite"
    with Store(db) as s:
        for slack, ms in ((None, 1.0), (1.5, 3.0)):
            cfg = RunConfig("fib", "test", "maxfreq", 0, "tx2", "sim", 0, deadline_slack=slack)
            s.add({**cfg.record_base(), "makespan_s": ms, "energy_j": 2 * ms, "ok": True})
    with Store(db) as s:
        groups = compute_stats(s.runs(with_stdout=False, with_timeseries=False))
    assert len(groups) == 2
    by_setting = {g.setting: g for g in groups}
    assert set(by_setting) == {"", "deadline slack 1.5x"}
    for setting, ms in (("", 1.0), ("deadline slack 1.5x", 3.0)):
        (ps,) = by_setting[setting].policies
        assert ps.runs == 1 and ps.makespan.mean == ms
    assert by_setting["deadline slack 1.5x"].title.endswith("(tx2, sim; deadline slack 1.5x)")
    files = write_report(db, tmp_path / "out")
    text = files.markdown.read_text()
    assert (
        "## fib / test (tx2, sim)" in text
        and "## fib / test (tx2, sim; deadline slack 1.5x)" in text
    )


def test_report_json_prints_the_summary_numbers(report, tmp_path):
    from click.testing import CliRunner

    from tools.cli import cli

    files, _, db = report
    r = CliRunner().invoke(
        cli, ["bots", "report", "--db", str(db), "--out", str(tmp_path / "o"), "--json"]
    )
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)  # stdout is the JSON alone
    assert out["baseline"] == json.loads(files.summary.read_text())["baseline"]
    assert [g["bench"] for g in out["groups"]] == ["fib", "sort"]


def _native_runs(db, runs):
    """Native run records of fib/test: (threads, seed, omp_env, omp_env_ignored) each."""
    from bots_bench.spec import RunConfig

    with Store(db) as s:
        for threads, seed, env, ignored in runs:
            cfg = RunConfig(
                "fib", "test", "maxfreq", seed, "tx2", "native", 0, threads=threads, cooldown=None
            )
            rec = {**cfg.record_base(), "makespan_s": 1.0, "energy_j": 2.0, "ok": True}
            if env is not None:
                rec["omp_env"] = env
            if ignored:
                rec["omp_env_ignored"] = ignored
            s.add(rec)


def test_a_native_table_says_which_openmp_environment_its_kernels_ran_with(tmp_path):
    """The records store `omp_env` (and the shell's variables left out, `omp_env_ignored`),
    but the report showed neither: a 2-thread table read like a 1-thread one, and an
    OMP_THREAD_LIMIT left in the shell was not named anywhere."""
    db = tmp_path / "r.sqlite"
    two = {"OMP_NUM_THREADS": "2"}
    one = {"OMP_NUM_THREADS": "1", "OMP_STACKSIZE": "16M"}
    _native_runs(
        db,
        [
            (2, 0, two, None),
            (2, 1, two, None),
            (1, 0, one, ["OMP_THREAD_LIMIT", "GOMP_SPINCOUNT"]),
            (1, 1, one, None),
            # threads left to the board: the runs did not all get the same
            (None, 0, two, None),
            (None, 1, {"OMP_NUM_THREADS": "4"}, None),
            (None, 2, None, None),  # failed before its command was built
        ],
    )
    # a simulated table of the same kernel says nothing about OpenMP
    with Store(db) as s:
        s.add({"bench": "fib", "class": "test", "policy": "maxfreq", "seed": 0, "board": "tx2",
               "backend": "sim", "rep": 0, "makespan_s": 1.0, "ok": True})  # fmt: skip
    with Store(db) as s:
        groups = {(g.backend, g.setting): g for g in compute_stats(s.runs(with_stdout=False))}
    g2, g1, auto = (groups[("native", lab)] for lab in ("2 threads", "1 thread", ""))
    assert [(u.env, u.runs) for u in g2.omp_env] == [(two, 2)] and not g2.omp_env_ignored
    assert [(u.env, u.runs) for u in g1.omp_env] == [(one, 2)]
    assert g1.omp_env_ignored == ["GOMP_SPINCOUNT", "OMP_THREAD_LIMIT"]
    assert g1.omp_env_ignored_runs == 1
    assert auto.omp_env_unrecorded == 1 and len(auto.omp_env) == 2
    assert groups[("sim", "")].omp_env == []

    files = write_report(db, tmp_path / "out", baseline="maxfreq")
    md = files.markdown.read_text()
    sections = {
        part.splitlines()[0]: part for part in md.split("\n## ")[1:]
    }  # heading -> its section
    assert (
        "OpenMP environment of the kernels: `OMP_NUM_THREADS=2`."
        in (sections["fib / test (tx2, native; 2 threads)"])
    )
    one_thread = sections["fib / test (tx2, native; 1 thread)"]
    assert (
        "OpenMP environment of the kernels: `OMP_NUM_THREADS=1 OMP_STACKSIZE=16M`. "
        "Left out or replaced from the campaign's shell (1 of 2 runs): `GOMP_SPINCOUNT`, "
        "`OMP_THREAD_LIMIT`." in one_thread
    )
    assert (
        "OpenMP environment of the kernels: `OMP_NUM_THREADS=2` (1 run); "
        "`OMP_NUM_THREADS=4` (1 run); not recorded (1 run)." in sections["fib / test (tx2, native)"]
    )
    assert "OpenMP" not in sections["fib / test (tx2, sim)"]
    page = files.html.read_text()
    assert "<code>OMP_NUM_THREADS=1 OMP_STACKSIZE=16M</code>" in page
    assert "<code>OMP_THREAD_LIMIT</code>" in page
    summary = json.loads(files.summary.read_text())
    envs = [g["omp_env"] for g in summary["groups"] if g["setting"] == "2 threads"]
    assert envs == [[{"env": two, "runs": 2}]]
