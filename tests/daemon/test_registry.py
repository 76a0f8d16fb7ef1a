"""The job registry over a real Unix socket: requests, malformed input, concurrency, permissions."""

from __future__ import annotations

import grp
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time

import pytest

from daemon.client import DaemonUnreachable, RegistryClient, RegistryError, run_registered
from daemon.jobs import JobTable
from daemon.registry import JobRegistry, RequestError, parse_request
from daemon.registryserver import MAX_LINE, ROOT_RESERVE, RegistryServer, RegistryStartError
from platforms.liveprocs import LiveProcessControl

PROCS = LiveProcessControl()


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


@pytest.fixture
def sock_path(tmp_path):
    path = str(tmp_path / "run" / "hidvfs.sock")
    if len(path) <= 100:
        yield path
        return
    # AF_UNIX limit; pytest's folders can be long: a short folder, removed after
    import shutil
    import tempfile

    short = tempfile.mkdtemp(prefix="hv", dir="/tmp")
    yield os.path.join(short, "run", "hidvfs.sock")
    shutil.rmtree(short, ignore_errors=True)


@pytest.fixture
def server(sock_path):
    table = JobTable()
    status = {"board": "tx2", "policy": "hidvfs", "ticks": 7}
    reg = JobRegistry(
        table,
        now=time.monotonic,
        alive=PROCS.alive,
        status_provider=lambda: status,
        pid_owner=PROCS.owner_uid,
    )
    srv = RegistryServer(reg, sock_path, group=None).start()
    yield srv
    srv.stop()


