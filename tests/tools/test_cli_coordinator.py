"""`hidvfs coordinator simulate|serve`: arguments checked up front, one-line errors, logging."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner

from tools.cli import cli

GOOD = "M1,1,j_1,1,Terminated,100,110,100,1\nR2_1,1,j_1,1,Terminated,110,120,100,1\n"
HEADER = "task_name,instance_num,job_name,task_type,status,start_time,end_time,plan_cpu,plan_mem"


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
        (["--policy", "all,hefft"], "unknown placement policy 'hefft'"),  # ran every policy
        (["--nodes", "tx2:cpus=nan"], "cpus='nan' must be a whole number of cores"),
        (["--nodes", "tx2:speed=inf"], "finite"),
        (["--nodes", "tx2:2:3"], "nodes spec 'tx2:2:3': count given twice"),
        (["--nodes", "tx2:cpus=4:cpus=8"], "cpus given twice"),
        (["--nodes", "tx2:speed=1e-300"], "speed='1e-300' must be a finite number from 0.01"),
        (["--nodes", "tx2:cpus=2.5"], "cpus='2.5' must be a whole number of cores from 1 to"),
        (["--seed", "-1"], "Invalid value for '--seed': -1 is not in the range x>=0"),
    ],
)
def test_simulate_refuses_bad_arguments_before_reading_the_trace(tmp_path, args, needle):
    empty = tmp_path / "empty.csv"
    empty.write_text("")  # reading it would fail with "no usable job"
    r = run("simulate", "--trace", str(empty), *args)
    assert r.exit_code != 0 and needle in r.output and "Traceback" not in r.output
    assert "no usable job" not in r.output


@pytest.mark.parametrize("text", ["", "\n\n", HEADER + "\n", "\ufeff" + HEADER + "\n\n"])
def test_simulate_says_a_trace_without_rows_is_empty(tmp_path, text):
    """An empty or header-only file read as "no usable job (0 issues)", which hid why."""
    path = tmp_path / "batch_task.csv"
    path.write_text(text, encoding="utf-8")
    r = run("simulate", "--trace", str(path), "--policy", "fifo")
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert f"{path}: holds no rows (the file is empty" in r.output
    assert "no usable job" not in r.output and len(r.output.strip().splitlines()) == 1


def test_simulate_still_counts_issues_when_no_job_is_usable(tmp_path):
    path = tmp_path / "batch_task.csv"
    path.write_text("R3_1,1\n")  # a row, but a damaged one
    r = run("simulate", "--trace", str(path), "--policy", "fifo")
    assert r.exit_code == 2 and "no usable job (1 issues)" in r.output


def test_simulate_seed_is_checked_outside_the_cli(trace):
    """The function and the argparse entry name --seed too (numpy's error named nothing)."""
    from tools.coordinator_cmd import main, simulate

    with pytest.raises(ValueError, match="--seed: expected an integer >= 0, got -1"):
        simulate(trace, ["fifo"], seed=-1)
    with pytest.raises(SystemExit):
        main(["simulate", "--trace", trace, "--seed", "-1"])


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


def test_simulate_counts_filled_in_values_and_warns_once(tmp_path):
    """cluster.md 1.3: missing values are imputed and the count logged; each was an info line
    only, unseen at the CLI's warning level, and counted nowhere."""
    path = tmp_path / "t.csv"
    path.write_text(
        GOOD + "M1,,j_2,1,Terminated,100,110,,1\nR2_1,1,j_2,1,Terminated,110,120,100,\n"
    )
    r = run("simulate", "--trace", str(path), "--policy", "fifo,sjf", "--json")
    assert r.exit_code == 0, r.output
    assert [row["imputed"] for row in json.loads(r.stdout)] == [3, 3]
    (warning,) = [ln for ln in r.stderr.splitlines() if "level=warning" in ln]
    assert f"{path}: 3 empty values filled in" in warning and "first at line 3" in warning
    assert "plan_cpu 100" in warning
    clean = tmp_path / "clean.csv"
    clean.write_text(GOOD)
    r = run("simulate", "--trace", str(clean), "--policy", "fifo", "--json")
    assert json.loads(r.stdout)[0]["imputed"] == 0 and "level=warning" not in r.stderr


def test_simulate_skips_the_header_of_the_published_subset(tmp_path):
    """selected_DAGs.csv has a header row; it was a skipped job "job_name" and a warning."""
    path = tmp_path / "selected_DAGs.csv"
    path.write_text(HEADER + "\n" + GOOD)
    r = run("simulate", "--trace", str(path), "--policy", "fifo", "--json")
    assert r.exit_code == 0, r.output
    row = json.loads(r.stdout)[0]
    assert (row["skipped_jobs"], row["dropped_rows"], row["tasks"]) == (0, 0, 2)
    assert "level=warning" not in r.stderr


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


@pytest.mark.parametrize(
    "nodes, needle",
    [
        ("a=tx2@ftp://127.0.0.1:9130/s", "'a=tx2@ftp://127.0.0.1:9130/s'"),
        ("a=tx2@http://127.0.0.1:99999/s", "Port out of range"),
        ("n1=tx2,n1=orin-nx", "node 'n1' is given twice"),
        ("=tx2", "'=tx2': no node name"),
    ],
)
def test_serve_refuses_a_malformed_nodes_entry_in_one_line(nodes, needle):
    r = run("serve", "--listen", "192.0.2.1:0", "--nodes", nodes)  # as above: never serves
    assert r.exit_code != 0 and needle in r.output and "nodes entry" in r.output
    assert len(r.output.strip().splitlines()) == 1


@pytest.fixture
def fake_training(monkeypatch):
    """Replaces training and export: records what would run, trains nothing."""
    import agents.placement.train as t

    calls = []

    def fake_train(cfg, log):
        calls.append(("train", cfg.iterations))
        return object(), []

    def fake_export(model, out, cfg, command, date, history, extra):
        import os

        assert os.path.isdir(os.path.dirname(os.path.abspath(out)))
        calls.append(("export", str(out), command))

    monkeypatch.setattr(t, "train", fake_train)
    monkeypatch.setattr(t, "export", fake_export)
    return calls


def _shipped_digest():
    import hashlib

    from agents.placement.higfrl import DEFAULT_MODEL

    return hashlib.sha256(DEFAULT_MODEL.read_bytes()).hexdigest()


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--iterations", "1"], "--out is required with --iterations"),
        (["--iterations", "1", "--out", ""], "--out: empty path"),
        (["--out", ""], "--out: empty path"),
        (["--out", "  "], "--out: empty path"),
        (["--seed", "-1"], "--seed"),
    ],
)
def test_train_refuses_before_training(fake_training, args, needle):
    before = _shipped_digest()
    r = run("train", *args)
    assert r.exit_code != 0 and needle in r.output and "Traceback" not in r.output
    assert fake_training == []  # nothing trained, nothing exported
    assert _shipped_digest() == before


