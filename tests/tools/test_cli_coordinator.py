"""`hidvfs coordinator simulate|serve`: arguments checked up front, one-line errors, logging."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from tools.cli import cli

GOOD = "M1,1,j_1,1,Terminated,100,110,100,1\nR2_1,1,j_1,1,Terminated,110,120,100,1\n"


def run(*args):
    return CliRunner().invoke(cli, ["coordinator", *args])


@pytest.fixture
def trace(tmp_path):
    path = tmp_path / "batch_task.csv"
    path.write_text(GOOD)
    return str(path)


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--policy", ","], "names no policy"),
        (["--policy", "fifo,nope"], "known: all, higfrl"),
        (["--nodes", "tx2:cpus=nan"], "finite"),
        (["--nodes", "tx2:speed=inf"], "finite"),
    ],
)
def test_simulate_refuses_bad_arguments_before_reading_the_trace(tmp_path, args, needle):
    empty = tmp_path / "empty.csv"
    empty.write_text("")  # reading it would fail with "no usable job"
    r = run("simulate", "--trace", str(empty), *args)
    assert r.exit_code != 0 and needle in r.output and "Traceback" not in r.output
    assert "no usable job" not in r.output


def test_simulate_takes_policies_in_any_case(trace):
    r = run("simulate", "--trace", trace, "--policy", "FIFO,Heft", "--nodes", "tx2:2", "--json")
    assert r.exit_code == 0, r.output
    assert [row["policy"] for row in json.loads(r.output)] == ["fifo", "heft"]


def test_simulate_logs_the_trace_problems(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text(GOOD + "R3_1,1\n")  # truncated: its job is unknown
    r = run("simulate", "--trace", str(path), "--policy", "fifo", "--json")
    assert r.exit_code == 0
    assert "level=warning" in r.stderr and "2 of 9 columns" in r.stderr
    assert json.loads(r.stdout)[0]["dropped_rows"] == 1


@pytest.mark.parametrize("listen", ["127.0.0.1:99999", "[::1]:99999", "::1:80", "nohost"])
def test_serve_refuses_a_bad_listen_address_in_one_line(listen):
    r = run("serve", "--listen", listen)
    assert r.exit_code != 0 and r.output.startswith("hidvfs: error: --listen")
    assert "Traceback" not in r.output and len(r.output.strip().splitlines()) == 1


def test_serve_refuses_an_unknown_board_in_one_line():
    # 192.0.2.1 (TEST-NET) cannot be bound: were the board not refused first, serve would stop
    # at the bind with another message, never serve forever
    r = run("serve", "--listen", "192.0.2.1:0", "--nodes", "a=orin_nx@http://127.0.0.1:1/s")
    assert r.exit_code != 0 and "unknown board 'orin_nx'" in r.output
    assert len(r.output.strip().splitlines()) == 1
