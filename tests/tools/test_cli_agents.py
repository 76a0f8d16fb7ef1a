"""`hidvfs agents`: options are range-checked with the option named, boards are checked
first, --models picks each board's folder, --json is strict JSON."""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import dataclass

import pytest
from click.testing import CliRunner

from agents.learned import MODELS_DIR
from tools.cli import cli
from tools.common import emit_json


def run(*args):
    return CliRunner().invoke(cli, ["agents", *args])


def strict(text: str):
    def refuse(c):
        raise ValueError(f"not JSON: {c}")

    return json.loads(text, parse_constant=refuse)


@dataclass
class _Point:
    x: float


def test_emit_json_turns_non_finite_floats_into_null(capsys):
    emit_json({"a": math.nan, "b": [1.5, -math.inf, (math.inf, 2)], "c": {"d": _Point(math.nan)}})
    assert strict(capsys.readouterr().out) == {
        "a": None,
        "b": [1.5, None, [None, 2]],
        "c": {"d": {"x": None}},
    }


@pytest.mark.parametrize(
    "args, option",
    [
        (("--seeds", "0"), "--seeds"),
        (("--seeds", "-2"), "--seeds"),
        (("--seeds", "50001"), "--seeds"),
        (("--jobs", "0"), "--jobs"),
        (("--slack", "0.5"), "--slack"),
    ],
)
def test_eval_options_are_range_checked(args, option):
    r = run("eval", "--board", "tx2", "--policy", "maxfreq", *args)
    assert r.exit_code == 2 and f"Invalid value for '{option}'" in r.output


@pytest.mark.parametrize("policy", ["", " , "])
def test_eval_without_a_policy_is_an_error(policy):
    r = run("eval", "--board", "tx2", "--policy", policy, "--seeds", "1")
    assert r.exit_code == 2 and "--policy names no policy" in r.output


def test_eval_json_is_strict_json():
    r = run(
        "eval", "--board", "tx2", "--policy", "maxfreq", "--seeds", "1", "--jobs", "1", "--json"
    )
    assert r.exit_code == 0, r.output
    rows = strict(r.output)
    assert {row["kind"] for row in rows} == {"run", "summary"}


def test_eval_tuning_mixes_are_the_tuning_seeds_and_capped():
    from agents.train import EVAL_SEEDS, TUNING_SEEDS

    common = ("eval", "--board", "tx2", "--policy", "maxfreq", "--jobs", "1", "--json")
    rows = strict(run(*common, "--seeds", "2", "--mixes", "tuning").output)
    assert sorted(r["seed"] for r in rows if r["kind"] == "run") == [
        TUNING_SEEDS,
        TUNING_SEEDS + 1,
    ]
    rows = strict(run(*common, "--seeds", "1").output)
    assert [r["seed"] for r in rows if r["kind"] == "run"] == [EVAL_SEEDS]
    r = run(*common, "--seeds", "901", "--mixes", "tuning")
    assert r.exit_code == 2 and "--mixes tuning has 900 mixes" in r.output


def test_eval_reserve_runs_the_daemon_s_mixed_criticality_stages():
    """`--reserve` runs a policy as the daemon does: on tx2's first held-out mix at slack 1.1
    maxfreq alone misses its HI job's deadline; with a reserved cluster the HI job meets it.
    The HI misses are counted apart, per run and in the summary."""
    common = ("eval", "--board", "tx2", "--policy", "maxfreq", "--seeds", "1", "--slack", "1.1")
    out = {}
    for flag in ("--no-reserve", "--reserve"):
        rows = strict(run(*common, flag, "--json").output)
        (rec,) = [r for r in rows if r["kind"] == "run"]
        (summary,) = [r for r in rows if r["kind"] == "summary"]
        assert summary["reserve"] is (flag == "--reserve")
        assert summary["hi_misses_total"] == rec["hi_misses"] <= rec["misses"]
        out[flag] = rec
    assert out["--no-reserve"]["hi_misses"] == 1 and out["--reserve"]["hi_misses"] == 0


