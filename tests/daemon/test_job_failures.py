"""A job that failed (non-zero exit, killed by a signal, stopped by `hidvfs run`) is counted
apart, never as a deadline met; a running job past its deadline shows as late (status,
metrics); `hidvfs run` leaves its command's stdout alone, says why a command cannot be
launched as a shell would, and takes HI/LO in any case."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest

from daemon.client import RegistryClient, RegistryError, run_registered
from daemon.jobs import REPORT_WAIT_S, JobEntry, JobExit, JobTable
from daemon.metrics import metrics_from_status, render
from daemon.registry import JobRegistry, RequestError, job_to_json, parse_request
from platforms.procs import NoProcesses
from tests.daemon.test_metrics import parse_exposition
from tests.daemon.test_registry import ROOT, run_json, server, sock_path  # noqa: F401


def _unreg(**fields) -> bytes:
    return json.dumps({"op": "unregister", "pid": 42, **fields}).encode()


# -- the protocol ------------------------------------------------------------------------------


def test_unregister_takes_how_the_job_ended_and_old_requests_still_parse():
    assert parse_request(_unreg()) == {"op": "unregister", "pid": 42}
    assert parse_request(_unreg(exit=None)) == {"op": "unregister", "pid": 42}
    req = parse_request(_unreg(exit={"code": 1, "signal": None, "stopped_by": None}))
    assert req["exit"] == JobExit(code=1) and req["exit"].failure == "exit 1"
    req = parse_request(_unreg(exit={"signal": 11}))
    assert req["exit"].failure == "killed by SIGSEGV"
    req = parse_request(_unreg(exit={"code": 0, "stopped_by": "SIGTERM"}))
    assert req["exit"].failure == "stopped by SIGTERM"
    assert parse_request(_unreg(exit={"code": 0}))["exit"].failure is None


@pytest.mark.parametrize(
    "bad, needle",
    [
        ("exit 1", "field 'exit' must be an object"),
        ({"code": 1, "signal": 9}, "one of 'code'"),
        ({}, "one of 'code'"),
        ({"code": 256}, "'exit.code' must be an integer from 0 to 255"),
        ({"code": True}, "'exit.code'"),
        ({"signal": 0}, "'exit.signal' must be an integer from 1 to 127"),
        ({"code": 0, "stopped_by": "TERM; rm"}, "'exit.stopped_by' must be a signal name"),
        ({"code": 0, "cod": 1}, "unknown field 'cod' in 'exit' (did you mean 'code'?)"),
    ],
)
def test_a_malformed_exit_is_refused_naming_it(bad, needle):
    with pytest.raises(RequestError, match=None) as err:
        parse_request(_unreg(exit=bad))
    assert needle in str(err.value)


# -- the table and the registry ----------------------------------------------------------------


def _registry(alive: set[int], now=lambda: 10.0) -> JobRegistry:
    return JobRegistry(JobTable(), now=now, alive=lambda pid: pid in alive)


@pytest.mark.parametrize(
    "ended, why",
    [
        (JobExit(code=1), "exit 1"),
        (JobExit(signal=11), "killed by SIGSEGV"),
        (JobExit(signal=9), "killed by SIGKILL"),
        (JobExit(code=0, stopped_by="SIGINT"), "stopped by SIGINT"),
    ],
)
def test_a_failed_job_is_counted_apart_not_as_met(ended, why):
    """It ended well within its deadline: it used to count as met. Told it failed, the
    daemon records it as failed, neither met nor missed."""
    alive = {42}
    reg = _registry(alive)
    reg.register(42, 5.0, "hi", "crash", peer_uid=0)
    alive.clear()
    reg.handle(parse_request(_unreg(exit={"code": ended.code, "signal": ended.signal,
                                          "stopped_by": ended.stopped_by})))  # fmt: skip
    (out,) = reg.table.outcomes
    assert out.failure == why and out.deadline_met is None
    assert reg.table.failed() == {"hi": 1, "lo": 0} and reg.table.misses() == {"hi": 0, "lo": 0}
    assert reg.table.done == 1


def test_a_job_told_it_succeeded_or_not_told_is_scored_by_time():
    alive = {42, 43}
    reg = _registry(alive)
    reg.register(42, 5.0, "lo", "ok", peer_uid=0)
    reg.register(43, 5.0, "lo", "old-client", peer_uid=0)
    alive.clear()
    reg.unregister(42, exit=JobExit(code=0))
    reg.unregister(43)  # a client from before the field: as it always was
    assert [o.deadline_met for o in reg.table.outcomes] == [True, True]
    assert reg.table.failed() == {"hi": 0, "lo": 0}


def test_the_loops_hold_waits_for_the_launchers_word_then_scores_by_time():
    """The loop saw the job end before `hidvfs run` unregistered it: the outcome waits for the
    word (with the end the loop saw); a launcher that never says is scored by time."""
    table = JobTable()
    reg = JobRegistry(table, now=lambda: 99.0, alive=lambda pid: False)
    for pid in (1, 2, 3):
        table.register(JobEntry(pid=pid, name=f"j{pid}", release_t=0.0, deadline_s=5.0))
        assert table.hold(pid, 1.0, until=1.0 + REPORT_WAIT_S) is not None
    assert len(table) == 0 and table.done == 0  # not running, not scored yet
    reg.unregister(1, exit=JobExit(signal=6))  # the word: killed by SIGABRT
    (out,) = table.take_ended()  # handed to the loop, with the end it saw (1.0, not 99.0)
    assert out.finish_t == 1.0 and out.failure == "killed by SIGABRT"
    # the launcher of 2 died (SIGKILLed): scored by time at once; 3's launcher lives on
    gone = table.release_held(2.0, lambda e: e.pid == 3)
    assert [(o.pid, o.deadline_met) for o in gone] == [(2, True)]
    assert table.release_held(1.0 + REPORT_WAIT_S, lambda e: True)[0].pid == 3  # waited enough
    assert table.failed() == {"hi": 0, "lo": 1} and table.done == 3


class _Procs(NoProcesses):
    """Live pids are those in ``live``; every start time unknown."""

    def __init__(self, live: set[int]):
        self.live = live

    def alive(self, pid):
        return pid in self.live

    def get_affinity(self, pid):
        return (0,)

    def set_affinity(self, pid, cpus):
        pass

    def set_priority(self, pid, rt_priority=0, nice=0):
        pass

    def start_time(self, pid):
        return None


class _Learner:
    """A stage that records what the loop tells it of ended jobs."""

    def __init__(self):
        self.done, self.forgot = [], []

    def __call__(self, decision, obs):
        return decision

    def job_done(self, pid, finish_t):
        self.done.append(pid)

    def forget(self, pid):
        self.forgot.append(pid)


def _loop(tmp_path, procs, table, stages=()):
    from agents.governors import make_governor
    from daemon.loop import ControlLoop
    from platforms.clock import VirtualClock
    from platforms.faketree import write_fake_tree
    from platforms.platform import Platform
    from platforms.spec import load_board
    from platforms.sysfs import DirSysfs

    spec = load_board("tx2")
    write_fake_tree(spec, tmp_path)
    clock = VirtualClock(0.0)
    loop = ControlLoop(
        Platform(spec, DirSysfs(tmp_path), procs, clock, kind="fake"),
        make_governor("schedutil"),
        jobs=table,
        stages=list(stages),
    )
    return loop, clock


@pytest.mark.parametrize("still_alive", [False, True])
def test_the_launchers_word_is_kept_when_the_loop_holds_the_job_mid_unregister(still_alive):
    """The loop's hold landing between unregister's look at the job and its finish (or its
    unregister of a job it saw alive): the word was refused as "not registered" (which
    `hidvfs run` ignores), and the job, scored by time once run was gone, counted as met."""
    table = JobTable()
    entry = JobEntry(
        pid=4242, name="crash", release_t=0.0, deadline_s=5.0, criticality="lo", adopter=(1, None)
    )
    table.register(entry)

    def alive(pid):  # the racing tick, injected where unregister looks at the process
        table.hold(pid, 1.0, 1.0 + REPORT_WAIT_S)
        return still_alive

    reg = JobRegistry(table, now=lambda: 1.0, alive=alive)
    reg.unregister(4242, exit=JobExit(code=1))
    assert table.failed() == {"hi": 0, "lo": 1} and table.misses() == {"hi": 0, "lo": 0}
    assert table.release_held(100.0, lambda e: False) == []  # nothing left to score by time


def test_an_unregister_during_the_holds_own_change_finds_the_job_held():
    """hold() took the job off the running ones (its change written to disk) before putting
    it among the held: the launcher's unregister in between found it nowhere, and the
    crashed job was scored by time as met."""
    table = JobTable()
    table.register(
        JobEntry(pid=4242, name="crash", release_t=0.0, deadline_s=5.0, criticality="lo")
    )
    reg = JobRegistry(table, now=lambda: 1.0, alive=lambda pid: False)
    said = []

    def on_change(jobs, registered):  # the daemon writes its job file here
        if not registered:
            reg.unregister(4242, exit=JobExit(code=1))
            said.append("accepted")

    table.on_change = on_change
    table.hold(4242, 1.0, 1.0 + REPORT_WAIT_S)
    assert said == ["accepted"]
    assert table.failed() == {"hi": 0, "lo": 1} and table.misses() == {"hi": 0, "lo": 0}
    assert table.release_held(100.0, lambda e: False) == []


def test_a_crash_the_loop_saw_first_is_logged_failed_not_met(tmp_path, caplog):
    """The race of the report: the loop's tick saw the command end before `hidvfs run`
    (alive, its adopter) said it crashed. It was scored met by time; now the loop waits for
    the word, logs job_done as failed, and the shield does not learn from it."""
    procs = _Procs({4242, 5000})
    table = JobTable()
    reg = JobRegistry(table, now=lambda: 0.0, alive=procs.alive)
    learner = _Learner()
    loop, clock = _loop(tmp_path, procs, table, [learner])
    table.register(
        JobEntry(pid=4242, name="crash", release_t=0.0, deadline_s=5.0, adopter=(5000, None))
    )
    loop.tick()
    procs.live.discard(4242)  # it crashed; hidvfs run (5000) has not said so yet
    clock.set(0.5)
    assert loop.tick().finished == [] and table.held(4242) is not None and len(table) == 0
    assert loop.status()["jobs_running"] == 0
    reg.unregister(4242, exit=JobExit(signal=11))
    clock.set(0.6)
    with caplog.at_level(logging.INFO, logger="hidvfs.loop"):
        (out,) = loop.tick().finished
    assert out.finish_t == 0.5 and out.deadline_met is None and out.failure == "killed by SIGSEGV"
    assert 'deadline_met=null failed="killed by SIGSEGV"' in caplog.text
    assert learner.forgot == [4242] and learner.done == []
    status = loop.status()
    assert status["jobs_failed"] == {"hi": 0, "lo": 1}
    assert status["deadline_misses"] == {"hi": 0, "lo": 0}


def test_an_orphan_whose_launcher_was_killed_is_scored_by_time(tmp_path):
    """`hidvfs run` SIGKILLed: nobody will say how its command ended; the daemon scores it
    by time when it ends, as before (here: past its deadline, a miss)."""
    procs = _Procs({4242})  # the launcher 5000 is gone
    table = JobTable()
    learner = _Learner()
    loop, clock = _loop(tmp_path, procs, table, [learner])
    table.register(
        JobEntry(pid=4242, name="orphan", release_t=0.0, deadline_s=1.0, adopter=(5000, None))
    )
    loop.tick()
    procs.live.clear()
    clock.set(2.0)
    (out,) = loop.tick().finished
    assert out.deadline_met is False and out.failure is None
    assert table.misses() == {"hi": 0, "lo": 1} and learner.done == [4242]


# -- hidvfs run --------------------------------------------------------------------------------


def test_run_tells_the_daemon_how_the_command_ended(server):  # noqa: F811
    crash = [sys.executable, "-c", "import os, time; time.sleep(0.3); os.abort()"]
    r = run_registered(crash, deadline_s=5.0, criticality="hi", socket_path=server.path)
    assert r["returncode"] == 128 + 6 and r["deadline_met"] is None
    assert r["failure"] == "killed by SIGABRT"
    (out,) = server.registry.table.outcomes
    assert out.failure == "killed by SIGABRT" and out.deadline_met is None
    assert server.registry.table.failed() == {"hi": 1, "lo": 0}
    ok = [sys.executable, "-c", "import time; time.sleep(0.3)"]
    r = run_registered(ok, deadline_s=5.0, socket_path=server.path)
    assert r["deadline_met"] is True and r["failure"] is None
    assert server.registry.table.outcomes[-1].deadline_met is True


def test_run_still_unregisters_with_a_daemon_that_predates_the_exit_field(server, monkeypatch):  # noqa: F811
    """A daemon upgraded but not restarted refuses the unknown field: asked again without."""
    import daemon.registry as registry

    monkeypatch.setitem(registry.FIELDS, "unregister", ("op", "pid"))
    cmd = [sys.executable, "-c", "import time; time.sleep(0.3); raise SystemExit(1)"]
    r = run_registered(cmd, deadline_s=5.0, socket_path=server.path)
    assert r["returncode"] == 1 and r["deadline_met"] is None  # the client knows
    assert len(server.registry.table) == 0  # unregistered all the same
    assert server.registry.table.outcomes[-1].deadline_met is True  # the old way: by time
    monkeypatch.undo()
    with pytest.raises(RegistryError, match="pid 1 is not registered"):  # not retried
        RegistryClient(server.path).unregister(1, JobExit(code=0))


def _hv(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tools.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        **kw,
    )


def test_run_passes_the_commands_stdout_through_untouched(server):  # noqa: F811
    """`echo hi | hidvfs run -- cat > out` got a summary line in out; --json could not be
    parsed. The command's stdout is its own; the report (text or JSON) goes to stderr."""
    cat = [
        sys.executable,
        "-c",
        "import sys, time; time.sleep(0.3); sys.stdout.write(sys.stdin.read())",
    ]
    r = _hv("run", "--socket", server.path, "--name", "cat", "--", *cat, input="1\n2\n3\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "1\n2\n3\n"
    assert r.stderr.startswith("cat: exit 0, makespan ")
    r = _hv("run", "--socket", server.path, "--json", "--", *cat, input='{"data": 1}\n')
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"data": 1}  # the command's JSON, parseable
    assert run_json(r.stderr)["returncode"] == 0