def test_train_refuses_the_shipped_path_for_a_partial_run(fake_training):
    from agents.placement.higfrl import DEFAULT_MODEL

    r = run("train", "--iterations", "1", "--out", str(DEFAULT_MODEL))
    assert r.exit_code != 0 and "is the shipped model" in r.output
    assert fake_training == []


def test_train_checks_out_is_writable_before_training(fake_training, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    r = run("train", "--iterations", "1", "--out", str(blocker / "m.onnx"))
    assert r.exit_code != 0 and "Traceback" not in r.output
    assert r.output == (
        f"hidvfs: error: --out {blocker / 'm.onnx'}: its folder {blocker} cannot be made "
        f"({blocker} is a file, not a folder); choose another --out\n"
    )
    assert fake_training == []
    r = run("train", "--iterations", "1", "--out", str(tmp_path))
    assert r.exit_code != 0 and "is a directory" in r.output and fake_training == []


def test_train_creates_the_parent_of_out_then_trains(fake_training, tmp_path):
    out = tmp_path / "new" / "dir" / "m.onnx"
    r = run("train", "--iterations", "1", "--out", str(out))
    assert r.exit_code == 0, r.output
    assert [c[0] for c in fake_training] == ["train", "export"]
    assert fake_training[1][1] == str(out)
    assert [p.name for p in out.parent.iterdir()] == []  # the probe file is gone


def test_full_budget_without_out_writes_the_shipped_path(fake_training):
    from agents.placement.higfrl import DEFAULT_MODEL

    r = run("train", "--seed", "0")
    assert r.exit_code == 0, r.output
    assert fake_training[0] == ("train", 240)
    assert fake_training[1][1] == str(DEFAULT_MODEL)


@pytest.mark.parametrize("seed", ["1", "7"])
def test_train_with_another_seed_needs_out_before_training(fake_training, seed):
    """Only --seed 0 at the full budget reproduces the shipped model; another seed used to
    overwrite it."""
    before = _shipped_digest()
    r = run("train", "--seed", seed)
    assert r.exit_code != 0 and "Traceback" not in r.output
    assert f"--out is required with --seed {seed}" in r.output
    assert fake_training == []  # refused before training
    assert _shipped_digest() == before


def test_train_with_another_seed_may_not_name_the_shipped_file(fake_training, tmp_path):
    from agents.placement.higfrl import DEFAULT_MODEL

    r = run("train", "--seed", "3", "--out", str(DEFAULT_MODEL))
    assert r.exit_code != 0 and "is the shipped model" in r.output and "--seed 0" in r.output
    assert fake_training == []
    out = tmp_path / "seed3.onnx"
    r = run("train", "--seed", "3", "--out", str(out))
    assert r.exit_code == 0, r.output
    assert fake_training[0] == ("train", 240) and fake_training[1][1] == str(out)


def test_module_entry_train_with_another_seed_needs_out(fake_training, capsys):
    from tools.coordinator_cmd import main

    assert main(["train", "--seed", "2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --out is required with --seed 2") and fake_training == []


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["evaluate", "--loads", "0"], "--loads"),
        (["evaluate", "--loads", "-1"], "--loads"),
        (["evaluate", "--loads", "nan"], "--loads"),
        (["evaluate", "--loads", "0.7,abc"], "--loads"),
        (["evaluate", "--jobs", "-3"], "--jobs"),
        (["evaluate", "--jobs", "0"], "--jobs"),
        (["train", "--seed", "-1"], "--seed"),
        (["train", "--iterations", "0"], "--iterations"),
    ],
)
def test_module_entry_checks_its_arguments(fake_training, capsys, argv, needle):
    from tools.coordinator_cmd import main

    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {needle}" in err and "Traceback" not in err
    assert fake_training == []


