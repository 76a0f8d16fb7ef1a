"""A policy limit moved behind the daemon's back (nvpmodel lowering ``scaling_max_freq``) is
obeyed and logged once, naming the cluster and the old and new kHz; the daemon's own limit
writes, and the files the drift check already watches, are not reported as such."""

from __future__ import annotations

import logging
import signal

from daemon.service import LimitsWatch
from platforms import paths
from platforms.faketree import write_fake_tree
from platforms.sense import Sensor
from platforms.spec import load_board
from platforms.sysfs import DirSysfs
from tests.daemon.test_daemon_process import board, start_daemon, wait_for  # noqa: F401

MAX0 = paths.policy_file(0, "scaling_max_freq")
MIN0 = paths.policy_file(0, "scaling_min_freq")


class _Ticks:
    """A LimitsWatch fed as the daemon feeds it: each check is one tick, whose sensor reads
    the tree before the tick's writes."""

    def __init__(self, spec, sysfs):
        self.sensor, self.watch = Sensor(spec, sysfs), LimitsWatch()

    def check(self, writes, owned=frozenset(), t=0.0):
        return self.watch.check(self.sensor.read(t), writes, owned, t)


def _watch(tmp_path):
    spec = load_board("tx2")
    write_fake_tree(spec, tmp_path / "tree")
    sysfs = DirSysfs(tmp_path / "tree")
    return spec, sysfs, _Ticks(spec, sysfs)


def _limit_lines(caplog):
    return [r for r in caplog.records if "limit_changed" in r.getMessage()]


def test_a_lowered_max_is_logged_once_with_cluster_and_khz(tmp_path, caplog):
    spec, sysfs, watch = _watch(tmp_path)
    cluster = next(c for c in spec.clusters if c.policy == 0)
    top, lower = cluster.freqs_khz[-1], cluster.freqs_khz[-4]
    with caplog.at_level(logging.INFO, logger="hidvfs.daemon"):
        assert watch.check([]) == []  # the first reading is the baseline
        (tmp_path / "tree" / MAX0).write_text(f"{lower}\n")  # nvpmodel steps in
        assert watch.check([]) == [MAX0]
        assert watch.check([]) == []  # once per change, not every tick
    lines = _limit_lines(caplog)
    assert len(lines) == 1 and lines[0].levelno == logging.WARNING
    msg = lines[0].getMessage()
    assert f"cluster={cluster.name}" in msg and "file=scaling_max_freq" in msg
    assert f"old_khz={top}" in msg and f"new_khz={lower}" in msg


def test_the_daemons_own_limit_writes_and_drift_watched_files_are_not_reported(tmp_path):
    spec, sysfs, watch = _watch(tmp_path)
    cluster = next(c for c in spec.clusters if c.policy == 0)
    watch.check([])
    low = cluster.freqs_khz[-2]
    assert watch.check([(MAX0, str(low))]) == []  # written by the daemon this tick
    (tmp_path / "tree" / MAX0).write_text(f"{low}\n")  # ... after the tick's reads
    assert watch.check([]) == []  # the next tick reads what the daemon wrote
    (tmp_path / "tree" / MIN0).write_text(f"{cluster.freqs_khz[1]}\n")
    assert watch.check([], owned={MIN0}) == []  # the drift check reports it
    (tmp_path / "tree" / MIN0).write_text(f"{cluster.freqs_khz[2]}\n")
    assert watch.check([]) == [MIN0]


def test_the_running_daemon_logs_a_max_lowered_under_userspace(board):  # noqa: F811
    """Under userspace the daemon never writes the limits, so the drift check never saw a
    lowered ceiling; the kernel obeyed it silently."""
    spec, tree, state = board
    proc, log = start_daemon(tree, state)
    gov = tree / paths.policy_file(0, "scaling_governor")
    cluster = next(c for c in spec.clusters if c.policy == 0)
    try:
        wait_for(lambda: gov.read_text().strip() == "userspace", what="the first write")
        (tree / MAX0).write_text(f"{cluster.freqs_khz[-5]}\n")
        wait_for(lambda: "event=limit_changed" in log.read_text(), what="the limit log line")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    assert proc.returncode == 0
    text = log.read_text()
    assert text.count("event=limit_changed") == 1
    assert f"new_khz={cluster.freqs_khz[-5]}" in text and f"cluster={cluster.name}" in text


def test_a_limit_that_keeps_moving_is_logged_once_per_quiet_period(tmp_path, caplog):
    """Thermal cooling can step scaling_max_freq every few ticks: one line per minute per
    file, the next one counting the changes it did not log."""
    spec, sysfs, watch = _watch(tmp_path)
    table = next(c for c in spec.clusters if c.policy == 0).freqs_khz
    with caplog.at_level(logging.INFO, logger="hidvfs.daemon"):
        watch.check([], t=0.0)
        for i in range(20):  # 20 changes in 10 s
            (tmp_path / "tree" / MAX0).write_text(f"{table[-2 - i % 2]}\n")
            assert watch.check([], t=0.5 * (i + 1)) == [MAX0]
        assert len(_limit_lines(caplog)) == 1
        (tmp_path / "tree" / MAX0).write_text(f"{table[-5]}\n")
        watch.check([], t=61.0)
    lines = _limit_lines(caplog)
    assert len(lines) == 2 and "19 more change(s)" in lines[1].getMessage()