def raw(path: str, payload: bytes, shutdown: bool = True, timeout: float = 5.0) -> list[dict]:
    """Send raw bytes, read every answer line until the server closes or goes quiet."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    s.connect(path)
    s.sendall(payload)
    if shutdown:
        s.shutdown(socket.SHUT_WR)
    buf = b""
    try:
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
            if not shutdown and buf.endswith(b"\n"):
                break
    finally:
        s.close()
    return [json.loads(x) for x in buf.splitlines() if x.strip()]


def still_serves(path: str) -> None:
    answer = RegistryClient(path).status()
    assert answer["board"] == "tx2"


# --------------------------------------------------------------------------------------------


def test_register_status_unregister(server):
    client = RegistryClient(server.path)
    me = os.getpid()
    job = client.register(me, deadline_s=5, criticality="hi", name="fft")
    assert (
        job["pid"] == me
        and job["deadline_s"] == 5.0
        and job["criticality"] == "hi"
        and job["name"] == "fft"
    )
    st_ = client.status()
    assert {k: v for k, v in st_.items() if k != "jobs"} == {
        "board": "tx2",
        "policy": "hidvfs",
        "ticks": 7,
    }
    assert [j["pid"] for j in st_["jobs"]] == [me]
    assert st_["jobs"][0]["elapsed_s"] >= 0
    entry = server.registry.table.get(me)
    assert entry is not None and entry.criticality == "hi"
    assert client.unregister(me)["name"] == "fft"
    assert client.status()["jobs"] == []
    assert server.registry.table.get(me) is None


def test_defaults_and_duplicates(server):
    client = RegistryClient(server.path)
    me = os.getpid()
    job = client.register(me)
    assert job["criticality"] == "lo" and job["deadline_s"] is None and job["name"] == f"pid{me}"
    with pytest.raises(RegistryError, match="already registered"):
        client.register(me)
    client.unregister(me)
    with pytest.raises(RegistryError, match="not registered"):
        client.unregister(me)


MALFORMED = [
    (b"not json\n", "malformed JSON"),
    (b"[1, 2]\n", "JSON object"),
    (b'"register"\n', "JSON object"),
    (b"\xff\xfe\n", "UTF-8"),
    (b"{}\n", "missing field 'op'"),
    (b'{"op": "nope"}\n', "unknown op"),
    (b'{"op": 3}\n', "unknown op"),
    (b'{"op": "stats"}\n', "did you mean 'status'"),
    (b'{"op": "register"}\n', "missing field 'pid'"),
    (b'{"op": "unregister"}\n', "missing field 'pid'"),
    (b'{"op": "register", "pid": "12"}\n', "'pid' must be a positive integer"),
    (b'{"op": "register", "pid": true}\n', "'pid' must be a positive integer"),
    (b'{"op": "register", "pid": -4}\n', "'pid' must be a positive integer"),
    (b'{"op": "register", "pid": 1.5}\n', "'pid' must be a positive integer"),
    (b'{"op": "register", "pid": PID, "deadline_s": -1}\n', "'deadline_s'"),
    (b'{"op": "register", "pid": PID, "deadline_s": "5"}\n', "'deadline_s'"),
    (b'{"op": "register", "pid": PID, "deadline_s": 1e999}\n', "'deadline_s'"),
    (
        b'{"op": "register", "pid": PID, "criticality": "mid"}\n',
        "'criticality' must be 'hi' or 'lo'",
    ),
    (b'{"op": "register", "pid": PID, "name": 5}\n', "'name'"),
    (b'{"op": "register", "pid": PID, "name": "a\\nb"}\n', "'name'"),
    (b'{"op": "register", "pid": PID, "deadline": 5}\n', "did you mean 'deadline_s'"),
    (b'{"op": "status", "verbose": true}\n', "unknown field"),
    (b'{"op": "register", "pid": DEAD}\n', "does not exist"),
]


@pytest.mark.parametrize(("payload", "error"), MALFORMED, ids=[m[1] for m in MALFORMED])
def test_malformed_requests_get_an_error_and_the_server_keeps_serving(server, payload, error):
    if b"DEAD" in payload:
        payload = payload.replace(b"DEAD", str(_dead_pid()).encode())
    payload = payload.replace(b"PID", str(os.getpid()).encode())
    answers = raw(server.path, payload)
    assert len(answers) == 1
    assert answers[0]["ok"] is False
    assert error in answers[0]["error"]
    still_serves(server.path)
    assert len(server.registry.table) == 0


def test_oversized_line_is_refused(server):
    answers = raw(server.path, b'{"op": "status", "x": "' + b"a" * (MAX_LINE + 10), shutdown=False)
    assert answers[0]["ok"] is False and "longer than" in answers[0]["error"]
    still_serves(server.path)


def test_oversized_line_with_newline_is_refused(server):
    answers = raw(server.path, b"[" + b"1," * MAX_LINE + b"1]\n")
    assert answers[0]["ok"] is False and "longer than" in answers[0]["error"]
    still_serves(server.path)


def test_client_hanging_up_mid_line(server):
    answers = raw(server.path, b'{"op": "sta')  # half-close after half a request
    assert answers == [{"ok": False, "error": answers[0]["error"]}]
    assert "incomplete request" in answers[0]["error"]
    # and a client that vanishes without reading anything
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(server.path)
    s.sendall(b'{"op": "status"}\n{"op": "reg')
    s.close()
    still_serves(server.path)


def test_pipelined_requests_on_one_connection_are_answered_in_order(server):
    me = os.getpid()
    lines = [
        {"op": "register", "pid": me, "criticality": "hi"},
        {"op": "status"},
        "garbage",
        {"op": "unregister", "pid": me},
        {"op": "status"},
    ]
    payload = b"".join(
        (json.dumps(x) if isinstance(x, dict) else x).encode() + b"\n" for x in lines
    )
    answers = raw(server.path, b"\n\r\n" + payload)  # blank lines are ignored
    assert [a["ok"] for a in answers] == [True, True, False, True, True]
    assert [j["pid"] for j in answers[1]["jobs"]] == [me]
    assert answers[4]["jobs"] == []


def test_concurrent_clients(server):
    children = [
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]) for _ in range(6)
    ]
    try:
        errors: list[BaseException] = []

        def worker(pid: int) -> None:
            try:
                client = RegistryClient(server.path)
                for _ in range(5):
                    client.register(pid, deadline_s=2.0, criticality="lo", name=f"job{pid}")
                    assert any(j["pid"] == pid for j in client.status()["jobs"])
                    client.unregister(pid)
                client.register(pid, name=f"job{pid}")
            except BaseException as err:  # noqa: BLE001 - reported below
                errors.append(err)

        def noise() -> None:
            for _ in range(20):
                raw(server.path, b"{broken\n")

        threads = [threading.Thread(target=worker, args=(c.pid,)) for c in children]
        threads.append(threading.Thread(target=noise))
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not errors, errors
        assert sorted(e.pid for e in server.registry.list()) == sorted(c.pid for c in children)
    finally:
        for c in children:
            c.kill()
            c.wait()


def test_many_idle_clients_do_not_block_others(server):
    idle = []
    for _ in range(20):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(server.path)
        s.sendall(b'{"op": "st')  # and then nothing
        idle.append(s)
    try:
        still_serves(server.path)
    finally:
        for s in idle:
            s.close()


def test_status_provider_failure_is_an_error_answer(sock_path):
    def broken() -> dict:
        raise RuntimeError("sensor exploded")

    reg = JobRegistry(now=time.monotonic, alive=PROCS.alive, status_provider=broken)
    with RegistryServer(reg, sock_path, group=None) as srv:
        with pytest.raises(RegistryError, match="sensor exploded"):
            RegistryClient(srv.path).status()
        RegistryClient(srv.path).register(os.getpid())  # still serving


# -- socket file ------------------------------------------------------------------------------


def _reg() -> JobRegistry:
    return JobRegistry(now=time.monotonic, alive=PROCS.alive)


def test_socket_mode_and_group_when_the_group_exists(sock_path):
    group = grp.getgrgid(os.getgid()).gr_name
    with RegistryServer(_reg(), sock_path, group=group, mode=0o660):
        st_ = os.stat(sock_path)
        assert stat.S_ISSOCK(st_.st_mode)
        assert stat.S_IMODE(st_.st_mode) == 0o660
        assert st_.st_gid == os.getgid()
    assert not os.path.exists(sock_path)  # removed on stop


@pytest.mark.parametrize("group", [None, "no-such-group-hidvfs-test"])
def test_socket_stays_root_only_without_a_group(sock_path, group, caplog):
    with (
        caplog.at_level("INFO", logger="hidvfs.registry"),
        RegistryServer(_reg(), sock_path, group=group),
    ):
        assert stat.S_IMODE(os.stat(sock_path).st_mode) == 0o600
    if group:
        assert any("does not exist" in r.getMessage() for r in caplog.records)


def test_parent_dir_created_and_stale_socket_removed(sock_path):
    os.makedirs(os.path.dirname(sock_path))
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(sock_path)
    stale.close()  # a crashed daemon's leftover: the file exists, nobody listens
    assert os.path.exists(sock_path)
    with RegistryServer(_reg(), sock_path, group=None) as srv:
        RegistryClient(srv.path).status()


def test_refuses_a_live_socket_or_a_regular_file(sock_path):
    with RegistryServer(_reg(), sock_path, group=None):
        with pytest.raises(RegistryStartError, match="already serving"):
            RegistryServer(_reg(), sock_path, group=None).start()
    with open(sock_path, "w") as f:
        f.write("precious")
    with pytest.raises(RegistryStartError, match="not a socket"):
        RegistryServer(_reg(), sock_path, group=None).start()
    assert open(sock_path).read() == "precious"


def test_a_socket_that_is_slow_to_answer_is_not_taken_for_a_stale_one(sock_path):
    """A listener whose accept queue is full times the probe out: it is alive, and its socket
    must stay (only a refused connection means nobody listens)."""
    os.makedirs(os.path.dirname(sock_path))
    busy = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    busy.bind(sock_path)
    busy.listen(0)  # never accepts: the queue fills and the next connect blocks
    fillers = []
    try:
        for _ in range(8):
            c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            c.setblocking(False)
            try:
                c.connect(sock_path)
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:
                c.close()
                break
            fillers.append(c)
        with pytest.raises(RegistryStartError, match="did not answer"):
            RegistryServer(_reg(), sock_path, group=None).start()
        assert os.path.exists(sock_path)
    finally:
        for c in fillers:
            c.close()
        busy.close()


def test_run_checks_the_registration_before_launching_anything(server, tmp_path):
    """A name (or deadline) the daemon would refuse is refused before the command starts, so
    a refused job leaves no side effects behind."""
    marker = tmp_path / "ran"
    cmd = [sys.executable, "-c", f"open({str(marker)!r}, 'w')"]
    for bad in ({"name": "a\tb"}, {"name": "x" * 200}, {"deadline_s": -1.0}):
        with pytest.raises(RegistryError, match="field '(name|deadline_s)'"):
            run_registered(cmd, socket_path=server.path, **bad)
    assert not marker.exists()


def test_stop_is_idempotent(sock_path):
    srv = RegistryServer(_reg(), sock_path, group=None).start()
    assert srv.running
    srv.stop()
    srv.stop()
    assert not srv.running


# -- client errors and the registry without a socket -----------------------------------------


def test_client_reports_an_unreachable_daemon(tmp_path):
    path = str(tmp_path / "absent.sock")
    with pytest.raises(DaemonUnreachable) as exc:
        RegistryClient(path).status()
    msg = str(exc.value)
    assert msg.startswith(f"cannot reach the hidvfs daemon at {path}: ")
    assert "is it running? (systemctl status hidvfs)" in msg


def test_client_reports_a_refused_connection(sock_path):
    os.makedirs(os.path.dirname(sock_path))
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(sock_path)
    s.close()
    with pytest.raises(DaemonUnreachable, match="connection refused"):
        RegistryClient(sock_path).register(os.getpid())


def test_foreign_pid_refused_for_non_root_clients():
    reg = JobRegistry(now=lambda: 0.0, alive=lambda pid: True, pid_owner=lambda pid: 0)
    with pytest.raises(RequestError, match="may only register its own"):
        reg.register(1, peer_uid=1000)
    assert reg.register(1, peer_uid=0).pid == 1  # root may register anything
    reg2 = JobRegistry(now=lambda: 0.0, alive=lambda pid: True, pid_owner=lambda pid: 1000)
    assert reg2.register(55, peer_uid=1000).pid == 55


def test_job_limit():
    reg = JobRegistry(now=lambda: 0.0, alive=lambda pid: True, max_jobs=2)
    reg.register(1)
    reg.register(2)
    with pytest.raises(RequestError, match="too many"):
        reg.register(3)


def test_register_wakes_the_loop():
    table = JobTable()
    reg = JobRegistry(table, now=lambda: 12.5, alive=lambda pid: True)
    table.changed.clear()
    e = reg.register(9, deadline_s=3, criticality="hi", name="x")
    assert table.changed.is_set() and e.release_t == 12.5
    assert reg.handle_line(b'{"op": "status"}')["jobs"][0]["elapsed_s"] == 0.0


def test_parse_request_accepts_integers_as_deadline():
    assert parse_request(b'{"op": "register", "pid": 3, "deadline_s": 5}')["deadline_s"] == 5.0


def test_connection_survives_an_oversized_line(server):
    answers = raw(server.path, b'{"x": "' + b"a" * (MAX_LINE * 2) + b'"}\n{"op": "status"}\n')
    assert [a["ok"] for a in answers] == [False, True]
    assert "longer than" in answers[0]["error"]


def test_too_many_clients_get_an_error(sock_path):
    with RegistryServer(_reg(), sock_path, group=None, max_clients=2) as srv:
        held = []
        # root (the tests may run as root) always has ROOT_RESERVE more slots
        for _ in range(2 + (ROOT_RESERVE if os.geteuid() == 0 else 0)):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(srv.path)
            held.append(s)
        time.sleep(0.1)  # let the server accept both
        try:
            with pytest.raises(RegistryError, match="too many clients"):
                RegistryClient(srv.path).status()
        finally:
            for s in held:
                s.close()
        time.sleep(0.1)
        assert RegistryClient(srv.path).status()["jobs"] == []


# -- hidvfs run -------------------------------------------------------------------------------


def run_json(stderr: str) -> dict:
    """The ``hidvfs run --json`` result: the last thing on its stderr (after any warning),
    never on stdout, which is the command's alone."""
    start = 0 if stderr.startswith("{") else stderr.index("\n{\n") + 1
    return json.loads(stderr[start:])


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_CHECK_REGISTERED = """
import os, sys
from daemon.client import RegistryClient
jobs = RegistryClient(sys.argv[1]).status()["jobs"]
mine = [j for j in jobs if j["pid"] == os.getpid()]
sys.exit(0 if mine and mine[0]["criticality"] == "hi" and mine[0]["deadline_s"] == 30.0 else 3)
"""


