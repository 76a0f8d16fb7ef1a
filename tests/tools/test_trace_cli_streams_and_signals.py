"""`trace record|replay|info` findings of a user review (/tmp/rev-trace/REPORT.md):

- H2: `trace record --out /dev/stdout` printed its summary into the trace (over its header
  when stdout was a file, as a last non-JSON line in a pipe); `daemon --record /dev/stdout
  --json` printed its status into it, a dry run its plan.
- H3: a replay of a FIFO no writer opens, or a recording to a FIFO no reader opens, waited in
  open() and SIGTERM/SIGINT did nothing (the stop handler only set a flag, and Python retried
  the open): only SIGKILL ended it.
- M1: `--check --period-ms` replayed on a grid instead of the recorded ticks and failed good
  recordings; M2: a `daemon --dry-run --record` trace was said not to be the daemon's.
- LOW: `trace record` overwrote an earlier --out; `--out -` wrote a file named '-'; `--policy
  ''` ran the default; a replay stopped by a signal exited 0; `trace info` did not say who
  recorded a trace; "1 writes differ".

The FIFO and signal tests run the CLI in a subprocess with timeouts, the signal sent from
the test: they cannot hang the suite."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from platforms.clock import VirtualClock
from platforms.faketree import write_fake_tree
from platforms.spec import load_board
from platforms.sysfs import DirSysfs
from platforms.trace import read_trace, record
from platforms.trace_io import TraceWriter
from tools.cli import cli
from tools.replay import replay_trace

ROOT = Path(__file__).resolve().parents[2]
#: how long a subprocess may take before the test gives up on it (and kills it)
LIMIT_S = 60


def hv(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def _hidvfs(*args, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tools.cli", *map(str, args)],
        cwd=ROOT,
        timeout=LIMIT_S,
        **kwargs,
    )


@pytest.fixture
def tree(tmp_path):
    write_fake_tree(load_board("tx2"), tmp_path / "tree")
    return tmp_path / "tree"


def _trace(tmp_path, tree, name="t.jsonl", duration_s=2.0, period_s=0.1):
    out = tmp_path / name
    record(
        DirSysfs(tree),
        VirtualClock(0.0),
        str(out),
        period_s=period_s,
        duration_s=duration_s,
        board="tx2",
    )
    return out


def _as_daemon(src, dst, policy="maxfreq", writes=None):
    """``src`` as `daemon --record` marks its recordings; ``writes(i, sample)`` gives each
    sample's ``w`` (default: none, as a --dry-run recording)."""
    tr = read_trace(src)
    tr.header.extra.update(recorded_by="daemon", policy=policy)
    with TraceWriter(dst, tr.header) as w:
        for i, s in enumerate(tr.samples):
            w.write_sample(s.t, s.r, writes(i, s) if writes else {})
    return dst


# -- H2: the trace alone on stdout ---------------------------------------------------------------


