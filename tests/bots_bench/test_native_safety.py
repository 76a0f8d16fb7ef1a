"""Native runs that used to go wrong quietly: Ctrl-C left the kernel running (it is in its own
session), a wrong binary or an impossible ``Time Program`` was recorded as a good run, the
kernels that need ``ulimit -s unlimited`` never got it, and the deadline study counted jobs
whose reference run had failed (so they had no deadline) as deadlines met."""

from __future__ import annotations

import os
import resource
import signal
import threading

import pytest

from bots_bench import native as native_mod
from bots_bench.native import run_native
from bots_bench.spec import RunConfig
from platforms.faketree import write_fake_tree
from platforms.spec import load_board
from tools.policies import build_policy_stack

BLOCK = (
    "Program             = {program}\n"
    "Parameters          = N=25\n"
    "Model               = OpenMP (using tasks)\n"
    "Embedded cut-off    = none\n"
    "# of Threads        = 2\n"
    "Verification        = successful\n"
    "Time Program        = {time} seconds\n"
)


def _cfg(bench, bots_bin, cls="smoke", **kw):
    return RunConfig(
        bench, cls, "maxfreq", 0, "tx2", "native", 0, bots_bin=str(bots_bin), cooldown=None, **kw
    )


def _stand_in(folder, name, script):
    folder.mkdir(exist_ok=True)
    path = folder / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)
    return path


def test_ctrl_c_during_a_run_kills_the_kernel_and_stops_the_sampler(bots_tree, board, monkeypatch):
    monkeypatch.setenv("BOTS_TEST_FAULT", "hang")
    spawned = []

    def spawn(*args, **kw):
        proc = real_spawn(*args, **kw)
        spawned.append(proc)
        threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
        return proc

    real_spawn = native_mod.spawn_job
    monkeypatch.setattr(native_mod, "spawn_job", spawn)
    # Ctrl-C raises KeyboardInterrupt, as in a terminal: a test run started as a background job
    # of a non-interactive shell inherits SIGINT ignored, and Python then keeps it ignored
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        try:
            rec = run_native(_cfg("sort", bots_tree.bin, timeout_s=60.0), board, build_policy_stack)
        except KeyboardInterrupt:
            pass
        else:  # say what came back: a record's error tells where it stopped before the kernel
            pytest.fail(f"no KeyboardInterrupt; {len(spawned)} spawned; record: {rec}")
        (proc,) = spawned
        assert proc.returncode is not None  # killed and reaped
        with pytest.raises(ProcessLookupError):
            os.killpg(proc.pid, 0)  # nothing of its group is left
        alive = {t.name for t in threading.enumerate()}
        assert "hidvfs-rail-sampler" not in alive and "hidvfs-loop" not in alive
    finally:
        signal.signal(signal.SIGINT, previous)
        for p in spawned:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.mark.parametrize(
    ("kernel", "program", "time", "error"),
    [
        ("sort", "Fibonacci", "0.5", "Program = 'Fibonacci' (kernel fib), not 'Sort' of sort"),
        ("sort", "Nothing Known", "0.5", "(no known kernel)"),
        ("fib", "Fibonacci", "inf", "Time Program = inf is not a finite"),
        ("fib", "Fibonacci", "-3.0", "Time Program = -3.0 is not a finite"),
    ],
)
def test_output_of_the_wrong_program_or_an_impossible_time_fails_the_run(
    board, tmp_path, kernel, program, time, error
):
    out = BLOCK.format(program=program, time=time)
    _stand_in(tmp_path / "bin", f"{kernel}.gcc.omp-tasks", f"printf '{out}'\n")
    rec = run_native(_cfg(kernel, tmp_path / "bin"), board, build_policy_stack)
    assert not rec["ok"] and error in rec["error"]
    assert rec["time_program_s"] is None or rec["time_program_s"] == float(time)
    if time == "inf":
        assert rec["time_program_s"] is None  # kept out so the record stays standard JSON


def test_a_stand_in_with_the_right_program_still_passes(board, tmp_path):
    out = BLOCK.format(program="Sort", time="0.25")
    _stand_in(tmp_path / "bin", "sort.gcc.omp-tasks", f"printf '{out}'\n")
    rec = run_native(_cfg("sort", tmp_path / "bin"), board, build_policy_stack)
    assert rec["ok"], rec["error"]
    assert rec["time_program_s"] == 0.25


