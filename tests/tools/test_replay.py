"""CI without hardware: record a fake board, replay it through the real control loop, and check
the daemon's decisions."""

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from platforms.clock import VirtualClock
from platforms.faketree import write_fake_tree
from platforms.spec import load_board
from platforms.sysfs import DirSysfs
from platforms.trace import read_trace, record
from tools.cli import cli
from tools.replay import replay_trace


def _record(tmp_path, board="tx2"):
    spec = load_board(board)
    root = tmp_path / "tree"
    writer = write_fake_tree(spec, root)
    temps = iter(range(40, 90, 2))

    def heat(_t):
        zone = next(z for z in spec.zones if z.role == "cpu")
        writer.set_temp(zone.type, float(next(temps, 90)))
        writer.advance_stat(busy=0.9)

    clock = VirtualClock(0.0, on_advance=heat)
    out = tmp_path / "t.jsonl.gz"
    n = record(DirSysfs(root), clock, str(out), period_s=0.1, duration_s=2.0, board=board)
    return out, n, spec


def test_replay_maxfreq_and_powersave_decisions(tmp_path):
    out, n, spec = _record(tmp_path)
    assert n == 20 and len(read_trace(out).samples) == 20
    top = replay_trace(str(out), "maxfreq")
    low = replay_trace(str(out), "powersave")
    for c in spec.clusters:
        sp = f"devices/system/cpu/cpufreq/policy{c.policy}/scaling_setspeed"
        assert (sp, str(c.fmax_khz)) in {(p, v) for _, p, v in top["writes"]}
        assert (sp, str(c.fmin_khz)) in {(p, v) for _, p, v in low["writes"]}
    assert top["ticks"] >= 19
    # Same trace, same policy: the same decisions.
    assert replay_trace(str(out), "maxfreq")["writes"] == top["writes"]


def test_trace_cli_info_and_replay_json(tmp_path):
    out, _, _ = _record(tmp_path)
    runner = CliRunner()
    r = runner.invoke(cli, ["trace", "info", str(out), "--json"])
    assert r.exit_code == 0, r.output
    assert '"board": "tx2"' in r.output
    r = runner.invoke(cli, ["trace", "replay", str(out), "--policy", "schedutil", "--json"])
    assert r.exit_code == 0, r.output


def test_corrupt_trace_is_a_clear_cli_error(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        '{"format": "hidvfs-trace", "version": 9, "board": "tx2", "period_s": 0.1, "started": "x", "files": []}\n'
    )
    r = CliRunner().invoke(cli, ["trace", "info", str(bad)])
    assert r.exit_code == 2 and "line 1" in r.output and "version 9" in r.output


def test_replay_honours_the_config_ceilings(tmp_path):
    """`daemon --replay --config`: the config's static ceilings hold in the replayed writes."""
    from daemon.config import parse_config

    out, _, spec = _record(tmp_path)
    a57 = spec.cluster("a57")
    cap = a57.freqs_khz[5]
    cfg = parse_config({"thermal": {"cap_khz": {"a57": cap}}})
    res = replay_trace(str(out), "maxfreq", config=cfg)
    sp = f"devices/system/cpu/cpufreq/policy{a57.policy}/scaling_setspeed"
    written = {int(v) for _, p, v in res["writes"] if p == sp}
    assert written and max(written) == cap


# -- replay time is trace time ----------------------------------------------------------------


def _shifted(src, dst, dt):
    """A copy of a trace with every sample time moved by ``dt`` (a recorder on a real clock
    stamps its first sample a few microseconds after 0; a cut trace starts later still)."""
    import json

    tr = read_trace(src)
    with open(dst, "w") as f:
        f.write(json.dumps(tr.header.to_json()) + "\n")
        for s in tr.samples:
            f.write(json.dumps({"t": s.t + dt, "r": s.r, "w": s.w}) + "\n")
    return dst


def test_replay_sees_the_first_sample_of_a_trace_that_does_not_start_at_zero(tmp_path):
    """Replay time is trace time: a trace whose samples start after t=0 is read from its first
    sample, so its zones are found and the guard caps the hot recording."""
    out, _, spec = _record(tmp_path)
    base = replay_trace(str(out), "maxfreq")
    assert base["status"]["temp_c"]
    for dt in (3e-6, 100.0):
        res = replay_trace(str(_shifted(out, tmp_path / f"s{dt}.jsonl", dt)), "maxfreq")
        assert res["status"]["temp_c"], f"shift {dt}: no zone seen"
        assert res["status"]["temp_c"] == base["status"]["temp_c"]
        assert [(p, v) for _, p, v in res["writes"]] == [(p, v) for _, p, v in base["writes"]]
    zone = next(z for z in spec.zones if z.role == "cpu")
    assert base["status"]["temp_c"][zone.type] >= 70.0  # the recording heated up to 78 C


