"""`daemon --record` on a long run: a full disk or the size limit ends the trace, never the
daemon's control or its restore; a restart keeps the previous run's trace."""

from __future__ import annotations

import errno
import subprocess
import sys
from pathlib import Path

import pytest

from daemon.service import run_live
from platforms import paths
from platforms.clock import VirtualClock
from platforms.faketree import write_fake_tree
from platforms.spec import load_board
from platforms.sysfs import DirSysfs
from platforms.trace import TickRecorder, keep_previous_recording, previous_name, read_trace
from platforms.trace_io import TraceWriter

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def board(tmp_path):
    spec = load_board("tx2")
    tree = tmp_path / "tree"
    write_fake_tree(spec, tree)
    state = tmp_path / "state"
    state.mkdir()
    return spec, tree, state


def _governors(spec, tree: Path) -> list[str]:
    return [
        (tree / paths.policy_file(c.policy, "scaling_governor")).read_text().strip()
        for c in spec.clusters
    ]


def _recorder(spec, tree, out, **kw) -> TickRecorder:
    return TickRecorder(
        DirSysfs(str(tree)), VirtualClock(), out, board="tx2", period_s=0.1, policy="x", **kw
    )


def test_a_full_disk_stops_the_recording_not_the_caller(board, tmp_path):
    spec, tree, _ = board
    told = []
    rec = _recorder(spec, tree, tmp_path / "r.jsonl", on_stop=told.append)
    gov = paths.policy_file(spec.clusters[0].policy, "scaling_governor")
    rec.sysfs.read(gov)
    rec.sample(0.1)
    rec._writer._f.close()
    rec._writer._f = open("/dev/full", "wb")  # every write from now on: ENOSPC
    rec.sysfs.read(gov)
    rec.sample(0.2)  # raised OSError before, which ended the daemon without its restore
    assert rec.stopped == "cannot write (No space left on device)"
    rec.sysfs.read(gov)
    rec.sample(0.3)  # stopped: nothing written, nothing raised, nothing piles up
    assert rec.sysfs.take() == ({}, {})
    rec.close()
    assert told == ["cannot write (No space left on device)"]  # told once
    assert rec.count == 1
    assert len(read_trace(tmp_path / "r.jsonl").samples) == 1  # what was written reads back


@pytest.mark.parametrize("name", ["r.jsonl", "r.jsonl.gz"])
def test_the_size_limit_ends_the_trace_readable(board, tmp_path, name):
    spec, tree, _ = board
    out = tmp_path / name
    cur = paths.policy_file(spec.clusters[0].policy, "scaling_cur_freq")
    rec = _recorder(spec, tree, out)
    for i in range(20):
        rec.sysfs.read(cur)
        rec.sample(0.1 * (i + 1))
    limit = rec._writer.size()  # what 20 samples take
    rec.close()
    rec = _recorder(spec, tree, out, max_bytes=limit)
    for i in range(60):
        rec.sysfs.read(cur)
        rec.sample(0.1 * (i + 1))
    assert rec.stopped.startswith("reached its size limit (") and f"of {limit} bytes" in rec.stopped
    assert 15 <= rec.count <= 21  # about where the limit is (gzip compresses unevenly)
    rec.close()
    assert len(read_trace(out).samples) == rec.count  # the gzip trailer was written


def test_writer_size_counts_compressed_bytes(tmp_path):
    from platforms.trace_io import TraceHeader

    w = TraceWriter(tmp_path / "t.jsonl.gz", TraceHeader(board="tx2", period_s=0.1, files=[]))
    w.open()
    for i in range(50):
        w.write_sample(0.1 * i, {"a": "1" * 200})
    assert 0 < w.size() == (tmp_path / "t.jsonl.gz").stat().st_size < 50 * 200
    w.close()


def test_the_previous_recording_is_kept_once(tmp_path):
    out = tmp_path / "d.jsonl.gz"
    assert previous_name(out) == str(tmp_path / "d.prev.jsonl.gz")
    assert previous_name(tmp_path / "trace") == str(tmp_path / "trace.prev")
    assert keep_previous_recording(out) is None  # nothing there
    out.write_bytes(b"")
    assert keep_previous_recording(out) is None and out.exists()  # nothing worth keeping
    out.write_bytes(b"first")
    assert keep_previous_recording(out) == str(tmp_path / "d.prev.jsonl.gz")
    assert not out.exists()
    out.write_bytes(b"second")
    keep_previous_recording(out)
    assert (tmp_path / "d.prev.jsonl.gz").read_bytes() == b"second"  # one previous run kept
    assert keep_previous_recording("/dev/null") is None


def test_a_disk_full_mid_run_still_restores_the_board(board, tmp_path, monkeypatch, capfd):
    """The audit's case: ENOSPC in the recording ended the daemon with exit 2, restore.json
    and the socket left behind and the governors at userspace."""
    spec, tree, state = board
    before = _governors(spec, tree)
    real = TraceWriter.write_sample
    calls = []

    def fill_up(self, *a, **kw):
        calls.append(1)
        if len(calls) > 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, *a, **kw)

    monkeypatch.setattr(TraceWriter, "write_sample", fill_up)
    status = run_live(
        sysfs_root=str(tree),
        policy="maxfreq",
        period_ms=20,
        state_dir=str(state),
        duration_s=0.5,
        socket_path=str(state / "s.sock"),
        record=str(tmp_path / "d.jsonl"),
    )
    assert len(calls) == 4  # the failed write stopped the recording
    assert status["ticks"] > 5  # and the daemon went on ticking
    assert _governors(spec, tree) == before
    assert not (state / "restore.json").exists()
    text = capfd.readouterr().err
    assert text.count("event=record_stopped") == 1 and "No space left on device" in text
    assert len(read_trace(tmp_path / "d.jsonl").samples) == 3


