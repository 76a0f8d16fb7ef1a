"""The campaign table: both energy rails, ratios to the first policy, geometric means."""

import math

import pytest

from bots_bench.campaign_sim import ratio_table


def rec(bench, policy, t, e, cpu, ok=True, seed=0):
    return {
        "bench": bench,
        "policy": policy,
        "seed": seed,
        "ok": ok,
        "error": None if ok else "RuntimeError: verification failed",
        "makespan_s": t if ok else None,
        "energy_j": e if ok else None,
        "cpu_energy_j": cpu if ok else None,
    }


def cells(table: str, kernel: str) -> list[str]:
    row = next(line for line in table.splitlines() if line.startswith(kernel))
    return row.split()


def test_ratios_cover_time_board_and_cpu_energy():
    records = [
        rec("fib", "hidvfs", 1.0, 10.0, 4.0),
        rec("fib", "maxfreq", 0.9, 10.5, 5.0),
        rec("sort", "hidvfs", 2.0, 20.0, 8.0),
        rec("sort", "maxfreq", 2.2, 18.0, 6.0),
    ]
    table = ratio_table(records, ["hidvfs", "maxfreq"])
    head, sub = table.splitlines()[:2]
    assert "maxfreq/hidvfs" in head
    assert sub.split()[-3:] == ["t", "E", "Ecpu"]
    fib = cells(table, "fib")
    assert fib[-3:] == ["0.900", "1.050", "1.250"]
    geo = cells(table, "geomean")
    assert geo[0] == "geomean" and geo[1] == "|"
    assert float(geo[2]) == pytest.approx(math.sqrt(0.9 * 1.1), abs=1e-3)
    assert float(geo[3]) == pytest.approx(math.sqrt(1.05 * 0.9), abs=1e-3)
    assert float(geo[4]) == pytest.approx(math.sqrt(1.25 * 0.75), abs=1e-3)


def test_mean_over_seeds_and_ratios_over_the_seeds_both_ran():
    """The ratio compared unpaired means (0.5 here): seed 1, which maxfreq never ran, weighed
    on the hidvfs side only."""
    records = [
        rec("fib", "hidvfs", 1.0, 10.0, 4.0, seed=0),
        rec("fib", "hidvfs", 3.0, 30.0, 8.0, seed=1),
        rec("fib", "maxfreq", 1.0, 10.0, 3.0),
    ]
    fib = cells(ratio_table(records, ["hidvfs", "maxfreq"]), "fib")
    assert fib[1:4] == ["2.000", "20.00", "6.00"]
    assert fib[-3:] == ["1.000", "1.000", "0.750"]


def test_missing_cpu_rail_and_failed_runs_are_marked_not_dropped():
    records = [
        rec("fib", "hidvfs", 1.0, 10.0, None),
        rec("fib", "maxfreq", 0.5, 8.0, None),
        rec("sort", "hidvfs", 2.0, 20.0, None),
        rec("sort", "maxfreq", 0, 0, 0, ok=False),
    ]
    table = ratio_table(records, ["hidvfs", "maxfreq"])
    fib = cells(table, "fib")
    assert fib[3] == "-" and fib[-1] == "-"  # no CPU rail: no number, no ratio
    assert fib[-3:-1] == ["0.500", "0.800"]
    sort = cells(table, "sort")
    assert "failed" in sort and sort[-3:] == ["-", "-", "-"]
    # the geometric mean is over the kernels that have the ratio
    geo = cells(table, "geomean")
    assert geo[-3:] == ["0.500", "0.800", "-"]
    assert "1 failed run(s):" in table
    assert "sort maxfreq seed 0: RuntimeError: verification failed" in table


def test_single_policy_has_no_ratio_block():
    table = ratio_table([rec("fib", "hidvfs", 1.0, 10.0, 4.0)], ["hidvfs"])
    assert "|" not in table and "geomean" not in table
    assert cells(table, "fib")[1:] == ["1.000", "10.00", "4.00"]


# -- input classes are rows of their own; ratios are paired per seed ---------------------
def crec(bench, cls, policy, t, seed=0, ok=True):
    return {**rec(bench, policy, t, 10 * t, 2 * t, ok=ok, seed=seed), "class": cls}


def test_input_classes_are_not_averaged_together():
    """(bench, policy) grouping averaged test and large inputs into one number."""
    records = [
        crec("fib", "test", "hidvfs", 1.0),
        crec("fib", "test", "maxfreq", 0.5),
        crec("fib", "large", "hidvfs", 100.0),
        crec("fib", "large", "maxfreq", 80.0),
    ]
    table = ratio_table(records, ["hidvfs", "maxfreq"])
    test, large = cells(table, "fib/test"), cells(table, "fib/large")
    assert test[1] == "1.000" and test[-3:] == ["0.500"] * 3
    assert large[1] == "100.000" and large[-3:] == ["0.800"] * 3
    geo = cells(table, "geomean")
    assert float(geo[2]) == pytest.approx(math.sqrt(0.5 * 0.8), abs=1e-3)
    lines = table.splitlines()
    assert len({len(x) for x in lines[1:6]}) == 1  # a long row label keeps the columns aligned


def test_a_seed_one_policy_failed_is_left_out_of_the_ratio():
    records = [
        crec("fib", "small", "hidvfs", 1.0, seed=0),
        crec("fib", "small", "hidvfs", 2.0, seed=1),
        crec("fib", "small", "hidvfs", 4.0, seed=2),
        crec("fib", "small", "maxfreq", 2.0, seed=0),
        crec("fib", "small", "maxfreq", 0.0, seed=1, ok=False),
        crec("fib", "small", "maxfreq", 2.0, seed=2),
    ]
    fib = cells(ratio_table(records, ["hidvfs", "maxfreq"]), "fib/small")
    # seeds 0 and 2: (2/1 + 2/4) / 2, not mean(2, 2) / mean(1, 2, 4)
    assert fib[-3:] == ["1.250"] * 3
    assert fib[1] == f"{7 / 3:.3f}"  # the policy's own mean keeps its every seed