def test_a_trace_without_samples_or_with_too_many_ticks_is_refused(tmp_path):
    header = (
        '{"format": "hidvfs-trace", "version": 1, "board": "tx2", "period_s": 0.001, '
        '"started": "2026-01-01T00:00:00+00:00", "files": []}\n'
    )
    empty = tmp_path / "empty.jsonl"
    empty.write_text(header)
    r = CliRunner().invoke(cli, ["trace", "replay", str(empty)])
    assert r.exit_code == 2 and "no samples: nothing to replay" in r.output
    sparse = tmp_path / "sparse.jsonl"
    sparse.write_text(header + '{"t": 0, "r": {}}\n{"t": 1e8, "r": {}}\n')
    r = CliRunner().invoke(cli, ["trace", "replay", str(sparse)])
    assert r.exit_code == 2 and "more than 10000000 ticks" in r.output


def test_a_recording_cut_short_is_shown_and_replays_on_request(tmp_path):
    out, _, _ = _record(tmp_path)
    text = open(_shifted(out, tmp_path / "p.jsonl", 0.0)).read()
    cut = tmp_path / "cut.jsonl"
    cut.write_text(text[: len(text) - 40])  # the last line loses its end
    r = CliRunner().invoke(cli, ["trace", "info", str(cut)])
    assert r.exit_code == 0 and "TRUNCATED" in r.output
    r = CliRunner().invoke(cli, ["trace", "replay", str(cut)])
    assert r.exit_code == 2 and "truncated" in r.output
    assert "replay the complete part with --allow-truncated" in r.output  # the way on
    r = CliRunner().invoke(cli, ["trace", "replay", str(cut), "--allow-truncated"])
    assert r.exit_code == 0 and "cut short" in r.output


def test_trace_record_refuses_a_board_it_does_not_know(tmp_path):
    write_fake_tree(load_board("tx2"), tmp_path / "tree")
    for bad in ("bogus", "../boards/tx2"):
        r = CliRunner().invoke(
            cli,
            [
                "trace",
                "record",
                "--sysfs-root",
                str(tmp_path / "tree"),
                "--out",
                str(tmp_path / "t.jsonl"),
                "--duration",
                "0.1",
                "--board",
                bad,
            ],
        )
        assert r.exit_code == 2 and "not a known board" in r.output
        assert not (tmp_path / "t.jsonl").exists()


# -- the daemon's own recording -----------------------------------------------------------------


def _daemon_recording(tmp_path, policy):
    """The real daemon process on a fake TX2 that heats up while it runs, recording."""
    import subprocess
    import sys
    import threading
    from pathlib import Path

    spec = load_board("tx2")
    tree = tmp_path / "tree"
    writer = write_fake_tree(spec, tree)
    out = tmp_path / "daemon.jsonl.gz"
    state = tmp_path / "state"
    done = threading.Event()

    def heat():
        zone = next(z for z in spec.zones if z.role == "cpu")
        t = 40.0
        while not done.wait(0.05):
            t = min(t + 1.5, 99.0)
            writer.set_temp(zone.type, t)
            writer.advance_stat(0.05, busy=0.8)

    th = threading.Thread(target=heat, daemon=True)
    th.start()
    try:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "tools.cli",
                "daemon",
                "--sysfs-root",
                str(tree),
                "--policy",
                policy,
                "--period-ms",
                "50",
                "--duration",
                "3",
                "--state-dir",
                str(state),
                "--socket",
                str(state / "s.sock"),
                "--record",
                str(out),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=Path(__file__).resolve().parents[2],
        )
    finally:
        done.set()
        th.join()
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


