"""Campaign spec: parsing, validation messages and the run matrix."""

from __future__ import annotations

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from bots_bench import registry
from bots_bench.spec import Cooldown, expand, load_spec, parse_spec
from platforms.errors import SpecError

GOOD = {
    "name": "smoke",
    "kernels": ["fib", "sort"],
    "classes": ["smoke", "test"],
    "policies": ["schedutil", "hidvfs", "maxfreq"],
    "seeds": [42, 123],
    "board": "tx2",
    "backend": "native",
    "repetitions": 3,
    "cooldown": {"start_temp_c": 40, "max_wait_s": 60},
    "timeout_s": 120,
    "bots_bin": "~/bots/bin",
    "threads": 4,
}


def test_full_spec_from_yaml(tmp_path):
    f = tmp_path / "campaign.yaml"
    f.write_text(yaml.safe_dump(GOOD))
    spec = load_spec(f)
    assert spec.kernels == ("fib", "sort") and spec.classes == ("smoke", "test")
    assert spec.seeds == (42, 123) and spec.repetitions == 3
    assert spec.cooldown == Cooldown(40.0, 60.0) and spec.timeout_s == 120.0
    assert spec.bots_bin.endswith("/bots/bin") and not spec.bots_bin.startswith("~")
    assert spec.threads == 4 and spec.variant == "omp-tasks" and spec.check is None
    assert spec.n_runs == 2 * 2 * 3 * 2 * 3


def test_defaults_and_shorthands():
    spec = parse_spec(
        {
            "kernels": "all",
            "classes": "test",
            "policies": "performance,schedutil",
            "seeds": 3,
            "board": "orin-nx",
            "backend": "sim",
            "cool-down": None,
        }
    )
    assert spec.kernels == registry.KERNEL_NAMES
    assert spec.classes == ("test",) and spec.policies == ("performance", "schedutil")
    assert spec.seeds == (0, 1, 2) and spec.repetitions == 1
    assert spec.cooldown is None and spec.bots_bin is None and spec.timeout_s == 600.0


def test_expand_order_and_keys():
    spec = parse_spec(GOOD)
    runs = expand(spec)
    assert len(runs) == spec.n_runs
    assert len({r.key for r in runs}) == len(runs)
    # policies are innermost: each consecutive triple is the same run under the 3 policies
    first = runs[:3]
    assert [r.policy for r in first] == ["schedutil", "hidvfs", "maxfreq"]
    assert {(r.bench, r.cls, r.seed, r.rep) for r in first} == {("fib", "smoke", 42, 0)}
    assert [r.rep for r in runs[:9:3]] == [0, 1, 2]
    base = runs[0].record_base()
    assert base["class"] == "smoke" and base["rep"] == 0 and base["spec_hash"] == runs[0].spec_hash
    assert base["config"]["threads"] == 4 and base["config"]["class"] == "smoke"
    assert base["config"]["cooldown"] == {"start_temp_c": 40.0, "max_wait_s": 60.0}


def test_spec_hash_tracks_what_changes_a_measurement():
    h = expand(parse_spec(GOOD))[0].spec_hash
    more = dict(GOOD, seeds=[42, 123, 7], repetitions=10, policies=["schedutil"], timeout_s=5)
    assert expand(parse_spec(more))[0].spec_hash == h  # a bigger campaign resumes
    assert expand(parse_spec(dict(GOOD, threads=2)))[0].spec_hash != h
    assert expand(parse_spec(dict(GOOD, variant="omp-tasks-tied")))[0].spec_hash != h
    assert expand(parse_spec(dict(GOOD, cooldown=None)))[0].spec_hash != h


def _bad(**changes):
    d = dict(GOOD)
    for k, v in changes.items():
        if v is KeyError:
            d.pop(k)
        else:
            d[k] = v
    return d


