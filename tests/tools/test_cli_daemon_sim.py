"""`hidvfs daemon --sim BOARD`: the status it prints, the config it reads, the flags it refuses."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from platforms.spec import load_board
from tools.cli import cli

ROOT = Path(__file__).resolve().parents[2]


def run(*args):
    return CliRunner().invoke(cli, ["daemon", *args])


def test_sim_daemon_prints_its_status(tmp_path):
    status_file = tmp_path / "st.json"
    r = run("--sim", "tx2", "--duration", "3", "--status-file", str(status_file), "--json")
    assert r.exit_code == 0, r.output
    st = json.loads(r.output)
    assert st["board"] == "tx2" and st["backend"] == "sim" and st["policy"] == "hidvfs"
    assert st["ticks"] == 60  # 3 s at the simulator's 50 ms default
    assert json.loads(status_file.read_text())["ticks"] == st["ticks"]


def test_sim_daemon_takes_policy_period_and_caps_from_the_config(tmp_path):
    a57 = load_board("tx2").cluster("a57")
    cap = a57.freqs_khz[6]
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"policy: maxfreq\nperiod_ms: 100\nthermal: {{cap_khz: {{a57: {cap + 1}}}}}\n")
    r = run("--sim", "tx2", "--duration", "2", "--config", str(cfg), "--json")
    assert r.exit_code == 0, r.output
    st = json.loads(r.output)
    assert st["policy"] == "maxfreq" and st["ticks"] == 20
    assert st["freq_khz"]["a57"] == cap  # maxfreq wants the top; the ceiling wins
    assert st["freq_khz"]["denver"] == load_board("tx2").cluster("denver").fmax_khz
    # a flag still beats the config
    r = run("--sim", "tx2", "--duration", "1", "--config", str(cfg), "--policy", "powersave")
    assert r.exit_code == 0 and "policy powersave" in r.output


def test_sim_daemon_refuses_a_bad_config_and_board_only_flags(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("period_ms: fast\n")
    r = run("--sim", "tx2", "--duration", "1", "--config", str(cfg))
    assert r.exit_code != 0 and "period_ms" in r.output
    cfg.write_text("thermal: {cap_khz: {big: 1000000}}\n")
    r = run("--sim", "tx2", "--duration", "1", "--config", str(cfg))
    assert r.exit_code != 0 and "thermal.cap_khz.big" in r.output and "a57, denver" in r.output
    r = run("--sim", "tx2", "--duration", "1", "--dry-run", "--state-dir", str(tmp_path))
    assert r.exit_code != 0 and "--state-dir, --dry-run" in r.output


def _signalled_sim_daemon(tmp_path, sig, *extra):
    """`daemon --sim tx2` for far longer than the test, sent ``sig`` once its loop runs."""
    status_file = tmp_path / "st.json"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tools.cli",
            "daemon",
            "--sim",
            "tx2",
            "--duration",
            "20000",
            "--status-file",
            str(status_file),
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        end = time.monotonic() + 60
        while not status_file.exists():  # written from the loop: the run has begun
            assert proc.poll() is None and time.monotonic() < end, proc.stderr.read()
            time.sleep(0.05)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, out, err, status_file


@pytest.mark.parametrize(
    "sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name
)
def test_a_signal_stops_the_sim_daemon_with_its_summary_and_exit_0(tmp_path, sig):
    """As the board daemon does: Ctrl-C, a kill or a closed terminal end the run (not
    click's 'Aborted!' rc 1, nor a death by SIGTERM), with the summary of the run so far."""
    rc, out, err, status_file = _signalled_sim_daemon(tmp_path, sig, "--json")
    assert rc == 0, err
    st = json.loads(out)
    assert st["board"] == "tx2" and st["backend"] == "sim" and 0 < st["t"] < 20000
    assert json.loads(status_file.read_text())["ticks"] == st["ticks"]  # the final status
    assert f"hidvfs: {sig.name}: stopped at t=" in err and "Aborted" not in err


def test_the_sim_daemon_text_summary_after_a_signal_is_the_usual_one(tmp_path):
    rc, out, err, _ = _signalled_sim_daemon(tmp_path, signal.SIGINT)
    assert rc == 0, err
    assert out.startswith("board tx2 (sim), policy hidvfs: t=") and "jobs done" in out


def test_a_malformed_config_is_one_line_naming_line_and_column(tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("period_ms: 100\npolicy: [a, b\n")
    r = run("--sim", "tx2", "--duration", "1", "--config", str(cfg))
    assert r.exit_code == 2
    assert r.output == (
        f"hidvfs: error: {cfg}: line 3, column 1: not valid YAML: expected ',' or ']', but got "
        "'<stream end>' (while parsing a flow sequence started at line 2, column 9)\n"
    )


def _must_not_run(*args, **kwargs):
    raise AssertionError("the run started")


def test_a_sim_duration_past_the_bound_is_a_usage_error(monkeypatch):
    """The whole workload is built before the run: 5e6 s took seconds and hundreds of MB,
    deaf to SIGTERM, and 1e9 ended in MemoryError."""
    from tools import simdaemon

    monkeypatch.setattr(simdaemon, "run_sim_daemon", _must_not_run)
    top = simdaemon.MAX_SIM_DURATION_S
    for duration in (f"{top + 1:g}", "5000000", "1e9"):
        r = run("--sim", "tx2", "--duration", duration)
        assert r.exit_code == 2, r.output
        assert "--duration" in r.output and f"{top:g}" in r.output
        assert "Traceback" not in r.output and "run started" not in r.output


def test_run_sim_daemon_refuses_a_duration_past_the_bound():
    from tools.simdaemon import MAX_SIM_DURATION_S, run_sim_daemon

    with pytest.raises(ValueError, match="at most"):
        run_sim_daemon(
            "tx2",
            "schedutil",
            period_ms=50,
            duration_s=MAX_SIM_DURATION_S + 1,
            status_file=None,
            seed=0,
            load=1.0,
        )


def test_the_largest_sim_duration_builds_its_workload_quickly():
    """The bound keeps the up-front workload build short even at the top load. Its time and
    memory go with the number of jobs, which share their DAGs and profiles: checked here by
    counting, the build's speed is not timed (a day at the top load is 55k jobs, well under
    a second; a week, 387k jobs, took 2-3 s and 190 MB)."""
    from bots_bench.workload import DAG_POOL, WorkloadSpec, default_items
    from tools.simdaemon import MAX_SIM_DURATION_S

    spec = load_board("rubikpi3")  # the most jobs per second of the shipped boards
    w = WorkloadSpec(duration_s=MAX_SIM_DURATION_S, load=3.0)  # the top --load
    items = default_items(spec, 0, w)
    jobs = len(items)
    assert 0 < jobs < 100_000  # two days at the top load would pass it
    assert len({id(job.dag) for job, _ in items}) <= DAG_POOL * len(w.kernels)
    assert len({id(profile) for _, profile in items}) <= len(w.kernels)


def test_a_sim_status_file_that_cannot_be_written_is_refused_before_the_run(tmp_path, monkeypatch):
    """It failed at the first write, after the workload build, with a bare errno line."""
    from tools import simdaemon

    monkeypatch.setattr(simdaemon, "run_sim_daemon", _must_not_run)
    blocker = tmp_path / "afile"
    blocker.write_text("")
    r = run("--sim", "tx2", "--duration", "1", "--status-file", str(blocker / "st.json"))
    assert r.exit_code == 2, r.output
    assert r.output == (
        f"hidvfs: error: --status-file {blocker / 'st.json'}: its folder {blocker} cannot be "
        f"made ({blocker} is a file, not a folder); choose another --status-file\n"
    )


@pytest.mark.parametrize("flag", ["--sim", "--policy", "--config", "--status-file", "--record"])
def test_an_empty_option_is_refused_not_read_as_left_out(flag, tmp_path):
    """`--sim "$BOARD"` with BOARD unset ran the daemon on the real board (or the default
    tree), `--policy ''` the default policy: an empty value is a mistake, said as one."""
    args = ["--sim", "tx2", "--duration", "0.2"] if flag != "--sim" else ["--duration", "0.2"]
    r = run(*args, flag, "")
    assert r.exit_code == 2
    assert f"Invalid value for '{flag}': empty" in r.output


def test_an_output_that_is_an_input_or_inside_the_tree_is_refused(tmp_path):
    """`--status-file c.yaml --config c.yaml` replaced the config with status JSON; a status
    file or record inside the driven tree would be written among its sysfs files."""
    from platforms.faketree import write_fake_tree

    cfg = tmp_path / "c.yaml"
    cfg.write_text("period_ms: 100\n")
    r = run("--sim", "tx2", "--duration", "0.2", "--config", str(cfg), "--status-file", str(cfg))
    assert r.exit_code == 2 and "is also --config" in r.output
    assert cfg.read_text() == "period_ms: 100\n"
    tree = tmp_path / "tree"
    write_fake_tree(load_board("tx2"), tree)
    inside = tree / "devices" / "st.json"
    state = tmp_path / "st"
    r = run(
        "--sysfs-root", str(tree), "--state-dir", str(state), "--socket", str(state / "s"),
        "--duration", "0.2", "--status-file", str(inside),
    )  # fmt: skip
    assert r.exit_code == 2 and "is inside the tree" in r.output
    assert not inside.exists() and not state.exists()  # refused before anything ran
    r = run("--sim", "tx2", "--duration", "0.2", "--status-file", str(tmp_path / "a.json"),
            "--seed", "-1")  # fmt: skip
    assert r.exit_code == 2 and "'--seed': -1 is not in the range" in r.output


def test_status_and_run_refuse_an_empty_socket_path():
    """`--socket ''` said "...at : Invalid argument; is it running?"."""
    for args in (["status", "--socket", ""], ["run", "--socket", "", "--", "true"]):
        r = CliRunner().invoke(cli, args)
        assert r.exit_code == 2 and "Invalid value for '--socket': empty" in r.output, r.output


def test_a_run_stopped_before_its_first_tick_says_so(capsys):
    """A signal while `--sim` built its workload printed t=0.0s ticks=0, an empty frequency
    list and `hottest zone: None C`."""
    from tools.cmd_daemon import _print_status

    status = {
        "board": "tx2",
        "backend": "sim",
        "policy": "hidvfs",
        "t": 0.0,
        "ticks": 0,
        "freq_khz": {},
        "temp_c": {},
        "jobs_done": 0,
        "jobs_running": 0,
        "deadline_misses": {"hi": 0, "lo": 0},
        "interventions": 0,
    }
    _print_status(status)
    out = capsys.readouterr().out
    assert out == "board tx2 (sim), policy hidvfs: stopped before its first tick; nothing ran\n"
    _print_status(status | {"ticks": 3, "t": 0.15, "freq_khz": {"a57": 2035200}})
    assert "frequencies: a57 2035 MHz" in capsys.readouterr().out
