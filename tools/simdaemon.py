"""``hidvfs daemon --sim BOARD``: the daemon on the simulated board with the default workload."""

from __future__ import annotations

from agents.mixed import daemon_stages
from bots_bench.workload import WorkloadSpec, default_items
from daemon.config import Config, policy_options
from daemon.guard import config_guard
from daemon.simrun import run_sim
from daemon.statusfile import write_status
from daemon.stopsignals import StopOnSignals
from tools.policies import build_policy_stack

#: longest --sim run, in virtual seconds (one day): the whole workload is built before the
#: run, deaf to signals; a day at the top load builds in well under a second, a week took
#: 2-3 s and 190 MB, 5e6 s hundreds of MB, and 1e9 ended in MemoryError
MAX_SIM_DURATION_S = 86400.0


def run_sim_daemon(
    board: str,
    policy_name: str,
    *,
    period_ms: int,
    duration_s: float,
    status_file: str | None,
    seed: int,
    load: float,
    config: Config | None = None,
    signals: StopOnSignals | None = None,
) -> dict:
    """Run ``duration_s`` virtual seconds; the status file is refreshed every virtual second.
    ``config``: its thermal margin and static caps, deadline margin (``deadline_slack``) and
    mixed-criticality reservation apply (the caller has taken its policy and period).

    SIGTERM, SIGINT and SIGHUP stop the run early, as they stop the board daemon: the status
    returned (and written) is then the run so far, and ``signals.received`` names the signal
    (pass ``signals`` to read it; one is made otherwise). The handlers are installed for the
    run and the previous ones put back after it."""
    from platforms.spec import load_board

    if duration_s > MAX_SIM_DURATION_S:
        raise ValueError(
            f"a simulated run lasts at most {MAX_SIM_DURATION_S:g} virtual seconds "
            f"(one day), not {duration_s:g}"
        )
    spec = load_board(board)
    signals = signals or StopOnSignals()
    with signals:  # from here on: building a long workload takes a while too
        w = WorkloadSpec(duration_s=duration_s, load=load)
        items = default_items(spec, seed, w)
        opts = policy_options(config, policy_name) if config else {}
        policy, stages = build_policy_stack(policy_name, spec, **opts)
        stages = daemon_stages(stages, config.mixed_criticality.reserve if config else True)
        cb = (lambda st: write_status(status_file, st)) if status_file else None
        result = run_sim(
            spec.name,
            policy,
            items,
            seed=seed,
            period_s=period_ms / 1000.0,
            duration_s=duration_s,
            stages=stages,
            guard=config_guard(spec, config),
            # the daemon's own default margin without a config (as on a board)
            deadline_margin=(config or Config()).deadline_slack,
            until_idle=False,
            status_cb=cb,
            stop=signals.stop,
            keep_energy_trace=False,  # read by training and metering, not here: a day is GBs
        )
    status = dict(result.status)
    status["energy_exact_j"] = round(result.energy_j, 6)
    status["peak_temp_c"] = round(result.peak_temp_c, 3)
    status["jobs_released"] = sum(1 for j in result.jobs if j.release_t <= result.t_end)
    if status_file:
        write_status(status_file, status)
    return status