def test_run_json_out_keeps_the_result_apart_from_the_commands_stderr(server, tmp_path):  # noqa: F811
    """--json on stderr mixes with what the command writes there: --json-out PATH keeps the
    result object apart, parseable whatever the command says."""
    noisy = [
        sys.executable,
        "-c",
        "import sys, time; time.sleep(0.3); print('progress', file=sys.stderr); print('data')",
    ]
    out = tmp_path / "new" / "r.json"
    r = _hv("run", "--socket", server.path, "--json-out", str(out), "--", *noisy)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "data\n" and "progress" in r.stderr and "returncode" not in r.stderr
    assert json.loads(out.read_text())["returncode"] == 0
    bad = _hv("run", "--socket", server.path, "--json-out", "/proc/r.json", "--", *noisy)
    assert bad.returncode == 2 and "--json-out" in bad.stderr and bad.stdout == ""  # not run


def test_run_json_out_leaves_no_stale_result_and_never_replaces_the_commands_output(
    server,  # noqa: F811
    tmp_path,
):
    """A run that failed before its end (command not found) left the previous run's result
    for a script to read; a --json-out that was the command's own stdout replaced its output."""
    out = tmp_path / "r.json"
    ok = _hv("run", "--socket", server.path, "--json-out", str(out), "--", "true")
    assert ok.returncode == 0 and json.loads(out.read_text())["returncode"] == 0
    gone = _hv("run", "--socket", server.path, "--json-out", str(out), "--", "/nonexistent/cmd")
    assert gone.returncode == 127 and out.read_text() == ""
    same = tmp_path / "same.txt"
    cmd = [sys.executable, "-m", "tools.cli", "run", "--socket", server.path]
    with open(same, "w") as f:
        r = subprocess.run(
            [*cmd, "--json-out", str(same), "--", "echo", "IMPORTANT"],
            stdout=f,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            cwd=ROOT,
        )
    assert r.returncode == 2 and "is this command's stdout" in r.stderr
    assert same.read_text() == ""  # nothing launched, nothing replaced


