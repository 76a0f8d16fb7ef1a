"""`trace replay --check` on the daemon's own recordings made with a config that changes its
decisions and with registered jobs: the header stores the decision settings, the samples the
jobs the control loop saw, and the replay feeds both back, so every write compares. Older
recordings (without them) replay as before, saying what they cannot vouch for; a trace read
from a pipe or a FIFO replays as from a file."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from agents import deadlines
from daemon.client import RegistryClient, RegistryError
from daemon.service import run_live
from platforms.errors import TraceError
from platforms.faketree import write_fake_tree
from platforms.observation import JobProfile
from platforms.spec import load_board
from platforms.trace import read_trace
from tools.cli import cli
from tools.replay import replay_trace

ROOT = Path(__file__).resolve().parents[2]
A57_CAP = 1420800


def _wait_for(cond, what: str, timeout: float = 20.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def _record(tree: Path, state: Path, out: Path, policy: str, duration_s: float) -> Path:
    """A daemon run of ``policy`` on ``tree`` for ``duration_s``, recorded to ``out``."""
    run_live(
        sysfs_root=str(tree),
        policy=policy,
        period_ms=50,
        state_dir=str(state),
        socket_path=str(state / "s.sock"),
        duration_s=duration_s,
        record=str(out),
    )
    return out


def _rewritten(src: Path, dst: Path, header=None, sample=None) -> Path:
    """A copy of a trace with its header and samples (as JSON objects) edited."""
    tr = read_trace(src)
    head = tr.header.to_json()
    if header is not None:
        header(head)
    with open(dst, "w") as f:
        f.write(json.dumps(head) + "\n")
        for i, s in enumerate(tr.samples):
            obj = {"t": s.t, "r": s.r, "w": s.w, **({"j": s.j} if s.j else {})}
            if sample is not None:
                sample(i, obj)
            f.write(json.dumps(obj) + "\n")
    return dst


def _as_before(src: Path, dst: Path) -> Path:
    """The recording as an older hidvfs wrote it (and as the replay before the header config
    and the jobs read it): no config, no jobs."""

    def strip(head):
        head.pop("config", None)
        head.pop("records_jobs", None)

    return _rewritten(src, dst, header=strip, sample=lambda i, obj: obj.pop("j", None))


def _check(path: Path, *extra: str):
    return CliRunner().invoke(cli, ["trace", "replay", str(path), "--check", *extra])


@pytest.fixture
def tx2(tmp_path):
    spec = load_board("tx2")
    tree = tmp_path / "tree"
    writer = write_fake_tree(spec, tree)
    state = tmp_path / "state"
    state.mkdir()
    return spec, tree, writer, state


def _heating(spec, writer, done: threading.Event) -> threading.Thread:
    """The CPU zone warms by 1.5 C every 50 ms and the CPUs are busy, while the daemon runs."""

    def heat():
        zone = next(z for z in spec.zones if z.role == "cpu")
        t = 40.0
        while not done.wait(0.05):
            t = min(t + 1.5, 95.0)
            writer.set_temp(zone.type, t)
            writer.advance_stat(0.05, busy=0.8)

    th = threading.Thread(target=heat, daemon=True)
    th.start()
    return th


# -- a config that changes the decisions -----------------------------------------------------


def test_a_recording_made_with_a_config_replays_with_it_and_checks(tx2, tmp_path):
    spec, tree, writer, state = tx2
    cfg = tmp_path / "config.yaml"
    cfg.write_text(
        "policy: maxfreq\n"
        f"thermal:\n  cap_khz: {{a57: {A57_CAP}}}\n  margin_c: 40\n"
        "deadline_slack: 0.2\n"
    )
    out = tmp_path / "cap.jsonl.gz"
    done = threading.Event()
    th = _heating(spec, writer, done)
    try:
        run_live(
            config_path=str(cfg),
            sysfs_root=str(tree),
            period_ms=50,
            state_dir=str(state),
            socket_path=str(state / "s.sock"),
            duration_s=1.5,
            record=str(out),
        )
    finally:
        done.set()
        th.join()
    tr = read_trace(out)
    extra = tr.header.extra
    assert extra["recorded_by"] == "daemon" and extra["policy"] == "maxfreq"
    # the decision settings as plain JSON; nothing about sockets, folders or tokens
    assert extra["config"]["thermal"] == {"margin_c": 40.0, "cap_khz": {"a57": A57_CAP}}
    assert extra["config"]["deadline_slack"] == 0.2
    assert set(extra["config"]) == {"deadline_slack", "thermal", "mixed_criticality", "shield"}
    assert extra["records_jobs"] is True
    a57 = f"devices/system/cpu/cpufreq/policy{spec.cluster('a57').policy}/scaling_setspeed"
    assert str(A57_CAP) in {v for s in tr.samples for p, v in s.w.items() if p == a57}

    r = _check(out)
    assert r.exit_code == 0, r.output
    assert "0 extra" in r.output and "differs" not in r.output
    res = replay_trace(str(out), None)
    assert res["matching_writes"] == res["recorded_writes"] > 0 and not res["unchecked"]

    # what the replay did before: the default config, and writes that "differ"
    old = _as_before(out, tmp_path / "old.jsonl")
    r = _check(old)
    assert r.exit_code == 1 and f"recorded {A57_CAP}" in r.output, r.output
    # said (a warning on stderr, "unchecked" in --json), so it is not taken for a wrong decision
    notes = replay_trace(str(old), None)["unchecked"]
    assert any("stores no config" in n and "--config" in n for n in notes), notes
    # --config gives it back; and --config overrides what a recording stores
    assert _check(old, "--config", str(cfg)).exit_code == 0
    plain = tmp_path / "plain.yaml"
    plain.write_text("policy: maxfreq\n")
    r = _check(out, "--config", str(plain))
    assert r.exit_code == 1 and f"recorded {A57_CAP}" in r.output, r.output


def test_a_bad_header_config_is_one_clear_error(tx2, tmp_path):
    spec, tree, _, state = tx2
    out = tmp_path / "d.jsonl"
    _record(tree, state, out, "maxfreq", 0.3)
    bad = _rewritten(
        out,
        tmp_path / "bad.jsonl",
        header=lambda h: h["config"]["thermal"].update(cap_khz={"nosuch": 1}),
    )
    r = _check(bad)
    assert r.exit_code == 2 and "nosuch" in r.output and "bad.jsonl" in r.output, r.output
    assert "Traceback" not in r.output


# -- registered jobs -----------------------------------------------------------------------


def _busy(seconds: float) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", f"import time\nt=time.time()\nwhile time.time()-t<{seconds}: pass"]
    )


def test_a_recording_with_registered_jobs_replays_them_and_checks(tx2, tmp_path):
    """Hi jobs with and without a profile, registered over the socket, ending and then
    unregistered as `hidvfs run` does (the registry reports the end); a lo job killed while
    registered (the loop finds it gone). The hidvfs stack (gate, shield, reservation, guard)
    decided for them: the replay feeds them back and repeats every write."""
    spec, tree, writer, state = tx2
    store = deadlines.ProfileStore()
    store.put("tx2", JobProfile("fib", 2.0, 0.3, 0.1, 1.0, 2035200, 4))
    deadlines.save(store, tmp_path / "profiles.json")
    cfg = tmp_path / "config.yaml"
    cfg.write_text(f"policy: hidvfs\nprofiles: {tmp_path / 'profiles.json'}\n")
    out = tmp_path / "jobs.jsonl.gz"
    sock = state / "s.sock"
    stop = threading.Event()
    failed: list[BaseException] = []

    def daemon():
        try:
            run_live(
                config_path=str(cfg),
                sysfs_root=str(tree),
                period_ms=50,
                state_dir=str(state),
                socket_path=str(sock),
                duration_s=30,
                stop=stop,
                record=str(out),
            )
        except BaseException as err:  # noqa: BLE001 - re-raised by the test
            failed.append(err)

    done = threading.Event()
    th = _heating(spec, writer, done)
    runner = threading.Thread(target=daemon)
    runner.start()
    jobs = []
    told: set[int] = set()  # the ends the registry was told of
    try:
        client = RegistryClient(str(sock))

        def serving():
            try:
                client.status()
                return True
            except Exception:  # noqa: BLE001 - not listening yet
                return False

        _wait_for(serving, "the registry socket")
        time.sleep(0.2)
        hi = _busy(0.8)
        lo = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        bare = _busy(0.5)
        jobs += [hi, lo, bare]
        client.register(hi.pid, deadline_s=1.5, criticality="hi", name="fib")
        client.register(lo.pid, deadline_s=10.0, criticality="lo", name="sleeper")
        client.register(bare.pid, deadline_s=0.6, criticality="hi", name="bare")
        time.sleep(0.3)
        lo.kill()  # gone while registered: the loop sees it and finishes it
        lo.wait()
        for job in (bare, hi):  # as `hidvfs run`: its command exits, then it unregisters
            job.wait(timeout=20)
            try:
                client.unregister(job.pid)
                told.add(job.pid)
            except RegistryError:  # the loop saw it end first (a tick in between): rare
                pass
        _wait_for(lambda: client.status()["jobs_done"] >= 3, "the three jobs to be done")
        time.sleep(0.3)
    finally:
        for job in jobs:
            if job.poll() is None:
                job.kill()
                job.wait()
        stop.set()
        runner.join(timeout=60)
        done.set()
        th.join()
    assert not failed, failed

    tr = read_trace(out)
    assert tr.header.extra["records_jobs"] is True
    js = [s.j for s in tr.samples if s.j]
    new = {row["name"]: row for j in js for row in j.get("new", ())}
    assert set(new) == {"fib", "sleeper", "bare"}
    assert new["fib"]["profile"]["work_s"] == 2.0 and new["bare"]["profile"] is None
    assert new["fib"]["criticality"] == "hi" and new["fib"]["deadline_s"] == 1.5
    assert new["fib"]["start_time"] is not None
    facts = [row for j in js for row in j.get("jobs", ())]
    assert any(row["pid"] == lo.pid and row["alive"] is False for row in facts)
    assert all("cpus" in row for row in facts if row["alive"])
    ended = {row["pid"] for j in js for row in j.get("ended", ())}
    assert ended == told

    r = _check(out)
    assert r.exit_code == 0, r.output
    res = replay_trace(str(out), None)
    assert res["matching_writes"] == res["recorded_writes"] and not res["mismatches"]
    assert res["status"]["jobs_done"] == 3

    # without its jobs (the replay before): the writes decided for them "differ"
    old = _as_before(out, tmp_path / "old.jsonl")
    r = _check(old)
    assert r.exit_code == 1 and "differ" in r.output, r.output
    assert any("stores no jobs" in n for n in replay_trace(str(old), None)["unchecked"])

    # a recorded write edited by hand is still caught
    first = next(i for i, s in enumerate(tr.samples) if s.w)
    path = next(iter(tr.samples[first].w))

    def edit(i, obj):
        if i == first:
            obj["w"][path] = "1"

    r = _check(_rewritten(out, tmp_path / "edited.jsonl", sample=edit))
    assert r.exit_code == 1 and "recorded 1," in r.output, r.output


def test_a_job_the_recording_never_registered_is_refused(tx2, tmp_path):
    spec, tree, _, state = tx2
    out = tmp_path / "d.jsonl"
    _record(tree, state, out, "hidvfs", 0.3)

    def orphan(i, obj):
        if i == 1:
            obj["j"] = {"jobs": [{"pid": 4242, "alive": True}]}

    r = _check(_rewritten(out, tmp_path / "orphan.jsonl", sample=orphan))
    assert r.exit_code == 2 and "pid 4242 was never registered" in r.output, r.output


def test_malformed_jobs_in_a_sample_name_the_line(tmp_path):
    head = {"format": "hidvfs-trace", "version": 1, "board": "tx2", "period_s": 0.1}
    head |= {"started": "2026-01-01T00:00:00+00:00", "files": [], "records_jobs": True}
    bad = tmp_path / "bad.jsonl"
    rows = [
        {"t": 0.0, "r": {}, "w": {}},
        {"t": 0.1, "r": {}, "w": {}, "j": {"new": [{"pid": 7, "name": "x"}]}},
    ]
    bad.write_text("\n".join(json.dumps(x) for x in [head, *rows]) + "\n")
    with pytest.raises(TraceError, match=r"line 3: corrupt line: 'j': 'new' row has no 'crit"):
        read_trace(bad)


# -- a trace read from a pipe or a FIFO ------------------------------------------------------


def _small_recording(tmp_path, tree, state) -> Path:
    return _record(tree, state, tmp_path / "d.jsonl.gz", "schedutil", 0.5)


@pytest.mark.parametrize("unzip", [False, True], ids=["gzip", "plain"])
def test_a_trace_from_a_fifo_replays_and_checks(tx2, tmp_path, unzip):
    _, tree, _, state = tx2
    out = _small_recording(tmp_path, tree, state)
    data = gzip.decompress(out.read_bytes()) if unzip else out.read_bytes()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)

    def feed():
        with open(fifo, "wb") as f:  # waits for the reader, as `cat d.jsonl.gz > fifo`
            f.write(data)

    th = threading.Thread(target=feed, daemon=True)
    th.start()
    # a process of its own: a reader that opened the FIFO twice waited for ever on the second
    proc = subprocess.run(
        [sys.executable, "-m", "tools.cli", "trace", "replay", str(fifo), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    th.join(timeout=10)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 extra" in proc.stdout


def test_a_trace_from_process_substitution_replays(tx2, tmp_path):
    """`hidvfs trace replay <(cat d.jsonl.gz) --check`: a /dev/fd pipe, opened once."""
    _, tree, _, state = tx2
    out = _small_recording(tmp_path, tree, state)
    proc = subprocess.run(
        [
            "bash",
            "-c",
            f'"{sys.executable}" -m tools.cli trace replay <(cat "{out}") --check && '
            f'zcat "{out}" | "{sys.executable}" -m tools.cli trace replay /dev/stdin --check',
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("0 extra") == 2 and "empty file" not in proc.stderr