@pytest.mark.parametrize("policy", ["schedutil", "hidvfs"])
def test_replay_of_the_daemons_own_recording_repeats_every_write(tmp_path, policy, caplog):
    """`daemon --record` then `trace replay --check`: the replay ticks at the recorded times
    with the recorded policy and writes exactly what the daemon wrote, while the board heated
    up under it (schedutil's frequency moves with the load, then the guard caps it); another
    policy on the same trace is caught."""
    out = _daemon_recording(tmp_path, policy)
    tr = read_trace(out)
    assert tr.header.extra["recorded_by"] == "daemon" and tr.header.extra["policy"] == policy
    # the decision settings it ran with and its (here no) jobs, for the replay
    assert tr.header.extra["config"]["thermal"] == {"margin_c": 5.0, "cap_khz": {}}
    assert tr.header.extra["records_jobs"] is True and not any(s.j for s in tr.samples)
    written = [(p, v) for s in tr.samples for p, v in s.w.items()]
    if policy == "schedutil":
        assert len({v for p, v in written if p.endswith("policy0/scaling_setspeed")}) >= 2
    # the restore at stop is not a decision: the last sample holds no governor give-back
    assert all(not p.endswith("scaling_governor") or v == "userspace" for p, v in written)
    r = CliRunner().invoke(cli, ["trace", "replay", str(out), "--check"])
    assert r.exit_code == 0, r.output
    res = replay_trace(str(out), None)
    assert res["lockstep"] and res["policy"] == policy and res["ticks"] == len(tr.samples)
    assert res["matching_writes"] == res["recorded_writes"] == len(written)
    assert not res["mismatches"] and res["extra_writes"] == 0
    r = CliRunner().invoke(cli, ["trace", "replay", str(out), "--check", "--policy", "maxfreq"])
    assert r.exit_code == 1 and "differ from the recording" in r.output
    # nothing changed the board behind the daemon: another policy's writes, which the
    # recorded reads do not show, are not taken for drift (they were, and rewritten each tick)
    caplog.clear()
    other = replay_trace(str(out), "maxfreq")
    assert "event=drift" not in caplog.text
    if policy == "schedutil":  # maxfreq writes its setspeed once, then only the guard's caps
        assert len(other["writes"]) < len(tr.samples)


def _lines(path) -> int:
    try:
        return Path(path).read_text().count("\n")
    except OSError:
        return 0


