"""One full TX2 observation through DirSysfs on a fake tree (goal: < 1 ms median)."""

from __future__ import annotations

from platforms.faketree import write_fake_tree
from platforms.sense import Sensor
from platforms.spec import load_board
from platforms.sysfs import DirSysfs


def test_bench_sense_tx2(benchmark, tmp_path):
    spec = load_board("tx2")
    w = write_fake_tree(spec, tmp_path, mode="all-online")
    sensor = Sensor(spec, DirSysfs(tmp_path), refresh_s=None)
    sensor.read(0.0)
    w.advance_stat(1.0, busy=0.5)
    obs = benchmark(sensor.read, 0.0)
    assert len(obs.clusters) == 2 and all(c.cur_khz is not None for c in obs.clusters)
    assert len(obs.zones) == 7 and len(obs.rails) == 6
    assert obs.total_power_w is not None
    # only the blank PLL-therm reading is unavailable on this tree
    assert len(obs.errors) == 1 and "thermal_zone3/temp" in obs.errors[0]