def test_eval_mix_options_shape_the_mixes():
    """--hi-fraction sets the share of deadline jobs that are HI (0: none, 1: all) and --load
    how densely the jobs arrive; both reach the mixes every policy runs."""
    common = ("eval", "--board", "tx2", "--policy", "maxfreq", "--seeds", "2", "--jobs", "6")
    rows = {}
    for extra in (("--hi-fraction", "0"), ("--hi-fraction", "1"), ("--load", "0.2")):
        out = strict(run(*common, *extra, "--json").output)
        rows[extra] = [r for r in out if r["kind"] == "run"]
    assert all(r["hi_jobs"] == 0 for r in rows[("--hi-fraction", "0")])
    every = rows[("--hi-fraction", "1")]
    assert all(r["hi_jobs"] == r["deadline_jobs"] > 0 for r in every)
    # a fifth of the default load spreads the same jobs out: the mixes take longer
    assert all(a["makespan_s"] > b["makespan_s"] for a, b in zip(rows[("--load", "0.2")], every))
    r = run(*common, "--hi-fraction", "1.5")
    assert r.exit_code == 2 and "--hi-fraction" in r.output


def test_eval_names_the_mixes_no_policy_can_meet():
    """At slack 1.0 (deadline = the job alone at the top OPP, before the plant's jitter) the
    first held-out mix overloads a window: the run rows say so, and its misses are counted
    apart from the ones a policy could have avoided."""
    common = ("eval", "--board", "tx2", "--policy", "maxfreq", "--seeds", "2", "--slack", "1.0")
    rows = strict(run(*common, "--json").output)
    runs = [r for r in rows if r["kind"] == "run"]
    (summary,) = [r for r in rows if r["kind"] == "summary"]
    bad = [r for r in runs if r["deadlines_infeasible"]]
    assert bad and all(r["window_load"] > 1.0 and r["misses"] >= 1 for r in bad)
    assert all(r["window_load"] <= 1.0 for r in runs if not r["deadlines_infeasible"])
    assert summary["infeasible_mixes"] == len(bad)
    assert summary["misses_on_infeasible"] == sum(r["misses"] for r in bad)
    text = run(*common).output
    assert f"{len(bad)} of 2 mixes overload a window" in text
    assert f"maxfreq {summary['misses_total'] - summary['misses_on_infeasible']}" in text


@pytest.mark.parametrize("cmd", ["check", "eval", "sweep"])
def test_unknown_board_is_named_first(cmd):
    r = run(cmd, "--board", "nosuch")
    assert r.exit_code == 2
    assert "unknown board 'nosuch'" in r.output and "run `hidvfs agents train`" not in r.output


def test_check_error_rows_have_no_diff_columns(tmp_path):
    shutil.copytree(MODELS_DIR / "tx2", tmp_path / "tx2")
    (tmp_path / "tx2" / "ztt.onnx").write_bytes(b"truncated")
    r = run("check", "--board", "tx2", "--models", str(tmp_path))
    assert r.exit_code == 1
    (bad,) = [line for line in r.output.splitlines() if "FAIL" in line]
    assert "ztt.onnx" in bad and "nan" not in bad and "max|diff|" not in bad
    ok = [line for line in r.output.splitlines() if " ok " in line]
    assert ok and all("max|diff|" in line and "seed 0" in line for line in ok)


def test_check_names_a_models_folder_that_is_not_there(tmp_path):
    missing = tmp_path / "m"
    r = run("check", "--models", str(missing))
    assert r.exit_code == 2
    assert f"--models {missing}: no such folder" in r.output, r.output
    assert "agents train" not in r.output and "FAIL" not in r.output
    afile = tmp_path / "f"
    afile.write_text("")
    r = run("check", "--board", "tx2", "--models", str(afile), "--json")
    assert r.exit_code == 2 and f"--models {afile}: not a folder" in r.output, r.output


def test_models_root_serves_each_board_from_its_subfolder(tmp_path):
    for b in ("tx2", "orin-nx", "rubikpi3"):
        shutil.copytree(MODELS_DIR / b, tmp_path / b)
    r = run("check", "--models", str(tmp_path), "--json")
    assert r.exit_code == 0, r.output
    reports = strict(r.output)
    assert [rep["folder"] for rep in reports] == [
        str(tmp_path / b) for b in ("tx2", "orin-nx", "rubikpi3")
    ]