def test_run_registered_launches_registers_and_unregisters(server, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", ROOT)
    cmd = [sys.executable, "-c", _CHECK_REGISTERED, server.path]
    result = run_registered(
        cmd, deadline_s=30.0, criticality="hi", name="probe", socket_path=server.path
    )
    assert result["returncode"] == 0  # the child saw itself registered while it ran
    assert result["name"] == "probe" and result["deadline_met"] is True and result["makespan_s"] > 0
    assert len(server.registry.table) == 0  # unregistered after exit


def test_run_registered_reports_failures(server):
    r = run_registered([sys.executable, "-c", "import sys; sys.exit(4)"], socket_path=server.path)
    assert (
        r["returncode"] == 4
        and r["deadline_met"] is None
        and r["name"] == os.path.basename(sys.executable)
    )
    r = run_registered(
        [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"],
        deadline_s=0.001,
        socket_path=server.path,
    )
    # killed: not scored against its deadline (neither met nor missed), and said why
    assert r["signal"] == 15 and r["returncode"] == 143 and r["deadline_met"] is None
    assert r["failure"] == "killed by SIGTERM"
    with pytest.raises(OSError, match="cannot launch"):
        run_registered(["/nonexistent/bin/job"], socket_path=server.path)


def test_run_registered_fails_before_launching_without_a_daemon(tmp_path):
    marker = tmp_path / "ran"
    with pytest.raises(DaemonUnreachable):
        run_registered(
            [sys.executable, "-c", f"open({str(marker)!r}, 'w')"],
            socket_path=str(tmp_path / "none.sock"),
        )
    assert not marker.exists()


def test_run_can_be_told_to_run_the_command_unmanaged_without_a_daemon(tmp_path):
    """`hidvfs run --if-no-daemon run`: a script that must run either way gets the command's
    own exit status and a warning that says why the daemon steered nothing."""
    from click.testing import CliRunner

    from tools.cli import cli

    marker = tmp_path / "ran"
    cmd = [sys.executable, "-c", f"open({str(marker)!r}, 'w'); raise SystemExit(3)"]
    r = run_registered(cmd, socket_path=str(tmp_path / "none.sock"), run_if_unreachable=True)
    assert marker.exists() and r["returncode"] == 3
    assert r["unmanaged"] is True and "no such socket" in r["unmanaged_reason"]
    marker.unlink()
    args = ["run", "--socket", str(tmp_path / "none.sock"), "--if-no-daemon", "run", "--"]
    out = CliRunner().invoke(cli, [*args, *cmd])
    assert out.exit_code == 3 and marker.exists()
    assert "is unmanaged: the daemon is unreachable: no such socket" in out.stderr
    assert out.stderr.count("unmanaged") == 1  # told once, at the start


def test_a_daemon_that_goes_away_before_the_registration(server, monkeypatch, tmp_path):
    """Reachable at the status, gone at the registration: by default the launched child is
    stopped and the error raised (it would run unsteered); opted in, it runs unmanaged."""

    def gone(self, *a, **k):
        raise DaemonUnreachable(server.path, "connection refused")

    monkeypatch.setattr(RegistryClient, "register", gone)
    marker = tmp_path / "done"
    cmd = [sys.executable, "-c", f"import time; time.sleep(1); open({str(marker)!r}, 'w')"]
    with pytest.raises(DaemonUnreachable):
        run_registered(cmd, socket_path=server.path)
    time.sleep(1.2)
    assert not marker.exists()  # stopped, not left running
    r = run_registered(cmd, socket_path=server.path, run_if_unreachable=True)
    assert marker.exists() and r["returncode"] == 0
    assert r["unmanaged_reason"] == "the daemon is unreachable: connection refused"


def test_run_warns_when_the_deadline_cannot_be_planned(server):
    """`hidvfs run --deadline` on a job the daemon has no reference profile for: it runs, and
    the user is told (at registration) how to measure one; with a profile, no warning."""
    from click.testing import CliRunner

    from platforms.observation import JobProfile
    from tools.cli import cli

    # long enough to be registered while it runs: one that ended first runs unmanaged, and
    # then there is no registration to warn at (a flake on a loaded machine)
    cmd = [sys.executable, "-c", "import time; time.sleep(0.5)"]
    args = ["run", "--socket", server.path, "--deadline", "5", "--name", "quick", "--json", "--"]
    r = CliRunner().invoke(cli, [*args, *cmd])
    assert r.exit_code == 0, r.output
    assert "no reference profile for 'quick'" in r.stderr
    assert "hidvfs profile measure --name quick" in r.stderr
    assert r.stdout == "" and run_json(r.stderr)["profile_version"] is None
    server.registry.profile_for = lambda name: JobProfile(name, 1.0, 0.2, 0.1, 0.5, 2035200, 4)
    r = CliRunner().invoke(cli, [*args, *cmd])
    assert r.exit_code == 0 and "warning" not in r.stderr
    assert r.stdout == "" and run_json(r.stderr)["profile_version"] == 1


#: tx2 at its top OPP: span 431 ms on denver (capacity 1.3), work 2 s on an a57
_HEAVY = ("heavy", 2.0, 0.5, 0.1, 1.0, 2035200, 4)


def _with_deadline_check(server):
    """The server's registry as the daemon wires it: tx2's profiles and DeadlineCheck."""
    from daemon.profiles import DeadlineCheck
    from platforms.observation import JobProfile
    from platforms.spec import load_board

    profiles = {
        "heavy": JobProfile(*_HEAVY),
        # a short span, much work: 613 ms on all six cores at their top, 1 s on the a57s
        "wide": JobProfile("wide", 4.0, 0.05, 0.1, 1.0, 2035200, 4),
    }
    server.registry.profile_for = profiles.get
    server.registry.deadline_check = DeadlineCheck(load_board("tx2"))
    return server


def _register_raw(path: str, pid: int, deadline_s, name: str) -> dict:
    req = {"op": "register", "pid": pid, "deadline_s": deadline_s, "criticality": "hi"}
    req["name"] = name
    (answer,) = raw(path, json.dumps(req).encode() + b"\n")
    return answer


def _infeasible_lines(caplog) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if "event=job_deadline_infeasible" in r.getMessage()
    ]


def test_a_deadline_no_operating_point_can_meet_is_told_at_registration(server, caplog):
    """A HI job whose deadline is below its span at the board's fastest point is registered
    (not refused), and the answer and the daemon's log say it, once; a feasible one gets no
    warning, nor does a job without a profile or a deadline."""
    _with_deadline_check(server)
    jobs = [
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]) for _ in "abcde"
    ]
    try:
        with caplog.at_level("INFO", logger="hidvfs.registry"):
            tight = _register_raw(server.path, jobs[0].pid, 0.05, "heavy")
            assert tight["ok"] is True and tight["job"]["pid"] == jobs[0].pid
            assert tight["warning"] == (
                "deadline 50 ms is below the job's span at the fastest point as the gate bounds "
                "it (431 ms on denver at 2035 MHz): the gate can plan no operating point for it"
            )
            assert _infeasible_lines(caplog) == [
                f"event=job_deadline_infeasible pid={jobs[0].pid} name=heavy criticality=hi "
                f"deadline_s=0.05 detail={json.dumps(tight['warning'])}"
            ]
            # its span fits, its work does not even on every core of the board
            wide = _register_raw(server.path, jobs[1].pid, 0.5, "wide")
            assert wide["ok"] is True
            assert wide["warning"] == (
                "deadline 500 ms is below the time the job's work takes on all 6 cores of the "
                "board at their fastest points as the gate bounds it (613 ms): the gate can plan "
                "no operating point for it"
            )
            caplog.clear()
            fine = _register_raw(server.path, jobs[2].pid, 5.0, "heavy")
            unprofiled = _register_raw(server.path, jobs[3].pid, 0.05, "unknown")
            no_deadline = _register_raw(server.path, jobs[4].pid, None, "heavy")
            for answer in (fine, unprofiled, no_deadline):
                assert answer["ok"] is True and "warning" not in answer, answer
            assert _infeasible_lines(caplog) == []
        assert len(server.registry.table) == 5  # every job was taken
        assert server.registry.table.get(jobs[0].pid).deadline_s == 0.05
    finally:
        for j in jobs:
            j.kill()
            j.wait()


