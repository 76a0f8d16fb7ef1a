"""`hidvfs profile measure` records when, on what and with which hidvfs a profile was
measured; `profile show` (text and --json) and `profile list` say it, and "unknown" for a
profile stored before provenance was recorded."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import shutil
import subprocess
import sys

import pytest
from click.testing import CliRunner

import tools
from agents import deadlines
from bots_bench.reference import reference_cluster
from platforms.faketree import write_fake_tree
from platforms.spec import load_board
from platforms.sysfs import DirSysfs
from tools.cli import cli
from tools.profile_measure import measure

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def tx2(tmp_path):
    spec = load_board("tx2")
    write_fake_tree(spec, tmp_path / "tree")
    (tmp_path / "state").mkdir()
    return spec, tmp_path


def fake_timer(argv, cpus, timeout_s):
    return 2.0 / len(cpus)


def measured(spec, tmp, **kw):
    prov: dict[str, str] = {}
    prof, _ = measure(
        spec,
        DirSysfs(tmp / "tree"),
        ["prog"],
        "prog",
        state_dir=str(tmp / "state"),
        timer=fake_timer,
        provenance=prov,
        **kw,
    )
    return prof, prov


def head_commit() -> str | None:
    if shutil.which("git") is None:
        return None
    out = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=False
    )
    return out.stdout.strip() if out.returncode == 0 else None


def test_a_measurement_records_its_provenance(tx2):
    spec, tmp = tx2
    before = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    prof, prov = measured(spec, tmp, repeat=2)
    after = dt.datetime.now(dt.timezone.utc)
    when = dt.datetime.fromisoformat(prov["measured_at"])
    assert when.utcoffset() == dt.timedelta(0)  # UTC, said in the string
    assert before <= when <= after
    assert prov["hidvfs_version"] == tools.__version__
    assert prov["board"] == "tx2" and prov["kernel"] == platform.release()
    ref = reference_cluster(spec)
    assert prov["cluster"] == ref.name
    assert prov["cpus"] == ",".join(map(str, ref.cpus)) and len(ref.cpus) == prof.ref_cores
    assert 0 < int(prov["low_khz"]) < prof.ref_khz and prov["repeat"] == "2"
    assert prov["sysfs_root"] == str(tmp / "tree")  # not the machine's own: said
    assert all(isinstance(v, str) for v in prov.values())
    commit = head_commit()
    if commit is None:  # no git, or not a checkout: left out
        assert "git_commit" not in prov
    else:
        assert prov["git_commit"] in (commit, commit + "+dirty")


def test_without_git_the_commit_is_left_out_and_the_measurement_stands(tx2, monkeypatch):
    spec, tmp = tx2
    monkeypatch.setenv("PATH", str(tmp / "empty"))  # no git binary to find
    prof, prov = measured(spec, tmp)
    assert "git_commit" not in prov and prov["board"] == "tx2" and prof.ref_makespan_s == 2.0 / 4

    import agents.onnx_export as ox

    def broken(*a, **k):
        raise RuntimeError("no")

    monkeypatch.setattr(ox, "git_commit", broken)
    _, prov = measured(spec, tmp)
    assert "git_commit" not in prov and "measured_at" in prov


def cli_args(tmp, *extra):
    return [
        "profile",
        "measure",
        "--store",
        str(tmp / "profiles.json"),
        "--sysfs-root",
        str(tmp / "tree"),
        "--board",
        "tx2",
        "--state-dir",
        str(tmp / "state"),
        "--socket",
        str(tmp / "state" / "none.sock"),
        *extra,
    ]


def run(*args):
    return CliRunner().invoke(cli, list(args))


def test_measure_stores_it_and_show_and_list_say_it(tx2):
    _, tmp = tx2
    store = str(tmp / "profiles.json")
    r = run(*cli_args(tmp, "--name", "sq", "--json", "--", sys.executable, "-c", "pass"))
    assert r.exit_code == 0, r.output
    prov = json.loads(r.stdout)["provenance"]
    assert prov["board"] == "tx2" and prov["hidvfs_version"] == tools.__version__
    assert deadlines.load(store).provenance_of("sq", "tx2") == prov

    shown = run("profile", "show", "sq", "--store", store, "--json")
    assert shown.exit_code == 0, shown.output
    (row,) = json.loads(shown.stdout)
    assert row["provenance"] == prov and row["version"] == 1
    for key in ("measured_at", "hidvfs_version", "board", "kernel", "cluster", "cpus"):
        assert key in row["provenance"]

    text = run("profile", "show", "sq", "--store", store).output.splitlines()
    assert f"  measured at          {prov['measured_at']}  (provenance.measured_at)" in text
    assert f"  hidvfs version       {tools.__version__}  (provenance.hidvfs_version)" in text
    assert "  board                tx2  (provenance.board)" in text
    assert f"  kernel               {platform.release()}  (provenance.kernel)" in text
    assert f"  beta frequency       {prov['low_khz']} kHz  (provenance.low_khz)" in text
    assert ("git_commit" in prov) == any("(provenance.git_commit)" in t for t in text)
    assert "unknown" not in "\n".join(text)

    listed = run("profile", "list", "--store", store)
    assert listed.output.rstrip().endswith(f"measured {prov['measured_at'][:10]}")
    (lrow,) = json.loads(run("profile", "list", "--store", store, "--json").stdout)
    assert lrow == row


def test_an_old_store_shows_unknown_provenance(tmp_path):
    """A store written before provenance was recorded, in that format exactly."""
    rows = [
        {"board": "tx2", "name": "fib", "work_s": 3.0, "span_s": 0.6, "beta": 0.25,
         "ref_makespan_s": 1.25, "ref_khz": 2035200, "ref_cores": 4, "version": 2,
         "span_cpu_s": None, "span_mem_s": None},
    ]  # fmt: skip
    path = tmp_path / "profiles.json"
    path.write_text(
        json.dumps({"format": "hidvfs-profiles", "version": 1, "profiles": rows}, indent=1) + "\n"
    )
    before = path.read_bytes()
    r = run("profile", "show", "fib", "--store", str(path))
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert "  version              2  (version)" in lines  # the profile as before
    assert "  provenance           unknown (measured before provenance was recorded)" in lines
    r = run("profile", "show", "fib", "--store", str(path), "--json")
    assert json.loads(r.stdout) == [{**rows[0], "provenance": None}]
    listed = run("profile", "list", "--store", str(path))
    assert listed.exit_code == 0 and listed.output.rstrip().endswith("measured ?")
    assert path.read_bytes() == before  # reading writes nothing


def test_remove_keeps_the_other_profiles_provenance(tx2):
    _, tmp = tx2
    store = str(tmp / "profiles.json")
    for name in ("a", "b"):
        r = run(*cli_args(tmp, "--name", name, "--", sys.executable, "-c", "pass"))
        assert r.exit_code == 0, r.output
    kept = deadlines.load(store).provenance_of("b", "tx2")
    assert kept is not None
    r = run("profile", "remove", "a", "--store", store)
    assert r.exit_code == 0, r.output
    s = deadlines.load(store)
    assert s.find("a", "tx2") is None and s.provenance_of("b", "tx2") == kept
    (row,) = json.loads(run("profile", "show", "b", "--store", store, "--json").stdout)
    assert row["provenance"] == kept