def test_module_entry_train_errors_are_one_line(fake_training, capsys):
    from tools.coordinator_cmd import main

    assert main(["train", "--iterations", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --out is required") and fake_training == []


def test_train_without_onnx_says_which_extra_before_training(fake_training, without, tmp_path):
    """It used to train (20 s) and then fail in the export: ModuleNotFoundError: onnx."""
    without("onnx")
    out = tmp_path / "t.onnx"
    r = run("train", "--iterations", "1", "--out", str(out))
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert r.output.strip().splitlines() == [
        "hidvfs: error: hidvfs coordinator train needs the cluster extra (onnx, skl2onnx, "
        'scikit-learn; missing: onnx): pip install "hidvfs[cluster]"'
    ]
    assert fake_training == [] and not out.exists()


def test_module_entry_train_without_onnx_is_one_line(fake_training, without, tmp_path, capsys):
    from tools.coordinator_cmd import main

    without("onnx")
    assert main(["train", "--iterations", "1", "--out", str(tmp_path / "t.onnx")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and 'pip install "hidvfs[cluster]"' in err
    assert fake_training == []


def test_train_needs_only_onnx(fake_training, without, tmp_path):
    without("sklearn", "skl2onnx")  # the placer is exported with onnx alone
    r = run("train", "--iterations", "1", "--out", str(tmp_path / "t.onnx"))
    assert r.exit_code == 0, r.output
    assert [c[0] for c in fake_training] == ["train", "export"]


def _rows(waits):
    return [
        {"policy": p, "makespan_s": 10.0, "mean_flow_s": 2.0 + w, "mean_wait_s": w, "tasks": 3}
        for p, w in waits.items()
    ]


def test_a_ratio_to_a_best_of_zero_is_none_not_one():
    """wait_vs_best read 1.0 (as good as the best) for a policy waiting 2 s against 0."""
    from tools.coordinator_cmd import _with_ratios, format_table

    rows = _with_ratios(_rows({"higfrl": 0.0, "fifo": 0.0, "sjf": 2.0}))
    by = {r["policy"]: r for r in rows}
    assert by["fifo"]["wait_vs_best"] == 1.0 and by["higfrl"]["wait_vs_best"] == 1.0
    assert by["sjf"]["wait_vs_best"] is None
    assert by["sjf"]["flow_vs_best"] == pytest.approx(2.0)
    assert json.loads(json.dumps(rows))[2]["wait_vs_best"] is None  # null in --json
    table = format_table(rows)
    sjf_line = next(line for line in table.splitlines() if " sjf " in f" {line} ")
    assert sjf_line.split()[7] == "inf" and "inf: the best is 0" in table
    # per load in a summary, as evaluate prints it
    rows = _with_ratios(
        [{**r, "load": 1.0} for r in _rows({"fifo": 0.0, "sjf": 1.0})]
        + [{**r, "load": 2.0} for r in _rows({"fifo": 3.0, "sjf": 1.0})],
        "load",
    )
    assert [r["wait_vs_best"] for r in rows] == [1.0, None, 3.0, 1.0]


def test_evaluate_reports_no_ratio_to_a_best_of_zero(monkeypatch):
    import agents.placement.train as t
    from tools.coordinator_cmd import evaluate

    summary = [{"load": 0.7, **r} for r in _rows({"higfrl": 1.0, "fifo": 0.0, "sjf": 2.0})]
    monkeypatch.setattr(t, "evaluate", lambda *a, **k: [])
    monkeypatch.setattr(t, "summarize", lambda rows: [dict(r, wait_vs_best=1.0) for r in summary])
    rows = evaluate(n_jobs=10)
    assert [r["wait_vs_best"] for r in rows] == [None, 1.0, None]


@pytest.mark.parametrize(
    "sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=lambda s: s.name
)
def test_serve_stops_cleanly_on_a_signal(tmp_path, sig):
    """SIGTERM (systemd's stop) and SIGHUP killed serve (rc 143, 129) without closing its
    socket and telemetry; all three now stop it with exit 0 and a log line."""
    err = tmp_path / "serve.err"
    cmd = [sys.executable, "-m", "tools.cli", "coordinator", "serve", "--listen", "127.0.0.1:0"]
    with open(err, "w") as f:
        proc = subprocess.Popen(
            [*cmd, "--policy", "fifo"],
            stdout=subprocess.DEVNULL,
            stderr=f,
            cwd=Path(__file__).resolve().parents[2],
        )
    try:
        end = time.monotonic() + 20
        while not (m := re.search(r"http://127\.0\.0\.1:(\d+)", err.read_text())):
            assert proc.poll() is None and time.monotonic() < end, err.read_text()
            time.sleep(0.05)
        with urllib.request.urlopen(f"http://127.0.0.1:{m[1]}/healthz", timeout=5) as r:
            assert json.loads(r.read())["ok"] is True
        proc.send_signal(sig)
        assert proc.wait(timeout=10) == 0, err.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert f"{sig.name}: extender stopped" in err.read_text()
    with pytest.raises(OSError):  # the socket is closed
        urllib.request.urlopen(f"http://127.0.0.1:{m[1]}/healthz", timeout=2)


def test_check_passes_the_shipped_model_and_fails_a_changed_one(tmp_path):
    import onnx
    from onnx import numpy_helper

    from agents.placement.higfrl import DEFAULT_MODEL

    ok = run("check", "--json")
    assert ok.exit_code == 0, ok.output
    report = json.loads(ok.output)
    assert report["ok"] and report["max_abs_diff"] <= 1e-5
    assert report["command"] == "hidvfs coordinator train --seed 0"
    m = onnx.load(str(DEFAULT_MODEL))
    w = numpy_helper.to_array(m.graph.initializer[0]).copy()
    w *= 1.01
    m.graph.initializer[0].CopyFrom(numpy_helper.from_array(w, m.graph.initializer[0].name))
    onnx.save(m, str(tmp_path / "changed.onnx"))
    bad = run("check", "--model", str(tmp_path / "changed.onnx"))
    assert bad.exit_code == 1
    assert "changed.onnx FAIL outputs differ from the training-time network's" in bad.output
    missing = run("check", "--model", str(tmp_path / "none.onnx"))  # bad input, not a failed check
    assert missing.exit_code == 2 and "does not exist" in missing.output
    assert run("check", "--model", "").exit_code == 2  # it checked the shipped model


def test_synth_writes_a_trace_simulate_reads_and_is_reproducible(tmp_path):
    from platforms.cluster.alibaba import read_batch_task

    a, b, c = tmp_path / "new" / "a.csv", tmp_path / "b.csv", tmp_path / "c.csv"
    r = run("synth", "--out", str(a), "--jobs", "40", "--seed", "3", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["jobs"] == 40
    run("synth", "--out", str(b), "--jobs", "40", "--seed", "3")
    run("synth", "--out", str(c), "--jobs", "40", "--seed", "3", "--load", "1.4")
    assert a.read_bytes() == b.read_bytes()  # the seed fixes the trace
    load = read_batch_task(str(a))
    assert len(load.jobs) == 40 and not load.issues
    # twice the load: the same jobs arrive in about half the time
    span = [max(j.arrival for j in read_batch_task(str(p)).jobs) for p in (a, c)]
    assert 0.35 < span[1] / span[0] < 0.65
    sim = run("simulate", "--trace", str(a), "--policy", "fifo", "--json")
    assert (
        sim.exit_code == 0 and json.loads(sim.output)[0]["tasks"] == json.loads(r.output)["tasks"]
    )
    bad = run("synth", "--out", str(tmp_path / "d.csv"), "--nodes", "bogus:3")
    assert bad.exit_code == 2 and "unknown board 'bogus'" in bad.output
    assert not (tmp_path / "d.csv").exists()


def test_synth_writes_through_links_and_streams_and_keeps_a_files_mode(tmp_path):
    """`--out /dev/stdout` replaced the /dev/stdout link with a regular file (the write went
    through a rename), a link given as --out became a file, and a 0444 file became 0644."""
    import os
    import subprocess
    import sys

    real = tmp_path / "real.csv"
    real.write_text("old\n")
    real.chmod(0o600)
    link = tmp_path / "link.csv"
    link.symlink_to(real)
    assert run("synth", "--out", str(link), "--jobs", "3").exit_code == 0
    assert link.is_symlink() and real.read_text().count(",j_") >= 3
    assert oct(real.stat().st_mode & 0o777) == "0o600"
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    cmd = [sys.executable, "-m", "tools.cli", "coordinator", "synth", "--jobs", "3"]
    reader = subprocess.Popen(["cat", str(fifo)], stdout=subprocess.PIPE)
    subprocess.run([*cmd, "--out", str(fifo)], check=True, capture_output=True, timeout=60)
    assert reader.communicate(timeout=30)[0].count(b",j_") >= 3 and fifo.exists()
    # to stdout: the trace alone there, what was written on stderr
    out = subprocess.run([*cmd, "--out", "/dev/stdout"], capture_output=True, timeout=60)
    assert out.returncode == 0 and out.stdout.count(b"\n") == out.stdout.count(b",j_")
    assert b"3 jobs" in out.stderr
    assert run("synth", "--out", "", "--jobs", "3").output.endswith("empty\n")


def test_simulate_compress_replays_the_arrivals_faster_and_says_the_load(tmp_path):
    """A trace of a lightly loaded cluster: every policy ties at the lower bound until
    --compress brings the arrivals closer; the rows and the table say the offered load."""
    from platforms.cluster.synthetic import SyntheticConfig, generate_rows, write_batch_task

    path = tmp_path / "t.csv"
    write_batch_task(path, generate_rows(SyntheticConfig(n_jobs=60, seed=3, load=0.05)))
    args = ("simulate", "--trace", str(path), "--policy", "fifo,heft", "--nodes", "tx2:2")
    light = json.loads(run(*args, "--json").output)
    heavy = json.loads(run(*args, "--compress", "40", "--json").output)
    assert [r["compress"] for r in light + heavy] == [1.0, 1.0, 40.0, 40.0]
    assert heavy[0]["offered_load"] == pytest.approx(40 * light[0]["offered_load"])
    assert heavy[0]["tasks"] == light[0]["tasks"]  # the same work, sooner
    assert max(r["makespan_s"] for r in heavy) < min(r["makespan_s"] for r in light)
    table = run(*args, "--compress", "40").output
    assert f"offered load {heavy[0]['offered_load']:.3g}" in table and "40x as fast" in table
    assert "try --compress" in run(*args).output
    r = run(*args, "--compress", "0")
    assert r.exit_code == 2 and "--compress" in r.output


def test_compressed_arrivals_keep_the_first_and_scale_the_gaps():
    import numpy as np

    from platforms.cluster.simcluster import NodeSpec, Workload, compress_arrivals, offered_load
    from platforms.cluster.synthetic import SyntheticConfig, synthetic_trace

    w = Workload.from_jobs(synthetic_trace(SyntheticConfig(n_jobs=20, seed=1)).jobs)
    c = compress_arrivals(w, 4.0)
    a0 = w.job_arrival.min()
    assert np.allclose(c.job_arrival - a0, (w.job_arrival - a0) / 4.0)
    assert c.work is w.work and np.array_equal(c.rank_u, w.rank_u)
    nodes = [NodeSpec("n", "tx2", cpus=4, mem=8, speed=1.0)]
    assert offered_load(c, nodes) == pytest.approx(4 * offered_load(w, nodes))
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="compression factor"):
            compress_arrivals(w, bad)


def test_offered_load_counts_a_task_larger_than_every_node_as_it_runs(tmp_path):
    """An 8-core task on 4-core nodes replays as a 4-core one; the offered load said beside
    the table counted its 8 cores (twice the load that was replayed)."""
    from platforms.cluster.alibaba import read_batch_task
    from platforms.cluster.simcluster import NodeSpec, Workload, offered_load
    from tools.coordinator_cmd import parse_nodes_spec

    path = tmp_path / "big.csv"
    path.write_text("M1,1,j_1,1,Terminated,0,10,800,0.1\nM1,1,j_2,1,Terminated,10,20,400,0.1\n")

    w = Workload.from_jobs(read_batch_task(path).jobs)
    nodes = [NodeSpec("n", "tx2", cpus=4, mem=8, speed=1.0)]
    # 10 s at 4 cores (clamped from 8) + 10 s at 4 cores, over 4 cores, arrivals 10 s apart
    assert offered_load(w, nodes) == pytest.approx((10 * 4 + 10 * 4) / (4 * 10))
    r = run("simulate", "--trace", str(path), "--policy", "fifo", "--nodes", "tx2:1", "--json")
    assert r.exit_code == 0, r.output
    (tx2,) = parse_nodes_spec("tx2:1")  # 4 cores at speed 1.0176
    assert json.loads(r.stdout)[0]["offered_load"] == pytest.approx(2.0 / tx2.speed)


def test_tasks_larger_than_every_node_are_said_once(tmp_path):
    """A task of 8 cores on 4-core boards ran as a 4-core one with nothing said but a
    clamped_tasks count in --json."""
    path = tmp_path / "big.csv"
    path.write_text("M1,1,j_1,1,Terminated,0,10,800,0.1\nM2_1,1,j_1,1,Terminated,10,20,100,0.1\n")
    r = run("simulate", "--trace", str(path), "--policy", "fifo,sjf", "--nodes", "tx2:2")
    assert r.exit_code == 0, r.output
    said = [ln for ln in r.stderr.splitlines() if "ask for more cores or memory" in ln]
    assert len(said) == 1 and "level=warning" in said[0], r.stderr
    assert f"{path}: 1 tasks ask for more cores or memory than the largest node" in said[0]