def test_one_boards_folder_is_refused_for_the_others():
    r = run("check", "--board", "all", "--models", str(MODELS_DIR / "tx2"), "--json")
    assert r.exit_code == 1
    reports = {rep["board"]: rep for rep in strict(r.output[: r.output.rindex("]") + 1])}
    assert reports["tx2"]["ok"]
    for b in ("orin-nx", "rubikpi3"):
        (row,) = reports[b]["files"]
        assert "holds the models of board 'tx2' only" in row["error"]
    r = run("eval", "--board", "tx2,orin-nx", "--models", str(MODELS_DIR / "tx2"), "--seeds", "1")
    assert r.exit_code == 2 and "holds the models of board 'tx2' only, not 'orin-nx'" in r.output
    assert "== tx2 ==" not in r.output  # refused before any board ran


def _one_board_folder(tmp_path, board="tx2"):
    """A folder as `agents train --board B --out DIR` writes it: one board's models at its top."""
    folder = tmp_path / "out"
    shutil.copytree(MODELS_DIR / board, folder)
    return folder


def test_check_of_one_boards_folder_checks_the_board_its_manifest_names(tmp_path):
    """`agents check --models DIR` on a folder `agents train --out DIR` wrote exited 1: the
    boards it does not hold failed ("holds the models of board 'tx2' only, not 'orin-nx'")
    unless --board was given. Without --board it checks the folder's board(s); an explicit
    --board (or all) is still checked as asked."""
    folder = _one_board_folder(tmp_path)
    r = run("check", "--models", str(folder), "--json")
    assert r.exit_code == 0, r.output
    (rep,) = strict(r.output)
    assert rep["board"] == "tx2" and rep["ok"] and rep["folder"] == str(folder)
    text = run("check", "--models", str(folder))
    assert text.exit_code == 0 and "orin-nx" not in text.output and "FAIL" not in text.output
    r = run("check", "--models", str(folder), "--board", "orin-nx")
    assert r.exit_code == 1 and "holds the models of board 'tx2' only" in r.output
    # a root of per-board subfolders: the boards it holds
    root = tmp_path / "root"
    shutil.copytree(MODELS_DIR / "rubikpi3", root / "rubikpi3")
    r = run("check", "--models", str(root), "--json")
    assert r.exit_code == 0, r.output
    assert [rep["board"] for rep in strict(r.output)] == ["rubikpi3"]
    # a folder with no manifest at all: every board, each told what is missing
    (tmp_path / "empty").mkdir()
    r = run("check", "--models", str(tmp_path / "empty"), "--json")
    assert r.exit_code == 1
    reports = strict(r.output[: r.output.rindex("]") + 1])
    assert [rep["board"] for rep in reports] == ["tx2", "orin-nx", "rubikpi3"]
    assert "--models, the boards the folder holds" in " ".join(
        run("check", "--help").output.split()
    )


def _with_hashes(folder):
    """``folder`` with a manifest recording its files' sha256, as `agents train` writes it."""
    from agents.learned import file_sha256

    man = json.loads((folder / "manifest.json").read_text())
    man["sha256"] = {
        p.relative_to(folder).as_posix(): file_sha256(p)
        for p in sorted(folder.rglob("*"))
        if p.suffix in (".onnx", ".npz")
    }
    (folder / "manifest.json").write_text(json.dumps(man))
    return folder


def test_check_names_the_file_that_does_not_hash_as_recorded(tmp_path):
    """A sha256 mismatch was reported on the manifest.json row (and `file` field), with "git
    checkout agents/models" advice for a folder outside the repository."""
    import onnx

    folder = _with_hashes(_one_board_folder(tmp_path))
    m = onnx.load(str(folder / "noshaping" / "priority.onnx"))
    m.doc_string = "edited"  # same outputs, other bytes
    onnx.save(m, str(folder / "noshaping" / "priority.onnx"))
    r = run("check", "--models", str(folder), "--json")
    assert r.exit_code == 1
    (rep,) = strict(r.output[: r.output.rindex("]") + 1])
    bad = [f for f in rep["files"] if not f["ok"]]
    assert [f["file"] for f in bad] == ["noshaping/priority.onnx"], bad
    assert "sha256" in bad[0]["error"] and "training recorded" in bad[0]["error"]
    assert "git checkout" not in bad[0]["error"]
    assert "re-run the `hidvfs agents train` that wrote it" in bad[0]["error"]
    assert all(f["file"] != "manifest.json" for f in rep["files"])
    assert len(rep["files"]) == 9  # every file still checked
    text = run("check", "--models", str(folder)).output
    (line,) = [ln for ln in text.splitlines() if "FAIL" in ln]
    assert line.split()[1] == "noshaping/priority.onnx" and "git checkout" not in text
    # reference.npz, which no network row stands for, fails on a row of its own
    with open(folder / "reference.npz", "ab") as f:
        f.write(b"\0")
    (rep,) = strict(run("check", "--models", str(folder), "--json").output.split("\nhidvfs")[0])
    assert [f["file"] for f in rep["files"] if not f["ok"]] == [
        "reference.npz",
        "noshaping/priority.onnx",
    ]