@pytest.mark.parametrize(
    ("data", "key", "expected"),
    [
        (_bad(kernal=["fib"]), "kernal", "a campaign key (did you mean 'kernels'?)"),
        # the bots run flag names, which difflib alone would not match
        (_bad(bench="fib"), "bench", "a campaign key (did you mean 'kernels'?)"),
        (_bad(policy="maxfreq"), "policy", "(did you mean 'policies'?)"),
        (_bad(**{"class": "test"}), "class", "(did you mean 'classes'?)"),
        (_bad(**{"bots-bin": "/x"}), "bots-bin", "(did you mean 'bots_bin'?)"),
        (_bad(timeout=5), "timeout", "(did you mean 'timeout_s'?)"),
        (_bad(deadline_slack=2), "deadline_slack", "pass --deadline-slack on the command line"),
        (_bad(zzz=1), "zzz", "a campaign key; campaign keys: name, kernels, classes"),
        (_bad(board=KeyError), "board", "required key is missing"),
        (_bad(kernels=["fib", "fibonacci"]), "kernels", "names from alignment"),
        (_bad(kernels=[]), "kernels", "non-empty list"),
        (_bad(kernels=["fib", "fib"]), "kernels", "without duplicates"),
        (_bad(classes=["t40"]), "classes", "a class every selected kernel has (sort has"),
        # the simulator models fewer classes than the binaries have: checked per backend
        (
            _bad(backend="sim", classes=["smoke"]),
            "classes",
            "a class every selected kernel has (fib has test, small, medium, large)",
        ),
        (_bad(policies=["fastest"]), "policies", "names from hidvfs"),
        (_bad(seeds=[]), "seeds", "non-empty list of integers"),
        (_bad(seeds=0), "seeds", "positive count"),
        (_bad(seeds=[1, 1]), "seeds", "without duplicates"),
        (_bad(seeds=["a"]), "seeds", "list of integers"),
        (_bad(backend="qemu"), "backend", "one of sim, native"),
        (_bad(board="jetson-nano"), "board", "one of"),
        (_bad(repetitions=0), "repetitions", "a positive integer"),
        (_bad(repetitions=True), "repetitions", "a positive integer"),
        (_bad(cooldown=45), "cooldown", "a mapping {start_temp_c, max_wait_s}"),
        (_bad(cooldown={"start_temp_c": "hot"}), "cooldown.start_temp_c", "a number"),
        (_bad(cooldown={"start_temp_c": 400}), "cooldown.start_temp_c", "below 150"),
        (_bad(cooldown={"max_wait_s": -1}), "cooldown.max_wait_s", "a number >= 0"),
        (_bad(cooldown={"wait": 3}), "cooldown.wait", "one of start_temp_c, max_wait_s"),
        (_bad(timeout_s=0), "timeout_s", "a number > 0"),
        (_bad(bots_bin=KeyError), "bots_bin", "required for backend native"),
        (_bad(bots_bin=3), "bots_bin", "a directory path"),
        (_bad(threads=0), "threads", "a positive integer"),
        (_bad(variant="single-omp-tasks"), "variant", "no 'single' version"),
        (_bad(variant="omp-tasks-turbo"), "variant", "bad BOTS variant"),
        (_bad(check="yes"), "check", "true, false or null"),
        (_bad(deadline_s=-2), "deadline_s", "a number > 0"),
        (["kernels"], "<top>", "a mapping of campaign settings"),
    ],
)
def test_malformed_specs_name_the_key(data, key, expected):
    with pytest.raises(SpecError) as e:
        parse_spec(data, "camp.yaml")
    assert e.value.key == key
    assert e.value.file == "camp.yaml"
    assert expected in e.value.expected, e.value.expected
    text = str(e.value)
    assert text.startswith(f"camp.yaml: key '{key}': "), text
    # said once: a reason that already says what was expected is not wrapped in another
    assert text.count("expected") <= 1 and text.count(", got ") <= 1, text


def test_a_bad_variant_is_said_once_with_the_variants_to_choose_from():
    with pytest.raises(SpecError) as e:
        parse_spec(_bad(kernels=["fib"], variant="bogus"), "camp.yaml")
    assert str(e.value) == (
        "camp.yaml: key 'variant': bad BOTS variant 'bogus' for fib: expected one of "
        "omp-tasks, omp-tasks-tied, omp-tasks-manual, omp-tasks-manual-tied, "
        "omp-tasks-if_clause, omp-tasks-if_clause-tied, omp-tasks-final, omp-tasks-final-tied, "
        "or serial"
    )
    assert e.value.key == "variant"


def test_a_sim_thread_count_is_refused_in_one_sentence():
    with pytest.raises(SpecError) as e:
        parse_spec(_bad(backend="sim", classes=["test"], threads=4), "camp.yaml")
    text = str(e.value)
    assert text.startswith("camp.yaml: key 'threads': not with backend sim (")
    assert text.endswith("leave threads out, or use backend native"), text


@pytest.mark.parametrize("content", ["", "# only comments\n", "---\n"])
def test_an_empty_spec_file_says_it_is_empty(tmp_path, content):
    f = tmp_path / "camp.yaml"
    f.write_text(content)
    with pytest.raises(SpecError) as e:
        load_spec(f)
    assert str(e.value) == (
        f"{f} is empty: a campaign spec is a mapping of settings (see `hidvfs bots run --help`)"
    )
    assert e.value.key == "<top>" and e.value.file == str(f)


