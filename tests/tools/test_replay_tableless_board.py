"""`trace replay --check` of a daemon recording from a board hidvfs does not ship whose cpufreq
driver has no frequency table (intel_pstate, amd-pstate, cppc: no
scaling_available_frequencies). The daemon synthesizes its grid from cpuinfo_min_freq and
cpuinfo_max_freq, read only at its start, before the recorder exists; the recorder puts every
header file the daemon did not read into the first sample, so the replay probes the board as
the daemon did. An older recording without those values says which files it lacks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from daemon.service import run_live
from platforms import paths
from platforms.clock import VirtualClock
from platforms.faketree import write_fake_tree
from platforms.spec import load_board
from platforms.sysfs import DirSysfs
from platforms.trace import TickRecorder, read_trace, record
from tools.cli import cli
from tools.replay import replay_trace

_CPUINFO = ("cpuinfo_min_freq", "cpuinfo_max_freq")


@pytest.fixture
def tableless(tmp_path) -> tuple[Path, list[int]]:
    """A TX2 tree that neither names its board (no device tree) nor has a frequency table."""
    spec = load_board("tx2")
    tree = tmp_path / "tree"
    write_fake_tree(spec, tree)
    for dt in (paths.DT_COMPATIBLE, paths.DT_MODEL, paths.DT_DTSFILENAME):
        (tree / dt).unlink(missing_ok=True)
    policies = [c.policy for c in spec.clusters]
    for p in policies:
        (tree / paths.policy_file(p, "scaling_available_frequencies")).unlink()
    return tree, policies


def _record_daemon(tree: Path, tmp_path: Path) -> Path:
    state = tmp_path / "state"
    state.mkdir()
    out = tmp_path / "rec.jsonl"
    run_live(
        sysfs_root=str(tree),
        policy="maxfreq",
        period_ms=100,
        state_dir=str(state),
        socket_path=str(state / "s.sock"),
        duration_s=0.5,
        record=str(out),
    )
    return out


def _cpuinfo_files(policies: list[int]) -> set[str]:
    return {paths.policy_file(p, n) for p in policies for n in _CPUINFO}


def test_a_daemon_recording_of_a_table_less_board_replays_identically(tableless, tmp_path):
    tree, policies = tableless
    out = _record_daemon(tree, tmp_path)
    tr = read_trace(out)
    assert tr.header.board == "unknown" and len(tr.samples) >= 3
    # the first sample holds every header file, with the board's value
    first, later = tr.samples[0], tr.samples[1:]
    assert set(tr.header.files) <= set(first.r)
    for path in _cpuinfo_files(policies):
        assert first.r[path] == (tree / path).read_text().strip()
    # later samples hold what the daemon read on their tick only: no cpuinfo bounds
    assert all(not _cpuinfo_files(policies) & set(s.r) for s in later)
    assert all(len(s.r) < len(tr.header.files) for s in later)

    r = CliRunner().invoke(cli, ["trace", "replay", str(out), "--check"])
    assert r.exit_code == 0, r.output
    res = replay_trace(str(out), None)
    assert res["recorded_writes"] > 0
    assert res["matching_writes"] == res["recorded_writes"] and not res["mismatches"]
    assert not res["unchecked"]


def test_an_older_recording_says_which_header_files_it_has_no_value_of(tableless, tmp_path):
    """A recording of the hidvfs before: the cpuinfo bounds in the header, in no sample. The
    replay controls no policy and says why, naming the files."""
    tree, policies = tableless
    out = _record_daemon(tree, tmp_path)
    cpuinfo = _cpuinfo_files(policies)
    old = tmp_path / "old.jsonl"
    with open(out) as src, open(old, "w") as dst:
        for i, line in enumerate(src):
            obj = json.loads(line)
            if i > 0:  # every sample (line 0 is the header)
                obj["r"] = {p: v for p, v in obj["r"].items() if p not in cpuinfo}
            dst.write(json.dumps(obj) + "\n")
    res = replay_trace(str(old), None)
    assert res["recorded_writes"] > 0 and res["matching_writes"] == 0
    [note] = [n for n in res["unchecked"] if "cannot be described" in n]
    assert ", ".join(f"policy{p}" for p in sorted(policies)) in note
    assert all(path in note for path in cpuinfo)
    r = CliRunner().invoke(cli, ["trace", "replay", str(old), "--check"])
    assert r.exit_code == 1 and "writes differ" in r.output


def test_a_trace_record_trace_holds_every_header_file_in_every_sample(tableless, tmp_path):
    """`trace record` reads all its files on each sample: the cpuinfo bounds are there."""
    tree, policies = tableless
    sysfs = DirSysfs(tree)
    out = tmp_path / "board.jsonl"
    record(sysfs, VirtualClock(0.0), out, period_s=0.1, duration_s=0.3, board="unknown")
    tr = read_trace(out)
    assert len(tr.samples) == 3
    assert all(set(s.r) == set(tr.header.files) for s in tr.samples)
    assert _cpuinfo_files(policies) <= set(tr.header.files)


def test_the_recorder_fills_the_first_sample_only_and_keeps_what_the_daemon_read(
    tableless, tmp_path
):
    tree, policies = tableless
    clock = VirtualClock(0.0)
    rec = TickRecorder(
        DirSysfs(tree), clock, tmp_path / "r.jsonl", board="unknown", period_s=0.1, policy="x"
    )
    governor = paths.policy_file(policies[0], "scaling_governor")
    cpuinfo = paths.policy_file(policies[0], "cpuinfo_max_freq")
    assert rec.sysfs.read(governor) == "schedutil"
    (tree / governor).write_text("userspace\n")  # what the daemon read stays what it read
    rec.sample(0.0)
    rec.sysfs.read(governor)
    rec.sample(0.1)
    rec.close()
    first, second = read_trace(tmp_path / "r.jsonl").samples
    assert first.r[governor] == "schedutil" and cpuinfo in first.r
    assert set(first.r) == set(read_trace(tmp_path / "r.jsonl").header.files)
    assert second.r == {governor: "userspace"}
