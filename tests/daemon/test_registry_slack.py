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
    out = json.loads(r.stdout)
    assert out["deadline_s"] == pytest.approx(2.5 * 0.8) and out["profile_version"] == 1
    assert out["deadline_met"] is True and out["unmanaged"] is False
    text = CliRunner().invoke(cli, [*args[:-2], "--", *CMD]).output
    assert "(deadline 2.000 s met)" in text


def test_a_job_without_a_profile_is_refused_and_its_command_stopped(server, tmp_path):  # noqa: F811
    server.registry.profile_for = {"fib": FIB}.get
    marker = tmp_path / "ran-to-the-end"
    cmd = [sys.executable, "-c", f"import time; time.sleep(1); open({str(marker)!r}, 'w')"]
    r = CliRunner().invoke(
        cli, ["run", "--socket", server.path, "--name", "sort", "--slack", "1.5", "--", *cmd]
    )
    assert r.exit_code == 2
    assert "no reference profile for 'sort'" in r.output and "profile measure" in r.output
    assert not marker.exists()
    assert len(server.registry.table) == 0


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
