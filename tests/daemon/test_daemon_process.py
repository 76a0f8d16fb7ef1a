"""The real daemon process against a fake tree: start, register a job over the socket, see the
writes, SIGTERM and find every file back; kill -9, restart, and the stale snapshot is restored
first. Bad inputs give a clear log line and no crash."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from daemon.client import RegistryClient
from platforms import paths
from platforms.faketree import write_fake_tree
from platforms.spec import load_board

POLICY_FILES = ("scaling_governor", "scaling_min_freq", "scaling_max_freq", "scaling_setspeed")


def read_settled(p: Path) -> str:
    """The file's value. A running daemon rewrites a plain file by truncating it first (sysfs
    swaps the value at once), so an empty read is a write in flight: read again."""
    for _ in range(200):
        text = p.read_text().strip()
        if text:
            return text
        time.sleep(0.005)
    return text


def tree_state(root: Path, spec) -> dict[str, str]:
    """Every restorable value. setspeed only counts under userspace: a plain folder cannot turn
    it back into '<unsupported>' the way the kernel does when the governor changes."""
    out = {}
    for c in spec.clusters:
        gov = read_settled(root / paths.policy_file(c.policy, "scaling_governor"))
        for name in POLICY_FILES:
            p = root / paths.policy_file(c.policy, name)
            if name == "scaling_setspeed" and gov != "userspace":
                continue
            if p.exists():
                out[str(p.relative_to(root))] = read_settled(p)
    for cpu in spec.cpus:
        p = root / paths.cpu_online(cpu)
        if p.exists():
            out[str(p.relative_to(root))] = read_settled(p)
    return out


#: every daemon :func:`start_daemon` started: the session's conftest kills any still
#: running once its test is over, whichever module started it
STARTED: list[subprocess.Popen] = []


def start_daemon(
    tree: Path,
    state: Path,
    *extra: str,
    policy: str = "maxfreq",
    period_ms: int = 50,
    status_file: bool = True,
) -> tuple[subprocess.Popen, Path]:
    """The real daemon process on ``tree`` (its log in ``state``), as a board would run it."""
    log = state / f"daemon-{time.monotonic_ns()}.log"
    cmd = [
        sys.executable,
        "-m",
        "tools.cli",
        "daemon",
        "--sysfs-root",
        str(tree),
        "--policy",
        policy,
        "--period-ms",
        str(period_ms),
        "--state-dir",
        str(state),
        "--socket",
        str(state / "hidvfs.sock"),
        *(["--status-file", str(state / "status.json")] if status_file else []),
        *extra,
    ]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=open(log, "w"),
        env=env,
        cwd=Path(__file__).resolve().parents[2],
    )
    STARTED.append(proc)
    return proc, log


def second_daemon(tree: Path, state: Path, sock: Path) -> subprocess.CompletedProcess:
    """A second daemon started on ``tree`` (powersave, 1 s) while one runs: its result."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "tools.cli",
            "daemon",
            "--sysfs-root",
            str(tree),
            "--policy",
            "powersave",
            "--duration",
            "1",
            "--state-dir",
            str(state),
            "--socket",
            str(sock),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
    )


def wait_for(cond, timeout=20.0, what="condition"):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def wait_serving(sock: Path) -> RegistryClient:
    """A client of the daemon's registry, once the socket answers."""
    client = RegistryClient(str(sock))

    def serving():
        try:
            client.status()
            return True
        except Exception:  # noqa: BLE001 - not listening yet
            return False

    wait_for(serving, what="the registry socket")
    return client


@pytest.fixture
def board(tmp_path):
    spec = load_board("tx2")
    tree = tmp_path / "tree"
    write_fake_tree(spec, tree)
    state = tmp_path / "state"
    state.mkdir()
    return spec, tree, state