def test_the_classes_that_need_it_get_an_unlimited_stack(board, tmp_path):
    out = BLOCK.format(program="Connected Components", time="0.1")
    _stand_in(
        tmp_path / "bin", "concom.gcc.omp-tasks", f"echo \"stack=$(ulimit -s)\"\nprintf '{out}'\n"
    )
    soft, hard = resource.getrlimit(resource.RLIMIT_STACK)
    # a known, lower soft limit here, so that a child that merely inherits it is told apart
    resource.setrlimit(resource.RLIMIT_STACK, (6 * 1024 * 1024, hard))
    try:
        small = run_native(_cfg("concom", tmp_path / "bin", "small"), board, build_policy_stack)
        test = run_native(_cfg("concom", tmp_path / "bin", "test"), board, build_policy_stack)
        assert resource.getrlimit(resource.RLIMIT_STACK)[0] == 6 * 1024 * 1024  # ours unchanged
    finally:
        resource.setrlimit(resource.RLIMIT_STACK, (soft, hard))
    assert small["ok"] and test["ok"], (small["error"], test["error"])
    raised = "unlimited" if hard == resource.RLIM_INFINITY else str(hard // 1024)
    assert f"stack={raised}" in small["stdout"]
    assert "stack=6144" in test["stdout"]  # concom test does not ask for it


def test_the_deadline_study_fails_when_its_reference_run_failed(bots_tree, tmp_path):
    from bots_bench.studies import deadline_vs_maxfreq
    from tools.native_study import native_runner

    root = tmp_path / "tree"
    write_fake_tree(load_board("tx2"), root)
    count = tmp_path / "count"
    real = bots_tree.binary("fib.gcc.omp-tasks")
    # the first run (the maxfreq reference) fails its verification, later ones pass
    _stand_in(
        tmp_path / "bin",
        "fib.gcc.omp-tasks",
        f'if [ ! -e {count} ]; then : > {count}; BOTS_TEST_FAULT=bad exec {real} "$@"; fi\n'
        f'exec {real} "$@"\n',
    )
    runner, nb = native_runner(None, "smoke", str(tmp_path / "bin"), str(root), slack=3.0)
    try:
        res = deadline_vs_maxfreq(
            "tx2",
            policy="performance",
            seeds=1,
            slack=3.0,
            kernels=["fib"],
            cls="smoke",
            runner=runner,
        )
    finally:
        nb.close()
    assert not res.ok
    assert any("reference maxfreq run failed" in p and "UNSUCCESSFUL" in p for p in res.problems)
    (row,) = res.rows
    assert row["ok"] is False and row["deadline_met"] is None


def test_a_kernel_killed_by_a_signal_is_a_failed_run_naming_it(board, tmp_path):
    out = BLOCK.format(program="Sort", time="0.25")
    _stand_in(tmp_path / "bin", "sort.gcc.omp-tasks", f"printf '{out}'\nkill -SEGV $$\n")
    rec = run_native(_cfg("sort", tmp_path / "bin"), board, build_policy_stack)
    assert not rec["ok"] and rec["error"] == "killed by SIGSEGV (11)"
    _stand_in(tmp_path / "bin", "sort.gcc.omp-tasks", "kill -ABRT $$\n")
    rec = run_native(_cfg("sort", tmp_path / "bin"), board, build_policy_stack)
    assert rec["error"].startswith("killed by SIGABRT (6); ")


def test_the_board_gets_its_own_settings_back_after_every_run(board, tmp_path):
    """Between runs (the cool-down, the next check) the board is not left at the last
    policy's pins; the snapshot stays for the campaign's end."""
    from platforms import paths

    root = board.platform.sysfs.root
    gov = os.path.join(root, paths.policy_file(0, "scaling_governor"))
    original = open(gov).read().strip()
    out = BLOCK.format(program="Sort", time="0.25")
    _stand_in(
        tmp_path / "bin",
        "sort.gcc.omp-tasks",
        f"sleep 0.3; cat {gov} >> {tmp_path}/seen; printf '{out}'\n",
    )
    rec = run_native(_cfg("sort", tmp_path / "bin"), board, build_policy_stack)
    assert rec["ok"], rec["error"]
    seen = (tmp_path / "seen").read_text().split()
    assert seen == ["userspace"]  # maxfreq held the board while the kernel ran
    assert open(gov).read().strip() == original  # and gave it back right after
    assert os.path.exists(os.path.join(board.state_dir, "restore.json"))  # still kept


def test_each_tree_has_its_own_native_state_dir(tmp_path):
    from bots_bench.native import native_state_dir

    a, b = native_state_dir(str(tmp_path / "a")), native_state_dir(str(tmp_path / "b"))
    assert a != b and native_state_dir(str(tmp_path / "a")) == a
    assert native_state_dir("/") not in (a, b)
    os.symlink(tmp_path / "a", tmp_path / "link")
    assert native_state_dir(str(tmp_path / "link")) == a  # the real path counts


def test_a_clean_campaign_leaves_no_default_state_dir_behind(tmp_path, monkeypatch):
    """The per-tree default folder under the temp dir used to stay after every campaign (one
    per fake tree the test suite ever ran on: hundreds); a clean end removes it, a folder the
    user named or one that still holds something stays."""
    import tempfile

    from bots_bench.native import native_state_dir, open_board

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    root = tmp_path / "tree"
    write_fake_tree(load_board("tx2"), root)
    default = native_state_dir(str(root))

    nb = open_board(str(root), None, None, say=lambda m: None)
    assert nb.state_dir == default and os.path.isdir(default)  # the snapshot lives there
    assert os.path.exists(os.path.join(default, "restore.json"))
    nb.close()
    assert not os.path.exists(default)

    named = tmp_path / "named"
    nb = open_board(str(root), None, str(named), say=lambda m: None)
    nb.close()
    assert named.is_dir()  # the user's folder is theirs

    nb = open_board(str(root), None, None, say=lambda m: None)
    (tmp_path / "tmp" / os.path.basename(default) / "keep.txt").write_text("x")
    nb.close()
    assert os.path.exists(os.path.join(default, "keep.txt"))  # not empty: kept as it is


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_or_sighup_ends_a_native_campaign_as_ctrl_c_does(tmp_path, sig):
    """systemd's stop or a dropped SSH session: the kernel is killed, the board given back,
    nothing stored (they used to kill the command with the board pinned)."""
    import subprocess
    import sys
    import time
    from pathlib import Path

    from platforms import paths

    root = tmp_path / "tree"
    write_fake_tree(load_board("tx2"), root)
    gov = root / paths.policy_file(0, "scaling_governor")
    original = gov.read_text()
    pidfile = tmp_path / "kernel.pid"
    _stand_in(tmp_path / "bin", "fib.gcc.omp-tasks", f"echo $$ > {pidfile}\nexec sleep 300\n")
    env = dict(os.environ, TMPDIR=str(tmp_path))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tools.cli",
            "bots",
            "run",
            "--backend",
            "native",
            "--bots-bin",
            str(tmp_path / "bin"),
            "--bench",
            "fib",
            "--class",
            "test",
            "--policy",
            "maxfreq",
            "--seeds",
            "1",
            "--sysfs-root",
            str(root),
            "--db",
            str(tmp_path / "r.sqlite"),
            "--profiles",
            str(tmp_path / "p.json"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        end = time.monotonic() + 30
        while not (pidfile.exists() and pidfile.read_text().strip()):
            assert time.monotonic() < end and proc.poll() is None, proc.stderr.read()
            time.sleep(0.05)
        kernel = int(pidfile.read_text())
        # the control loop pins the board at its first tick, a moment after the launch
        while gov.read_text().strip() != "userspace":
            assert time.monotonic() < end and proc.poll() is None, "the board was never pinned"
            time.sleep(0.05)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130 and b"interrupted" in err, err  # the shell's interrupt code
    with pytest.raises(ProcessLookupError):
        os.kill(kernel, 0)
    assert gov.read_text().strip() == original.strip()


def test_processes_a_kernel_leaves_running_are_killed_after_its_run(board, tmp_path):
    out = BLOCK.format(program="Sort", time="0.25")
    pidfile = tmp_path / "child.pid"
    _stand_in(
        tmp_path / "bin",
        "sort.gcc.omp-tasks",
        f"sleep 300 &\necho $! > {pidfile}\nprintf '{out}'\n",
    )
    rec = run_native(_cfg("sort", tmp_path / "bin"), board, build_policy_stack)
    assert rec["ok"], rec["error"]
    child = int(pidfile.read_text())
    for _ in range(100):  # killed; reaped by init soon after
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        with open(f"/proc/{child}/stat") as f:
            if f.read().split(") ")[1].startswith("Z"):
                break
        import time

        time.sleep(0.02)
    else:
        pytest.fail(f"pid {child} still running after the run")
