"""`hidvfs profile show` prints every stored field of one profile; `hidvfs profile remove`
takes one out of the store atomically and leaves the others as they were."""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

from agents import deadlines
from platforms.observation import JobProfile
from tools.cli import cli

FIB = JobProfile("fib", 3.0, 0.6, 0.25, 1.25, 2035200, 4, version=2)
SPLIT = JobProfile("fft", 2.0, 0.5, 0.1, 0.75, 2035200, 2, span_cpu_s=0.4, span_mem_s=0.2)
OTHER = JobProfile("sort", 1.5, 0.3, 0.05, 0.5, 1984000, 4)


@pytest.fixture
def store(tmp_path):
    s = deadlines.ProfileStore()
    s.profiles[("fib", "tx2")] = FIB
    s.profiles[("fft", "tx2")] = SPLIT
    s.profiles[("sort", "orin-nx")] = OTHER
    path = tmp_path / "profiles.json"
    deadlines.save(s, path)
    return path


def run(*args):
    return CliRunner().invoke(cli, ["profile", *args])


def test_show_prints_every_stored_field(store):
    r = run("show", "fib", "--store", str(store))
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines[0] == "fib on tx2"
    assert "  version              2  (version)" in lines
    assert "  reference makespan   1.25 s  (ref_makespan_s)" in lines
    assert "  reference frequency  2035200 kHz  (ref_khz)" in lines
    assert "  reference cores      4  (ref_cores)" in lines
    assert "  work C               3 s  (work_s)" in lines
    assert "  span L               0.6 s  (span_s)" in lines
    assert "  memory-bound beta    0.25  (beta)" in lines
    assert "span_cpu_s" not in r.output  # not stored for this one
    r = run("show", "fft", "--store", str(store))
    assert "  compute-only span    0.4 s  (span_cpu_s)" in r.output
    assert "  memory-only span     0.2 s  (span_mem_s)" in r.output


def test_show_json_is_the_stored_row(store):
    r = run("show", "fft", "--store", str(store), "--json")
    assert r.exit_code == 0, r.output
    rows = json.loads(store.read_text())["profiles"]
    # stored without provenance: the row, and null for it
    assert json.loads(r.stdout) == [
        {**row, "provenance": None} for row in rows if row["name"] == "fft"
    ]


def test_show_and_remove_of_an_unknown_name_list_the_known_ones(store, tmp_path):
    for cmd in ("show", "remove"):
        r = run(cmd, "fibb", "--store", str(store))
        assert r.exit_code == 2
        assert r.stderr == (
            f"hidvfs: error: no profile 'fibb' in {store} (known: fft, fib, sort)\n"
        )
    empty = tmp_path / "empty.json"
    deadlines.save(deadlines.ProfileStore(), empty)
    r = run("remove", "fib", "--store", str(empty))
    assert r.exit_code == 2 and r.stderr.endswith(": the store is empty\n")
    r = run("show", "fib", "--store", str(store), "--board", "orin-nx")
    assert r.exit_code == 2 and "(it has one for: tx2)" in r.stderr
    r = run("remove", "fib", "--store", str(tmp_path / "typo.json"))
    assert r.exit_code == 2 and "no such profile store" in r.stderr


@pytest.mark.parametrize("name", ["", " ", " fib", "fib "])
def test_a_blank_or_space_padded_name_is_refused(store, name):
    before = store.read_bytes()
    for cmd in ("show", "remove"):
        r = run(cmd, name, "--store", str(store))
        assert r.exit_code == 2 and "without leading or trailing spaces" in r.stderr
    assert store.read_bytes() == before


def test_remove_takes_out_that_profile_only(store, tmp_path):
    r = run("remove", "fib", "--store", str(store))
    assert r.exit_code == 0, r.output
    assert r.output == f"removed fib (version 2) on tx2 from {store}\n"
    kept = deadlines.ProfileStore()
    kept.profiles[("fft", "tx2")] = SPLIT
    kept.profiles[("sort", "orin-nx")] = OTHER
    deadlines.save(kept, tmp_path / "expected.json")
    assert store.read_bytes() == (tmp_path / "expected.json").read_bytes()
    assert deadlines.load(store).profiles == kept.profiles
    assert sorted(os.listdir(tmp_path)) == ["expected.json", "profiles.json", "profiles.json.lock"]
    r = run("remove", "fib", "--store", str(store))  # gone
    assert r.exit_code == 2 and "(known: fft, sort)" in r.stderr


