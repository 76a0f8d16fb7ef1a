"""`hidvfs run --slack S`: the soft deadline is S x the job's reference makespan, from the
profile stored under its name (the mission's "soft deadlines from a measured reference
cost"); a name without a profile, a slack below 1 or with a deadline too, is refused."""

from __future__ import annotations

import json
import sys

import pytest
from click.testing import CliRunner

from daemon.registry import RequestError, parse_request
from platforms.observation import JobProfile
from tests.daemon.test_registry import server, sock_path  # noqa: F401 - fixtures
from tools.cli import cli

FIB = JobProfile("fib", 1.0, 0.2, 0.1, 0.8, 2035200, 4)  # reference makespan 0.8 s
CMD = [sys.executable, "-c", "import time; time.sleep(0.5)"]


def _req(**kw) -> bytes:
    return json.dumps({"op": "register", "pid": 1234, **kw}).encode()


@pytest.mark.parametrize(
    "fields, needle",
    [
        ({"slack": 0.9}, "field 'slack' must be a number from 1 to 1000"),
        ({"slack": float("inf")}, "field 'slack'"),
        ({"slack": True}, "field 'slack'"),
        ({"slack": "2"}, "field 'slack'"),
        ({"slack": 1.5, "deadline_s": 2.0}, "give 'deadline_s' or 'slack', not both"),
    ],
)
def test_a_bad_slack_is_refused_naming_it(fields, needle):
    with pytest.raises(RequestError, match=needle):
        parse_request(_req(**fields))


def test_the_deadline_is_slack_times_the_reference_makespan(server):  # noqa: F811
    server.registry.profile_for = {"fib": FIB}.get
    args = ["run", "--socket", server.path, "--name", "fib", "--slack", "2.5", "--json", "--"]
    r = CliRunner().invoke(cli, [*args, *CMD])
    assert r.exit_code == 0, r.output
    assert r.stdout == ""  # the report is on stderr: stdout is the command's
    out = json.loads(r.stderr)
    assert out["deadline_s"] == pytest.approx(2.5 * 0.8) and out["profile_version"] == 1
    assert out["deadline_met"] is True and out["unmanaged"] is False
    text = CliRunner().invoke(cli, [*args[:-2], "--", *CMD]).output
    assert "(deadline 2.000 s met)" in text


def test_a_job_without_a_profile_is_refused_before_its_command_starts(server, tmp_path):  # noqa: F811
    server.registry.profile_for = {"fib": FIB}.get
    marker = tmp_path / "started"
    cmd = [sys.executable, "-c", f"open({str(marker)!r}, 'w'); import time; time.sleep(1)"]
    r = CliRunner().invoke(
        cli, ["run", "--socket", server.path, "--name", "sort", "--slack", "1.5", "--", *cmd]
    )
    assert r.exit_code == 2
    assert "no reference profile for 'sort'" in r.output and "profile measure" in r.output
    assert "--deadline" in r.output
    assert not marker.exists()  # asked first (op 'profile'): nothing was launched
    assert len(server.registry.table) == 0


def test_a_daemon_that_cannot_be_asked_first_still_refuses_at_the_registration(
    server,  # noqa: F811
    tmp_path,
    monkeypatch,
):
    """A daemon from before the 'profile' op: the command starts, is refused and stopped."""
    from daemon.client import RegistryClient, RegistryError

    def old_daemon(self, name):
        raise RegistryError("profile", "unknown op 'profile'; known ops: register, unregister")

    monkeypatch.setattr(RegistryClient, "profile", old_daemon)
    server.registry.profile_for = {"fib": FIB}.get
    marker = tmp_path / "ran-to-the-end"
    cmd = [sys.executable, "-c", f"import time; time.sleep(1); open({str(marker)!r}, 'w')"]
    r = CliRunner().invoke(
        cli, ["run", "--socket", server.path, "--name", "sort", "--slack", "1.5", "--", *cmd]
    )
    assert r.exit_code == 2 and "no reference profile for 'sort'" in r.output
    assert not marker.exists() and len(server.registry.table) == 0


def test_the_profile_op_answers_what_a_registration_would_get(server):  # noqa: F811
    from daemon.client import RegistryClient

    server.registry.profile_for = {"fib": FIB}.get
    client = RegistryClient(server.path)
    assert client.profile("fib") == {"version": 1, "ref_makespan_s": 0.8}
    assert client.profile("sort") is None
    with pytest.raises(RequestError, match="field 'name'"):
        parse_request(json.dumps({"op": "profile", "name": ""}).encode())


def test_deadline_and_slack_together_are_refused_before_anything_runs(tmp_path):
    marker = tmp_path / "ran"
    cmd = [sys.executable, "-c", f"open({str(marker)!r}, 'w')"]
    r = CliRunner().invoke(
        cli,
        [
            "run",
            "--socket",
            str(tmp_path / "none.sock"),
            "--deadline",
            "1",
            "--slack",
            "2",
            "--",
            *cmd,
        ],
    )
    assert r.exit_code == 2 and "--deadline or --slack, not both" in r.output
    assert not marker.exists()