def test_start_register_write_sigterm_restores_everything(board):
    spec, tree, state = board
    original = tree_state(tree, spec)
    proc, log = start_daemon(tree, state)
    try:
        sock = state / "hidvfs.sock"
        client = wait_serving(sock)
        job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        answer = client.register(job.pid, deadline_s=5.0, criticality="hi", name="sleeper")
        assert answer.get("ok", True)
        # maxfreq: userspace governor and the table maximum on every policy.
        gov = tree / paths.policy_file(0, "scaling_governor")
        wait_for(lambda: gov.read_text().strip() == "userspace", what="the userspace governor")
        setspeed = tree / paths.policy_file(0, "scaling_setspeed")
        wait_for(
            lambda: setspeed.read_text().strip() == str(spec.clusters[0].fmax_khz), what="setspeed"
        )
        status = client.status()
        assert status["board"] == "tx2" and any(j["pid"] == job.pid for j in status["jobs"])
        assert (state / "restore.json").exists()
        # A malformed request is answered with an error and the daemon keeps serving.
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(str(sock))
            s.sendall(b"{not json\n")
            reply = json.loads(s.makefile().readline())
        assert reply["ok"] is False and reply["error"]
        # The job vanishes: the daemon notices and carries on.
        job.kill()
        job.wait()
        wait_for(lambda: client.status()["jobs_done"] >= 1, what="the job to be noticed as done")
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, log.read_text()
    assert tree_state(tree, spec) == original
    assert not (state / "restore.json").exists()
    text = log.read_text()
    assert "event=restored" in text and "ok=true" in text


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGHUP])
def test_interrupt_or_hangup_stops_and_restores(board, sig):
    """Ctrl-C or a closed terminal: the daemon stops as on SIGTERM, the board gets its
    settings back (SIGHUP's default would kill it with nothing restored)."""
    spec, tree, state = board
    original = tree_state(tree, spec)
    proc, log = start_daemon(tree, state)
    gov = tree / paths.policy_file(0, "scaling_governor")
    wait_for(lambda: gov.read_text().strip() == "userspace", what="the first write")
    proc.send_signal(sig)
    proc.communicate(timeout=30)
    assert proc.returncode == 0, log.read_text()
    assert tree_state(tree, spec) == original
    assert f"signal={sig.name}" in log.read_text()


def crash_after_first_write(tree: Path, state: Path) -> None:
    """Start the daemon, wait for its first write, SIGKILL it (nothing restored)."""
    proc, _log = start_daemon(tree, state)
    gov = tree / paths.policy_file(0, "scaling_governor")
    wait_for(lambda: gov.read_text().strip() == "userspace", what="the first write")
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)


def test_kill9_then_restart_restores_old_snapshot_first(board):
    spec, tree, state = board
    original = tree_state(tree, spec)
    crash_after_first_write(tree, state)
    assert tree_state(tree, spec) != original  # the crash left our settings behind
    assert (state / "restore.json").exists()
    proc2, log2 = start_daemon(tree, state, "--duration", "0.5")
    proc2.communicate(timeout=60)
    assert proc2.returncode == 0, log2.read_text()
    text = log2.read_text()
    assert text.index("stale") < text.index("event=snapshot_saved")
    assert tree_state(tree, spec) == original


@pytest.mark.parametrize("why", ["config typo", "file gone"])
def test_a_restart_that_is_refused_still_restores_the_crashed_runs_snapshot(board, why):
    """After a crash the next start may refuse (a config typo, a file the crash left
    missing); it puts the dead run's snapshot back first, or under Restart=on-failure the
    board would keep the dead run's settings for good. The file that goes missing is one
    the dead run wrote (its governor): the snapshot gives back only those."""
    spec, tree, state = board
    original = tree_state(tree, spec)
    crash_after_first_write(tree, state)
    assert tree_state(tree, spec) != original
    extra: tuple[str, ...] = ("--duration", "0.5")
    gone = tree / paths.policy_file(0, "scaling_governor")
    if why == "config typo":
        cfg = state / "bad.yaml"
        cfg.write_text("perod_ms: 100\n")
        extra += ("--config", str(cfg))
    else:
        kept = gone.read_text()
        gone.unlink()
    proc2, log2 = start_daemon(tree, state, *extra)
    _, err = proc2.communicate(timeout=60)
    assert proc2.returncode != 0
    text = log2.read_text()
    assert "perod_ms" in text if why == "config typo" else "scaling_governor" in text
    if why == "file gone":
        gone.write_text(kept)
        assert (state / "restore.json").exists()  # partly restored: the originals are kept
        original.pop(str(gone.relative_to(tree)))
        now = tree_state(tree, spec)
        now.pop(str(gone.relative_to(tree)))
        # the governor put back by hand reads userspace, which shows its setspeed file
        now.pop(paths.policy_file(0, "scaling_setspeed"), None)
        assert now == original
    else:
        assert tree_state(tree, spec) == original
        assert not (state / "restore.json").exists()


