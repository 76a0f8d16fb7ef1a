"""An interrupted `hidvfs bots run` or `bots study` says what it kept and whether the same
command again resumes; every interrupt still exits 130 with "interrupted" first."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import bots_bench.campaign_sim as campaign_sim
from tools.cli import cli

CAMPAIGN = ["bots", "run", "--bench", "fib", "--class", "test", "--policy", "maxfreq,powersave"]


@pytest.fixture
def stop_at_second_run(monkeypatch):
    """The simulated campaign's second run is interrupted (Ctrl-C); returns the runs made."""
    real, made = campaign_sim.run_one, []

    def run_one(cfg, *args, **kw):
        made.append(cfg.policy)
        if len(made) == 2:
            raise KeyboardInterrupt
        return real(cfg, *args, **kw)

    monkeypatch.setattr(campaign_sim, "run_one", run_one)
    return made


def interrupted(*args: str) -> str:
    r = CliRunner().invoke(cli, list(args))
    assert r.exit_code == 130, r.output
    last = r.stderr.splitlines()[-1]
    assert last.split(":")[0] == "interrupted"  # what scripts match
    return last


def test_a_campaign_with_a_db_says_its_runs_are_kept_and_a_re_run_resumes(
    stop_at_second_run, tmp_path, monkeypatch
):
    db = tmp_path / "r.sqlite"
    assert interrupted(*CAMPAIGN, "--db", str(db)) == (
        f"interrupted: the runs finished before it are kept in {db}; the same command again "
        "resumes the campaign"
    )
    assert stop_at_second_run == ["maxfreq", "powersave"]
    monkeypatch.undo()  # the same command again, not interrupted
    real, again = campaign_sim.run_one, []
    monkeypatch.setattr(campaign_sim, "run_one", lambda cfg, *a: again.append(cfg) or real(cfg, *a))
    r = CliRunner().invoke(cli, [*CAMPAIGN, "--db", str(db), "--json"])
    assert r.exit_code == 0, r.output
    assert len(json.loads(r.stdout)) == 2
    assert [c.policy for c in again] == ["powersave"]  # the finished run was kept


def test_a_simulated_campaign_from_flags_says_nothing_was_kept(stop_at_second_run):
    assert interrupted(*CAMPAIGN) == (
        "interrupted: nothing was kept: a simulated campaign from flags keeps its runs in memory "
        "(pass --db FILE to keep them, and a re-run resumes)"
    )


def test_a_spec_campaign_keeps_its_runs_in_results_sqlite(
    stop_at_second_run, tmp_path, monkeypatch
):
    spec = tmp_path / "c.yaml"
    spec.write_text(
        "kernels: [fib]\nclasses: [test]\npolicies: [maxfreq, powersave]\nseeds: 1\n"
        "board: tx2\nbackend: sim\n"
    )
    monkeypatch.chdir(tmp_path)
    line = interrupted("bots", "run", "--spec", str(spec))
    assert line.startswith("interrupted: the runs finished before it are kept in results.sqlite;")
    assert (tmp_path / "results.sqlite").exists()


def test_a_native_campaign_keeps_its_runs_in_results_sqlite(monkeypatch, tmp_path):
    """Interrupted during its runs (the store open), or before the board was open (a
    native campaign opens its store only then: nothing was stored)."""
    import tools.native_campaign

    def during_runs(configs, store, **kw):
        store()
        raise KeyboardInterrupt

    def before_the_board(configs, store, **kw):
        raise KeyboardInterrupt

    monkeypatch.chdir(tmp_path)
    native = [*CAMPAIGN, "--backend", "native", "--bots-bin", str(tmp_path)]
    monkeypatch.setattr(tools.native_campaign, "run_configs", during_runs)
    line = interrupted(*native)
    assert line.startswith("interrupted: the runs finished before it are kept in results.sqlite;")
    (tmp_path / "results.sqlite").unlink()
    monkeypatch.setattr(tools.native_campaign, "run_configs", before_the_board)
    assert (
        interrupted(*native) == "interrupted: before any run; nothing was stored in results.sqlite"
    )
    assert not (tmp_path / "results.sqlite").exists()


def test_a_study_says_it_starts_over_and_other_commands_say_interrupted(monkeypatch, tmp_path):
    import bots_bench.registry
    import bots_bench.studies

    def stopped(*args, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(bots_bench.studies, "vs_geardvfs", stopped)
    assert interrupted("bots", "study", "vs-geardvfs", "--bench", "fib", "--class", "test") == (
        "interrupted: nothing was kept: a study keeps its runs in memory (the same command "
        "again starts it over)"
    )
    monkeypatch.setattr(bots_bench.registry, "find_binaries", stopped)
    assert interrupted("bots", "list", "--bots-bin", str(tmp_path)) == "interrupted"