def test_the_client_hands_back_the_warning_and_a_failing_check_costs_only_it(server):
    _with_deadline_check(server)
    client = RegistryClient(server.path)
    jobs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]) for _ in "ab"]
    try:
        job = client.register(jobs[0].pid, deadline_s=0.05, criticality="hi", name="heavy")
        assert (
            job["pid"] == jobs[0].pid
            and "the gate can plan no operating point for it" in job["warning"]
        )

        def broken(profile, deadline_s):
            raise ZeroDivisionError("bad profile")

        server.registry.deadline_check = broken
        job = client.register(jobs[1].pid, deadline_s=0.05, criticality="hi", name="heavy")
        assert job["pid"] == jobs[1].pid and "warning" not in job
    finally:
        for j in jobs:
            j.kill()
            j.wait()


def test_hidvfs_run_prints_the_daemons_warning_and_runs_the_command(server):
    """`hidvfs run` of a job the gate can plan no operating point for: the command runs, the warning is
    on stderr, the exit status is the command's; a feasible deadline prints none."""
    from click.testing import CliRunner

    from tools.cli import cli

    _with_deadline_check(server)
    cmd = [sys.executable, "-c", "import time; time.sleep(0.5); raise SystemExit(3)"]
    args = ["run", "--socket", server.path, "--criticality", "hi", "--name", "heavy", "--json"]
    r = CliRunner().invoke(cli, [*args, "--deadline", "0.05", "--", *cmd])
    assert r.exit_code == 3, r.output
    assert r.stderr.startswith(
        "hidvfs: warning: deadline 50 ms is below the job's span at the fastest point as the "
        "gate bounds it (431 ms on denver at 2035 MHz): the gate can plan no operating point "
        "for it\n{\n"
    )
    result = run_json(r.stderr)
    assert result["returncode"] == 3 and result["unmanaged"] is False
    # exit 3: it failed, so its deadline is not scored (neither met nor missed)
    assert result["deadline_met"] is None and result["failure"] == "exit 3"
    r = CliRunner().invoke(cli, [*args, "--deadline", "5", "--", *cmd])
    assert r.exit_code == 3 and r.stderr.startswith("{\n"), r.stderr  # no warning