def test_a_second_daemon_on_the_same_state_dir_is_refused_before_touching_anything(board):
    spec, tree, state = board
    original = tree_state(tree, spec)
    proc, log = start_daemon(tree, state, policy="maxfreq")
    try:

        def pinned():  # the first daemon's first tick has written every cluster
            return all(
                (tree / paths.policy_file(c.policy, "scaling_governor")).read_text().strip()
                == "userspace"
                and (tree / paths.policy_file(c.policy, "scaling_setspeed")).read_text().strip()
                == str(c.freqs_khz[-1])
                for c in spec.clusters
            )

        wait_for(pinned, what="the first daemon")
        held = tree_state(tree, spec)
        snap = (state / "restore.json").read_text()
        second = second_daemon(tree, state, state / "other.sock")
        assert second.returncode == 2
        assert f"another hidvfs daemon (pid {proc.pid}) is running" in second.stderr
        assert (state / "restore.json").read_text() == snap  # the first one's originals
        assert tree_state(tree, spec) == held
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    assert proc.returncode == 0, log.read_text()
    assert tree_state(tree, spec) == original


def test_a_second_daemon_on_the_same_board_with_its_own_state_dir_is_refused(board, tmp_path):
    """Two daemons with their own state dirs would undo each other on one board (the second
    saves the first's settings as its originals): the board itself is locked."""
    spec, tree, state = board
    original = tree_state(tree, spec)
    proc, log = start_daemon(tree, state, "--duration", "20")
    try:
        top = {
            tree / paths.policy_file(c.policy, "scaling_setspeed"): str(c.freqs_khz[-1])
            for c in spec.clusters
            if (tree / paths.policy_dir(c.policy)).exists()
        }
        # every policy pinned at its top (maxfreq): nothing moves after this
        wait_for(
            lambda: all(p.read_text().strip() == khz for p, khz in top.items()),
            what="every policy's first writes",
        )
        held = tree_state(tree, spec)
        other = tmp_path / "other-state"
        second = second_daemon(tree, other, other / "s.sock")
        assert second.returncode == 2, second.stderr
        assert f"another hidvfs daemon is controlling {tree}" in second.stderr
        assert not (other / "restore.json").exists()
        assert tree_state(tree, spec) == held
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    assert proc.returncode == 0, log.read_text()
    assert tree_state(tree, spec) == original


def test_rt_throttling_raises_the_planning_margin_and_says_so(board):
    spec, tree, state = board
    proc, log = start_daemon(tree, state, "--duration", "0.3")  # the kernel's 95 %: no change
    proc.communicate(timeout=60)
    assert proc.returncode == 0, log.read_text()
    status = json.loads((state / "status.json").read_text())
    assert status["deadline_margin"] == 0.05  # the shipped deadline_slack
    assert "event=rt_throttling" not in log.read_text()
    (tree / paths.RT_RUNTIME).write_text("800000\n")  # RT threads get 80 % of each second
    proc, log = start_daemon(tree, state, "--duration", "0.3")
    proc.communicate(timeout=60)
    assert proc.returncode == 0, log.read_text()
    status = json.loads((state / "status.json").read_text())
    assert status["deadline_margin"] == pytest.approx(0.2)
    text = log.read_text()
    assert "event=rt_throttling" in text and "sched_rt_runtime_us=-1" in text


