"""The final table of `hidvfs bots run` reads only the campaign's runs, without their blobs."""

from __future__ import annotations

import json

from click.testing import CliRunner

from bots_bench.store import Store
from tools.cli import cli
from tools.native_campaign import campaign_records


def _run(bench, policy, seed=0, **kw):
    rec = {
        "bench": bench,
        "class": "test",
        "policy": policy,
        "seed": seed,
        "board": "tx2",
        "backend": "sim",
        "ok": True,
        "error": None,
        "makespan_s": 1.0,
        "energy_j": 2.0,
        "stdout": "x" * 100_000,
        "series": {"t": [0.0, 0.1], "temp_c": [40.0, 41.0]},
    }
    rec.update(kw)
    return rec


def test_campaign_records_skip_other_runs_and_every_blob(tmp_path):
    store = Store(tmp_path / "r.sqlite")
    mine = [_run("fib", "maxfreq"), _run("fib", "performance")]
    for r in mine + [_run("sort", "maxfreq"), _run("fib", "maxfreq", seed=7)]:
        store.add(r)
    keys = {store.key_for(r) for r in mine}
    got = campaign_records(store, keys)
    assert sorted(r["policy"] for r in got) == ["maxfreq", "performance"]
    assert all("stdout" not in r and "timeseries" not in r for r in got)
    assert campaign_records(store, set()) == []
    store.close()


def test_bots_run_loads_no_blob_for_its_table(tmp_path, monkeypatch):
    """It loaded every stored run's stdout and time series (1.1 GB RSS on a 420 MB file)."""
    db = tmp_path / "r.sqlite"
    with Store(db) as store:
        store.add(_run("sort", "maxfreq", seed=3))  # another campaign's run in the same file
    calls = []
    real = Store.runs

    def spy(self, filters=None, **kw):
        calls.append(kw)
        return real(self, filters, **kw)

    monkeypatch.setattr(Store, "runs", spy)
    args = ["bots", "run", "--bench", "fib", "--class", "test", "--policy", "maxfreq"]
    r = CliRunner().invoke(cli, [*args, "--db", str(db), "--json"])
    assert r.exit_code == 0, r.output
    assert calls and all(
        kw.get("with_stdout") is False and kw.get("with_timeseries") is False for kw in calls
    )
    records = json.loads(r.stdout)
    assert [(x["bench"], x["policy"]) for x in records] == [("fib", "maxfreq")]