def test_run_says_a_failed_command_is_not_scored(server):  # noqa: F811
    cmd = [sys.executable, "-c", "import time; time.sleep(0.3); raise SystemExit(1)"]
    r = _hv("run", "--socket", server.path, "--name", "failjob", "--deadline", "2", "--", *cmd)
    assert r.returncode == 1 and r.stdout == ""
    summary = r.stderr.splitlines()[-1]
    assert summary.startswith("failjob: exit 1, makespan ")
    assert summary.endswith("(deadline 2.000 s: not scored, the command failed (exit 1))")
    assert "met" not in summary
    kill = [sys.executable, "-c", "import os, time; time.sleep(0.3); os.kill(os.getpid(), 9)"]
    r = _hv("run", "--socket", server.path, "--name", "k", "--deadline", "2", "--", *kill)
    assert r.returncode == 137
    assert r.stderr.splitlines()[-1].endswith(
        "(deadline 2.000 s: not scored, the command was killed by SIGKILL)"
    )


def test_a_command_that_cannot_be_launched_exits_as_a_shell_would(server, tmp_path):  # noqa: F811
    """127 not found, 126 not executable (was 2, an exit any command may give), and no raw
    [Errno N] in the message; nothing is registered."""
    r = _hv("run", "--socket", server.path, "--", str(tmp_path / "nonexistent_prog"), "a")
    assert r.returncode == 127, r.stderr
    assert r.stderr == (
        f"hidvfs: error: cannot launch '{tmp_path / 'nonexistent_prog'}': "
        "No such file or directory\n"
    )
    r = _hv("run", "--socket", server.path, "--", "hidvfs-no-such-command-here")
    assert r.returncode == 127
    assert "cannot launch 'hidvfs-no-such-command-here': not found in PATH" in r.stderr
    plain = tmp_path / "data.txt"
    plain.write_text("not a program\n")
    plain.chmod(0o644)
    r = _hv("run", "--socket", server.path, "--", str(plain))
    assert r.returncode == 126, r.stderr
    assert r.stderr == f"hidvfs: error: cannot launch '{plain}': Permission denied\n"
    assert "[Errno" not in r.stderr and len(server.registry.table) == 0


