"""The canned studies produce their tables from real simulated runs."""

import pytest
from click.testing import CliRunner

from bots_bench.studies import deadline_vs_maxfreq, format_study, mixed_criticality
from tools.cli import cli


def test_deadline_vs_maxfreq_counts_misses_and_energy():
    r = deadline_vs_maxfreq(
        "tx2", policy="powersave", seeds=1, slack=1.5, kernels=["fib"], cls="test"
    )
    # powersave is far slower than 1.5x the maxfreq reference: the study must fail loudly.
    assert r.summary["misses"] == 1 and not r.ok
    assert "missed its deadline" in " ".join(r.problems)
    ok = deadline_vs_maxfreq("tx2", policy="performance", seeds=1, kernels=["fib"], cls="test")
    assert ok.ok and abs(ok.summary["energy_saved_mean"]) < 0.05  # same point as maxfreq
    assert abs(ok.summary["cpu_energy_saved_mean"]) < 0.05
    assert "energy saved" in format_study(ok) and "CPU rail" in format_study(ok)
    # the CPU-rail saving is the runs' own: 1 - policy / maxfreq on that rail
    row = r.rows[0]
    want = 1 - row["policy_cpu_energy_j"] / row["maxfreq_cpu_energy_j"]
    assert r.summary["cpu_energy_saved_mean"] == pytest.approx(want)
    assert r.summary["cpu_energy_saved_mean"] != pytest.approx(r.summary["energy_saved_mean"])


def test_mixed_criticality_study_table():
    r = mixed_criticality("orin-nx", seeds=1, n_hi=5)
    assert r.ok
    assert r.summary["with_reservation"]["hi_misses"] == 0
    assert r.summary["without_reservation"]["hi_misses"] >= 1
    text = format_study(r)
    assert "with reservation" in text and "95% CI" in text


def test_study_cli_exit_code_follows_the_assertion():
    r = CliRunner().invoke(
        cli,
        [
            "bots",
            "study",
            "deadline-vs-maxfreq",
            "--bench",
            "fib",
            "--class",
            "test",
            "--seeds",
            "1",
            "--policy",
            "powersave",
        ],
    )
    assert r.exit_code == 1 and "FAILED" in r.output


def test_an_empty_kernel_selection_is_refused_not_every_kernel():
    """`kernels or KERNELS` turned [] (an empty --bench) into all 12 kernels."""
    from bots_bench.studies import vs_geardvfs

    def sim(k, s, p):
        raise AssertionError("a run was made")

    for study in (deadline_vs_maxfreq, vs_geardvfs):
        with pytest.raises(ValueError, match="no kernels selected"):
            study("tx2", seeds=1, kernels=[], cls="test", runner=sim)


# -- scripted runners (no simulation) --------------------------------------------------
def _scripted(records):
    def sim(kernel, seed, policy):
        return records(seed, policy)

    return sim  # named "sim": the study reports the sim backend


def _rec(policy, ok=True, energy=10.0, met=True):
    return {
        "policy": policy,
        "ok": ok,
        "error": None if ok else "RuntimeError: boom",
        "energy_j": energy if ok else None,
        "cpu_energy_j": None if energy is None or not ok else energy / 2,
        "makespan_s": 1.0 if ok else None,
        "deadline_s": 1.5,
        "deadline_met": met if ok else None,
    }


def test_failed_policy_runs_count_as_deadline_misses():
    """n counted them but misses never did: 3 failures of 4 read as 0 misses (CI 0-0.6)."""
    runner = _scripted(
        lambda seed, p: _rec(p, ok=seed == 3) if p == "hidvfs" else _rec(p, energy=12.0)
    )
    r = deadline_vs_maxfreq("tx2", seeds=4, kernels=["fib"], runner=runner)
    assert (r.summary["misses"], r.summary["jobs"]) == (3, 4)
    assert r.summary["miss_ratio_ci95"][0] > 0.1 and not r.ok
    assert [row["deadline_met"] for row in r.rows] == [None, None, None, True]


def test_a_pair_without_energy_has_no_energy_reduction_of_its_own():
    """The row of a pair with no energy reading showed the previous pair's reduction."""
    from bots_bench.studies import vs_geardvfs

    def records(seed, p):
        return _rec(p, energy=None if seed == 1 else (8.0 if p == "hidvfs" else 10.0))

    r = vs_geardvfs("tx2", seeds=2, kernels=["fib"], runner=_scripted(records))
    assert [row["energy_reduction"] for row in r.rows] == [pytest.approx(0.2), None]
    assert r.summary["energy_reduction_mean"] == pytest.approx(0.2)


def test_no_power_monitor_prints_unavailable_not_nan():
    from bots_bench.studies import vs_geardvfs

    runner = _scripted(lambda seed, p: _rec(p, energy=None))
    r = deadline_vs_maxfreq("tx2", seeds=2, kernels=["fib"], runner=runner)
    text = format_study(r)
    assert "nan" not in text.lower() and "energy saved: unavailable" in text
    g = format_study(vs_geardvfs("tx2", seeds=2, kernels=["fib"], runner=runner))
    assert "nan" not in g.lower() and "energy reduction: unavailable" in g
    # every pair failed: no speedup either, still no nan
    failed = _scripted(lambda seed, p: _rec(p, ok=False))
    text = format_study(vs_geardvfs("tx2", seeds=1, kernels=["fib"], runner=failed))
    assert "nan" not in text.lower() and "unavailable" in text


def test_a_policy_run_without_energy_is_left_out_of_the_saving_not_a_crash():
    """One native run whose rail read too little has energy None: the study crashed."""
    runner = _scripted(
        lambda seed, p: _rec(p, energy=None if (seed == 0 and p == "hidvfs") else 10.0)
    )
    r = deadline_vs_maxfreq("tx2", seeds=2, kernels=["fib"], runner=runner)
    assert "energy saved" in format_study(r)
