"""The static yardstick: busy clusters at a fraction of the table, idle ones at the bottom."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from agents.static import StaticFraction
from platforms.observation import ClusterObs, JobObs, Observation
from platforms.spec import load_board
from tools.cli import cli

SPEC = load_board("tx2")


def _obs(jobs=(), max_khz=None) -> Observation:
    cls = tuple(
        ClusterObs(
            c.name,
            i,
            c.cpus,
            c.cpus,
            c.freqs_khz,
            1.0,
            c.fmax_khz,
            c.fmin_khz,
            max_khz or c.fmax_khz,
            "userspace",
            (),
            (0.5,) * len(c.cpus),
        )
        for i, c in enumerate(SPEC.clusters)
    )
    return Observation(0.0, "tx2", cls, (), (), tuple(jobs))


def test_busy_clusters_take_the_fraction_idle_ones_the_bottom():
    a57 = SPEC.cluster("a57")
    idle = StaticFraction(0.5).decide(_obs())
    assert idle.freq_khz == {c.name: c.fmin_khz for c in SPEC.clusters}
    job = JobObs(1, "j", "lo", 0.0, 0.0, None, a57.cpus)
    d = StaticFraction(0.5).decide(_obs([job]))
    f = d.freq_khz["a57"]
    assert f in a57.freqs_khz and f >= 0.5 * a57.fmax_khz
    assert all(g < 0.5 * a57.fmax_khz for g in a57.freqs_khz if g < f)  # the lowest such entry
    assert d.freq_khz["denver"] == SPEC.cluster("denver").fmin_khz
    assert d.jobs[1].cpus == tuple(sorted(c for cl in SPEC.clusters for c in cl.cpus))


def test_fraction_follows_the_scaling_limit():
    a57 = SPEC.cluster("a57")
    cap = a57.freqs_khz[len(a57.freqs_khz) // 2]
    job = JobObs(1, "j", "lo", 0.0, 0.0, None, a57.cpus)
    d = StaticFraction(1.0).decide(_obs([job], max_khz=cap))
    assert d.freq_khz["a57"] == cap


@pytest.mark.parametrize("bad", [0.0, -0.1, 1.5])
def test_fraction_out_of_range_is_refused(bad):
    with pytest.raises(ValueError, match="fraction"):
        StaticFraction(bad)


def test_sweep_command_reports_energy_against_maxfreq():
    r = CliRunner().invoke(
        cli,
        [
            "agents",
            "sweep",
            "--board",
            "rubikpi3",
            "--fractions",
            "1.0,0.6",
            "--seeds",
            "1",
            "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    rows = {row["policy"]: row for row in json.loads(r.output)}
    assert set(rows) == {"maxfreq", "static-1", "static-0.6", "floor"}
    assert rows["maxfreq"]["cpu_energy_vs_maxfreq"] == pytest.approx(1.0)
    # slower points spend less CPU energy and take at least as long
    assert rows["static-0.6"]["cpu_energy_j"] < rows["static-1"]["cpu_energy_j"]
    assert rows["static-0.6"]["makespan_s"] >= rows["static-1"]["makespan_s"]
    # one mix: the EDP ratio is the ratio of the two products
    assert rows["maxfreq"]["edp_vs_maxfreq"] == pytest.approx(1.0)
    assert rows["static-0.6"]["edp_vs_maxfreq"] == pytest.approx(
        rows["static-0.6"]["edp"] / rows["maxfreq"]["edp"]
    )
    # the floor is below every point that met its deadlines, and says how much could be saved
    floor = rows["floor"]
    for name in ("maxfreq", "static-1", "static-0.6"):
        if rows[name]["misses"] == 0:
            assert floor["energy_j"] < rows[name]["energy_j"]
            assert floor["cpu_energy_j"] < rows[name]["cpu_energy_j"]
    assert 0.0 < floor["board_ceiling_min"] <= floor["board_ceiling_max"] < 1.0
    assert floor["energy_vs_maxfreq"] == pytest.approx(1.0 - floor["board_ceiling_min"])
    bad = CliRunner().invoke(cli, ["agents", "sweep", "--board", "tx2", "--fractions", "2"])
    assert bad.exit_code != 0 and "fractions" in bad.output