@pytest.mark.parametrize("given", ["HI", "Hi", "hi"])
def test_criticality_is_taken_in_any_case(server, given):  # noqa: F811
    cmd = [sys.executable, "-c", "import time; time.sleep(0.3)"]
    r = _hv("run", "--socket", server.path, "--criticality", given, "--json", "--", *cmd)
    assert r.returncode == 0, r.stderr
    assert run_json(r.stderr)["criticality"] == "hi"


# -- late jobs: status and metrics ------------------------------------------------------------


def test_a_job_past_its_deadline_shows_as_overdue():
    table = JobTable()
    table.register(JobEntry(pid=1, name="late", release_t=0.0, deadline_s=0.5, criticality="hi"))
    table.register(JobEntry(pid=2, name="fine", release_t=0.0, deadline_s=10.0))
    table.register(JobEntry(pid=3, name="free", release_t=0.0))
    assert table.overdue(2.3) == {"hi": 1, "lo": 0}
    late, fine, free = (job_to_json(e, now=2.3) for e in table.snapshot())
    assert late["overdue_s"] == pytest.approx(1.8) and late["remaining_s"] == 0.0
    assert fine["overdue_s"] == 0.0 and fine["remaining_s"] == pytest.approx(7.7)
    assert free["overdue_s"] is None and free["remaining_s"] is None