def _eval_json(*args):
    r = run("eval", "--board", "tx2", "--jobs", "1", *args, "--json")
    assert r.exit_code == 0, r.output
    return strict(r.output)


def test_eval_ratios_carry_their_standard_error_and_say_which_spread_is_printed():
    """The ratio "±" was the std over the mixes while the docs quote the standard error of
    the mean (10x smaller at 100 mixes), and the output said neither. The JSON keeps [mean,
    std] and adds METRIC_se and METRIC_n; the table prints ratios as mean±s.e. [std] to 4
    decimals, and says the per-policy metrics are mean ± std over N mixes."""
    common = ("--policy", "hidvfs,maxfreq", "--no-ablations", "--seeds", "3")
    rows = _eval_json(*common)
    (ratio,) = [r for r in rows if r["kind"] == "ratio"]
    for m in ("makespan_s", "energy_j", "cpu_energy_j", "edp"):
        mean, sd = ratio[m]
        assert ratio[f"{m}_n"] == 3 and sd > 0
        assert ratio[f"{m}_se"] == pytest.approx(sd / math.sqrt(3))
    r = run("eval", "--board", "tx2", "--jobs", "1", *common)
    lines = r.output.splitlines()
    assert "makespan, energy, EDP, peak C, capped s: mean ± std over 3 mixes" in r.output
    assert "mean±s.e. [std] over 3 mixes" in r.output and "standard error of the mean" in r.output
    (row,) = [ln for ln in lines if ln.strip().startswith("hidvfs") and "/ maxfreq" in ln]
    mean, sd = ratio["edp"]
    assert row.rstrip().endswith(f"{mean:.4f}±{ratio['edp_se']:.4f} [{sd:.4f}]"), row
    mean, sd = ratio["makespan_s"]
    assert f"{mean:.4f}±{ratio['makespan_s_se']:.4f} [{sd:.4f}]" in row
    help_text = " ".join(run("eval", "--help").output.split())
    assert "mean ± std over the mixes" in help_text
    assert "mean ± s.e., the standard error of their mean" in help_text
    assert "METRIC_se" in help_text


def test_eval_with_one_mix_prints_no_spread_and_no_empty_ratio_header():
    """With one mix every std printed as "±0.000" (mean_std returned 0.0); without a hidvfs
    variant an empty "ratios (per seed, policy / baseline):" header was printed."""
    from tools.agents_eval import mean_std, mean_std_se

    m, sd = mean_std([2.0])
    assert m == 2.0 and math.isnan(sd)
    assert mean_std_se([1.0, 3.0]) == pytest.approx((2.0, math.sqrt(2), 1.0, 2))
    rows = _eval_json("--policy", "hidvfs,maxfreq", "--no-ablations", "--seeds", "1")
    (ratio,) = [r for r in rows if r["kind"] == "ratio"]
    assert ratio["edp"][1] is None and ratio["edp_se"] is None and ratio["edp_n"] == 1
    assert all(r["edp"][1] is None for r in rows if r["kind"] == "summary")
    text = run(
        "eval",
        "--board",
        "tx2",
        "--jobs",
        "1",
        "--seeds",
        "1",
        "--policy",
        "hidvfs,maxfreq",
        "--no-ablations",
    ).output
    assert "±" not in text.replace("mean ± std", "") and "n=1" in text
    (row,) = [ln for ln in text.splitlines() if "/ maxfreq" in ln]
    assert f"{ratio['edp'][0]:.4f}" in row
    text = run("eval", "--board", "tx2", "--jobs", "1", "--seeds", "1", "--policy", "maxfreq")
    assert text.exit_code == 0 and "ratios" not in text.output


