"""`hidvfs bots run --backend sim ... --db` then `hidvfs bots report`: the report's numbers are
the database's."""

import json
import sqlite3
import statistics

from click.testing import CliRunner

from tools.cli import cli


def test_sim_campaign_then_report_numbers_match_the_database(tmp_path):
    db = tmp_path / "r.sqlite"
    runner = CliRunner()
    r = runner.invoke(
        cli,
        [
            "bots",
            "run",
            "--backend",
            "sim",
            "--board",
            "tx2",
            "--bench",
            "fib,sparselu",
            "--class",
            "test",
            "--policy",
            "hidvfs,geardvfs,maxfreq",
            "--seeds",
            "2",
            "--db",
            str(db),
            "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    records = json.loads(r.output)
    assert len(records) == 12 and all(x["ok"] for x in records)
    for x in records:
        assert x["lower_bound_s"] <= x["makespan_s"]
        assert x["energy_j"] > 0 and x["peak_temp_c"] > 20
    # Re-running skips everything already stored.
    again = runner.invoke(
        cli,
        [
            "bots",
            "run",
            "--backend",
            "sim",
            "--board",
            "tx2",
            "--bench",
            "fib,sparselu",
            "--class",
            "test",
            "--policy",
            "hidvfs,geardvfs,maxfreq",
            "--seeds",
            "2",
            "--db",
            str(db),
            "--json",
        ],
    )
    assert again.exit_code == 0 and len(json.loads(again.output)) == 12
    out = tmp_path / "report"
    r = runner.invoke(
        cli, ["bots", "report", "--db", str(db), "--out", str(out), "--baseline", "maxfreq"]
    )
    assert r.exit_code == 0, r.output
    summary = json.loads((out / "summary.json").read_text())
    con = sqlite3.connect(db)
    rows = con.execute(
        "SELECT bench, policy, seed, makespan_s, energy_j FROM runs WHERE ok = 1"
    ).fetchall()
    assert len(rows) == 12
    checked = 0
    for g in summary["groups"]:
        for p in g["policies"]:
            vals = [(m, e) for b, pol, _, m, e in rows if b == g["bench"] and pol == p["policy"]]
            assert p["makespan"]["mean"] == statistics.fmean(m for m, _ in vals)
            assert p["energy"]["mean"] == statistics.fmean(e for _, e in vals)
            checked += 1
    assert checked == 6
    md = (out / "report.md").read_text()
    assert "hidvfs" in md and "geardvfs" in md and "maxfreq (baseline)" in md


def test_report_without_matplotlib_says_so_and_writes_the_tables(tmp_path, monkeypatch):
    """It printed "... and 0 plots" with rc 0 and no word on why."""
    import sys

    db = tmp_path / "r.sqlite"
    runner = CliRunner()
    args = ["bots", "run", "--bench", "fib", "--class", "test", "--policy", "maxfreq"]
    r = runner.invoke(cli, [*args, "--db", str(db)])
    assert r.exit_code == 0, r.output
    out = tmp_path / "report"
    with monkeypatch.context() as m:
        m.setitem(sys.modules, "matplotlib", None)  # import matplotlib fails
        r = runner.invoke(cli, ["bots", "report", "--db", str(db), "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert r.stderr.strip().splitlines() == [
        'note: no plots: they need the report extra (matplotlib): pip install "hidvfs[report]"'
    ]
    assert r.stdout.strip().endswith("and 0 plots")
    assert (out / "report.md").is_file() and (out / "report.html").is_file()
    assert not list(out.glob("*.png"))
    r = runner.invoke(cli, ["bots", "report", "--db", str(db), "--out", str(tmp_path / "r2")])
    assert r.exit_code == 0 and r.stderr == ""  # with matplotlib: plots, no note


def test_an_empty_board_is_refused_not_read_as_tx2():
    """`bots run --board "$B"` with B unset ran the campaign on tx2, the default."""
    for cmd in (["bots", "run", "--backend", "sim"], ["bots", "study", "vs-geardvfs"]):
        r = CliRunner().invoke(cli, [*cmd, "--board", ""])
        assert r.exit_code == 2 and "Invalid value for '--board': empty" in r.output, r.output