def test_the_daemon_keeps_going_past_its_record_limit_and_keeps_the_last_trace(board, tmp_path):
    spec, tree, state = board
    out = tmp_path / "d.jsonl.gz"
    out.write_bytes(b"the run before")
    before = _governors(spec, tree)
    cmd = [
        sys.executable, "-m", "tools.cli", "daemon", "--sysfs-root", str(tree),
        "--policy", "maxfreq", "--period-ms", "10", "--duration", "2",
        "--state-dir", str(state), "--socket", str(state / "s.sock"),
        "--record", str(out), "--record-max-mb", "0.0001",
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "event=record_stopped" in proc.stderr and "reached its size limit" in proc.stderr
    assert "event=record_previous_kept" in proc.stderr
    assert (tmp_path / "d.prev.jsonl.gz").read_bytes() == b"the run before"
    assert len(read_trace(out).samples) == 1  # the limit is below one sample: stops at once
    assert _governors(spec, tree) == before


def test_a_recording_into_a_pipe_is_not_stopped_by_the_size_limit(board, tmp_path):
    """tell() on a FIFO fails (ESPIPE): with the default limit every recording into a pipe
    stopped after one sample as if the disk were full."""
    import os
    import threading

    spec, tree, _ = board
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(open(fifo, "rb").read()))
    reader.start()
    rec = _recorder(spec, tree, fifo, max_bytes=1)
    for i in range(5):
        rec.sysfs.read(paths.policy_file(spec.clusters[0].policy, "scaling_cur_freq"))
        rec.sample(0.1 * (i + 1))
    assert rec.stopped is None and rec.count == 5
    rec.close()
    reader.join(timeout=10)
    assert got and got[0].count(b"\n") == 6  # the header and five samples


def test_the_check_after_a_tick_is_recorded_where_the_next_tick_reads_otherwise(board, tmp_path):
    """The daemon's check of its writes after a tick reads into the next sample, where the
    next tick's own reads of the same files win: a governor changed in between was seen by
    that tick but not by the check, and a replay could not tell which read what. The check's
    reads that the next tick read differently are kept under the sample's "c"."""
    spec, tree, _ = board
    out = tmp_path / "r.jsonl"
    rec = _recorder(spec, tree, out, rechecks=True)
    fs = DirSysfs(str(tree))
    gov = paths.policy_file(spec.clusters[0].policy, "scaling_governor")
    speed = paths.policy_file(spec.clusters[0].policy, "scaling_setspeed")
    rec.sysfs.read(gov)  # tick 1: read, written
    rec.sysfs.write(gov, "userspace")
    rec.sysfs.write(speed, "960000")
    rec.sample(0.1)
    with rec.rechecking():  # the check after it: what it wrote is there
        rec.sysfs.read(gov)
        rec.sysfs.read(speed)
    fs.write(gov, "schedutil")  # another tool, between the check and the next tick
    rec.sysfs.read(gov)  # tick 2 reads the governor (not the setspeed)
    rec.sample(0.2)
    with rec.rechecking():
        rec.sysfs.read(gov)
    rec.sysfs.read(gov)  # tick 3 reads what the check read: nothing kept apart
    rec.sample(0.3)
    rec.close()
    tr = read_trace(out)
    assert tr.header.extra["records_rechecks"] is True
    assert tr.samples[1].r[gov] == "schedutil" and tr.samples[1].c == {gov: "userspace"}
    assert speed in tr.samples[1].r  # read by the check alone: its value is in "r"
    assert tr.samples[0].c is None and tr.samples[2].c is None
    assert "records_rechecks" not in read_trace(_plain(spec, tree, tmp_path)).header.extra


def _plain(spec, tree, tmp_path):
    rec = _recorder(spec, tree, tmp_path / "plain.jsonl")
    rec.sysfs.read(paths.policy_file(spec.clusters[0].policy, "scaling_governor"))
    rec.sample(0.1)
    rec.close()
    return tmp_path / "plain.jsonl"


def test_a_replay_s_check_reads_what_the_daemon_s_check_read(tmp_path):
    from platforms.errors import SysfsUnavailable
    from platforms.trace import RecheckReads, ReplaySysfs
    from platforms.trace_io import TraceHeader

    gov, speed, mx = (f"devices/system/cpu/cpufreq/policy0/{n}" for n in (
        "scaling_governor", "scaling_setspeed", "scaling_max_freq"))  # fmt: skip
    out = tmp_path / "t.jsonl"
    with TraceWriter(out, TraceHeader(board="tx2", period_s=0.1, files=[gov, speed, mx])) as w:
        w.write_sample(0.0, {gov: "userspace", speed: "960000", mx: "2035200"}, {})
        w.write_sample(0.1, {gov: "schedutil", speed: "960000", mx: None}, {}, None,
                       {gov: "userspace", mx: None})  # fmt: skip
    clock = VirtualClock()
    sysfs = ReplaySysfs(read_trace(out), clock, t0=0.0)
    clock.set(0.1)
    view = RecheckReads(sysfs, read_trace(out).samples[1].c)
    assert view.read(gov) == "userspace" and sysfs.read(gov) == "schedutil"
    assert view.read(speed) == "960000"
    with pytest.raises(SysfsUnavailable, match="when the daemon checked it"):
        view.read(mx)