def _trial_folder(tmp_path):
    """A folder as `agents train --policy hidvfs --out DIR` writes it: hidvfs's files only."""
    folder = _one_board_folder(tmp_path)
    for f in ("geardvfs.onnx", "ztt.onnx"):
        (folder / f).unlink()
    shutil.rmtree(folder / "noshaping")
    man = json.loads((folder / "manifest.json").read_text())
    man["policies"] = {"hidvfs": man["policies"]["hidvfs"]}
    (folder / "manifest.json").write_text(json.dumps(man))
    return folder


def test_eval_of_a_trial_folder_says_what_to_run_instead(tmp_path):
    """`agents eval --models DIR` of a trial folder failed on the default policy list, then
    on the ablations, with no hint of --policy or --no-ablations."""
    folder = _trial_folder(tmp_path)
    base = ("eval", "--board", "tx2", "--seeds", "1", "--jobs", "1", "--models", str(folder))
    r = run(*base)
    assert r.exit_code == 2 and "does not exist" in r.output
    assert f"{folder} holds the models of hidvfs only" in r.output
    assert "run with --policy hidvfs,schedutil,maxfreq --no-ablations" in r.output, r.output
    r = run(*base, "--policy", "hidvfs,maxfreq")
    assert r.exit_code == 2 and "not noshaping: run with --no-ablations" in r.output, r.output
    r = run(*base, "--policy", "hidvfs,maxfreq", "--no-ablations")
    assert r.exit_code == 0, r.output


def test_models_help_says_how_a_folder_is_chosen():
    for cmd in ("check", "eval"):
        r = run(cmd, "--help")
        assert "ROOT/BOARD/manifest.json" in " ".join(r.output.split())


def test_sweep_counts_a_repeated_fraction_once():
    r = run(
        "sweep",
        "--board",
        "rubikpi3",
        "--fractions",
        "0.5,0.5,0.50",
        "--seeds",
        "1",
        "--jobs",
        "1",
        "--json",
    )
    assert r.exit_code == 0, r.output
    rows = strict(r.output)
    assert [row["policy"] for row in rows] == ["maxfreq", "static-0.5", "floor"]
    assert rows[1]["seeds"] == 1 and rows[1]["deadline_jobs"] == rows[0]["deadline_jobs"]


@pytest.fixture
def no_training(monkeypatch):
    """Replaces agents.trainboard.train_board: records the policies it was asked to train."""
    import agents.trainboard as t

    calls = []

    def fake(spec, run_episode, make_mix, seed, out, command, **kw):
        calls.append(kw["policies"])
        return {}

    monkeypatch.setattr(t, "train_board", fake)
    return calls


def test_train_without_the_train_extra_refuses_before_training(without, no_training, tmp_path):
    """It used to train, then fail at the export: 'training job 0 failed:
    ModuleNotFoundError: No module named onnx' and a 40-line traceback."""
    without("onnx")
    out = tmp_path / "m"
    r = run("train", "--board", "tx2", "--episodes", "1", "--policy", "geardvfs", "--out", str(out))
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert r.output.strip().splitlines() == [
        "hidvfs: error: hidvfs agents train needs the train extra (onnx, skl2onnx, "
        'scikit-learn; missing: onnx): pip install "hidvfs[train]"'
    ]
    assert no_training == [] and not out.exists()


def test_train_asks_for_scikit_learn_only_for_the_hidvfs_shield(without, no_training, tmp_path):
    without("sklearn")
    args = ["train", "--board", "tx2", "--episodes", "1", "--out", str(tmp_path / "m")]
    r = run(*args, "--policy", "hidvfs,ztt")
    assert r.exit_code == 2 and "missing: scikit-learn)" in r.output
    assert len(r.output.strip().splitlines()) == 1 and no_training == []
    # geardvfs, ztt and noshaping are exported with onnx alone
    r = run(*args, "--policy", "geardvfs,ztt,noshaping")
    assert r.exit_code == 0, r.output
    assert no_training == [("geardvfs", "ztt", "noshaping")]


@pytest.mark.parametrize("group", ["agents", "bots", "coordinator", "profile"])
def test_every_option_has_help(group):
    """`agents check --board/--json`, `agents eval --policy/--ablations/--json` and
    `profile list --json` had none."""
    import click

    for name, cmd in cli.commands[group].commands.items():
        for p in cmd.params:
            if isinstance(p, click.Option):
                assert p.help, f"{group} {name} {p.opts[0]} has no help text"