def test_remove_writes_the_other_rows_back_as_the_file_held_them(tmp_path):
    """A store written by hand (another order, integers, a key this hidvfs does not read):
    the rows that stay are not rewritten."""
    rows = [
        {"name": "b", "board": "tx2", "work_s": 2, "span_s": 1, "beta": 0, "note": "by hand",
         "ref_makespan_s": 1.5, "ref_khz": 2035200, "ref_cores": 4, "version": 1},
        {"name": "a", "board": "tx2", "work_s": 1.0, "span_s": 0.5, "beta": 0.1,
         "ref_makespan_s": 0.75, "ref_khz": 2035200, "ref_cores": 4, "version": 3},
        {"name": "c", "board": "tx2", "work_s": 0.1 + 0.2, "span_s": 0.1, "beta": 1,
         "ref_makespan_s": 0.25, "ref_khz": 2035200, "ref_cores": 1, "version": 1},
    ]  # fmt: skip
    store = tmp_path / "profiles.json"
    store.write_text(json.dumps({"format": "hidvfs-profiles", "version": 1, "profiles": rows}))
    r = run("remove", "a", "--store", str(store))
    assert r.exit_code == 0, r.output
    assert json.loads(store.read_text())["profiles"] == [rows[0], rows[2]]


@pytest.mark.parametrize("mode, kept", [(0o600, 0o600), (0o640, 0o640), (0o664, 0o644)])
def test_remove_keeps_the_store_files_mode(store, mode, kept):
    """An administrator's narrower mode is kept; none wider than 0644 (group members could
    otherwise rewrite the profiles root plans deadlines with)."""
    os.chmod(store, mode)
    r = run("remove", "sort", "--store", str(store))
    assert r.exit_code == 0, r.output
    assert oct(store.stat().st_mode & 0o7777) == oct(kept)
    assert sorted(n for n, _ in deadlines.load(store).profiles) == ["fft", "fib"]


def test_a_name_stored_for_two_boards_is_removed_per_board(store):
    deadlines.update(store, "orin-nx", FIB)
    r = run("show", "fib", "--store", str(store), "--json")
    assert [row["board"] for row in json.loads(r.stdout)] == ["orin-nx", "tx2"]
    before = store.read_bytes()
    r = run("remove", "fib", "--store", str(store))
    assert r.exit_code == 2 and "give --board" in r.stderr and store.read_bytes() == before
    r = run("remove", "fib", "--store", str(store), "--board", "orin-nx")
    assert r.exit_code == 0, r.output
    assert deadlines.load(store).find("fib", "orin-nx") is None
    assert deadlines.load(store).find("fib", "tx2") == FIB


def test_remove_refuses_a_store_that_is_not_one(tmp_path):
    store = tmp_path / "profiles.json"
    store.write_text("{not json")
    r = run("remove", "fib", "--store", str(store))
    assert r.exit_code == 2 and "valid JSON" in r.stderr
    assert store.read_text() == "{not json"


def test_a_running_daemon_finds_a_removed_profile_gone_at_the_next_lookup(store):
    """What `profile remove --help` says: the daemon rereads the store when it changes."""
    from daemon.profiles import ProfileLookup

    lookup = ProfileLookup(store, "tx2")
    assert lookup("fib") == FIB
    assert run("remove", "fib", "--store", str(store)).exit_code == 0
    assert lookup("fib") is None and lookup("fft") == SPLIT


def test_remove_from_a_store_that_cannot_be_rewritten_says_so_and_keeps_it(store, monkeypatch):
    """An immutable store (chattr +i) failed with the raw rename error naming its temporary
    file."""
    before = store.read_bytes()

    def refused(*args, **kwargs):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "replace", refused)
    r = run("remove", "fib", "--store", str(store))
    monkeypatch.undo()
    assert r.exit_code == 2
    assert r.stderr == (
        f"hidvfs: error: {store}: cannot rewrite it (Operation not permitted); nothing was "
        "removed\n"
    )
    assert store.read_bytes() == before
    assert sorted(p.name for p in store.parent.iterdir()) == ["profiles.json", "profiles.json.lock"]
