"""`hidvfs bots ...`: a BOTS folder that does not exist is refused before anything runs or is
stored, a flag that is ignored says so, a board used only because nothing was detected is
named, and the listings and tables keep their columns whole and aligned."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from bots_bench.campaign_sim import ratio_table
from tools.cli import cli


def bots(*args):
    return CliRunner().invoke(cli, ["bots", *args])


@pytest.fixture
def no_board(monkeypatch):
    """Records every board a command opens; nothing is opened for real."""
    import bots_bench.native as native

    opened = []

    def fake(*args, **kw):
        opened.append(args)
        raise AssertionError("the board was opened")

    monkeypatch.setattr(native, "open_board", fake)
    return opened


NATIVE = ["run", "--backend", "native", "--bench", "fib", "--class", "test"]


def test_native_run_refuses_a_missing_bots_bin_before_running(no_board, tmp_path):
    """It used to run the whole matrix, one failed run per config stored in --db, exit 1."""
    db = tmp_path / "r.sqlite"
    r = bots(*NATIVE, "--bots-bin", str(tmp_path / "nope"), "--db", str(db), "--json")
    assert r.exit_code == 2, r.output
    assert r.output.strip().splitlines() == [
        f"hidvfs: error: --bots-bin {tmp_path / 'nope'}: no such folder (build BOTS there, "
        "see README)"
    ]
    assert not db.exists() and no_board == []


def test_native_run_without_bots_bin_is_refused_in_one_line(no_board, tmp_path):
    db = tmp_path / "r.sqlite"
    r = bots(*NATIVE, "--db", str(db))
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1
    assert "--bots-bin: the native backend needs the folder of the BOTS binaries" in r.output
    assert "<command line>" not in r.output and not db.exists() and no_board == []


def _spec(tmp_path, backend: str, bots_bin) -> str:
    path = tmp_path / "campaign.yaml"
    path.write_text(
        "kernels: [fib]\nclasses: [test]\npolicies: [maxfreq]\nseeds: 1\nboard: tx2\n"
        f"backend: {backend}\nbots_bin: {bots_bin}\n"
    )
    return str(path)


def test_a_spec_s_missing_bots_bin_is_refused_before_running(no_board, tmp_path):
    spec = _spec(tmp_path, "native", tmp_path / "nope")
    db = tmp_path / "r.sqlite"
    r = bots("run", "--spec", spec, "--db", str(db))
    assert r.exit_code == 2, r.output
    assert f"{spec}: bots_bin {tmp_path / 'nope'}: no such folder" in r.output
    assert not db.exists() and no_board == []
    afile = tmp_path / "file"
    afile.write_text("")
    r = bots("run", "--spec", _spec(tmp_path, "native", afile), "--db", str(db))
    assert r.exit_code == 2 and "is not a folder" in r.output and not db.exists()


def test_the_simulator_notes_that_it_ignores_bots_bin(tmp_path):
    r = bots(
        "run", "--bench", "fib", "--class", "test", "--policy", "maxfreq", "--json",
        "--bots-bin", str(tmp_path / "nope"),
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    assert r.stderr.strip().splitlines() == [
        "note: --bots-bin is ignored with the sim backend (the simulator runs the kernels' "
        "DAG models, not the binaries)"
    ]
    assert json.loads(r.stdout)[0]["ok"]


def test_flags_a_spec_replaces_are_noted(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a spec campaign keeps its results in ./results.sqlite
    spec = _spec(tmp_path, "sim", tmp_path)
    r = bots("run", "--spec", spec, "--bench", "sort", "--class", "small", "--json")
    assert r.exit_code == 0, r.output
    assert f"note: --spec {spec} sets the campaign: --bench, --class ignored" in r.stderr
    assert [x["bench"] for x in json.loads(r.stdout)] == ["fib"]


def test_run_help_documents_the_spec_keys():
    r = bots("run", "--help")
    for key in ("kernels:", "classes:", "policies:", "seeds:", "bots_bin:", "cooldown:"):
        assert key in r.output


def test_a_native_study_refuses_a_missing_bots_bin_before_opening_the_board(no_board, tmp_path):
    for extra in (["--bots-bin", str(tmp_path / "nope")], []):
        r = bots("study", "deadline-vs-maxfreq", "--backend", "native", "--bench", "fib", *extra)
        assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1, r.output
        assert ("no such folder" if extra else "needs the folder") in r.output
    assert no_board == []


def test_bots_profile_refuses_a_missing_bots_bin_like_list_and_run(monkeypatch, tmp_path):
    import tools.cmd_profile as cp

    def fake(*a, **kw):
        raise AssertionError("a measuring session was opened")

    monkeypatch.setattr(cp, "MeasureSession", fake)
    nope = str(tmp_path / "nope")
    outs = [bots(cmd, "--bots-bin", nope) for cmd in ("profile", "list")]
    for r in outs:
        assert r.exit_code == 2
    assert outs[0].output == outs[1].output
    assert f"--bots-bin {nope}: no such folder" in outs[0].output


def test_bots_list_columns_are_aligned_and_name_the_binaries(tmp_path):
    (tmp_path / "fib.gcc.omp-tasks").write_text("")
    (tmp_path / "fib.gcc.omp-tasks").chmod(0o755)
    for args, found in (([], False), (["--bots-bin", str(tmp_path)], True)):
        r = bots("list", *args)
        assert r.exit_code == 0, r.output
        lines = r.output.splitlines()
        # the legend of the class columns and the --bots-bin hint are not rows
        legend = [x for x in lines if x.startswith("sim classes: ")]
        assert len(legend) == 1
        head = lines[0]
        rows = [x for x in lines[1:] if not x.startswith("(") and x not in legend]
        assert len(rows) == 12
        columns = ["kernel", "binary (default)", "sim classes", "native classes"]
        columns += [f"found in {tmp_path}"] if found else []
        starts = [head.index(c) for c in columns]
        by_kernel = {}
        for row in rows:  # every cell starts where its header does
            for a in starts[1:]:
                assert row[a - 2 : a] == "  " and row[a] != " ", row
            cells = row.split()
            by_kernel[cells[0]] = cells
        assert by_kernel["fib"][1] == "fib.gcc.omp-tasks"
        assert by_kernel["sparselu"][1] == "sparselu.gcc.single-omp-tasks"
        assert by_kernel["nqueens"][2:4] == [
            "test,small,medium,large,huge",  # sim
            "smoke,test,small,medium,large,huge",  # native
        ]
        if found:
            assert by_kernel["fib"][-1] == "omp-tasks" and by_kernel["sort"][-1] == "none"
            assert not any(x.startswith("(") for x in lines)
        else:
            assert len(by_kernel["fib"]) == 4  # no "found: -" column without a folder
            assert lines[-1].startswith("(pass --bots-bin DIR to look for built binaries;")
            assert "--kernel NAME" in lines[-1]
    r = bots("list", "--json")
    assert json.loads(r.stdout)[3]["binary"] == "fib.gcc.omp-tasks"


def _rec(bench, policy, t):
    return {
        "bench": bench, "policy": policy, "seed": 0, "ok": True, "error": None,
        "makespan_s": t, "energy_j": 2 * t, "cpu_energy_j": t,
    }  # fmt: skip


def test_ratio_table_labels_are_whole_and_columns_aligned():
    """`performance/schedutil` used to be cut to `performance/scheduti`."""
    pols = ["schedutil", "performance", "conservative", "maxfreq"]
    records = [_rec(b, p, 1.0 + i) for b in ("fib", "sort") for i, p in enumerate(pols)]
    table = ratio_table(records, pols)
    lines = table.splitlines()
    head = lines[0]
    for p in pols[1:]:
        assert f" {p}/schedutil " in head + " "
    for p in pols:
        assert f" {p} " in head
    width = len(lines[1])
    assert all(len(x) == width for x in lines[1:5])  # sub, rule, fib, sort, geomean...
    assert len(lines[5]) == width
    # each ratio label starts over its group's first ratio column: the groups line up
    bar = lines[1].index("|")
    assert all(x[bar] == "|" for x in (lines[1], lines[3], lines[4], lines[5]))
    fib = lines[3].split()
    assert fib[fib.index("|") + 1 :] == [
        "2.000", "2.000", "2.000", "3.000", "3.000", "3.000", "4.000", "4.000", "4.000",
    ]  # fmt: skip
    geo = lines[5].split()
    assert geo[0] == "geomean" and geo[1] == "|" and geo[2:5] == ["2.000"] * 3


@pytest.fixture
def no_sim(monkeypatch):
    """Fails any study or campaign that gets as far as simulating a run."""
    import bots_bench.campaign_sim as campaign_sim
    import bots_bench.studies as studies

    def ran(*a, **kw):
        raise AssertionError("a run was simulated")

    monkeypatch.setattr(studies, "_sim_runner", ran)
    monkeypatch.setattr(campaign_sim, "run_one", ran)


@pytest.mark.parametrize("seed", ["9223372036854775808", "-1"])
def test_a_spec_seed_the_store_cannot_keep_is_refused_before_running(no_sim, tmp_path, seed):
    """2**63 crashed with an OverflowError after simulating; -1 stored a failed run."""
    spec = tmp_path / "c.yaml"
    spec.write_text(
        "kernels: [fib]\nclasses: [test]\npolicies: [maxfreq]\nboard: tx2\nbackend: sim\n"
        f"seeds: [{seed}]\n"
    )
    db = tmp_path / "r.sqlite"
    r = bots("run", "--spec", str(spec), "--db", str(db))
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert f"{spec}: key 'seeds': expected integers from 0 to" in r.output
    assert not db.exists()


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_run_deadline_slack_must_be_finite(no_sim, value):
    """inf and nan used to fail after simulating, on the JSON of the run key."""
    r = bots("run", "--bench", "fib", "--class", "test", "--policy", "maxfreq",
             "--deadline-slack", value)  # fmt: skip
    assert r.exit_code == 2 and "Invalid value for '--deadline-slack'" in r.output, r.output
    assert "not a finite number" in r.output


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_study_slack_must_be_finite(no_sim, value):
    r = bots("study", "deadline-vs-maxfreq", "--bench", "fib", "--class", "test", "--slack", value)
    assert r.exit_code == 2 and "Invalid value for '--slack'" in r.output, r.output


STUDY = ["study", "deadline-vs-maxfreq", "--seeds", "1"]


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--bench", "fib", "--class", "nosuch"], ["--bench", "fib", "--class", "nosuch"]),
        (["--bench", "fib", "--class", "test", "--policy", "nosuch"],
         ["--bench", "fib", "--class", "test", "--policy", "nosuch"]),
        (["--bench", "", "--class", "test"], ["--bench", "", "--class", "test"]),
        (["--bench", "fib,nosuch", "--class", "test"], ["--bench", "fib,nosuch", "--class", "test"]),
    ],
)  # fmt: skip
def test_study_refuses_a_bad_selection_like_run(no_sim, args, flag):
    """A typo in --class or --policy gave a FAILED report (exit 1); --bench "" ran every
    kernel. The refusal is the one `bots run` gives for the same flags."""
    r = bots(*STUDY, *args)
    want = bots("run", *flag)
    assert r.exit_code == 2 and want.exit_code == 2, r.output
    assert r.output == want.output and r.output.startswith("hidvfs: error: <command line>: key")


def test_vs_geardvfs_checks_the_class_but_not_the_unused_policy(no_sim):
    r = bots("study", "vs-geardvfs", "--bench", "fib", "--class", "nosuch", "--policy", "nosuch")
    assert r.exit_code == 2 and "key 'classes'" in r.output, r.output


def test_deadline_study_takes_one_policy(no_sim):
    r = bots(*STUDY, "--bench", "fib", "--class", "test", "--policy", "hidvfs,ztt")
    assert r.exit_code == 2 and "--policy hidvfs,ztt" in r.output, r.output


@pytest.mark.parametrize(
    ("args", "key"), [(["--class", "nosuch"], "classes"), (["--bench", ""], "kernels")]
)
def test_bots_profile_refuses_a_bad_class_or_bench_before_measuring(
    monkeypatch, tmp_path, args, key
):
    """--class nosuch opened the board and failed every kernel (exit 1)."""
    import tools.cmd_profile as cp

    def fake(*a, **kw):
        raise AssertionError("a measuring session was opened")

    monkeypatch.setattr(cp, "MeasureSession", fake)
    r = bots("profile", "--bots-bin", str(tmp_path), *args)
    assert r.exit_code == 2 and f"<command line>: key '{key}'" in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1


def test_bots_list_kernel_shows_each_class_on_both_backends():
    """One class name is not always one input: fib's sim small is n = 40, the native
    small -n 10 (bots.md section 2); the detail view puts them side by side."""
    r = bots("list", "--kernel", "fib")
    assert r.exit_code == 0, r.output
    rows = {line.split()[0]: line for line in r.output.splitlines()[1:] if "  " in line}
    assert "n=40" in rows["small"] and "-n 10 -x 5" in rows["small"]
    assert rows["smoke"].split()[1] == "-" and rows["t40"].split()[1] == "-"  # native only
    r = bots("list", "--kernel", "concom", "--json")
    by = {row["class"]: row for row in json.loads(r.output)}
    assert by["large"]["native"] is None and by["large"]["sim"]["nodes"] == 5000000
    assert by["test"]["native"] == ["-n", "100000"] and by["test"]["sim"]["nodes"] == 1000
    r = bots("list", "--kernel", "nope")
    assert r.exit_code == 2 and "unknown BOTS kernel 'nope'" in r.output


def test_bots_list_shows_a_binary_that_is_not_executable_as_such(tmp_path):
    """It was "none", as if it were not built, while `bots run` said "not executable"."""
    for name, mode in (
        ("fib.gcc.omp-tasks", 0o644),
        ("fib.gcc.serial", 0o755),
        ("sort.gcc.omp-tasks", 0o600),
    ):
        (tmp_path / name).write_text("#!/bin/sh\n")
        (tmp_path / name).chmod(mode)
    r = bots("list", "--bots-bin", str(tmp_path))
    assert r.exit_code == 0, r.output
    head, *lines = r.output.splitlines()
    at = head.index(f"found in {tmp_path}")
    found = {x.split()[0]: x[at:] for x in lines if x.split()[0] in ("fib", "sort", "uts")}
    assert found == {
        "fib": "serial; omp-tasks (not executable: chmod +x)",
        "sort": "omp-tasks (not executable: chmod +x)",
        "uts": "none",
    }
    r = bots("list", "--bots-bin", str(tmp_path), "--json")
    fib = json.loads(r.stdout)[3]
    assert fib["binaries_found"] == {"serial": str(tmp_path / "fib.gcc.serial")}
    assert fib["binaries_not_executable"] == {"omp-tasks": str(tmp_path / "fib.gcc.omp-tasks")}