@pytest.mark.parametrize("option", ["--load", "--slack", "--hi-fraction"])
@pytest.mark.parametrize("value", ["nan", "inf"])
def test_eval_and_sweep_mix_options_must_be_finite(monkeypatch, option, value):
    """nan passes every click.FloatRange bound: --load nan ran and printed nan results,
    --hi-fraction nan was ignored, --slack nan failed without naming the option."""
    import tools.cmd_agents as ca

    def ran(*a, **kw):
        raise AssertionError("the mixes were run")

    monkeypatch.setattr(ca, "evaluate", ran)
    monkeypatch.setattr(ca, "make_runner", ran)
    for cmd in ("eval", "sweep"):
        r = run(cmd, "--board", "tx2", "--seeds", "1", option, value)
        assert r.exit_code == 2 and f"Invalid value for '{option}'" in r.output, r.output


def test_train_lambda_e_must_be_finite(no_training, tmp_path):
    out = tmp_path / "m"
    r = run("train", "--board", "tx2", "--episodes", "1", "--out", str(out), "--lambda-e", "nan")
    assert r.exit_code == 2 and "Invalid value for '--lambda-e'" in r.output
    assert "not a finite number" in r.output and no_training == [] and not out.exists()


@pytest.mark.parametrize(
    "args",
    [
        ["daemon", "--sim", "tx2", "--duration", "nan"],
        ["daemon", "--sim", "tx2", "--duration", "inf"],
        ["trace", "record", "--sysfs-root", ".", "--out", "x.jsonl", "--duration", "nan"],
    ],
)
def test_every_float_option_refuses_nan_and_inf(args):
    from click.testing import CliRunner

    from tools.cli import cli

    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 2 and "is not a finite number" in r.output, r.output


def test_eval_policy_names_are_case_insensitive_and_checked_for_every_board_first(tmp_path):
    """GEARDVFS used to run the shipped models whatever --models said, and a second board's
    missing models were found after the first board's table had printed."""
    import shutil

    from click.testing import CliRunner

    from agents.learned import MODELS_DIR
    from tools.cli import cli

    (tmp_path / "empty").mkdir()
    base = ["agents", "eval", "--seeds", "1", "--jobs", "1", "--no-ablations"]
    r = CliRunner().invoke(
        cli, [*base, "--board", "tx2", "--policy", "GEARDVFS", "--models", str(tmp_path / "empty")]
    )
    assert r.exit_code == 2 and "no trained models" in r.output, r.output
    shutil.copytree(MODELS_DIR / "tx2", tmp_path / "r" / "tx2")
    r = CliRunner().invoke(
        cli,
        [
            *base,
            "--board",
            "tx2,orin-nx",
            "--policy",
            "hidvfs,maxfreq",
            "--models",
            str(tmp_path / "r"),
        ],
    )
    assert r.exit_code == 2 and "no trained models" in r.output
    assert "EDP" not in r.output and "makespan" not in r.output  # no table before the refusal


def test_train_refuses_an_empty_policy_list_before_making_anything(tmp_path):
    from click.testing import CliRunner

    from tools.cli import cli

    out = tmp_path / "m"
    r = CliRunner().invoke(
        cli, ["agents", "train", "--board", "tx2", "--policy", ",", "--out", str(out)]
    )
    assert r.exit_code == 2 and "names no policy to train" in r.output
    assert not out.exists()


def test_eval_miss_ratio_is_pooled_per_criticality_with_an_interval():
    """A mix without deadline jobs has no miss ratio (it was 0.0, and a mean of per-mix
    ratios then understated the pooled one); the summary pools the jobs per criticality."""
    from tools.agents_eval import miss_ratios

    runs = [
        {"misses": 2, "hi_misses": 1, "deadline_jobs": 4, "hi_jobs": 1},
        {"misses": 0, "hi_misses": 0, "deadline_jobs": 0, "hi_jobs": 0},
        {"misses": 1, "hi_misses": 0, "deadline_jobs": 2, "hi_jobs": 0},
    ]
    out = miss_ratios(runs)
    assert out["miss_ratio"] == pytest.approx(3 / 6)
    lo, hi = out["miss_ci95"]
    assert 0 < lo < 0.5 < hi < 1
    assert out["hi_miss"]["misses"] == 1 and out["hi_miss"]["jobs"] == 1
    assert out["lo_miss"] == {
        "misses": 2,
        "jobs": 5,
        "ratio": pytest.approx(0.4),
        "ci95": pytest.approx(out["lo_miss"]["ci95"]),
    }
    assert miss_ratios(runs[1:2])["miss_ratio"] is None
    assert miss_ratios(runs[1:2])["hi_miss"]["ci95"] is None


