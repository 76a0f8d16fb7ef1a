"""A native run whose total rail stopped reading part-way: its energy integral covers only
part of the run, and is stored as unavailable with the reason, not as a silent undercount."""

from __future__ import annotations

import threading

import pytest

from bots_bench.native import MIN_ENERGY_COVERAGE, open_board, run_native, usable_energy
from bots_bench.spec import RunConfig
from platforms import paths
from platforms.faketree import write_fake_tree
from platforms.sampler import SampleSummary
from platforms.spec import load_board
from tests.bots_bench.outputs import fib_block
from tools.policies import build_policy_stack

BLOCK = fib_block(0.5)


def _summary(energy, coverage, cpu=1.0, cpu_coverage=1.0):
    return SampleSummary(
        energy_j=energy,
        cpu_energy_j=cpu,
        duration_s=1.0,
        samples=100,
        rate_hz=100.0,
        peak_temp_c=None,
        energy_coverage=coverage,
        cpu_energy_coverage=cpu_coverage,
    )


def test_usable_energy_refuses_a_partial_integral():
    e, c, notes = usable_energy(_summary(2.5, 0.5))
    assert e is None and c == 1.0
    assert len(notes) == 1 and "50%" in notes[0] and "energy unavailable" in notes[0]
    e, c, notes = usable_energy(_summary(4.9, MIN_ENERGY_COVERAGE, cpu=0.2, cpu_coverage=0.1))
    assert e == 4.9 and c is None and "cpu energy unavailable" in notes[0]
    assert usable_energy(_summary(None, None, None, None)) == (None, None, [])


def test_native_run_with_a_rail_that_stops_reading_stores_no_energy(tmp_path):
    spec = load_board("tx2")
    root = tmp_path / "tree"
    writer = write_fake_tree(spec, root)
    nb = open_board(str(root), None, str(tmp_path / "state"), say=lambda m: None)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    kernel = bin_dir / "fib.gcc.omp-tasks"
    kernel.write_text(f"#!/bin/sh\nsleep 0.8\nprintf '{BLOCK}'\n")
    kernel.chmod(0o755)
    total = spec.total_rail
    blank = threading.Timer(0.15, writer.put, (paths.iio_power(total.device, total.channel), ""))
    cfg = RunConfig(
        "fib", "smoke", "maxfreq", 0, "tx2", "native", 0, bots_bin=str(bin_dir), cooldown=None
    )
    try:
        blank.start()
        rec = run_native(cfg, nb, build_policy_stack)
    finally:
        blank.cancel()
        nb.close()
    assert rec["ok"], rec["error"]
    assert rec["energy_coverage"] is not None and rec["energy_coverage"] < MIN_ENERGY_COVERAGE
    assert rec["energy_j"] is None and rec["edp"] is None
    assert "energy unavailable" in rec["energy_note"]
    assert rec["cpu_energy_j"] is not None  # its rail kept reading
    assert rec["cpu_energy_coverage"] == pytest.approx(1.0)
