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