def test_status_marks_a_late_job_and_counts_failed_ones(monkeypatch):
    from click.testing import CliRunner

    from tools.cli import cli

    status = {
        "board": "tx2",
        "backend": "live",
        "policy": "schedutil",
        "t": 12.0,
        "ticks": 120,
        "freq_khz": {"a57": 2035200},
        "temp_c": {},
        "energy_j": None,
        "jobs_done": 7,
        "jobs_failed": {"hi": 0, "lo": 2},
        "jobs_running": 2,
        "jobs_overdue": {"hi": 1, "lo": 0},
        "deadline_misses": {"hi": 0, "lo": 0},
        "interventions": 3,
        "jobs": [
            {"pid": 27085, "name": "late", "criticality": "hi", "deadline_s": 0.5,
             "elapsed_s": 2.3, "overdue_s": 1.8, "profile_version": None},
            {"pid": 27086, "name": "ok", "criticality": "lo", "deadline_s": 5.0,
             "elapsed_s": 2.3, "overdue_s": 0.0, "profile_version": None},
        ],
    }  # fmt: skip
    monkeypatch.setattr(RegistryClient, "status", lambda self: status)
    r = CliRunner().invoke(cli, ["status"])
    assert r.exit_code == 0, r.output
    assert "jobs done 7 (2 failed: hi=0 lo=2), running 2 (1 LATE), deadline misses" in r.output
    assert (
        "job 27085 late (hi): running 2.3 s of a 0.5 s deadline, LATE by 1.8 s, no profile"
        in r.output
    )
    assert "job 27086 ok (lo): running 2.3 s of a 5 s deadline, no profile" in r.output