def test_a_recording_where_another_tool_changed_the_daemons_files_replays_its_rewrites(
    tmp_path,
):
    """The daemon checks its writes after each tick and writes a file another tool changed
    (nvpmodel, an administrator) again on the next; the replay did not check, so `--check`
    of such a recording failed, or, checking before a tick, rewrote a tick early. Here the
    governor (which every tick also reads) and a setspeed (which only the check reads) are
    changed behind the running daemon."""
    from platforms import paths

    spec = load_board("tx2")
    tree = tmp_path / "tree"
    write_fake_tree(spec, tree)
    out, state = tmp_path / "d.jsonl", tmp_path / "state"
    fs = DirSysfs(tree)

    def meddle():
        for n, path, value in (
            (6, paths.policy_file(0, "scaling_governor"), "schedutil"),
            (14, paths.policy_file(1, "scaling_setspeed"), "652800"),
            (22, paths.policy_file(0, "scaling_governor"), "performance"),
        ):
            t_end = time.monotonic() + 60
            while _lines(out) < n and time.monotonic() < t_end:
                time.sleep(0.005)
            fs.write(path, value)

    th = threading.Thread(target=meddle, daemon=True)
    th.start()
    proc = subprocess.run(
        [
            sys.executable, "-m", "tools.cli", "daemon", "--sysfs-root", str(tree),
            "--policy", "schedutil", "--period-ms", "50", "--duration", "2.5",
            "--state-dir", str(state), "--socket", str(state / "s.sock"), "--record", str(out),
        ],
        capture_output=True, text=True, timeout=120, cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    th.join(timeout=5)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stderr.count("event=drift") == 3, proc.stderr[-3000:]
    tr = read_trace(out)
    assert tr.header.extra["records_rechecks"] is True
    gov0 = paths.policy_file(0, "scaling_governor")
    # taken at the start, then again after each of the three (a drift re-establishes the mode)
    assert sum(1 for s in tr.samples if s.w.get(gov0) == "userspace") == 4
    r = CliRunner().invoke(cli, ["trace", "replay", str(out), "--check"])
    assert r.exit_code == 0, r.output
    res = replay_trace(str(out), None)
    assert res["matching_writes"] == res["recorded_writes"] and res["extra_writes"] == 0


def test_check_needs_a_recording_with_writes(tmp_path):
    out, _, _ = _record(tmp_path)
    r = CliRunner().invoke(cli, ["trace", "replay", str(out), "--check"])
    assert r.exit_code == 2 and "daemon --record" in r.output


def test_matching_writes_counts_recorded_writes_repeated_not_replayed_ones(tmp_path):
    """4 recorded writes that the replay repeats, among many more replayed: 4 identical."""
    import json

    out, _, spec = _record(tmp_path)
    first = replay_trace(str(out), "maxfreq")
    t0 = read_trace(out).samples[0].t
    keep = [(t, p, v) for t, p, v in first["writes"] if abs(t - t0) < 1e-9][:4]
    assert len(keep) == 4 and len(first["writes"]) > 4
    tr = read_trace(out)
    dst = tmp_path / "w.jsonl"
    with open(dst, "w") as f:
        f.write(json.dumps(tr.header.to_json()) + "\n")
        for i, s in enumerate(tr.samples):
            w = {p: v for _, p, v in keep} if i == 0 else {}
            f.write(json.dumps({"t": s.t, "r": s.r, "w": w}) + "\n")
    res = replay_trace(str(dst), "maxfreq")
    assert res["recorded_writes"] == 4 and res["matching_writes"] == 4
    assert res["extra_writes"] == len(res["mismatches"]) > 0


def test_a_refused_start_leaves_an_earlier_recording_alone(tmp_path):
    write_fake_tree(load_board("tx2"), tmp_path / "tree")
    rec = tmp_path / "rec.jsonl"
    rec.write_text("an earlier recording\n")
    r = CliRunner().invoke(
        cli,
        [
            "daemon",
            "--sysfs-root",
            str(tmp_path / "tree"),
            "--policy",
            "nosuch",
            "--duration",
            "1",
            "--state-dir",
            str(tmp_path / "st"),
            "--socket",
            str(tmp_path / "st" / "s.sock"),
            "--record",
            str(rec),
        ],
    )
    assert r.exit_code != 0 and "nosuch" in r.output
    assert rec.read_text() == "an earlier recording\n"


def _signalled(args: list[str], sig: signal.Signals, ready) -> tuple[int, str, str]:
    """Run ``hidvfs ARGS``, send ``sig`` once ``ready(proc)`` holds; (rc, stdout, stderr)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tools.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        end = time.monotonic() + 60
        while not ready(proc):
            assert proc.poll() is None and time.monotonic() < end, proc.stderr.read()
            time.sleep(0.05)
        proc.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, stdout, stderr


@pytest.mark.parametrize(
    "sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=lambda s: s.name
)
def test_a_signal_ends_trace_record_with_a_complete_replayable_trace(tmp_path, sig):
    """`trace record` killed, interrupted or hung up: the .gz gets its trailer (a SIGTERM's
    default left a stream that replay refuses as cut short), it says what it recorded and
    exits 0, and the trace replays without --allow-truncated."""
    write_fake_tree(load_board("tx2"), tmp_path / "tree")
    out = tmp_path / "t.jsonl.gz"
    args = ["trace", "record", "--sysfs-root", str(tmp_path / "tree"), "--out", str(out)]
    rc, stdout, stderr = _signalled(
        args + ["--period-ms", "50", "--duration", "600"],
        sig,
        lambda _: out.exists() and out.stat().st_size >= 2000,  # a few samples are in
    )
    assert rc == 0, stderr
    n = len(read_trace(out).samples)
    assert n >= 1
    assert f"recorded {n} samples of board tx2 to {out} (stopped by {sig.name} after" in stdout
    r = CliRunner().invoke(cli, ["trace", "replay", str(out)])
    assert r.exit_code == 0, r.output
    assert f"replayed {n} ticks of tx2" in r.output and "cut short" not in r.output


def test_a_set_stop_event_ends_the_replay_before_its_first_tick(tmp_path):
    out, _, _ = _record(tmp_path)
    stop = threading.Event()
    stop.set()
    r = replay_trace(str(out), "maxfreq", stop=stop)
    assert r["stopped"] and r["ticks"] == 0
    assert not replay_trace(str(out), "maxfreq")["stopped"]


def _catches(pid: int, sig: signal.Signals) -> bool:
    """Has process ``pid`` installed a handler for ``sig`` (SigCgt in /proc/PID/status)?"""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_a_signal_stops_daemon_replay_with_its_summary_and_exit_0(tmp_path, sig):
    """As `daemon --sim`: a kill or a closed terminal ends a long replay with the summary of
    what ran (it used to die by the signal's default)."""
    spec = load_board("tx2")
    write_fake_tree(spec, tmp_path / "tree")
    out = tmp_path / "long.jsonl.gz"
    record(
        DirSysfs(tmp_path / "tree"),
        VirtualClock(0.0),
        str(out),
        period_s=1.0,
        duration_s=600.0,
        board="tx2",
    )
    rc, stdout, stderr = _signalled(
        ["daemon", "--replay", str(out), "--period-ms", "1", "--json"],
        sig,
        lambda proc: _catches(proc.pid, signal.SIGTERM),  # the handlers are in: replay runs
    )
    assert rc == 0, stderr
    assert f"hidvfs: {sig.name}: replay stopped at t=" in stderr
    assert json.loads(stdout)["board"] == "tx2"


def test_record_refuses_a_board_the_tree_is_not(tmp_path):
    write_fake_tree(load_board("tx2"), tmp_path / "tree")
    out = tmp_path / "t.jsonl"
    args = ["trace", "record", "--sysfs-root", str(tmp_path / "tree"), "--out", str(out)]
    r = CliRunner().invoke(cli, [*args, "--board", "orin-nx", "--duration", "0.2"])
    assert r.exit_code == 2 and "detected as 'tx2'" in r.output, r.output
    assert not out.exists()
