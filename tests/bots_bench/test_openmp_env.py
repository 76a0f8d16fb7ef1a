"""A native kernel runs with the OpenMP environment the campaign sets, and its record says which:
an ``OMP_THREAD_LIMIT=1`` left in the shell used to turn a "2-thread" run into a 1-thread one,
stored as ok (and reused as done by the next campaign)."""

from __future__ import annotations

import os

from bots_bench import registry
from bots_bench.native import run_native
from bots_bench.spec import RunConfig
from tests.bots_bench.outputs import fib_block
from tools.policies import build_policy_stack

#: what a shell may hold that changes an OpenMP run (libgomp and the LLVM/Intel runtime)
SHELL = {
    "OMP_THREAD_LIMIT": "1",
    "OMP_PROC_BIND": "true",
    "OMP_WAIT_POLICY": "passive",
    "GOMP_SPINCOUNT": "0",
    "KMP_AFFINITY": "compact",
}
BLOCK = fib_block(0.25)


def _stand_in(folder, name):
    """A fib binary that prints the OpenMP variables it was given, then a good result."""
    folder.mkdir(exist_ok=True)
    path = folder / name
    path.write_text(
        f"#!/bin/sh\nenv | grep -E '^(OMP|GOMP|KMP)_' | sed 's/^/env: /'\nprintf '{BLOCK}'\n"
    )
    path.chmod(0o755)
    return path


def test_command_for_drops_the_callers_openmp_variables(tmp_path):
    _stand_in(tmp_path / "bin", "fib.gcc.omp-tasks")
    base = {"PATH": "/usr/bin", "HOME": "/root", "OMP_NUM_THREADS": "8", **SHELL}
    cmd = registry.command_for("fib", "smoke", tmp_path / "bin", 2, base_env=base)
    assert cmd.env == {"PATH": "/usr/bin", "HOME": "/root", "OMP_NUM_THREADS": "2"}
    assert registry.openmp_env(cmd.env) == registry.omp_env("fib", "smoke", 2)
    # a class that sets a stack size keeps it, and the caller's own is not what it gets
    _stand_in(tmp_path / "bin", "uts.gcc.omp-tasks")
    (tmp_path / "inputs" / "uts").mkdir(parents=True)
    (tmp_path / "inputs" / "uts" / "test.input").write_text("")
    uts = registry.command_for(
        "uts", "test", tmp_path / "bin", 2, base_env={"OMP_STACKSIZE": "1G", **SHELL}
    )
    assert uts.env == {"OMP_NUM_THREADS": "2", "OMP_STACKSIZE": "2M"}


def _fib_run(bots_bin, threads: int) -> RunConfig:
    return RunConfig(
        "fib",
        "smoke",
        "maxfreq",
        0,
        "tx2",
        "native",
        0,
        threads=threads,
        bots_bin=str(bots_bin),
        cooldown=None,
    )


def test_a_native_run_gets_and_records_only_the_campaigns_openmp_variables(
    board, tmp_path, monkeypatch, caplog
):
    for k in list(os.environ):  # an earlier import (an OpenMP library) may have set some
        if registry.is_openmp_var(k):
            monkeypatch.delenv(k)
    for k, v in SHELL.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("OMP_NUM_THREADS", "8")
    _stand_in(tmp_path / "bin", "fib.gcc.omp-tasks")
    cfg = _fib_run(tmp_path / "bin", threads=2)
    with caplog.at_level("WARNING", logger="hidvfs.native"):
        rec = run_native(cfg, board, build_policy_stack)
        again = run_native(cfg, board, build_policy_stack)
    assert rec["ok"] and again["ok"], (rec["error"], again["error"])
    seen = sorted(line[5:] for line in rec["stdout"].splitlines() if line.startswith("env: "))
    assert seen == ["OMP_NUM_THREADS=2"]  # what the kernel saw
    assert rec["omp_env"] == {"OMP_NUM_THREADS": "2"}  # what the record says it ran with
    assert rec["omp_env_ignored"] == sorted([*SHELL, "OMP_NUM_THREADS"])
    # said once per campaign, not once per run
    warned = [r for r in caplog.records if "openmp_env_ignored" in r.getMessage()]
    assert len(warned) == 1 and "OMP_THREAD_LIMIT" in warned[0].getMessage()


def test_without_openmp_variables_in_the_shell_nothing_is_named(board, tmp_path, monkeypatch):
    for k in list(os.environ):
        if registry.is_openmp_var(k):
            monkeypatch.delenv(k)
    _stand_in(tmp_path / "bin", "fib.gcc.omp-tasks")
    cfg = _fib_run(tmp_path / "bin", threads=3)
    rec = run_native(cfg, board, build_policy_stack)
    assert rec["ok"], rec["error"]
    assert rec["omp_env"] == {"OMP_NUM_THREADS": "3"} and "omp_env_ignored" not in rec


def test_the_report_shows_the_openmp_environment_a_native_run_recorded(
    board, tmp_path, monkeypatch
):
    """What a native run records (omp_env, omp_env_ignored) is what `bots report` shows
    above the run's table: its title names no thread count (the record has no spec config
    here), the environment does."""
    from bots_bench.report import write_report
    from bots_bench.store import Store

    for k in list(os.environ):
        if registry.is_openmp_var(k):
            monkeypatch.delenv(k)
    monkeypatch.setenv("OMP_THREAD_LIMIT", "1")
    _stand_in(tmp_path / "bin", "fib.gcc.omp-tasks")
    rec = run_native(_fib_run(tmp_path / "bin", threads=2), board, build_policy_stack)
    assert rec["ok"], rec["error"]
    db = tmp_path / "r.sqlite"
    with Store(db) as s:
        s.add(rec)
    md = write_report(db, tmp_path / "out").markdown.read_text()
    assert (
        "## fib / smoke (tx2, native)\n\n"
        "OpenMP environment of the kernels: `OMP_NUM_THREADS=2`. "
        "Left out or replaced from the campaign's shell (every run): `OMP_THREAD_LIMIT`.\n"
    ) in md
