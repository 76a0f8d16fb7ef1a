"""`trace record` refuses a tree with nothing to record and an --out it cannot or must not
write; a replay refuses a trace whose header names a board its recording is not."""

import os

import pytest
from click.testing import CliRunner

from platforms.clock import VirtualClock
from platforms.faketree import write_fake_tree
from platforms.spec import load_board
from platforms.sysfs import DirSysfs
from platforms.trace import TraceWriter, read_trace, record
from tools.cli import cli

GOV = "devices/system/cpu/cpufreq/policy0/scaling_governor"


def hv(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.fixture
def tree(tmp_path):
    write_fake_tree(load_board("tx2"), tmp_path / "tree")
    return tmp_path / "tree"


def _record_cli(root, out, *extra):
    return hv("trace", "record", "--sysfs-root", root, "--out", out, "--duration", "0.2", *extra)


# -- 1. a tree with no cpufreq policy ---------------------------------------------------------


def test_record_refuses_a_tree_without_a_cpufreq_policy(tmp_path, tree):
    """An empty folder, or a subfolder of a board's tree, recorded as `board unknown` with no
    files, and the replay of it ran 0 writes (the daemon refuses the same root)."""
    (tmp_path / "empty").mkdir()
    for root in (tmp_path / "empty", tree / "devices"):
        out = tmp_path / "e.jsonl"
        r = _record_cli(root, out)
        assert r.exit_code == 2, r.output
        assert f"--sysfs-root {root}: no cpufreq policy found under" in r.output
        assert "Errno" not in r.output and not out.exists()


# -- 2. an --out that cannot be written -------------------------------------------------------


def test_record_makes_a_missing_out_folder_and_says_when_the_path_is_empty(tmp_path, tree):
    """A missing folder is made (0o755) and the trace recorded, as every output option
    does; it used to be refused."""
    missing = tmp_path / "nodir" / "sub" / "x.jsonl"
    r = _record_cli(tree, missing)
    assert r.exit_code == 0, r.output
    assert "recorded 2 samples of board tx2" in r.output and missing.is_file()
    assert os.stat(tmp_path / "nodir" / "sub").st_mode & 0o777 == 0o755 & ~_umask()
    assert [p.name for p in missing.parent.iterdir()] == ["x.jsonl"]  # no probe file left
    r = _record_cli(tree, "")
    assert r.exit_code == 2 and "--out: empty path" in r.output and "Errno" not in r.output


def test_record_refuses_an_out_whose_folder_a_file_blocks_before_recording(tmp_path, tree):
    blocker = tmp_path / "afile"
    blocker.write_text("")
    out = blocker / "sub" / "x.jsonl"
    r = _record_cli(tree, out)
    assert r.exit_code == 2
    assert r.output == (
        f"hidvfs: error: --out {out}: its folder {blocker / 'sub'} cannot be made ({blocker} "
        "is a file, not a folder); choose another --out\n"
    )
    assert blocker.read_text() == "" and sorted(os.listdir(tmp_path)) == ["afile", "tree"]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# -- 3. an --out inside the tree it records ---------------------------------------------------


def test_record_refuses_an_out_inside_the_tree_it_records(tmp_path, tree):
    """A trace written over a board file (or beside them) would clobber the tree it samples;
    real paths are compared, so a symlink into the tree is inside it."""
    before = (tree / GOV).read_text()
    (tmp_path / "link").symlink_to(tree)
    for out in (tree / GOV, tree / "t.jsonl", tmp_path / "link" / "t.jsonl"):
        r = _record_cli(tree, out)
        assert r.exit_code == 2, r.output
        assert f"--out {out} is inside the tree it records ({os.path.realpath(tree)})" in r.output
    assert (tree / GOV).read_text() == before and not (tree / "t.jsonl").exists()
    ok = _record_cli(tree, tmp_path / "t.jsonl")
    assert ok.exit_code == 0, ok.output
    assert "recorded 2 samples of board tx2" in ok.output


# -- 4. a header board that is not the recording's --------------------------------------------


def _trace(tmp_path, root, name="t.jsonl", board="tx2"):
    out = tmp_path / name
    record(DirSysfs(root), VirtualClock(0.0), str(out), period_s=0.1, duration_s=0.5, board=board)
    return out


def _with_board(src, dst, board):
    """``src`` with its header's board edited by hand."""
    tr = read_trace(src)
    tr.header.board = board
    with TraceWriter(dst, tr.header) as w:
        for s in tr.samples:
            w.write_sample(s.t, s.r, s.w)
    return dst


def test_replay_refuses_a_header_board_its_recorded_files_are_not(tmp_path, tree):
    """A tx2 trace with `orin-nx` in its header replayed with actuation errors on policy4."""
    edited = _with_board(_trace(tmp_path, tree), tmp_path / "o.jsonl", "orin-nx")
    for cmd in (["trace", "replay"], ["daemon", "--replay"]):
        r = hv(*cmd, edited)
        assert r.exit_code == 2, r.output
        assert f"{edited}: line 1: header board 'orin-nx'" in r.output
        assert "detected as 'tx2'" in r.output and "actuation" not in r.output
    assert hv("trace", "info", edited).exit_code == 0  # still shown as it is


def test_a_header_board_that_is_not_shipped_replays_from_the_recording_and_says_so(
    tmp_path, tree, caplog
):
    """`bogus` was replayed quietly as the board its recording describes. A daemon run with a
    board spec file records that spec's name, so such a trace is not refused: the replay
    describes the board from the recording and warns that it did."""
    edited = _with_board(_trace(tmp_path, tree), tmp_path / "b.jsonl", "bogus")
    for cmd in (["trace", "replay"], ["daemon", "--replay"]):
        caplog.clear()
        r = hv(*cmd, edited)
        assert r.exit_code == 0, (cmd, r.output)
        assert "header board 'bogus' is not a shipped board" in caplog.text
        assert "described from the recording" in caplog.text
    assert hv("trace", "info", edited).exit_code == 0


def test_traces_of_an_unknown_board_still_replay(tmp_path, tree):
    """A board no spec matches (its device tree says nothing known) is recorded as `unknown`
    and replayed on the topology probed from the recording; a null header board too."""
    for name in ("model", "compatible"):
        (tree / "proc" / "device-tree" / name).write_text("Acme Board\x00")
    out = tmp_path / "u.jsonl"
    r = _record_cli(tree, out)
    assert r.exit_code == 0 and "board unknown" in r.output, r.output
    assert read_trace(out).header.board == "unknown"
    null = _with_board(out, tmp_path / "n.jsonl", None)
    for trace in (out, null):
        r = hv("trace", "replay", trace)
        assert r.exit_code == 0 and "ticks of unknown" in r.output, r.output
        assert hv("trace", "info", trace).exit_code == 0


def test_a_shipped_header_board_is_trusted_when_the_recording_names_none(tmp_path, tree):
    """A trace without the device-tree files (a hand-made fixture) keeps its header's board."""
    import shutil

    shutil.rmtree(tree / "proc" / "device-tree")
    out = _trace(tmp_path, tree)
    r = hv("trace", "replay", out)
    assert r.exit_code == 0 and "ticks of tx2" in r.output, r.output


# -- a recording slower than its period ---------------------------------------------------------


def test_record_says_when_reading_the_tree_outran_the_period(tmp_path, tree, monkeypatch):
    """A 2 ms period on a tree that takes longer to read recorded a fraction of the samples
    asked, at another spacing, and the summary said only how many it wrote."""
    import time

    slow_read = DirSysfs.read_or

    def read_or(self, path, fallback=None):
        time.sleep(0.0005)
        return slow_read(self, path, fallback)

    monkeypatch.setattr(DirSysfs, "read_or", read_or)
    r = _record_cli(tree, tmp_path / "t.jsonl", "--period-ms", "2")
    assert r.exit_code == 0, r.output
    n = len(read_trace(tmp_path / "t.jsonl").samples)
    assert n < 50
    assert f"recorded {n} samples" in r.output
    assert f"{100 - n} of the 100 sample times of a 2 ms period were skipped" in r.output
    assert "ms apart on average (a longer --period-ms samples evenly)" in r.output
    monkeypatch.setattr(DirSysfs, "read_or", slow_read)
    r = _record_cli(tree, tmp_path / "u.jsonl", "--period-ms", "50")
    assert r.exit_code == 0 and "skipped" not in r.output


@pytest.mark.parametrize(
    "n, last_t, duration, period_ms, said",
    [
        (100, 0.99, 1.0, 10, ""),  # every grid point
        (91, 0.99, 1.0, 10, ""),  # a tenth skipped at most: not worth a line
        (50, 0.98, 1.0, 10, "50 of the 100 sample times of a 10 ms period were skipped"),
        (1, 0.0, 1.0, 10, "99 of the 100"),  # one sample: no spacing to give
    ],
)
def test_skipped_samples_note(n, last_t, duration, period_ms, said):
    from tools.cmd_trace import skipped_samples_note

    note = skipped_samples_note(n, last_t, duration, period_ms)
    assert (said in note) if said else note == ""
    assert ("apart on average" in note) == (bool(said) and n > 1)
