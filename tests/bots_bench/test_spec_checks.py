"""Campaign spec checks that used to pass validation and fail later: non-finite numbers (they
aborted the campaign after its first run), a file that is not UTF-8 (the error did not name
it), and the deadline slack, which was not part of the run key (a re-run with a new slack
returned the old runs, measured without deadlines)."""

from __future__ import annotations

import pytest

from bots_bench.spec import RunConfig, load_spec, parse_spec
from platforms.errors import SpecError

BASE = {
    "kernels": ["fib"],
    "classes": ["test"],
    "policies": ["maxfreq"],
    "seeds": 1,
    "board": "tx2",
    "backend": "sim",
}


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ({"timeout_s": float("inf")}, "timeout_s"),
        ({"deadline_s": float("nan")}, "deadline_s"),
        ({"deadline_s": float("inf")}, "deadline_s"),
        ({"cooldown": {"start_temp_c": float("nan")}}, "cooldown.start_temp_c"),
        ({"cooldown": {"max_wait_s": float("inf")}}, "cooldown.max_wait_s"),
    ],
)
def test_non_finite_numbers_are_refused_naming_the_key(extra, key):
    with pytest.raises(SpecError, match=rf"key '{key}': expected a finite number"):
        parse_spec({**BASE, **extra}, "c.yaml")


def test_yaml_inf_and_nan_are_refused_when_loading(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text(
        "kernels: [fib]\nclasses: [test]\npolicies: [maxfreq]\nseeds: 1\nboard: tx2\n"
        "backend: sim\ntimeout_s: .inf\n"
    )
    with pytest.raises(SpecError, match="timeout_s"):
        load_spec(f)


def test_a_spec_file_that_is_not_utf8_is_named(tmp_path):
    f = tmp_path / "latin1.yaml"
    f.write_bytes("kernels: [fib]\nname: caf\xe9\n".encode("latin-1"))
    with pytest.raises(SpecError) as err:
        load_spec(f)
    assert str(f) in str(err.value) and "UTF-8" in str(err.value)


def test_the_deadline_slack_is_part_of_the_run_key():
    plain = RunConfig("fib", "test", "maxfreq", 0, "tx2", "sim", 0)
    slack = RunConfig("fib", "test", "maxfreq", 0, "tx2", "sim", 0, deadline_slack=1.5)
    other = RunConfig("fib", "test", "maxfreq", 0, "tx2", "sim", 0, deadline_slack=2.0)
    assert len({plain.key, slack.key, other.key}) == 3
    # runs stored before the slack was a key field keep their hash, so they still resume
    assert plain.spec_hash == "7291c03cb8b1"


@pytest.mark.parametrize("seeds", [[2**63], [99999999999999999999999], [-1], [0, -5], 2**63 + 1])
def test_seeds_outside_the_store_s_integer_range_are_refused(seeds):
    """A seed above 2**63-1 crashed the store with an OverflowError after simulating; a
    negative one passed and stored a failed run per config."""
    with pytest.raises(SpecError, match="key 'seeds': expected"):
        parse_spec({**BASE, "seeds": seeds}, "c.yaml")


def test_the_extreme_seeds_are_accepted():
    assert parse_spec({**BASE, "seeds": [0, 2**63 - 1]}, "c.yaml").seeds == (0, 2**63 - 1)