def test_record_to_dev_stdout_in_a_pipe_is_a_trace_with_the_summary_on_stderr(tmp_path, tree):
    p = _hidvfs(
        "trace", "record", "--sysfs-root", tree, "--out", "/dev/stdout", "--duration", "0.3",
        capture_output=True,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    got = tmp_path / "pipe.jsonl"
    got.write_bytes(p.stdout)
    n = len(read_trace(got).samples)  # every line JSON: the summary was a last line
    assert n >= 1
    assert f"recorded {n} samples of board tx2 to /dev/stdout" in p.stderr.decode()


def test_record_to_dev_stdout_sent_to_a_file_keeps_its_header(tmp_path, tree):
    got = tmp_path / "file.jsonl"
    with open(got, "wb") as f:
        p = _hidvfs(
            "trace", "record", "--sysfs-root", tree, "--out", "/dev/stdout", "--duration",
            "0.3", stdout=f, stderr=subprocess.PIPE,
        )  # fmt: skip
    assert p.returncode == 0, p.stderr
    tr = read_trace(got)  # the summary overwrote the start of the header
    assert tr.header.board == "tx2" and tr.samples
    assert b"recorded " in p.stderr


def test_daemon_json_with_its_recording_on_stdout_is_refused_before_it_starts(tmp_path, tree):
    state = tmp_path / "st"
    p = _hidvfs(
        "daemon", "--sysfs-root", tree, "--duration", "0.3", "--state-dir", state,
        "--socket", state / "s.sock", "--record", "/dev/stdout", "--json",
        capture_output=True, text=True,
    )  # fmt: skip
    assert p.returncode == 2, p.stderr
    assert p.stdout == ""
    assert "--json prints the status on stdout, where --record /dev/stdout writes" in p.stderr
    assert not state.exists()  # refused before anything was made


def test_daemon_recording_to_its_own_stderr_is_refused_before_it_starts(tmp_path, tree):
    """The daemon logs to stderr all run long: `--record /dev/stderr` (or stdout sent to the
    same file as stderr) interleaved log lines with the trace's samples."""
    state = tmp_path / "st"
    log = tmp_path / "both.log"
    for target, stdout in (("/dev/stderr", subprocess.PIPE), ("/dev/stdout", "stderr's")):
        with open(log, "wb") as f:
            p = _hidvfs(
                "daemon", "--sysfs-root", tree, "--duration", "0.3", "--state-dir", state,
                "--socket", state / "s.sock", "--record", target,
                stdout=f if stdout == "stderr's" else stdout, stderr=f,
            )  # fmt: skip
        text = log.read_text()
        assert p.returncode == 2, text
        assert f"--record {target} is this command's stderr, where the daemon logs" in text
        assert not state.exists()  # refused before anything was made
    # a recording thrown away with the logs (a unit's StandardError=null): nothing to mix
    with open(os.devnull, "wb") as null:
        p = _hidvfs(
            "daemon", "--sysfs-root", tree, "--duration", "0.3", "--state-dir", state,
            "--socket", state / "s.sock", "--record", os.devnull, stdout=null, stderr=null,
        )  # fmt: skip
    assert p.returncode == 0


def test_a_dry_run_recording_on_stdout_gets_its_plan_on_stderr(tmp_path, tree):
    state = tmp_path / "st"
    p = _hidvfs(
        "daemon", "--sysfs-root", tree, "--duration", "0.3", "--state-dir", state,
        "--socket", state / "s.sock", "--record", "/dev/stdout", "--dry-run",
        "--policy", "maxfreq", capture_output=True,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    got = tmp_path / "dry.jsonl"
    got.write_bytes(p.stdout)
    tr = read_trace(got)
    assert tr.header.extra["recorded_by"] == "daemon" and tr.samples
    assert b"dry-run: would write" in p.stderr


# -- H3: a FIFO that nobody opens ----------------------------------------------------------------


def _catches(pid: int, sig: signal.Signals) -> bool:
    """Has process ``pid`` installed a handler for ``sig`` (SigCgt in /proc/PID/status)?"""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    for line in text.splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    return False


def _waiting_in_open(pid: int) -> bool:
    """Is ``pid`` asleep in a FIFO's open (wait_for_partner; older kernels: fifo_open)?"""
    try:
        wchan = Path(f"/proc/{pid}/wchan").read_text()
    except OSError:
        return False
    return "partner" in wchan or "fifo" in wchan


def _signalled(args, sig: signal.Signals, ready) -> tuple[int, str, str]:
    """Run ``hidvfs ARGS``; once ``ready(pid)`` holds (at most 20 s), send ``sig``; the process
    must then end within LIMIT_S (else it is killed and the test fails). (rc, stdout, stderr)"""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tools.cli", *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        end = time.monotonic() + 20
        while not ready(proc.pid) and time.monotonic() < end:
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.05)
        proc.send_signal(sig)
        try:
            stdout, stderr = proc.communicate(timeout=LIMIT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{' '.join(map(str, args))}: still running {LIMIT_S} s after {sig.name}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, stdout, stderr


def _blocked(pid: int) -> bool:
    return _catches(pid, signal.SIGTERM) and _waiting_in_open(pid)


SIGNALS = [signal.SIGTERM, signal.SIGINT, signal.SIGHUP]


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_a_signal_ends_a_replay_waiting_for_a_fifo_writer(tmp_path, sig):
    fifo = tmp_path / "f.jsonl.gz"
    os.mkfifo(fifo)
    rc, stdout, stderr = _signalled(["trace", "replay", fifo], sig, _blocked)
    assert rc == 130, stderr
    assert f"interrupted: {sig.name}: the replay of {fifo} stopped" in stderr
    assert stdout == "" and "Traceback" not in stderr


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_a_signal_ends_a_recording_waiting_for_a_fifo_reader(tmp_path, tree, sig):
    fifo = tmp_path / "f.jsonl.gz"
    os.mkfifo(fifo)
    args = ["trace", "record", "--sysfs-root", tree, "--out", fifo, "--duration", "1"]
    rc, stdout, stderr = _signalled(args, sig, _blocked)
    assert rc == 130, stderr
    assert f"interrupted: {sig.name} before the first sample; nothing recorded to {fifo}" in stderr
    assert "no reader opened the FIFO" in stderr and "Traceback" not in stderr
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)  # left as it was, nothing kept aside
    assert sorted(os.listdir(tmp_path)) == ["f.jsonl.gz", "tree"]


def test_a_replay_stopped_by_a_signal_is_interrupted_not_a_success(tmp_path, tree):
    """It printed "replay stopped before the trace's end" and exited 0."""
    long = _trace(tmp_path, tree, "long.jsonl.gz", duration_s=600.0, period_s=1.0)
    rc, stdout, stderr = _signalled(
        ["trace", "replay", long, "--period-ms", "1", "--json"],
        signal.SIGTERM,
        lambda pid: _catches(pid, signal.SIGTERM) and (time.sleep(0.3) or True),
    )
    assert rc == 130, stderr
    assert f"interrupted: SIGTERM: the replay of {long} stopped before the trace's end" in stderr
    assert stdout == ""


# -- M1, M2: what --check can compare -------------------------------------------------------------


def test_check_with_a_period_is_refused_up_front(tmp_path, tree):
    """A grid of --period-ms ticks misplaces writes against the recorded samples: good
    recordings failed --check."""
    daemon_made = _as_daemon(_trace(tmp_path, tree), tmp_path / "d.jsonl")
    r = hv("trace", "replay", daemon_made, "--check", "--period-ms", "100")
    assert r.exit_code == 2
    assert r.output.startswith("hidvfs: error: --check replays at the recorded ticks")
    assert len(r.output.splitlines()) == 1 and "--period-ms" in r.output
    assert hv("trace", "replay", daemon_made, "--period-ms", "100").exit_code == 0


def test_check_of_a_recording_without_writes_says_so_not_that_it_is_no_daemons(tmp_path, tree):
    """A `daemon --dry-run --record` trace holds no writes; --check said it needed one from
    `daemon --record`, which it is."""
    dry = _as_daemon(_trace(tmp_path, tree), tmp_path / "dry.jsonl", policy="schedutil")
    r = hv("trace", "replay", dry, "--check")
    assert r.exit_code == 2
    assert f"{dry}: holds no writes (recorded by `trace record`, or by a daemon with " in r.output
    assert "--dry-run), so --check has nothing to compare" in r.output


def test_one_differing_write_is_said_in_the_singular(tmp_path, tree):
    from bisect import bisect_right

    src = _trace(tmp_path, tree)
    ours = replay_trace(str(_as_daemon(src, tmp_path / "a.jsonl")), None)["writes"]
    times = [s.t for s in read_trace(src).samples]
    per_tick: list[dict[str, str]] = [{} for _ in times]
    for t, p, v in ours:  # each write on the sample it was made at, as the daemon records
        per_tick[max(bisect_right(times, t + 1e-6) - 1, 0)][p] = v
    tick, path = next((i, p) for i, w in enumerate(per_tick) for p, v in w.items() if v.isdigit())
    per_tick[tick][path] = str(int(per_tick[tick][path]) - 1)  # the one write that differs
    one = _as_daemon(src, tmp_path / "one.jsonl", writes=lambda i, _s: per_tick[i])
    r = hv("trace", "replay", one, "--check")
    assert r.exit_code == 1, r.output
    assert r.output.count("differs: ") == 1
    assert "hidvfs: error: 1 write differs from the recording" in r.output


# -- LOW: trace record's --out ---------------------------------------------------------------------


def test_record_keeps_an_earlier_trace_as_prev(tmp_path, tree):
    out = tmp_path / "k.jsonl.gz"
    args = ["trace", "record", "--sysfs-root", tree, "--out", out, "--duration", "0.2"]
    assert hv(*args).exit_code == 0
    first = out.read_bytes()
    r = hv(*args)
    assert r.exit_code == 0, r.output
    prev = tmp_path / "k.prev.jsonl.gz"
    assert prev.read_bytes() == first and read_trace(out).samples
    assert f"the previous {out} is kept as {prev}" in r.output
    # an empty file is written over, and /dev/null stays the device it is
    empty = tmp_path / "e.jsonl"
    empty.write_text("")
    assert hv(*args[:-3], empty, "--duration", "0.2").exit_code == 0
    assert not (tmp_path / "e.prev.jsonl").exists() and read_trace(empty).samples
    assert hv(*args[:-3], "/dev/null", "--duration", "0.2").exit_code == 0
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_record_out_dash_is_refused_not_a_file_named_dash(tmp_path, tree, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = hv("trace", "record", "--sysfs-root", tree, "--out", "-", "--duration", "0.2")
    assert r.exit_code == 2
    assert "--out -: '-' is not stdout here; give --out /dev/stdout" in r.output
    assert not (tmp_path / "-").exists()


def test_replay_refuses_an_empty_policy(tmp_path, tree):
    """An unset variable (`--policy "$P"`) ran the recorded or default policy quietly."""
    r = hv("trace", "replay", _trace(tmp_path, tree), "--policy", "")
    assert r.exit_code == 2
    assert "--policy" in r.output and "empty" in r.output


# -- LOW: trace info ------------------------------------------------------------------------------


def test_info_says_who_recorded_a_trace_and_its_policy(tmp_path, tree):
    plain = _trace(tmp_path, tree)
    daemon_made = _as_daemon(plain, tmp_path / "d.jsonl", policy="schedutil")
    info = json.loads(hv("trace", "info", daemon_made, "--json").stdout)
    assert info["recorded_by"] == "daemon" and info["policy"] == "schedutil"
    text = hv("trace", "info", daemon_made).output
    assert "recorded  by the daemon (daemon --record), policy schedutil" in text
    assert "no writes (a --dry-run)" in text
    info = json.loads(hv("trace", "info", plain, "--json").stdout)
    assert info["recorded_by"] is None and info["policy"] is None
    assert "recorded  by trace record" in hv("trace", "info", plain).output


def test_info_of_a_truncated_trace_says_so_in_text_and_json(tmp_path, tree):
    text = _trace(tmp_path, tree).read_text()
    cut = tmp_path / "cut.jsonl"
    cut.write_text(text[: len(text) - 40])
    r = hv("trace", "info", cut)
    assert r.exit_code == 0
    assert "TRUNCATED line" in r.output and "--allow-truncated" in r.output
    j = hv("trace", "info", cut, "--json")
    assert j.exit_code == 0 and "truncated" in json.loads(j.stdout)["truncated"]
