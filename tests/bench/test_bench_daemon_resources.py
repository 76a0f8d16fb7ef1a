"""CPU share and memory of the real daemon process at a 100 ms period on a fake TX2 tree
(goal: under 2% of one core and under 100 MB RSS). Measured after start-up, over a window."""

import time

import psutil

from platforms.faketree import write_fake_tree
from platforms.spec import load_board
from tests.daemon.test_daemon_process import start_daemon


def test_bench_daemon_cpu_and_rss(benchmark, tmp_path):
    tree = tmp_path / "tree"
    write_fake_tree(load_board("tx2"), tree)
    state = tmp_path / "state"
    state.mkdir()
    proc, _ = start_daemon(
        tree, state, "--duration", "12", policy="schedutil", period_ms=100, status_file=False
    )

    def measure():
        p = psutil.Process(proc.pid)
        time.sleep(3.0)  # start-up (imports, snapshot) is not steady state
        c0, t0 = sum(p.cpu_times()[:2]), time.monotonic()
        time.sleep(6.0)
        c1, t1 = sum(p.cpu_times()[:2]), time.monotonic()
        return (c1 - c0) / (t1 - t0), p.memory_info().rss

    try:
        share, rss = benchmark.pedantic(measure, rounds=1, iterations=1)
    finally:
        proc.wait(timeout=60)
    assert proc.returncode == 0
    assert 0.0 < share < 1.0 and rss > 0
    benchmark.extra_info["cpu_share_of_one_core"] = round(share, 4)
    benchmark.extra_info["rss_mb"] = round(rss / 2**20, 1)
    print(
        f"\ndaemon at 100 ms on a fake TX2 tree: {share * 100:.2f}% of one core, {rss / 2**20:.1f} MB RSS"
    )
