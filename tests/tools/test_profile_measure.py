"""`hidvfs profile measure` on a fake tree: the runs happen at the pinned frequencies, the
profile is the one those times imply, the tree gets its settings back, bad runs store nothing."""

from __future__ import annotations

import json
import os
import re
import sys
import time

import pytest
from click.testing import CliRunner

from agents import deadlines
from bots_bench.reference import reference_cluster
from daemon.jobs import JobTable
from daemon.registry import JobRegistry
from daemon.registryserver import RegistryServer
from platforms import paths
from platforms.faketree import write_fake_tree
from platforms.spec import load_board
from platforms.sysfs import DirSysfs
from tests.daemon.test_daemon_process import tree_state
from tools.cli import cli
from tools.profile_measure import MeasureError, measure

C, L, BETA = 3.0, 0.6, 0.25  # the synthetic program's true cost (capacity-1 seconds at the top)


@pytest.fixture
def tx2(tmp_path):
    spec = load_board("tx2")
    write_fake_tree(spec, tmp_path / "tree")
    (tmp_path / "state").mkdir()
    return spec, tmp_path


def test_measure_pins_the_reference_cluster_and_recovers_the_cost(tx2):
    spec, tmp = tx2
    sysfs = DirSysfs(tmp / "tree")
    ref = reference_cluster(spec)
    original = tree_state(tmp / "tree", spec)
    seen = []

    def timer(argv, cpus, timeout_s):
        # the time the gate's models give at the frequency the tree holds right now
        khz = sysfs.read_int(paths.policy_file(ref.policy, "scaling_setspeed"))
        gov = sysfs.read(paths.policy_file(ref.policy, "scaling_governor")).strip()
        seen.append((gov, khz, tuple(cpus)))
        phi = (1 - BETA) * ref.fmax_khz / (ref.capacity * khz) + BETA
        n = len(cpus)
        return (L + (C - L) / n) * phi

    prof, times = measure(spec, sysfs, ["prog"], "prog", state_dir=str(tmp / "state"), timer=timer)
    assert [s[0] for s in seen] == ["userspace"] * 3
    assert seen[0][1] == seen[1][1] == ref.fmax_khz and seen[2][1] < ref.fmax_khz
    assert seen[0][2] == tuple(ref.cpus) and len(seen[1][2]) == 1
    assert prof.beta == pytest.approx(BETA) and prof.work_s == pytest.approx(C)
    assert prof.span_s == pytest.approx(L) and prof.ref_makespan_s == times["all cores, top"]
    assert tree_state(tmp / "tree", spec) == original  # everything given back
    assert not (tmp / "state" / "restore.json").exists()


def test_a_failing_run_stores_nothing_and_restores(tx2):
    spec, tmp = tx2
    sysfs = DirSysfs(tmp / "tree")
    original = tree_state(tmp / "tree", spec)

    def timer(argv, cpus, timeout_s):
        raise MeasureError("prog exited with status 3")

    with pytest.raises(MeasureError, match="status 3"):
        measure(spec, sysfs, ["prog"], "prog", state_dir=str(tmp / "state"), timer=timer)
    assert tree_state(tmp / "tree", spec) == original


def cli_args(tmp, *extra):
    return [
        "profile",
        "measure",
        "--store",
        str(tmp / "profiles.json"),
        "--sysfs-root",
        str(tmp / "tree"),
        "--board",
        "tx2",
        "--state-dir",
        str(tmp / "state"),
        "--socket",
        str(tmp / "state" / "none.sock"),
        *extra,
    ]


def test_a_board_another_process_controls_is_not_measured(tx2):
    """A running daemon (or campaign) holds the board's lock: its pins would move under the
    timed runs, so the measurement is refused before anything is written."""
    from platforms.treelock import TreeBusy, TreeLock

    spec, tmp = tx2
    sysfs = DirSysfs(tmp / "tree")
    original = tree_state(tmp / "tree", spec)
    ran = []
    with TreeLock(DirSysfs(tmp / "tree")):
        with pytest.raises(TreeBusy, match="another hidvfs process is controlling"):
            measure(
                spec,
                sysfs,
                ["prog"],
                "prog",
                state_dir=str(tmp / "state"),
                timer=lambda *a: ran.append(a) or 1.0,
            )
    assert not ran and tree_state(tmp / "tree", spec) == original
    assert not (tmp / "state" / "restore.json").exists()


