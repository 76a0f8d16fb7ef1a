"""A restarted daemon takes up the jobs registered with the run before it (same boot, same
processes), deadlines counted from their first registration; a job that ended meanwhile, a
reused pid or a file of another boot is not taken up."""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
import time

import pytest

from daemon import jobpersist
from daemon.jobpersist import RegistrationsFile, from_row, take_up, to_row
from daemon.jobs import JobEntry, JobTable
from tests.daemon.test_daemon_process import (  # noqa: F401 - board is a fixture
    board,
    start_daemon,
    wait_for,
    wait_serving,
)

LOG = logging.getLogger("test.takeup")
BOOT = "0f0e0d0c-0b0a-0908-0706-050403020100"


def _entry(pid=4242, start=1234.0, **kw) -> JobEntry:
    base = dict(
        pid=pid,
        name="fib",
        release_t=100.5,
        deadline_s=3.0,
        criticality="hi",
        registrant_uid=1000,
        start_time=start,
        adopter=(4000, 1200.0),
    )
    return JobEntry(**{**base, **kw})


def test_a_job_round_trips_through_its_row():
    e = _entry()
    assert from_row(json.loads(json.dumps(to_row(e)))) == e
    assert from_row(to_row(_entry(deadline_s=None, adopter=None, registrant_uid=None))) == _entry(
        deadline_s=None, adopter=None, registrant_uid=None
    )


@pytest.mark.parametrize(
    "change",
    [
        {"start_time": None},  # a reused pid could not be told from the job
        {"criticality": "mid"},
        {"deadline_s": 0},
        {"release_t": "soon"},
        {"pid": -1},
    ],
)
def test_a_row_that_does_not_read_whole_is_not_a_job(change):
    assert from_row({**to_row(_entry()), **change}) is None
    row = to_row(_entry())
    del row["name"]
    assert from_row(row) is None


def test_the_table_is_on_disk_after_every_change_and_gone_when_empty(tmp_path):
    store = RegistrationsFile(tmp_path, BOOT, LOG)
    table = JobTable(on_change=store.save)
    path = tmp_path / jobpersist.FILE_NAME
    table.register(_entry(pid=1))
    table.register(_entry(pid=2))
    assert store.flush()
    data = json.loads(path.read_text())
    assert data["boot_id"] == BOOT and [r["pid"] for r in data["jobs"]] == [1, 2]
    table.finish(1, 200.0)
    assert store.flush()
    assert [r["pid"] for r in json.loads(path.read_text())["jobs"]] == [2]
    table.unregister(2)
    store.close()
    assert not path.exists()


def test_a_departure_never_waits_for_the_disk(tmp_path, monkeypatch):
    """A job ends on the control loop's thread: the write happens on the writer's thread,
    which writes the newest table it was given."""
    import threading

    gate = threading.Event()
    written = []
    real = jobpersist.write_json_atomic

    def slow(path, data, **kw):
        gate.wait(5)  # an SD card's fsync
        written.append([r["pid"] for r in data["jobs"]])
        return real(path, data, **kw)

    monkeypatch.setattr(jobpersist, "write_json_atomic", slow)
    store = RegistrationsFile(tmp_path, BOOT, LOG)
    table = JobTable()
    for pid in range(1, 6):
        table.register(_entry(pid=pid))
    table.on_change = store.save
    t0 = time.monotonic()
    for pid in (1, 2, 3):
        table.finish(pid, 200.0)
    assert time.monotonic() - t0 < 1.0  # the writer holds the first write; nobody waits
    gate.set()
    store.close()
    assert written[-1] == [4, 5] and len(written) <= 2  # the newest, not each one


def test_a_registration_is_on_disk_before_it_is_acknowledged(tmp_path):
    store = RegistrationsFile(tmp_path, BOOT, LOG)
    table = JobTable(on_change=store.save)
    table.register(_entry(pid=7))  # no flush: the registry answers its client after this
    rows = json.loads((tmp_path / jobpersist.FILE_NAME).read_text())["jobs"]
    assert [r["pid"] for r in rows] == [7]
    store.close()


def test_take_up_keeps_the_same_processes_of_this_boot_only(tmp_path):
    store = RegistrationsFile(tmp_path, BOOT, LOG)
    store.write_now(
        [_entry(pid=1, start=10.0), _entry(pid=2, start=20.0), _entry(pid=3, start=30.0)]
    )
    starts = {1: 10.0, 2: 99.0, 4000: 1200.0}  # 2: its pid is another process now; 3: ended
    got = take_up(tmp_path, BOOT, starts.get, LOG)
    assert [e.pid for e in got] == [1] and got[0].adopter == (4000, 1200.0)
    assert got[0].release_t == 100.5 and got[0].deadline_s == 3.0  # its first registration's
    # its `hidvfs run` gone: the job is taken up without an adopter
    assert take_up(tmp_path, BOOT, {1: 10.0}.get, LOG)[0].adopter is None
    # another boot: the clock and the pids are another's
    assert take_up(tmp_path, "another-boot", starts.get, LOG) == []
    assert take_up(tmp_path, None, starts.get, LOG) == []