def test_eval_records_carry_a_mix_lower_bound_no_policy_beats():
    from tools.agents_episodes import EpisodeSpec
    from tools.agents_eval import evaluate

    records, _, _ = evaluate("orin-nx", ["maxfreq", "powersave"], 3, EpisodeSpec(n_jobs=3))
    for r in records:
        assert r["lower_bound_s"] is not None and 0 < r["lower_bound_s"] <= r["makespan_s"]
    fast = [r for r in records if r["policy"] == "maxfreq"]
    assert all(r["lower_bound_s"] > 0.5 * r["makespan_s"] for r in fast)  # not a trivial bound


def _cli_process(args, stderr):
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    return subprocess.Popen(
        [sys.executable, "-m", "tools.cli", *args],
        cwd=root,
        stdout=subprocess.DEVNULL,
        stderr=stderr,
    )


def test_sigterm_stops_parallel_training_with_its_workers(tmp_path):
    """SIGTERM killed `agents train --workers 2` and orphaned its workers, which went on
    writing into the folder for minutes. Now it ends as Ctrl-C does: the workers killed,
    exit 130 with one line, the folder as it was (nothing finished, nothing moved in)."""
    import os
    import signal
    import time

    import psutil

    from agents.learned import check_board

    folder = tmp_path / "rubikpi3"
    shutil.copytree(MODELS_DIR / "rubikpi3", folder)
    err = tmp_path / "stderr"
    args = ["agents", "train", "--board", "rubikpi3", "--policy", "ztt,geardvfs"]
    args += ["--episodes", "400", "--jobs", "2", "--workers", "2", "--out", str(folder)]
    with open(err, "w") as f:
        proc = _cli_process(args, f)
    kids: list = []
    try:
        t_end = time.monotonic() + 60
        while "episode 8/400" not in err.read_text() and time.monotonic() < t_end:
            time.sleep(0.1)
        kids = psutil.Process(proc.pid).children()
        assert len(kids) == 2, err.read_text()
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(30) == 130
        _, alive = psutil.wait_procs(kids, timeout=10)
        assert alive == [], "workers outlived the command"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for p in kids:  # only this test's workers, by pid
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
    lines = err.read_text().strip().splitlines()
    assert lines[-1].startswith("hidvfs: training interrupted (SIGTERM): the policies finished")
    assert "Traceback" not in err.read_text()
    assert check_board("rubikpi3", folder)["ok"]
    assert not [p for p in folder.iterdir() if p.name.startswith(".staging-")]


def test_train_repeats_an_untrained_policy_s_warning_at_the_end(monkeypatch, tmp_path):
    import agents.trainboard as t

    warning = "[ztt tx2] WARNING: the exported network is its untrained initial one"

    def fake(spec, run_episode, make_mix, seed, out, command, **kw):
        return {"policies": {"ztt": {"untrained": True, "warning": warning}}}

    monkeypatch.setattr(t, "train_board", fake)
    r = run("train", "--board", "tx2", "--episodes", "1", "--policy", "ztt", "--out", str(tmp_path))
    assert r.exit_code == 0, r.output
    assert r.output.strip().splitlines()[-1] == warning