def test_status_command_lists_the_jobs_and_the_adaptive_shield(sock_path):
    from click.testing import CliRunner

    from platforms.observation import JobProfile
    from tools.cli import cli

    status = {
        "board": "tx2",
        "backend": "live",
        "policy": "hidvfs",
        "t": 12.0,
        "ticks": 120,
        "freq_khz": {"a57": 2035200},
        "temp_c": {"BCPU-therm": 41.0},
        "energy_j": 30.0,
        "jobs_done": 1,
        "jobs_running": 2,
        "deadline_misses": {"hi": 0, "lo": 0},
        "interventions": 3,
        "shield": {"alpha": 0.1, "alpha_t": 0.1123, "updates": 40, "miss_rate": 0.075},
    }
    reg = JobRegistry(
        JobTable(),
        now=time.monotonic,
        alive=PROCS.alive,
        status_provider=lambda: status,
        profile_for=lambda name: (
            JobProfile(name, 1.0, 0.2, 0.1, 0.5, 2035200, 4) if name == "fib" else None
        ),
    )
    srv = RegistryServer(reg, sock_path, group=None).start()
    jobs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(20)"]) for _ in "ab"]
    try:
        reg.register(jobs[0].pid, deadline_s=5.0, name="fib")
        reg.register(jobs[1].pid, deadline_s=3.0, name="other")
        r = CliRunner().invoke(cli, ["status", "--socket", sock_path])
    finally:
        for j in jobs:
            j.kill()
        srv.stop()
    assert r.exit_code == 0, r.output
    assert "adaptive shield: alpha 0.1 -> 0.1123 after 40 bounds scored" in r.output
    assert f"job {jobs[0].pid} fib (lo)" in r.output and "profile v1" in r.output
    assert f"job {jobs[1].pid} other (lo)" in r.output and "no profile" in r.output