def test_a_setting_whose_original_cannot_be_read_is_never_taken(board):
    """An original that reads empty (EAGAIN, ENODATA) could never be given back: the start is
    refused, naming the file, before any write."""
    spec, tree, state = board
    (tree / paths.policy_file(0, "scaling_governor")).write_text("")
    original = tree_state(tree, spec)
    proc, log = start_daemon(tree, state, "--duration", "0.5")
    _, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2
    text = log.read_text()
    assert "cannot read the original value of devices/system/cpu/cpufreq/policy0/" in text
    assert tree_state(tree, spec) == original
    assert not (state / "restore.json").exists()


def test_a_restore_that_fails_at_stop_exits_non_zero_and_keeps_the_originals(board):
    """systemd must see a failed give-back (Restart=on-failure retries it at the next start);
    the snapshot stays for that start."""
    spec, tree, state = board
    proc, log = start_daemon(tree, state, "--duration", "3")
    gov = tree / paths.policy_file(1, "scaling_governor")
    wait_for(lambda: gov.read_text().strip() == "userspace", what="the first write")
    gone = tree / paths.policy_file(0, "scaling_governor")
    gone.unlink()
    proc.communicate(timeout=60)
    assert proc.returncode != 0
    text = log.read_text()
    assert "could not give back devices/system/cpu/cpufreq/policy0/scaling_governor" in text
    assert "event=restored level=error" in text
    assert (state / "restore.json").exists()


def test_a_status_file_that_cannot_be_written_is_refused_at_start_and_warned_of_mid_run(
    board, tmp_path
):
    spec, tree, state = board
    original = tree_state(tree, spec)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    proc, log = start_daemon(
        tree,
        state,
        "--duration",
        "0.5",
        "--status-file",
        str(blocker / "s.json"),
        status_file=False,
    )
    proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert f"--status-file {blocker / 's.json'}: its folder {blocker} cannot be made" in (
        log.read_text()
    )
    assert tree_state(tree, spec) == original and not (state / "restore.json").exists()
    folder = tmp_path / "status"
    proc, log = start_daemon(
        tree,
        state,
        "--duration",
        "2.5",
        "--status-file",
        str(folder / "s.json"),
        status_file=False,
    )
    wait_for(lambda: (folder / "s.json").exists(), what="the first status")
    shutil.rmtree(folder)
    folder.write_text("")  # the folder is now a file: every later write fails
    proc.communicate(timeout=60)
    assert proc.returncode == 0, log.read_text()
    assert log.read_text().count("event=status_file_unwritable") == 1  # once, not per write
    assert tree_state(tree, spec) == original


