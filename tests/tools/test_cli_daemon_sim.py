"""`hidvfs daemon --sim BOARD`: the status it prints, the config it reads, the flags it refuses."""

import json

from click.testing import CliRunner

from platforms.spec import load_board
from tools.cli import cli


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