def test_cli_measures_a_real_program_stores_and_lists_it(tx2):
    spec, tmp = tx2
    original = tree_state(tmp / "tree", spec)
    prog = [sys.executable, "-c", "sum(i * i for i in range(200000))"]
    r = CliRunner().invoke(cli, cli_args(tmp, "--name", "sq", "--json", "--", *prog))
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["name"] == "sq" and out["board"] == "tx2" and out["version"] == 1
    assert set(out["times_s"]) == {"all cores, top", "one core, top", "all cores, low"}
    store = deadlines.load(tmp / "profiles.json")
    assert store.find("sq", "tx2").ref_makespan_s == out["ref_makespan_s"]
    assert tree_state(tmp / "tree", spec) == original
    # a fake tree pins nothing real: the user is told the profile is not the board's
    assert (
        "is not this machine's sysfs" in r.stderr and "beta measures run-to-run noise" in r.stderr
    )
    listed = CliRunner().invoke(cli, ["profile", "list", "--store", str(tmp / "profiles.json")])
    assert "sq" in listed.output and "v1" in listed.output
    # measuring again gives other times: refused without --replace (before any timed run,
    # naming the flag), a new version with it
    again = CliRunner().invoke(cli, cli_args(tmp, "--name", "sq", "--", *prog))
    assert again.exit_code != 0 and "already has a profile on tx2 (version 1)" in again.output
    assert "--replace" in again.output
    again = CliRunner().invoke(
        cli, cli_args(tmp, "--name", "sq", "--replace", "--json", "--", *prog)
    )
    assert again.exit_code == 0 and json.loads(again.stdout)["version"] == 2


def test_cli_refuses_a_failing_program_and_a_running_daemon(tx2):
    spec, tmp = tx2
    r = CliRunner().invoke(cli, cli_args(tmp, "--", sys.executable, "-c", "raise SystemExit(3)"))
    assert r.exit_code != 0 and "status 3" in r.output
    assert not (tmp / "profiles.json").exists()
    sock = tmp / "state" / "d.sock"
    reg = JobRegistry(JobTable(), now=time.monotonic, alive=lambda pid: True)
    srv = RegistryServer(reg, str(sock), group=None).start()
    try:
        args = cli_args(tmp, "--", "true")
        args[args.index("--socket") + 1] = str(sock)
        r = CliRunner().invoke(cli, args)
        assert r.exit_code != 0 and "daemon is running" in r.output
    finally:
        srv.stop()


def test_offline_cores_are_left_out_of_the_runs(tx2):
    """A power mode took half the reference cluster offline: the runs use the online ones."""
    spec, tmp = tx2
    ref = reference_cluster(spec)
    for cpu in ref.cpus[2:]:
        (tmp / "tree" / paths.cpu_online(cpu)).write_text("0\n")
    # the kernel's summary file follows the per-CPU files in a real tree
    online = [c for c in spec.cpus if c not in ref.cpus[2:]]
    (tmp / "tree" / "devices/system/cpu/online").write_text(",".join(map(str, online)) + "\n")
    seen = []

    def timer(argv, cpus, timeout_s):
        seen.append(tuple(cpus))
        return 1.0 if len(cpus) > 1 else 1.8

    prof, _ = measure(
        spec, DirSysfs(tmp / "tree"), ["p"], "p", state_dir=str(tmp / "state"), timer=timer
    )
    assert seen[0] == tuple(ref.cpus[:2]) and prof.ref_cores == 2


@pytest.mark.parametrize("name", ["bad\nname", "x" * 129])
def test_a_name_the_registry_would_refuse_is_refused_before_measuring(tx2, name):
    _spec, tmp = tx2
    ran = tmp / "ran"
    prog = [sys.executable, "-c", f"open({str(ran)!r}, 'w')"]
    r = CliRunner().invoke(cli, cli_args(tmp, "--name", name, "--", *prog))
    assert r.exit_code == 2 and "must be printable, 1 to 128 characters" in r.output
    assert not ran.exists()