@pytest.mark.parametrize(
    ("data", "kind"), [(["kernels"], "a list"), ("fib", "a string"), (3, "a number")]
)
def test_a_spec_that_is_not_a_mapping_names_its_yaml_type(data, kind):
    with pytest.raises(SpecError) as e:
        parse_spec(data, "camp.yaml")
    assert str(e.value) == (
        f"camp.yaml: key '<top>': expected a mapping of campaign settings, got {kind}"
    )


def test_bots_run_prints_the_spec_messages_without_python_names(tmp_path):
    from click.testing import CliRunner

    from tools.cli import cli

    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        yaml.safe_dump(_bad(backend="sim", classes=["test"], threads=KeyError, variant="bogus"))
    )
    for spec, said in (
        (empty, f"{empty} is empty: a campaign spec is a mapping of settings"),
        (bad, "key 'variant': bad BOTS variant 'bogus' for fib: expected one of omp-tasks,"),
    ):
        r = CliRunner().invoke(
            cli, ["bots", "run", "--spec", str(spec), "--db", str(tmp_path / "r")]
        )
        assert r.exit_code == 2 and said in r.output, r.output
        assert "NoneType" not in r.output and "got 'bogus'" not in r.output


def test_sim_campaigns_accept_the_classes_the_simulator_models():
    from bots_bench.dags import CLASSES

    sim = {k: v for k, v in GOOD.items() if k != "threads"}  # a native-only key
    spec = parse_spec({**sim, "backend": "sim", "classes": ["test", "small"]}, "camp.yaml")
    assert spec.classes == ("test", "small")
    assert all({"test", "small"} <= set(CLASSES[k]) for k in spec.kernels)


def test_unreadable_and_invalid_files(tmp_path):
    with pytest.raises(SpecError, match="readable YAML file"):
        load_spec(tmp_path / "nope.yaml")
    f = tmp_path / "bad.yaml"
    f.write_text("kernels: [fib\n")
    with pytest.raises(SpecError, match="valid YAML"):
        load_spec(f)


@given(
    kernels=st.lists(st.sampled_from(["fib", "sort", "sparselu", "uts"]), min_size=1, unique=True),
    policies=st.lists(st.sampled_from(["hidvfs", "ztt", "performance"]), min_size=1, unique=True),
    seeds=st.lists(st.integers(0, 10**6), min_size=1, max_size=4, unique=True),
    reps=st.integers(1, 4),
)
def test_matrix_is_the_full_product(kernels, policies, seeds, reps):
    spec = parse_spec(
        {
            "kernels": kernels,
            "classes": ["test"],
            "policies": policies,
            "seeds": seeds,
            "board": "rubikpi3",
            "backend": "sim",
            "repetitions": reps,
        }
    )
    runs = expand(spec)
    combos = {(r.bench, r.cls, r.policy, r.seed, r.rep) for r in runs}
    assert len(runs) == len(combos) == len(kernels) * len(policies) * len(seeds) * reps
    assert {r.key for r in runs} == {r.key for r in expand(spec)}  # deterministic


def test_the_readme_spec_example_parses():
    """README's example campaign spec is a valid spec, key for key."""
    from pathlib import Path

    readme = (Path(__file__).parents[2] / "README.md").read_text()
    block = readme.split("```yaml\nkernels:", 1)[1].split("```", 1)[0]
    spec = parse_spec(yaml.safe_load("kernels:" + block), "README.md")
    assert spec.kernels == ("fib", "sort") and spec.backend == "native" and spec.repetitions == 10


def test_a_campaign_yaml_syntax_error_is_one_line(tmp_path):
    f = tmp_path / "camp.yaml"
    f.write_text("kernels: [fib\nclasses: [test]\n")
    with pytest.raises(SpecError) as exc:
        load_spec(f)
    assert "\n" not in str(exc.value)
    assert str(exc.value).startswith(f"{f}: line 2, column 8: not valid YAML: ")


def test_a_relative_bots_bin_is_taken_relative_to_the_spec_file(tmp_path, monkeypatch):
    """Not to wherever the campaign is started from."""
    (tmp_path / "camp").mkdir()
    f = tmp_path / "camp" / "c.yaml"
    f.write_text(yaml.safe_dump({**GOOD, "backend": "native", "bots_bin": "../bots/bin"}))
    monkeypatch.chdir("/")
    assert load_spec(f).bots_bin == str(tmp_path / "bots" / "bin")
    f.write_text(yaml.safe_dump({**GOOD, "backend": "native", "bots_bin": "/opt/bots/bin"}))
    assert load_spec(f).bots_bin == "/opt/bots/bin"
    # a mapping parsed without a file keeps the path as given (the caller's working directory)
    assert parse_spec({**GOOD, "backend": "native", "bots_bin": "bots/bin"}).bots_bin == "bots/bin"