def test_take_up_keeps_the_jobs_of_the_same_tree_its_registrant_may_still_steer(tmp_path):
    """A test daemon on a fake tree must not steer the live daemon's jobs; a job whose
    process is no longer its registrant's (a setuid program since) is left out."""
    RegistrationsFile(tmp_path, BOOT, LOG, tree="/").write_now(
        [_entry(pid=1, start=10.0), _entry(pid=2, start=20.0, registrant_uid=0)]
    )
    starts = {1: 10.0, 2: 20.0, 4000: 1200.0}.get
    assert take_up(tmp_path, BOOT, starts, LOG, tree="/tmp/fake") == []
    assert [e.pid for e in take_up(tmp_path, BOOT, starts, LOG, tree="/")] == [1, 2]
    refuse = {1: "it belongs to uid 0, not to its registrant"}.get
    got = take_up(tmp_path, BOOT, starts, LOG, tree="/", refuse=lambda e: refuse(e.pid))
    assert [e.pid for e in got] == [2]


@pytest.mark.parametrize(
    "text",
    [
        "{not json",
        '{"format": "x"}',
        '{"format": "hidvfs-registrations", "version": 9, "jobs": []}',
    ],
)
def test_an_unreadable_file_is_logged_and_takes_up_nothing(tmp_path, caplog, text):
    (tmp_path / jobpersist.FILE_NAME).write_text(text)
    with caplog.at_level(logging.ERROR):
        assert take_up(tmp_path, BOOT, lambda pid: 1.0, LOG) == []
    assert "event=registrations_unreadable" in caplog.text


def test_a_write_that_fails_is_said_once_and_the_table_goes_on(tmp_path, caplog):
    blocker = tmp_path / "state"
    blocker.write_text("a file where the state dir should be")
    store = RegistrationsFile(blocker, BOOT, LOG)
    table = JobTable(on_change=store.save)
    with caplog.at_level(logging.WARNING):
        table.register(_entry(pid=1))
        assert store.flush()
        table.register(_entry(pid=2))
        store.close()
    assert len(table) == 2
    assert caplog.text.count("event=registrations_unsaved") == 1


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGKILL])
def test_a_restarted_daemon_steers_the_job_registered_before(board, stop):  # noqa: F811
    """A registered HI job with a deadline, the daemon stopped (cleanly or killed) and
    started again: the new daemon lists it with its deadline and first registration time,
    and the job's end is still counted."""
    spec, tree, state = board
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        proc, log = start_daemon(tree, state)
        client = wait_serving(state / "hidvfs.sock")
        client.register(job.pid, deadline_s=30.0, criticality="hi", name="sleeper")
        registered = time.monotonic()
        (first,) = client.status()["jobs"]
        proc.send_signal(stop)
        proc.communicate(timeout=30)
        assert (state / jobpersist.FILE_NAME).exists()
        proc2, log2 = start_daemon(tree, state)
        client = wait_serving(state / "hidvfs.sock")
        (again,) = client.status()["jobs"]
        assert again["pid"] == job.pid and again["name"] == "sleeper"
        assert again["criticality"] == "hi" and again["deadline_s"] == first["deadline_s"]
        # counted from the first registration, not from the restart
        assert again["elapsed_s"] >= time.monotonic() - registered - 0.5
        job.kill()
        job.wait()
        wait_for(lambda: client.status()["jobs_done"] >= 1, what="the job's end")
        wait_for(lambda: not (state / jobpersist.FILE_NAME).exists(), what="the file to go")
        proc2.send_signal(signal.SIGTERM)
        proc2.communicate(timeout=30)
        (line,) = [ln for ln in log2.read_text().splitlines() if "event=job_taken_up" in ln]
        assert f"pid={job.pid} " in line and "name=sleeper" in line
    finally:
        job.kill()
        job.wait()


def test_a_job_that_ended_while_no_daemon_ran_is_not_taken_up(board):  # noqa: F811
    spec, tree, state = board
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    proc, log = start_daemon(tree, state)
    client = wait_serving(state / "hidvfs.sock")
    client.register(job.pid, deadline_s=30.0, name="sleeper")
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    job.kill()
    job.wait()
    proc2, log2 = start_daemon(tree, state, "--duration", "0.5")
    proc2.communicate(timeout=60)
    assert proc2.returncode == 0, log2.read_text()
    assert "job_taken_up" not in log2.read_text()
    assert not (state / jobpersist.FILE_NAME).exists()