def test_metrics_export_failed_and_overdue_jobs_by_criticality():
    status = {
        "jobs_done": 4,
        "deadline_misses": {"hi": 0, "lo": 1},
        "jobs_failed": {"hi": 1, "lo": 0},
        "jobs_overdue": {"hi": 1, "lo": 0},
    }
    fams = parse_exposition(render(metrics_from_status(status)))
    failed, overdue = fams["hidvfs_jobs_failed_total"], fams["hidvfs_jobs_overdue"]
    assert failed["type"] == "counter" and overdue["type"] == "gauge"
    assert "signal" in failed["help"] and "past their deadline" in overdue["help"]
    assert failed["samples"] == [({"criticality": "hi"}, 1.0), ({"criticality": "lo"}, 0.0)]
    assert overdue["samples"] == [({"criticality": "hi"}, 1.0), ({"criticality": "lo"}, 0.0)]
    # an older status without them: no sample, still a valid exposition
    fams = parse_exposition(render(metrics_from_status({"jobs_done": 1})))
    assert fams["hidvfs_jobs_overdue"]["samples"] == []


def test_the_loop_status_counts_overdue_jobs(tmp_path):
    table = JobTable()
    loop, clock = _loop(tmp_path, _Procs({1, 2}), table)
    table.register(JobEntry(pid=1, name="a", release_t=0.0, deadline_s=0.5, criticality="hi"))
    table.register(JobEntry(pid=2, name="b", release_t=0.0, deadline_s=5.0))
    clock.set(0.4)
    assert loop.status()["jobs_overdue"] == {"hi": 0, "lo": 0}
    clock.set(2.5)
    assert loop.status()["jobs_overdue"] == {"hi": 1, "lo": 0}