def test_train_interrupted_exits_130_with_one_line(monkeypatch, tmp_path):
    import agents.trainboard as t

    def fake(*a, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(t, "train_board", fake)
    r = run("train", "--board", "tx2", "--episodes", "1", "--policy", "ztt", "--out", str(tmp_path))
    assert r.exit_code == 130
    assert r.output.strip().splitlines() == [
        f"hidvfs: training interrupted (SIGINT): the policies finished before it are saved in "
        f"{tmp_path}, the others keep their previous files"
    ]


def test_eval_runs_a_sampling_kernel_governor_at_its_own_rate(monkeypatch):
    """baselines.md 1.2/1.3: schedutil decides at its rate limit, ondemand at its sampling
    period. Every 50 ms (the agents' period) schedutil needed ~650 ms to climb orin-nx's
    table and missed 237 deadlines on 100 held-out mixes instead of 36 (a weakened baseline).
    Training keeps one period for every policy."""
    import daemon.simrun
    from agents.governors import make_governor
    from platforms.spec import load_board
    from tools.agents_episodes import EpisodeSpec, make_runner

    seen = {}

    def fake_run_sim(board, policy, items, **kw):
        seen[policy.name] = kw["period_s"]

    monkeypatch.setattr(daemon.simrun, "run_sim", fake_run_sim)
    spec = load_board("orin-nx")
    for kernel_rates in (True, False):
        run = make_runner("orin-nx", EpisodeSpec(), kernel_rates=kernel_rates)
        for name in ("schedutil", "ondemand", "maxfreq"):
            run(make_governor(name, spec), [], 0)
        if kernel_rates:
            assert seen == {"schedutil": None, "ondemand": None, "maxfreq": 0.05}
        else:
            assert seen == {"schedutil": 0.05, "ondemand": 0.05, "maxfreq": 0.05}


def test_an_empty_fractions_list_is_refused():
    """`--fractions ''` swept maxfreq alone, as if the option had been left out."""
    from click.testing import CliRunner

    from tools.cli import cli

    r = CliRunner().invoke(cli, ["agents", "sweep", "--board", "tx2", "--fractions", ""])
    assert r.exit_code == 2 and "Invalid value for '--fractions': empty" in r.output


@pytest.fixture
def train_outs(monkeypatch):
    """Replaces agents.trainboard.train_board: records the folder each run would write."""
    import agents.trainboard as t

    outs = []

    def fake(spec, run_episode, make_mix, seed, out, command, **kw):
        outs.append((str(out), command, kw["cfg"].calib_episodes))
        return {}

    monkeypatch.setattr(t, "train_board", fake)
    return outs


@pytest.mark.parametrize(
    "extra",
    [
        ["--seed", "1"],
        ["--episodes", "2"],
        ["--policy", "ztt"],
        ["--jobs", "4"],
        ["--hot-fraction", "0.5"],
        ["--lambda-e", "0.5"],
        ["--val-mixes", "2"],
        ["--restarts", "2"],
        ["--calib-episodes", "20"],
    ],
)
def test_a_run_that_does_not_reproduce_the_shipped_models_needs_out(train_outs, extra):
    """`agents train --board tx2 --episodes 2` wrote over the shipped models of tx2."""
    r = run("train", "--board", "tx2", *extra)
    assert r.exit_code == 2 and "--out is needed" in r.output, r.output
    assert "holds the shipped models" in r.output and train_outs == []


@pytest.mark.parametrize(
    "extra",
    [
        ["--calib-episodes", "256"],
        ["--val-mixes", "16", "--energy-rail", "total", "--power-ref", "busy"],
        ["--restarts", "1", "--seed", "0"],
    ],
)
def test_defaults_given_explicitly_still_reproduce_the_shipped_models(train_outs, extra):
    """`--calib-episodes 256` is the default: the run is the reproducing one, not a trial that
    needs --out (tx2's board defaults given by hand are its defaults too)."""
    from agents.learned import model_dir

    r = run("train", "--board", "tx2", *extra)
    assert r.exit_code == 0, r.output
    assert [o for o, _, _ in train_outs] == [str(model_dir("tx2"))]


def test_the_reproducing_run_writes_the_shipped_folder_and_others_write_out(train_outs, tmp_path):
    from agents.learned import model_dir

    assert run("train", "--board", "tx2").exit_code == 0
    # the same settings in another order are the same run
    r = run("train", "--board", "tx2", "--policy", "ztt,geardvfs,noshaping,hidvfs")
    assert r.exit_code == 0, r.output
    out = tmp_path / "m"
    r = run(
        "train", "--board", "tx2", "--episodes", "2", "--calib-episodes", "20", "--out", str(out)
    )
    assert r.exit_code == 0, r.output
    assert [o for o, _, _ in train_outs] == [str(model_dir("tx2"))] * 2 + [str(out)]
    assert train_outs[2][1].endswith("--calib-episodes 20") and train_outs[2][2] == 20
    assert train_outs[0][2] == 256  # TrainConfig's calibration
    assert run("train", "--board", "tx2", "--calib-episodes", "19").exit_code == 2
