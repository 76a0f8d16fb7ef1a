"""CI without hardware: record a fake board, replay it through the real control loop, and check
the daemon's decisions."""

from click.testing import CliRunner

from platforms.clock import VirtualClock
from platforms.faketree import write_fake_tree
from platforms.spec import load_board
from platforms.sysfs import DirSysfs
from platforms.trace import read_trace, record
from tools.cli import cli
from tools.replay import replay_trace


def _record(tmp_path, board="tx2"):
    spec = load_board(board)
    root = tmp_path / "tree"
    writer = write_fake_tree(spec, root)
    temps = iter(range(40, 90, 2))

    def heat(_t):
        zone = next(z for z in spec.zones if z.role == "cpu")
        writer.set_temp(zone.type, float(next(temps, 90)))
        writer.advance_stat(busy=0.9)

    clock = VirtualClock(0.0, on_advance=heat)
    out = tmp_path / "t.jsonl.gz"
    n = record(DirSysfs(root), clock, str(out), period_s=0.1, duration_s=2.0, board=board)
    return out, n, spec


def test_replay_maxfreq_and_powersave_decisions(tmp_path):
    out, n, spec = _record(tmp_path)
    assert n == 20 and len(read_trace(out).samples) == 20
    top = replay_trace(str(out), "maxfreq")
    low = replay_trace(str(out), "powersave")
    for c in spec.clusters:
        sp = f"devices/system/cpu/cpufreq/policy{c.policy}/scaling_setspeed"
        assert (sp, str(c.fmax_khz)) in {(p, v) for _, p, v in top["writes"]}
        assert (sp, str(c.fmin_khz)) in {(p, v) for _, p, v in low["writes"]}
    assert top["ticks"] >= 19
    # Same trace, same policy: the same decisions.
    assert replay_trace(str(out), "maxfreq")["writes"] == top["writes"]


def test_trace_cli_info_and_replay_json(tmp_path):
    out, _, _ = _record(tmp_path)
    runner = CliRunner()
    r = runner.invoke(cli, ["trace", "info", str(out), "--json"])
    assert r.exit_code == 0, r.output
    assert '"board": "tx2"' in r.output
    r = runner.invoke(cli, ["trace", "replay", str(out), "--policy", "schedutil", "--json"])
    assert r.exit_code == 0, r.output


def test_corrupt_trace_is_a_clear_cli_error(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        '{"format": "hidvfs-trace", "version": 9, "board": "tx2", "period_s": 0.1, "started": "x", "files": []}\n'
    )
    r = CliRunner().invoke(cli, ["trace", "info", str(bad)])
    assert r.exit_code == 2 and "line 1" in r.output and "version 9" in r.output


def test_replay_honours_the_config_ceilings(tmp_path):
    """`daemon --replay --config`: the config's static ceilings hold in the replayed writes."""
    from daemon.config import parse_config

    out, _, spec = _record(tmp_path)
    a57 = spec.cluster("a57")
    cap = a57.freqs_khz[5]
    cfg = parse_config({"thermal": {"cap_khz": {"a57": cap}}})
    res = replay_trace(str(out), "maxfreq", config=cfg)
    sp = f"devices/system/cpu/cpufreq/policy{a57.policy}/scaling_setspeed"
    written = {int(v) for _, p, v in res["writes"] if p == sp}
    assert written and max(written) == cap