def test_the_daemons_refusal_is_the_registrys_owner_rule():
    """A user's job whose process is now another uid's is not taken up; root's is."""
    import os

    from daemon.service import _refusal
    from platforms.liveprocs import LiveProcessControl

    refuse = _refusal(LiveProcessControl())
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        start = LiveProcessControl().start_time(child.pid)
        mine = _entry(pid=child.pid, start=start, registrant_uid=os.geteuid())
        assert refuse(mine) is None
        other = _entry(pid=child.pid, start=start, registrant_uid=os.geteuid() + 4242)
        assert "belongs to uid" in refuse(other)
        assert refuse(_entry(pid=1, start=1.0, registrant_uid=0)) is not None  # init: never
    finally:
        child.kill()
        child.wait()


def test_a_departure_does_not_wait_behind_a_registration_waiting_for_the_disk(
    tmp_path, monkeypatch
):
    """A registration waits for its row on the registry's thread; a job ending meanwhile on
    the control loop's thread goes ahead at once."""
    import threading

    gate = threading.Event()
    real = jobpersist.write_json_atomic
    monkeypatch.setattr(
        jobpersist, "write_json_atomic", lambda *a, **k: (gate.wait(5), real(*a, **k))[1]
    )
    store = RegistrationsFile(tmp_path, BOOT, LOG)
    table = JobTable()
    table.register(_entry(pid=1))
    table.on_change = store.save
    registering = threading.Thread(target=table.register, args=(_entry(pid=2),))
    registering.start()
    time.sleep(0.2)  # the registration now waits for the held write
    t0 = time.monotonic()
    table.finish(1, 200.0)
    assert time.monotonic() - t0 < 0.5
    gate.set()
    registering.join(5)
    store.close()
    assert [
        r["pid"] for r in json.loads((tmp_path / jobpersist.FILE_NAME).read_text())["jobs"]
    ] == [2]


def test_a_writer_that_hits_an_unexpected_error_keeps_writing(tmp_path, monkeypatch, caplog):
    """Anything but OSError in a write killed the writer thread, and every registration
    after it waited its full 2 s for a write that never came."""
    store = RegistrationsFile(tmp_path, BOOT, LOG)
    real = jobpersist.write_json_atomic
    calls = []

    def once_broken(*a, **k):
        calls.append(1)
        if len(calls) == 1:
            raise TypeError("not JSON serializable")
        return real(*a, **k)

    monkeypatch.setattr(jobpersist, "write_json_atomic", once_broken)
    table = JobTable(on_change=store.save)
    with caplog.at_level(logging.ERROR):
        table.register(_entry(pid=1))
    t0 = time.monotonic()
    table.register(_entry(pid=2))
    assert time.monotonic() - t0 < 1.0  # written at once, no 2 s wait
    rows = json.loads((tmp_path / jobpersist.FILE_NAME).read_text())["jobs"]
    assert [r["pid"] for r in rows] == [1, 2] and "registrations_write_failed" in caplog.text
    store.close()


def test_a_registration_waits_for_the_disk_without_holding_the_registrys_lock(
    tmp_path, monkeypatch
):
    """Its row is on disk before the client is answered, but another client's unregister
    (the registry's lock) does not queue behind that fsync."""
    import os
    import threading

    from daemon.registry import JobRegistry

    gate = threading.Event()
    real = jobpersist.write_json_atomic
    monkeypatch.setattr(
        jobpersist, "write_json_atomic", lambda *a, **k: (gate.wait(5), real(*a, **k))[1]
    )
    store = RegistrationsFile(tmp_path, BOOT, LOG)
    table = JobTable()
    table.register(_entry(pid=4242, registrant_uid=None))
    table.on_change = store.save
    reg = JobRegistry(table, now=time.monotonic, alive=lambda pid: True)
    done = threading.Event()
    registering = threading.Thread(
        target=lambda: (reg.register(os.getpid(), name="me"), done.set())
    )
    registering.start()
    time.sleep(0.2)
    assert not done.is_set()  # waiting for its row on disk
    t0 = time.monotonic()
    reg.unregister(4242)
    assert time.monotonic() - t0 < 0.5
    gate.set()
    registering.join(5)
    assert done.is_set()
    store.close()
    rows = json.loads((tmp_path / jobpersist.FILE_NAME).read_text())["jobs"]
    assert [r["pid"] for r in rows] == [os.getpid()]