def test_a_command_that_ends_before_it_registers_still_reports_its_exit(server, monkeypatch):
    """`hidvfs run -- sh -c 'exit 3'`: the child can exit before the daemon sees it (a
    zombie counts as gone); its own exit status and makespan are the result, flagged
    unmanaged, not a registry error with status 2."""
    import daemon.client as client_mod

    real_spawn = client_mod.spawn

    def spawn_and_wait(cmd):
        proc = real_spawn(cmd)
        # make the race certain: the child has exited, a zombie not yet reaped
        os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
        return proc

    monkeypatch.setattr(client_mod, "spawn", spawn_and_wait)
    r = run_registered(["sh", "-c", "exit 3"], socket_path=server.path)
    assert r["returncode"] == 3 and r["unmanaged"] is True and r["makespan_s"] > 0
    assert len(server.registry.table) == 0


@pytest.mark.parametrize(
    "answer", [{}, None, {"board": "tx2", "freq_khz": {"a": "bad"}}, {"jobs": "x"}]
)
def test_status_of_an_answer_it_cannot_read_is_one_line(monkeypatch, answer):
    """A daemon of another version may answer a status this client cannot format: one clear
    line, no traceback."""
    from click.testing import CliRunner

    from tools.cli import cli

    monkeypatch.setattr(RegistryClient, "status", lambda self: answer)
    r = CliRunner().invoke(cli, ["status", "--socket", "/nonexistent.sock"])
    assert r.exit_code == 2, r.output
    assert "answered a status this hidvfs cannot read" in r.output
    assert "Traceback" not in r.output


def test_one_user_cannot_take_every_slot_and_root_always_has_room(sock_path):
    srv = RegistryServer(_reg(), sock_path, group=None, max_clients=8)

    class C:
        def __init__(self, uid, draining=False):
            self.peer_uid, self.draining = uid, draining

    srv._conns = {0: C(1000)}
    assert srv._refusal(1000) is None
    srv._conns[1] = C(1000)  # a quarter of 8: full
    assert "too many connections from uid 1000 (limit 2)" in srv._refusal(1000)
    assert srv._refusal(1001) is None  # another user still gets in
    srv._conns = {i: C(1000 + i) for i in range(8)}  # every slot taken by users
    assert "too many clients" in srv._refusal(1009)
    assert srv._refusal(0) is None  # the administrator's status still answers
    srv._conns |= {100 + i: C(5000, draining=True) for i in range(50)}  # refusals: not slots
    assert srv._refusal(0) is None


def test_only_the_registrant_or_the_owner_may_unregister_a_job():
    """A user of the socket group could drop another user's hi-criticality job (and its
    reservation)."""
    owners = {4242: 1234}
    reg = JobRegistry(now=lambda: 0.0, alive=lambda pid: True, pid_owner=owners.get)
    reg.register(4242, 100.0, "hi", "victim", peer_uid=1234)
    with pytest.raises(RequestError, match="registered by uid 1234; a client with uid 65534"):
        reg.unregister(4242, peer_uid=65534)
    assert reg.table.get(4242) is not None
    assert reg.unregister(4242, peer_uid=1234).name == "victim"
    reg.register(4242, None, "lo", "again", peer_uid=0)  # root registered it for the user
    assert reg.unregister(4242, peer_uid=1234).name == "again"  # the owner may drop it
    reg.register(4242, None, "lo", "third", peer_uid=1234)
    assert reg.unregister(4242, peer_uid=0).name == "third"  # and root may drop any


def test_a_line_after_an_oversized_one_in_the_same_write_is_answered(server):
    big = b'{"x": "' + b"a" * (MAX_LINE + 500) + b'"}\n'
    answers = raw(server.path, big + b'{"op": "status"}\n{"op": "status"}\n')
    assert [a["ok"] for a in answers] == [False, True, True]


def test_a_profile_store_filled_after_the_start_is_used():
    """An empty store is falsy; profiles measured after the daemon started must be found."""

    class Store:
        def __init__(self):
            self.profiles = {}

        def __len__(self):
            return len(self.profiles)

        def __call__(self, name):
            return self.profiles.get(name)

    store = Store()
    reg = JobRegistry(now=lambda: 0.0, alive=lambda pid: True, profile_for=store)
    prof = __import__("types").SimpleNamespace(version=3)
    store.profiles["fib"] = prof
    assert reg.register(77, 5.0, "lo", "fib").profile is prof


def test_run_registers_itself_as_the_adopter_of_what_the_job_leaves_behind(sock_path):
    """`hidvfs run` is a child subreaper while its command runs (and only then), and the
    daemon records it as the job's adopter: its parent, with its start time."""
    from platforms.liveprocs import adopts_orphans

    seen = []
    table = JobTable()
    reg = JobRegistry(
        table,
        now=time.monotonic,
        alive=PROCS.alive,
        pid_owner=PROCS.owner_uid,
        start_time=PROCS.start_time,
        parent_of=PROCS.parent,
    )
    srv = RegistryServer(reg, sock_path, group=None).start()
    try:
        r = run_registered(
            [sys.executable, "-c", "import time; time.sleep(0.3)"],
            socket_path=sock_path,
            on_registered=lambda job: seen.append((table.get(job["pid"]), adopts_orphans())),
        )
    finally:
        srv.stop()
    assert r["returncode"] == 0 and not r["unmanaged"]
    ((entry, adopting),) = seen
    assert adopting and entry.adopter == (os.getpid(), PROCS.start_time(os.getpid()))
    assert not adopts_orphans()  # put back as it was


