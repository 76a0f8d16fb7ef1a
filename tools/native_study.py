"""Native runners for the canned studies: the reference makespan is measured on this board
(maxfreq, once per kernel), then deadlines are slack x that reference. The profile of the
build that runs, stored as BENCH.CLASS (BENCH.CLASS.VARIANT for a variant other than the
default; ``hidvfs bots profile``), is handed to the loop with each job, so the gate and the
shield can plan its deadline."""

from __future__ import annotations

import click

from bots_bench.native import open_board, run_native
from bots_bench.registry import DEFAULT_VARIANT, job_name
from bots_bench.spec import RunConfig
from tools.policies import build_policy_stack


def native_runner(
    board: str | None,
    cls: str,
    bots_bin: str | None,
    sysfs_root: str,
    slack: float | None,
    profiles_path: str | None = None,
    variant: str = DEFAULT_VARIANT,
):
    from agents import deadlines
    from daemon.config import DEFAULT_PROFILES

    # the detected board (a different ``board`` is refused); its notes go to stderr, so
    # that --json output stays JSON
    nb = open_board(sysfs_root, board, None, say=lambda m: click.echo(m, err=True))
    refs: dict[str, float | str] = {}  # kernel -> reference makespan, or why it failed
    store = deadlines.load(profiles_path or DEFAULT_PROFILES, missing_ok=True)

    def cfg(kernel: str, seed: int, policy: str, deadline_s: float | None) -> RunConfig:
        return RunConfig(
            bench=kernel,
            cls=cls,
            policy=policy,
            seed=seed,
            board=nb.platform.spec.name,
            backend="native",
            rep=0,
            deadline_s=deadline_s,
            bots_bin=bots_bin,
            cooldown=None,
            variant=variant,
        )

    def native(kernel: str, seed: int, policy: str) -> dict:
        deadline = None
        if slack is not None:
            if kernel not in refs:
                ref = run_native(cfg(kernel, 0, "maxfreq", None), nb, build_policy_stack)
                refs[kernel] = ref["makespan_s"] if ref["ok"] else f"{ref['error']}"
            if isinstance(refs[kernel], str):
                # without a reference there is no deadline: running anyway would be counted
                # as a deadline met, so the run is a failure naming the reference's
                failed = cfg(kernel, seed, policy, None)
                return {
                    **failed.record_base(),
                    "ok": False,
                    "error": f"reference maxfreq run failed, so no deadline: {refs[kernel]}",
                    "makespan_s": None,
                    "energy_j": None,
                    "cpu_energy_j": None,
                    "deadline_met": None,
                }
            deadline = slack * refs[kernel]
        run = cfg(kernel, seed, policy, deadline)
        prof = store.find(job_name(run.bench, run.cls, run.variant, run.label), run.board)
        return run_native(run, nb, build_policy_stack, prof)

    return native, nb
