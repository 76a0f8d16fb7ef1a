"""Speed of the whole daemon on the simulated board with the default workload, relative to
real time (goal >= 100x): the real control loop, sensor reads through SimSysfs, the policy,
actuation and the plant, for 60 virtual seconds of the built-in BOTS mix."""

import time

import pytest

from agents.factory import make_policy_stack
from bots_bench.workload import WorkloadSpec, default_items
from daemon.simrun import run_sim
from platforms.spec import load_board


@pytest.mark.parametrize("period_ms", [100, 50])
def test_bench_daemon_speed_vs_real_time(benchmark, period_ms):
    spec = load_board("tx2")
    w = WorkloadSpec(duration_s=60.0)
    items = default_items(spec, 0, w)

    def run():
        policy, stages = make_policy_stack("schedutil", spec)
        t0 = time.perf_counter()
        res = run_sim(
            "tx2",
            policy,
            items,
            period_s=period_ms / 1000.0,
            duration_s=60.0,
            stages=stages,
            until_idle=False,
        )
        return res, 60.0 / (time.perf_counter() - t0)

    res, speed = benchmark.pedantic(run, rounds=1, iterations=1)
    assert res.t_end == pytest.approx(60.0) and res.ticks >= 60_000 // period_ms
    assert any(j.finish_t is not None for j in res.jobs)
    benchmark.extra_info["x_real_time"] = round(speed, 1)
    print(f"\ndaemon on simulated tx2, {period_ms} ms period: {speed:.0f}x real time")