def test_run_works_with_a_daemon_that_predates_the_adopter_field(server, monkeypatch):
    """An upgraded package before the daemon was restarted: the field is refused as
    unknown, and the job is registered without it."""
    import daemon.registry as registry

    old = tuple(f for f in registry.FIELDS["register"] if f != "adopter")
    monkeypatch.setitem(registry.FIELDS, "register", old)
    r = run_registered(
        [sys.executable, "-c", "import time; time.sleep(0.3)"], socket_path=server.path
    )
    assert r["returncode"] == 0 and not r["unmanaged"]


@pytest.mark.parametrize("name", [" ", " fib", "fib "])
def test_a_blank_or_space_padded_job_name_is_refused(name):
    """`hidvfs run --name ' '` was registered as ' ': a padded name never finds the profile
    stored without the spaces, and the store refuses it the same way."""
    from agents.deadlines import check_name
    from daemon.registry import RequestError, parse_request

    req = {"op": "register", "pid": os.getpid(), "name": name, "deadline_s": 1.0}
    with pytest.raises(RequestError, match="without leading or trailing spaces"):
        parse_request(json.dumps(req).encode())
    with pytest.raises(ValueError, match="without leading or trailing spaces"):
        check_name(name)
    ok = parse_request(json.dumps({**req, "name": "fib"}).encode())
    assert ok["name"] == "fib" and check_name("fib.test@clang") == "fib.test@clang"


# -- hidvfs run: stop signals, its own options, its exit status --------------------------------

#: a command that exits 0 on SIGTERM, SIGHUP or SIGINT, once it has said it is ready
_STOPPABLE = """
import signal, sys, time, pathlib
for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
    signal.signal(s, lambda *a: sys.exit(0))
pathlib.Path(sys.argv[1]).write_text("ready")
time.sleep(20)
"""

#: a command that ignores them, with a child that does too: only SIGKILL ends them
_STUBBORN = """
import os, signal, subprocess, sys, time, pathlib
for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
    signal.signal(s, signal.SIG_IGN)
child = subprocess.Popen(["sleep", "30"])
pathlib.Path(sys.argv[1]).write_text(str(child.pid))
time.sleep(30)
"""


def _hidvfs(*args: str, grace: float | None = None, **popen) -> subprocess.Popen:
    """``hidvfs ARGS`` as a process of its own session (no terminal: a SIGINT sent to it is
    not a Ctrl-C), optionally with a shorter stop grace."""
    code = "import daemon.client as c, sys; from tools.cli import cli\n"
    if grace is not None:
        code += f"c.STOP_GRACE_S = {grace}\n"
    code += "cli(sys.argv[1:], prog_name='hidvfs')"
    popen.setdefault("stdout", subprocess.PIPE)
    popen.setdefault("stderr", subprocess.PIPE)
    return subprocess.Popen(
        [sys.executable, "-c", code, *args], cwd=ROOT, start_new_session=True, text=True, **popen
    )


def _wait_until(what, cond, timeout: float = 20.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.02)


def _gone(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_stop_signal_is_passed_on_and_the_job_unregistered(server, tmp_path, sig):
    """SIGTERM/SIGHUP killed `hidvfs run` and left its command running, registered; a SIGINT
    sent to it alone was swallowed and the run reported exit 0. The command gets the signal,
    the job is unregistered, and the run exits 128 + signal whatever the command made of it."""
    ready = tmp_path / "ready"
    run = _hidvfs(
        "run", "--socket", server.path, "--json", "--", sys.executable, "-c", _STOPPABLE, str(ready)
    )
    try:
        _wait_until("the registration", lambda: len(server.registry.table) == 1 and ready.exists())
        (pid,) = [e.pid for e in server.registry.table.snapshot()]
        run.send_signal(sig)
        out, err = run.communicate(timeout=30)
    finally:
        run.kill()
    assert run.returncode == 128 + sig, err
    assert out == ""  # the command's stdout alone
    result = run_json(err)
    assert result["stopped_by"] == sig.name and result["returncode"] == 0  # its own exit 0
    assert len(server.registry.table) == 0 and _gone(pid)


def test_a_command_that_ignores_the_signal_is_killed_after_the_grace(server, tmp_path):
    """The stop is bounded: past the grace the command and what it started are SIGKILLed."""
    ready = tmp_path / "child"
    run = _hidvfs(
        "run", "--socket", server.path, "--json", "--", sys.executable, "-c", _STUBBORN, str(ready),
        grace=0.5,
    )  # fmt: skip
    try:
        _wait_until("the registration", lambda: len(server.registry.table) == 1 and ready.exists())
        (pid,) = [e.pid for e in server.registry.table.snapshot()]
        t0 = time.monotonic()
        run.send_signal(signal.SIGHUP)
        out, err = run.communicate(timeout=30)
    finally:
        run.kill()
    assert time.monotonic() - t0 < 10
    assert run.returncode == 129, err
    assert run_json(err)["signal"] == signal.SIGKILL
    assert _gone(pid) and _gone(int(ready.read_text()))
    assert len(server.registry.table) == 0


def test_a_ctrl_c_from_the_terminal_is_not_sent_twice(server, tmp_path):
    """Ctrl-C reaches the whole foreground group, the command included: `hidvfs run` does not
    pass it on again (a second SIGINT cut short what the command does on the first) and
    reports the command's own exit status."""
    import fcntl
    import termios

    ready = tmp_path / "ready"
    code = (
        "import pathlib, sys, time\n"
        "try:\n"
        f"    pathlib.Path({str(ready)!r}).write_text('ready'); time.sleep(20)\n"
        "except KeyboardInterrupt:\n"
        "    print('once', flush=True)\n"
        "    try:\n"
        "        time.sleep(1)\n"
        "    except KeyboardInterrupt:\n"
        "        print('twice', flush=True)\n"
    )
    master, slave = os.openpty()
    run = _hidvfs(
        "run", "--socket", server.path, "--", sys.executable, "-c", code,
        stdin=slave, stdout=slave, stderr=slave,
        preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0),
    )  # fmt: skip
    os.close(slave)
    try:
        _wait_until("the registration", lambda: len(server.registry.table) == 1 and ready.exists())
        os.write(master, b"\x03")
        assert run.wait(timeout=30) == 0
    finally:
        run.kill()
    out = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # EIO: the terminal's last user is gone
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    text = out.decode(errors="replace")
    assert "once" in text and "twice" not in text and "stopped by" not in text, text