def test_two_measurements_saved_together_both_land(tmp_path):
    """Each measurement used to save the copy of the store it loaded at its start."""
    import threading

    from platforms.observation import JobProfile

    path = tmp_path / "p.json"
    base = dict(work_s=2.0, span_s=0.5, beta=0.1, ref_makespan_s=1.0, ref_khz=1, ref_cores=4)
    threads = [
        threading.Thread(
            target=deadlines.update, args=(path, "tx2", JobProfile(name=f"j{i}", **base))
        )
        for i in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(n for (n, _b) in deadlines.load(path).profiles) == [f"j{i}" for i in range(8)]
    assert oct(path.stat().st_mode & 0o777) == "0o644"


# -- the stack limit of the measured program ----------------------------------------------------

#: a child that appends the soft RLIMIT_STACK it started with (and its OMP_STACKSIZE) to a file
_REPORT_STACK = (
    "import os, resource, sys; soft = resource.getrlimit(resource.RLIMIT_STACK)[0]; "
    "open(sys.argv[1], 'a').write(f\"{soft} {os.environ.get('OMP_STACKSIZE', '-')}\\n\")"
)
LOW = 8 << 20  # the usual default soft limit, 8 MiB


@pytest.fixture
def low_stack():
    """This process's soft stack limit lowered to 8 MiB (a soft limit can always be lowered;
    the test's hard limit stays), and put back after."""
    import resource

    old = resource.getrlimit(resource.RLIMIT_STACK)
    if old[1] != resource.RLIM_INFINITY and old[1] < 4 * LOW:
        pytest.skip(f"hard stack limit {old[1]} too low to tell a raised limit")
    resource.setrlimit(resource.RLIMIT_STACK, (LOW, old[1]))
    yield old[1]
    resource.setrlimit(resource.RLIMIT_STACK, old)


def _measure_stack(tmp, *options, name="stk"):
    import resource

    seen = tmp / f"seen-{len(list(tmp.glob('seen-*')))}.txt"
    r = CliRunner().invoke(
        cli,
        cli_args(
            tmp, "--name", name, "--replace", "--json", *options,
            "--", sys.executable, "-c", _REPORT_STACK, str(seen),
        ),
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    rows = [line.split() for line in seen.read_text().splitlines()]
    assert len(rows) == 3  # the three timed runs
    assert resource.getrlimit(resource.RLIMIT_STACK)[0] == LOW  # this process's is put back
    softs = {int(s) for s, _ in rows}
    assert len(softs) == 1
    return softs.pop(), {o for _, o in rows}.pop(), json.loads(r.stdout)


def test_stack_unlimited_raises_the_measured_programs_soft_limit_to_the_hard_one(tx2, low_stack):
    _, tmp = tx2
    soft, _, out = _measure_stack(tmp, "--stack", "unlimited")
    assert soft == low_stack
    if low_stack == -1:  # RLIM_INFINITY
        assert out["stack_limit"] == "unlimited"


@pytest.mark.parametrize(("size", "expected"), [("64M", 64 << 20), ("16384", 16 << 20)])
def test_stack_size_sets_the_measured_programs_soft_limit(tx2, low_stack, size, expected):
    _, tmp = tx2
    soft, _, out = _measure_stack(tmp, "--stack", size)
    assert soft == expected and out["stack_limit"] == f"{expected // 1024} KiB"


def test_an_arbitrary_command_keeps_the_callers_stack_by_default(tx2, low_stack):
    """The default is 'auto': a name that is no BOTS class inherits (an unlimited limit
    would shrink glibc's default thread stacks from the limit to 2 MiB)."""
    _, tmp = tx2
    assert _measure_stack(tmp)[0] == LOW
    assert _measure_stack(tmp, "--stack", "inherit")[0] == LOW


def test_a_bots_class_name_gets_the_stack_bots_profile_gives_it(tx2, low_stack, monkeypatch):
    """`--name concom.small` by hand: unlimited and its OMP_STACKSIZE, as `hidvfs bots profile`
    runs it (the class declares unlimited_stack); a class without it inherits."""
    _, tmp = tx2
    monkeypatch.delenv("OMP_STACKSIZE", raising=False)
    soft, omp, _ = _measure_stack(tmp, name="concom.small")
    assert soft == low_stack and omp == "512M"
    monkeypatch.setenv("OMP_STACKSIZE", "2M")  # the user's own choice wins
    assert _measure_stack(tmp, name="concom.small")[1] == "2M"
    monkeypatch.delenv("OMP_STACKSIZE")
    soft, omp, _ = _measure_stack(tmp, name="concom.test")
    assert soft == LOW and omp == "64M"


@pytest.mark.parametrize("bad", ["12Q", "100K", "unlimitedx", "-5M", ""])
def test_a_bad_stack_is_refused_before_anything_runs(tx2, bad):
    _, tmp = tx2
    r = CliRunner().invoke(cli, cli_args(tmp, "--stack", bad, "--", "true"))
    assert r.exit_code == 2 and "--stack" in r.output
    assert not (tmp / "profiles.json").exists()


def test_a_size_above_the_hard_limit_is_capped_at_it(tx2):
    import resource

    from tools.cmd_profile import stack_limit

    old = resource.getrlimit(resource.RLIMIT_STACK)
    hard = 32 << 20
    if old[1] != resource.RLIM_INFINITY and old[1] < hard:
        pytest.skip("hard stack limit below 32 MiB")
    pid = os.fork()
    if pid == 0:  # lowering the hard limit cannot be undone: in a child only
        code = 1
        try:
            resource.setrlimit(resource.RLIMIT_STACK, (LOW, hard))
            with stack_limit(1 << 30) as soft:
                code = 0 if soft == hard else 3
            code = code or (0 if resource.getrlimit(resource.RLIMIT_STACK) == (LOW, hard) else 4)
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_segfault_suggests_the_stack_option(tx2):
    _, tmp = tx2
    crash = "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"
    r = CliRunner().invoke(cli, cli_args(tmp, "--", sys.executable, "-c", crash))
    assert (
        r.exit_code != 0
        and "killed by SIGSEGV (11)" in r.output
        and "--stack unlimited" in r.output
    )


def test_the_default_timer_runs_with_the_environment_of_the_moment(monkeypatch):
    """A timer made earlier (time_command is made at import) must not freeze os.environ."""
    import sys

    from tools.profile_measure import command_timer

    seen = []
    timer = command_timer(check=lambda out: seen.append(out.strip()) or None)
    monkeypatch.setenv("HIDVFS_TIMER_PROBE", "set-later")
    code = "import os; print(os.environ.get('HIDVFS_TIMER_PROBE'))"
    assert timer([sys.executable, "-c", code], [0], 30.0) > 0
    assert seen == ["set-later"]


def test_listing_a_store_that_is_not_there_is_an_error_not_an_empty_list(tmp_path):
    r = CliRunner().invoke(cli, ["profile", "list", "--store", str(tmp_path / "typo.json")])
    assert r.exit_code == 2 and "no such profile store" in r.output


def test_repeated_runs_count_by_their_median(tx2):
    """models.md 8: the reference makespan is the median of the repeats, not the fastest (a
    deadline from the luckiest run is tighter than the job's usual time)."""
    spec, tmp = tx2
    sysfs = DirSysfs(tmp / "tree")
    runs = iter([1.00, 1.10, 1.06] + [2.0, 2.2, 2.1] + [1.5, 1.7, 1.6])

    def timer(argv, cpus, timeout_s):
        return next(runs)

    prof, times = measure(
        spec, sysfs, ["prog"], "prog", state_dir=str(tmp / "state"), timer=timer, repeat=3
    )
    assert list(times.values()) == [1.06, 2.1, 1.6]
    assert prof.ref_makespan_s == 1.06


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP"])
def test_a_stop_signal_kills_the_command_and_gives_the_board_back(tx2, sig):
    """systemd's stop or a dropped SSH session killed `profile measure` with the governor
    left at userspace, restore.json behind and the measured command running on."""
    import signal
    import subprocess

    spec, tmp = tx2
    original = tree_state(tmp / "tree", spec)
    started = tmp / "started"
    prog = [
        sys.executable,
        "-c",
        f"import os, time; open({str(started)!r}, 'w').write(str(os.getpid())); time.sleep(60)",
    ]
    proc = subprocess.Popen(
        [sys.executable, "-m", "tools.cli", *cli_args(tmp, "--name", "sig", "--", *prog)],
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 30
        while not (started.exists() and started.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert started.exists(), proc.stderr.read() if proc.poll() is not None else "no start"
        child = int(started.read_text())
        assert tree_state(tmp / "tree", spec) != original  # pinned while it runs
        proc.send_signal(getattr(signal, sig))
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert tree_state(tmp / "tree", spec) == original
    assert not (tmp / "state" / "restore.json").exists()
    assert not (tmp / "profiles.json").exists()
    time.sleep(0.2)
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)  # the command did not run on


def test_a_store_in_a_folder_no_file_can_be_made_in_is_refused_before_the_runs():
    """os.access said yes to root for /proc or /sys: every timed run happened, then the save
    failed with a raw errno and the times were lost."""
    from tools.cmd_profile import StoreUnwritable, check_store_writable

    why = r"its folder /proc is not writable \(/proc is on the proc pseudo filesystem\)"
    with pytest.raises(StoreUnwritable, match=why):
        check_store_writable("/proc/hidvfs-profiles.json")
    r = CliRunner().invoke(cli, ["profile", "measure", "--store", "/proc/p.json", "--", "true"])
    assert r.exit_code == 2 and r.output.startswith("hidvfs: error: --store /proc/p.json: ")
    assert re.search(why, r.output) and len(r.output.splitlines()) == 1
    r = CliRunner().invoke(cli, ["profile", "measure", "--store", "/sys/new/p.json", "--", "true"])
    assert r.exit_code == 2
    assert "its folder /sys/new cannot be made (/sys is on the sysfs" in r.output
    assert not os.path.exists("/sys/new")


def test_a_zero_byte_store_lists_as_empty_and_a_measurement_fills_it(tx2):
    """`touch profiles.json` (or a file made before its first save) failed `profile list` and
    every measurement with "expected valid JSON", while an absent store read as empty."""
    _, tmp = tx2
    store = tmp / "profiles.json"
    store.touch()
    listed = CliRunner().invoke(cli, ["profile", "list", "--store", str(store)])
    assert listed.exit_code == 0 and listed.output == f"no profiles in {store}\n"
    listed = CliRunner().invoke(cli, ["profile", "list", "--store", str(store), "--json"])
    assert listed.exit_code == 0 and json.loads(listed.stdout) == []
    prog = [sys.executable, "-c", "pass"]
    r = CliRunner().invoke(cli, cli_args(tmp, "--name", "e", "--", *prog))
    assert r.exit_code == 0, r.output
    assert json.loads(store.read_text())["format"] == "hidvfs-profiles"  # a store, not a blob
    assert [p.name for _, p in deadlines.load(store)] == ["e"]
    # only nothing reads as empty: other content that is no store is refused as before
    bad = tmp / "bad.json"
    for content in (b"\0\0\0\0", b"[]", b"\n"):
        bad.write_bytes(content)
        listed = CliRunner().invoke(cli, ["profile", "list", "--store", str(bad)])
        assert listed.exit_code == 2 and str(bad) in listed.output
        args = cli_args(tmp, "--name", "f", "--", *prog)
        args[args.index("--store") + 1] = str(bad)
        r = CliRunner().invoke(cli, args)
        assert r.exit_code == 2 and str(bad) in r.output and bad.read_bytes() == content


def test_a_store_whose_lock_is_a_link_is_refused_before_any_run(tmp_path):
    """The lock is opened without following links: said before the timed runs, not after."""
    from tools.cmd_profile import StoreUnwritable, check_store_writable

    target = tmp_path / "elsewhere"
    target.write_text("")
    (tmp_path / "p.json.lock").symlink_to(target)
    with pytest.raises(StoreUnwritable, match="lock file .* is a symbolic link"):
        check_store_writable(str(tmp_path / "p.json"))