def test_a_crash_then_a_config_with_an_error_still_restores_to_its_state_dir(board, tmp_path):
    """The state dir named in a config that fails to load for another key is still where the
    crashed run's snapshot is looked for."""
    spec, tree, _ = board
    state = tmp_path / "from-config"
    good = tmp_path / "good.yaml"
    good.write_text(f"state_dir: {state}\n")
    original = tree_state(tree, spec)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tools.cli",
            "daemon",
            "--sysfs-root",
            str(tree),
            "--config",
            str(good),
            "--policy",
            "maxfreq",
            "--socket",
            str(tmp_path / "s.sock"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=Path(__file__).resolve().parents[2],
    )
    gov = tree / paths.policy_file(0, "scaling_governor")
    wait_for(lambda: gov.read_text().strip() == "userspace", what="the first write")
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    assert tree_state(tree, spec) != original
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"state_dir: {state}\npolcy: maxfreq\n")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "tools.cli",
            "daemon",
            "--sysfs-root",
            str(tree),
            "--config",
            str(bad),
            "--duration",
            "0.5",
            "--socket",
            str(tmp_path / "s.sock"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert r.returncode == 2 and "polcy" in r.stderr, r.stderr
    assert tree_state(tree, spec) == original
    assert not (state / "restore.json").exists()


def test_missing_file_and_eagain_zone_are_logged_not_fatal(board):
    spec, tree, state = board
    (tree / paths.zone_file(0, "temp")).unlink()  # BCPU-therm vanishes
    proc, log = start_daemon(tree, state, "--duration", "1")
    proc.communicate(timeout=60)
    assert proc.returncode == 0, log.read_text()
    status = json.loads((state / "status.json").read_text())
    assert any("thermal_zone0/temp" in u for u in status["unavailable"])
    assert "BCPU-therm" not in status["temp_c"]  # unavailable, never 0


def test_read_only_tree_is_refused_with_a_clear_message(board, monkeypatch):
    import daemon.service
    from daemon.service import DaemonError, run_live

    monkeypatch.setattr(daemon.service, "setup_logging", lambda *a, **k: None)  # keep pytest's

    spec, tree, state = board
    real_access = os.access
    monkeypatch.setattr(
        os,
        "access",
        lambda p, m, *a, **k: (
            False if str(p).startswith(str(tree)) and m == os.W_OK else real_access(p, m, *a, **k)
        ),
    )
    with pytest.raises(DaemonError, match="read-only tree"):
        run_live(
            sysfs_root=str(tree),
            policy="maxfreq",
            state_dir=str(state),
            duration_s=0.2,
            socket_path=str(state / "s.sock"),
        )
    assert not (state / "restore.json").exists()  # nothing was touched


def test_dry_run_prints_writes_and_changes_nothing(board):
    spec, tree, state = board
    original = tree_state(tree, spec)
    proc, log = start_daemon(tree, state, "--duration", "0.5", "--dry-run")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, log.read_text()
    assert b"dry-run: would write" in out and b"scaling_setspeed" in out
    assert tree_state(tree, spec) == original


def test_hidvfs_run_launches_registers_and_reports_makespan(board):
    spec, tree, state = board
    proc, log = start_daemon(tree, state)
    sock = state / "hidvfs.sock"
    try:
        client = RegistryClient(str(sock))

        def serving():
            try:
                client.status()
                return True
            except Exception:  # noqa: BLE001
                return False

        wait_for(serving, what="the registry socket")
        cmd = [
            sys.executable,
            "-m",
            "tools.cli",
            "run",
            "--deadline",
            "10",
            "--criticality",
            "hi",
            "--socket",
            str(sock),
            "--json",
            "--",
            sys.executable,
            "-c",
            "import time; time.sleep(0.3)",
        ]
        out = subprocess.run(
            cmd, capture_output=True, text=True, timeout=60, cwd=Path(__file__).resolve().parents[2]
        )
        assert out.returncode == 0, out.stderr
        # stdout is the command's alone: the --json result is the end of stderr (after the
        # warning that the job has no profile)
        assert out.stdout == ""
        result = json.loads(out.stderr[out.stderr.index("{\n") :])
        assert 0.3 <= result["makespan_s"] < 10 and result["deadline_met"] is True
        # A failing command's exit status is passed through, and the daemon, told how it
        # ended, counts it as failed: not a deadline met (it was, by time), nor missed.
        bad = subprocess.run(
            cmd[:-3] + [sys.executable, "-c", "import time; time.sleep(0.3); raise SystemExit(3)"],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=Path(__file__).resolve().parents[2],
        )
        assert bad.returncode == 3
        assert json.loads(bad.stderr[bad.stderr.index("{\n") :])["deadline_met"] is None
        status = client.status()
        assert status["jobs_failed"] == {"hi": 1, "lo": 0}, status
        assert status["deadline_misses"] == {"hi": 0, "lo": 0} and status["jobs_done"] == 2
        wait_for(
            lambda: 'deadline_met=null failed="exit 3"' in log.read_text(),
            what="the failed job's job_done line",
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    assert proc.returncode == 0


def test_hidvfs_run_without_a_daemon_is_a_clear_error(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "tools.cli",
            "run",
            "--socket",
            str(tmp_path / "none.sock"),
            "--",
            "true",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert out.returncode == 2 and "cannot reach the hidvfs daemon" in out.stderr


def test_settings_changed_behind_its_back_are_logged(board):
    spec, tree, state = board
    proc, log = start_daemon(tree, state)
    gov = tree / paths.policy_file(0, "scaling_governor")
    try:
        wait_for(lambda: gov.read_text().strip() == "userspace", what="the first write")
        gov.write_text("performance\n")  # another tool (nvpmodel, jetson_clocks) steps in
        wait_for(lambda: "event=drift" in log.read_text(), what="the drift log line")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert "policy0/scaling_governor" in log.read_text()


def test_not_root_on_the_live_tree_is_refused(monkeypatch):
    import daemon.service
    from daemon.service import DaemonError, run_live

    monkeypatch.setattr(daemon.service, "setup_logging", lambda *a, **k: None)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(DaemonError, match="must run as root"):
        run_live(sysfs_root="/", policy="maxfreq", duration_s=0.1)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 usable CPUs")
def test_after_a_crash_the_next_start_gives_jobs_their_own_settings_back(board):
    """A job the crashed daemon pinned would keep that pin for good: its originals are in
    the state dir while it runs, and the next start puts them back."""
    spec, tree, state = board
    proc, log = start_daemon(tree, state, policy="powersave")
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        before = os.sched_getaffinity(job.pid)
        client = wait_serving(state / "hidvfs.sock")
        client.register(job.pid, deadline_s=30.0, criticality="hi", name="pinned")
        wait_for(lambda: os.sched_getaffinity(job.pid) != before, what="the job to be placed")
        wait_for(lambda: (state / "jobs.json").exists(), what="the job originals on disk")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        assert os.sched_getaffinity(job.pid) != before  # the crash left it pinned
        proc2, log2 = start_daemon(tree, state, "--duration", "0.5")
        proc2.communicate(timeout=60)
        assert proc2.returncode == 0, log2.read_text()
        assert os.sched_getaffinity(job.pid) == before
        line = next(ln for ln in log2.read_text().splitlines() if "event=jobs_restored" in ln)
        assert "count=1" in line
        assert not (state / "jobs.json").exists()
    finally:
        job.kill()
        job.wait()
        if proc.poll() is None:
            proc.kill()


def test_a_board_whose_only_cpufreq_policy_is_policy0_is_controlled(tmp_path):
    """TX2 in its default power mode (Denver off) has policy0 alone: the policy number 0
    must not read as "no policy"."""
    spec = load_board("tx2")
    tree = tmp_path / "tree"
    write_fake_tree(spec, tree, mode="default")
    assert sorted(p.name for p in (tree / "devices/system/cpu/cpufreq").iterdir()) == ["policy0"]
    state = tmp_path / "state"
    state.mkdir()
    gov = tree / paths.policy_file(0, "scaling_governor")
    before = gov.read_text().strip()
    proc, log = start_daemon(tree, state, "--duration", "1.5")
    proc.communicate(timeout=60)
    assert proc.returncode == 0, log.read_text()
    assert "event=restored" in log.read_text()
    assert gov.read_text().strip() == before


@pytest.mark.parametrize(
    "why, expected",
    [
        ("no cpufreq policy", "no cpufreq policy found under"),
        ("config typo", "perod_ms"),
        ("malformed config", "line 2, column 1: not valid YAML"),
        ("unknown board", "key 'board'"),
        ("unknown policy", "unknown policy 'nosuch'"),
        ("thermal cap on no cluster", "key 'thermal.cap_khz.bogus'"),
        ("token file missing", "key 'metrics.token_file'"),
        ("listen host that does not resolve", "host 'board.invalid' does not resolve"),
    ],
)
def test_a_start_refused_by_a_check_creates_no_state_dir(tmp_path, why, expected):
    """A check that needs no lock refuses before the state dir (and its lock file) exist: on a
    machine without cpufreq, `hidvfs daemon` must not leave /var/lib/hidvfs behind."""
    tree = tmp_path / "tree"
    if why == "no cpufreq policy":
        tree.mkdir()
    else:
        write_fake_tree(load_board("tx2"), tree)
    state = tmp_path / "new" / "state"
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        {
            "config typo": "perod_ms: 100\n",
            "malformed config": "policy: [a,\n\tb]\n",
            "unknown board": "board: nosuch\n",
            "thermal cap on no cluster": "thermal:\n  cap_khz: {bogus: 1000000}\n",
            "token file missing": "metrics:\n  enabled: true\n"
            f"  token_file: {tmp_path / 'no-token'}\n",
            "listen host that does not resolve": "telemetry:\n  listen: board.invalid:19135\n"
            "  token: s3cr3t-token-for-the-test-0123456789\n",
        }.get(why, "")
    )
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "tools.cli",
            "daemon",
            "--sysfs-root",
            str(tree),
            "--config",
            str(cfg),
            "--policy",
            "nosuch" if why == "unknown policy" else "maxfreq",
            "--duration",
            "1",
            "--state-dir",
            str(state),
            "--socket",
            str(tmp_path / "s.sock"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert r.returncode == 2 and expected in r.stderr, r.stderr
    assert not (tmp_path / "new").exists()


def test_a_read_only_tree_is_refused_before_the_state_dir_is_made(board, monkeypatch):
    import daemon.service
    from daemon.service import DaemonError, run_live

    monkeypatch.setattr(daemon.service, "setup_logging", lambda *a, **k: None)
    spec, tree, _state = board
    real_access = os.access
    monkeypatch.setattr(
        os,
        "access",
        lambda p, m, *a, **k: (
            False if str(p).startswith(str(tree)) and m == os.W_OK else real_access(p, m, *a, **k)
        ),
    )
    state = tree.parent / "fresh-state"
    with pytest.raises(DaemonError, match="read-only tree"):
        run_live(
            sysfs_root=str(tree),
            policy="maxfreq",
            state_dir=str(state),
            duration_s=0.2,
            socket_path=str(tree.parent / "s.sock"),
        )
    assert not state.exists()


def test_job_originals_left_by_a_crash_are_restored_before_a_refusal(board, monkeypatch):
    """jobs.json alone (a crash with no cpufreq snapshot left) also means: lock and restore
    first, then the checks that may refuse."""
    import daemon.service
    from daemon.service import run_live
    from platforms.errors import HidvfsError

    monkeypatch.setattr(daemon.service, "setup_logging", lambda *a, **k: None)
    spec, tree, state = board
    (state / "jobs.json").write_text('{"format": "hidvfs-job-originals", "version": 1, "jobs": []}')
    bad = state / "bad.yaml"
    bad.write_text("perod_ms: 100\n")
    with pytest.raises(HidvfsError, match="perod_ms"):
        run_live(config_path=str(bad), sysfs_root=str(tree), state_dir=str(state))
    assert not (state / "jobs.json").exists()  # restored (nothing to do) and removed


def _read_only(tree, *names):
    """The tree as the daemon sees it when ``names`` of every policy cannot be written."""
    from platforms.sysfs import DirSysfs

    class ReadOnly(DirSysfs):
        def writable(self, path: str) -> bool:
            return path.rsplit("/", 1)[-1] not in names and super().writable(path)

    return ReadOnly(tree)


@pytest.mark.parametrize(
    "names",
    [("scaling_governor",), ("scaling_min_freq", "scaling_max_freq"), ("scaling_setspeed",)],
)
def test_one_way_of_setting_a_frequency_is_enough_to_start(board, names):
    """min = max pins never write the governor, the userspace governor never writes the
    limits: a policy needs the files of one of them (both used to be required)."""
    from daemon.service import check_writable

    spec, tree, _ = board
    check_writable(_read_only(tree, *names), spec)  # no DaemonError


def test_a_policy_no_way_can_drive_is_refused_naming_why(board, monkeypatch):
    """Read-only limits with no userspace governor (or its setspeed read-only) is refused;
    the hint fits who runs it: root is not told to run as root."""
    from daemon.service import DaemonError, check_writable

    spec, tree, _ = board
    for c in spec.clusters:
        f = tree / paths.policy_file(c.policy, "scaling_available_governors")
        f.write_text(" ".join(g for g in f.read_text().split() if g != "userspace") + "\n")
    ro = _read_only(tree, "scaling_min_freq", "scaling_max_freq")
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    with pytest.raises(DaemonError, match="no userspace governor") as err:
        check_writable(ro, spec)
    assert "read-only tree: root cannot write them either" in str(err.value)
    assert "run as root" not in str(err.value)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    ro = _read_only(tree, "scaling_min_freq", "scaling_max_freq", "scaling_setspeed")
    with pytest.raises(DaemonError, match="scaling_setspeed read-only.*run as root"):
        check_writable(ro, spec)


# -- what nvpmodel changes during a run (boards.md 1.1, 5.1) ---------------------------------


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM and wait: the daemon gives the tree back and exits 0. A test that fails before
    it still ends the daemon (``finally``), or it would run on with no --duration."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    assert proc.returncode == 0


def test_a_policy_that_comes_online_mid_run_gets_its_originals_back(tmp_path):
    """TX2 in its default mode starts with Denver offline (no policy1); `nvpmodel -m 0`
    brings it online while hidvfs runs. Its originals are saved before the daemon's first
    write to it, and given back at the stop (it was left on userspace, pinned)."""
    spec = load_board("tx2")
    tree, state = tmp_path / "tree", tmp_path / "state"
    state.mkdir()
    fake = write_fake_tree(spec, tree, mode="default")
    assert not (tree / paths.policy_dir(1)).exists()
    proc, log = start_daemon(tree, state, policy="maxfreq")
    gov1 = tree / paths.policy_file(1, "scaling_governor")
    try:
        gov0 = tree / paths.policy_file(0, "scaling_governor")
        wait_for(lambda: read_settled(gov0) == "userspace", what="the first write")
        # the governor the kernel gives a policy that comes online (read from the tree after
        # the hotplug, it raced the daemon's first write there on a busy machine)
        original = spec.cluster_of_cpu(1).default_governor
        assert original != "userspace"
        for cpu in (1, 2):
            fake.set_cpu_online(cpu, True)
        wait_for(lambda: read_settled(gov1) == "userspace", what="policy1 taken")
        saved = json.loads((state / "restore.json").read_text())
        p1 = next(p for p in saved["policies"] if p["policy"] == 1)
        assert p1["governor"] == original and "scaling_governor" in p1["touched"]
    finally:
        _stop(proc)
    assert read_settled(gov1) == original
    assert any(
        "event=snapshot_extended" in line and "policy=1" in line
        for line in log.read_text().splitlines()
    )


def test_what_nvpmodel_changes_mid_run_is_left_as_it_made_it(board):
    """A lower ceiling (a max the daemon never wrote: it drives setspeed) and cores taken
    offline during the run are nvpmodel's: the stop gives back only the daemon's writes."""
    spec, tree, state = board
    proc, log = start_daemon(tree, state, policy="maxfreq")
    gov0 = tree / paths.policy_file(0, "scaling_governor")
    mx = tree / paths.policy_file(0, "scaling_max_freq")
    cpu = tree / paths.CPU
    try:
        wait_for(lambda: read_settled(gov0) == "userspace", what="the first write")
        mx.write_text("1420800\n")
        (cpu / "cpu4/online").write_text("0\n")
        (cpu / "online").write_text("0-3,5\n")
        wait_for(lambda: "event=limit_changed" in log.read_text(), what="the new limit seen")
    finally:
        _stop(proc)
    assert read_settled(mx) == "1420800"
    assert read_settled(cpu / "cpu4/online") == "0"
    assert read_settled(gov0) == "schedutil"