def test_a_refused_command_that_ignores_sigterm_is_killed_not_awaited(
    server, tmp_path, monkeypatch
):
    """The daemon refused the job and the command ignored SIGTERM: `hidvfs run` waited for
    its whole run before it said so. It now waits the grace, then SIGKILLs it."""
    import daemon.client as client_mod

    ready = tmp_path / "child"

    def refuse(self, pid, **kw):
        _wait_until("the command", ready.exists)  # its SIGTERM is ignored by now
        raise RegistryError("register", "too many jobs")

    monkeypatch.setattr(client_mod, "STOP_GRACE_S", 0.5)
    monkeypatch.setattr(RegistryClient, "register", refuse)
    t0 = time.monotonic()
    with pytest.raises(RegistryError, match="too many jobs"):
        run_registered([sys.executable, "-c", _STUBBORN, str(ready)], socket_path=server.path)
    assert time.monotonic() - t0 < 10
    assert _gone(int(ready.read_text()))


def test_everything_after_the_command_is_the_commands(server, tmp_path):
    """Without `--`, options after CMD went to hidvfs (`--name foo --json` taken, `--help`
    printed hidvfs's help); a mistyped option of hidvfs run is a usage error, not a CMD."""
    from click.testing import CliRunner

    from tools.cli import cli

    seen = tmp_path / "argv"
    probe = f"import sys, pathlib; pathlib.Path({str(seen)!r}).write_text(repr(sys.argv[1:]))"
    args = ["run", "--socket", server.path, sys.executable, "-c", probe]
    r = CliRunner().invoke(cli, [*args, "a", "--name", "foo", "--json", "-v"])
    assert r.exit_code == 0, r.output
    assert seen.read_text() == repr(["a", "--name", "foo", "--json", "-v"])
    assert r.stderr.startswith(f"{os.path.basename(sys.executable)}: exit 0")  # not JSON
    r = CliRunner().invoke(cli, ["run", "--socket", server.path, "--deadline", "5", "sh", "--help"])
    assert "Usage: " not in r.output and "sh: exit" in r.output
    r = CliRunner().invoke(cli, ["run", "--socket", server.path, "--nmae", "x", "true"])
    assert r.exit_code == 2 and "No such option '--nmae'" in r.output


@pytest.mark.parametrize("closed", ["stdout", "stderr"])
def test_a_closed_stdout_does_not_hide_the_commands_exit_status(server, closed):
    """`hidvfs run -- sh -c 'sleep .5; exit 7' | true` exited 0: the broken pipe of its own
    report replaced the command's 7. The report is on stderr now: one closed there (`2>&-`
    into a pipe whose reader left) loses the report, not the status."""
    run = _hidvfs("run", "--socket", server.path, "--", "sh", "-c", "sleep .5; exit 7")
    gone, kept = (run.stdout, run.stderr) if closed == "stdout" else (run.stderr, run.stdout)
    gone.close()  # the reader is gone before the report is printed
    try:
        assert run.wait(timeout=30) == 7
        assert "Traceback" not in kept.read()
    finally:
        run.kill()
        kept.close()


@pytest.mark.parametrize(
    "answer", [{"ok": True, "status": [1, 2], "jobs": 7}, {"ok": True, "status": {}, "jobs": 7}]
)
def test_a_status_of_another_shape_is_one_line_not_a_traceback(sock_path, tmp_path, answer):
    """A daemon of another version answering with a list for the status (or a number for
    the jobs) crashed `hidvfs status` and `hidvfs run` with a TypeError."""
    from click.testing import CliRunner

    from tools.cli import cli

    os.makedirs(os.path.dirname(sock_path))
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(sock_path)
    listener.listen(8)
    listener.settimeout(0.2)
    done = threading.Event()

    def serve():
        while not done.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.recv(65536)
                conn.sendall(json.dumps(answer).encode() + b"\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    marker = tmp_path / "ran"
    try:
        r = CliRunner().invoke(cli, ["status", "--socket", sock_path])
        ran = CliRunner().invoke(
            cli, ["run", "--socket", sock_path, "--", "sh", "-c", f"touch {marker}"]
        )
    finally:
        done.set()
        thread.join(5)
        listener.close()
    for out in (r, ran):
        assert out.exit_code == 2, out.output
        assert "answered a status this hidvfs cannot read" in out.output
        assert len(out.output.strip().splitlines()) == 1  # one line, no traceback
    assert not marker.exists()


def test_the_measure_hint_quotes_the_name(server):
    """`--name 'a b/;$(id)'` was printed unquoted in the command to copy."""
    from click.testing import CliRunner

    from tools.cli import cli

    name = "a b/;$(id)"
    args = ["run", "--socket", server.path, "--deadline", "5", "--name", name, "--"]
    r = CliRunner().invoke(cli, [*args, sys.executable, "-c", "import time; time.sleep(0.5)"])
    assert r.exit_code == 0, r.output
    assert "measure --name 'a b/;$(id)' -- " in r.stderr
