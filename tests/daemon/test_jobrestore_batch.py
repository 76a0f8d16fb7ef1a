"""jobs.json is written a few times per actuation round, not several times per job (at 1000
jobs the whole-file rewrites took most of two minutes), and still holds every job's
originals, and every new placement with the one it replaces, before the round's first
write to a process."""

from __future__ import annotations

import json
import logging
import os

import pytest

import daemon.jobrestore as jobrestore
from agents.policy import Decision, JobSetting
from daemon.actuator import Actuator
from daemon.jobrestore import JobOriginals, jobs_path, restore_stale_jobs
from platforms.observation import ClusterObs, Observation
from platforms.procs import NoProcesses, ProcessGone
from platforms.sysfs import DirSysfs

LOG = logging.getLogger("jobrestore-batch-test")


class _Procs(NoProcesses):
    """Jobs 100.. with no children; settings kept per pid, writes recorded."""

    def __init__(self, n):
        self.starts = {100 + k: float(k) for k in range(n)}
        self.aff: dict[int, tuple] = {}
        self.prio: dict[int, tuple] = {}
        self.calls: list[tuple] = []
        self.on_write = None  # called before every write (pid, what)

    def alive(self, pid):
        return pid in self.starts

    def start_time(self, pid):
        return self.starts.get(pid)

    def _check(self, pid, what):
        if pid not in self.starts:
            raise ProcessGone(pid)
        if self.on_write is not None:
            self.on_write(pid, what)

    def get_affinity(self, pid):
        return self.aff.get(pid, (0, 1, 2))

    def get_priority(self, pid):
        return self.prio.get(pid, (0, 0))

    def set_affinity(self, pid, cpus):
        self._check(pid, "aff")
        self.aff[pid] = tuple(cpus)
        self.calls.append(("aff", pid, tuple(cpus)))

    def set_priority(self, pid, rt_priority=0, nice=0):
        self._check(pid, "prio")
        self.prio[pid] = (rt_priority, 0) if rt_priority else (0, nice)
        self.calls.append(("prio", pid, rt_priority, nice))


def obs(t=0.0) -> Observation:
    c = ClusterObs("c", 0, (0, 1, 2), (0, 1, 2), (1000,), 1.0, None, None, None, None)
    return Observation(t, "toy", (c,), (), ())


def jobs(n, cpus=(0,), nice=5):
    return Decision({}, jobs={100 + k: JobSetting(cpus, 0, nice) for k in range(n)})


@pytest.fixture
def writes(monkeypatch):
    """Every write of jobs.json (its content), in order."""
    done = []
    real = jobrestore.write_json_atomic

    def counting(path, obj, **kw):
        done.append(json.loads(json.dumps(obj)))
        return real(path, obj, **kw)

    monkeypatch.setattr(jobrestore, "write_json_atomic", counting)
    return done


def _on_disk(tmp_path):
    with open(jobs_path(tmp_path), encoding="utf-8") as f:
        return {row["pid"]: row for row in json.load(f)["jobs"]}


class _Crash(BaseException):
    """The daemon dies here (SIGKILL): nothing after it runs."""


# -- the store -------------------------------------------------------------------------------


def test_deferred_changes_are_written_once_by_flush(tmp_path, writes):
    store = JobOriginals(tmp_path)
    with store.deferred():
        for pid in range(1, 51):
            store.record(pid, 1.0, (0, 1), (0, 0))
            store.placed(pid, (0,), 0, 5)
            store.members(pid, {pid + 1000: 2.0})
        assert writes == []
    store.flush()
    assert len(writes) == 1 and len(writes[0]["jobs"]) == 50
    store.flush()  # nothing pending: nothing written
    assert len(writes) == 1
    store.record(99, 1.0, (0,), (0, 0))  # outside the block: at once, as before
    assert len(writes) == 2


def test_a_failed_flush_keeps_the_changes_pending(tmp_path, monkeypatch):
    store = JobOriginals(tmp_path)
    real = jobrestore.write_json_atomic

    def full(path, obj, **kw):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(jobrestore, "write_json_atomic", full)
    with store.deferred():
        store.record(1, 1.0, (0, 1), (0, 0))
        store.placed(1, (0,), 0, 5)
    with pytest.raises(OSError):
        store.flush()
    monkeypatch.setattr(jobrestore, "write_json_atomic", real)
    store.flush()
    assert _on_disk(tmp_path)[1]["placed"] == {"cpus": [0], "rt_priority": 0, "nice": 5}


def test_dropping_every_job_in_a_batch_removes_the_file(tmp_path):
    store = JobOriginals(tmp_path)
    store.record(1, 1.0, (0,), (0, 0))
    with store.deferred():
        store.drop(1)
    store.flush()
    assert not os.path.exists(jobs_path(tmp_path))  # nothing steered: no file


# -- the actuator ------------------------------------------------------------------------------


def test_a_round_placing_many_jobs_writes_the_file_at_most_three_times(tmp_path, writes):
    n = 60
    procs = _Procs(n)
    act = Actuator(DirSysfs(tmp_path), procs, live_jobs=True, originals=JobOriginals(tmp_path))
    act.apply(jobs(n), obs())
    # the originals, then the placements; the writes left nothing new (no members, the
    # placements went through as written)
    assert len(writes) == 2
    assert [len(w["jobs"]) for w in writes] == [n] * 2
    assert all("placed" not in r for r in writes[0]["jobs"])
    assert all(r["placed"]["cpus"] == [0] for r in writes[1]["jobs"])
    act.apply(jobs(n, cpus=(1,)), obs(t=1.0))  # all of them move: two more
    assert len(writes) == 4
    assert all(
        r["placed_before"] == [{"cpus": [0], "rt_priority": 0, "nice": 5}]
        for r in writes[2]["jobs"]
    )
    assert all("placed_before" not in r for r in writes[3]["jobs"])
    for k in range(2, 60):  # re-applied every 5 s, nothing changed: nothing written
        act.apply(jobs(n, cpus=(1,)), obs(t=float(k)))
    assert len(writes) == 4


def test_every_jobs_originals_and_placement_are_on_disk_before_the_first_write(tmp_path):
    """The daemon dies at the round's very first write to a process: every job of the round
    is named, with its originals and the placement it was about to get."""
    n = 5
    procs = _Procs(n)
    seen = []

    def die_at_first_write(pid, what):
        seen.append(_on_disk(tmp_path))
        raise _Crash()

    procs.on_write = die_at_first_write
    act = Actuator(DirSysfs(tmp_path), procs, live_jobs=True, originals=JobOriginals(tmp_path))
    with pytest.raises(_Crash):
        act.apply(jobs(n), obs())
    (rows,) = seen
    assert sorted(rows) == [100 + k for k in range(n)]
    assert all(r["cpus"] == [0, 1, 2] and r["placed"]["cpus"] == [0] for r in rows.values())


def test_a_crash_halfway_through_a_round_names_both_placements_of_every_job(tmp_path):
    """All jobs move from CPU 0 to CPU 1; the daemon dies at the third job's priority write:
    those moved already, the one halfway and those not reached are all restored."""
    n = 5
    procs = _Procs(n)
    act = Actuator(DirSysfs(tmp_path), procs, live_jobs=True, originals=JobOriginals(tmp_path))
    act.apply(jobs(n), obs())

    def die(pid, what):
        if (pid, what) == (102, "prio"):
            raise _Crash()

    procs.on_write = die
    with pytest.raises(_Crash):
        act.apply(jobs(n, cpus=(1,), nice=3), obs(t=1.0))
    procs.on_write = None
    rows = _on_disk(tmp_path)
    for row in rows.values():
        assert row["placed"] == {"cpus": [1], "rt_priority": 0, "nice": 3}
        assert row["placed_before"] == [{"cpus": [0], "rt_priority": 0, "nice": 5}]
    procs.calls.clear()
    assert restore_stale_jobs(tmp_path, procs, LOG) == n
    assert all(procs.aff[100 + k] == (0, 1, 2) for k in range(n))
    assert all(procs.prio[100 + k] == (0, 0) for k in range(n))


def test_jobs_whose_originals_cannot_be_saved_are_not_steered(tmp_path, monkeypatch):
    n = 4
    procs = _Procs(n)
    store = JobOriginals(tmp_path)
    act = Actuator(DirSysfs(tmp_path), procs, live_jobs=True, originals=store)
    real = jobrestore.write_json_atomic

    def full(path, obj, **kw):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(jobrestore, "write_json_atomic", full)
    report = act.apply(jobs(n), obs())
    assert procs.calls == []
    assert len(report.errors) == n
    assert all("could not be saved for a crash restore" in e for e in report.errors)
    assert store.jobs == {}  # not kept as if saved
    monkeypatch.setattr(jobrestore, "write_json_atomic", real)
    report = act.apply(jobs(n, cpus=(1,)), obs(t=1.0))  # a new decision tries again
    assert report.errors == []
    assert all(procs.aff[100 + k] == (1,) for k in range(n))
    assert sorted(_on_disk(tmp_path)) == [100 + k for k in range(n)]


def test_a_gone_job_does_not_stop_the_others_originals(tmp_path):
    class Vanishing(_Procs):
        def get_affinity(self, pid):
            if pid == 101:
                raise ProcessGone(pid)
            return super().get_affinity(pid)

    procs = Vanishing(3)
    act = Actuator(DirSysfs(tmp_path), procs, live_jobs=True, originals=JobOriginals(tmp_path))
    report = act.apply(jobs(3), obs())
    assert report.gone == [101] and report.errors == []
    assert sorted(_on_disk(tmp_path)) == [100, 102]
    assert ("aff", 101, (0,)) not in procs.calls and ("aff", 102, (0,)) in procs.calls


def test_a_round_whose_placements_cannot_be_written_logs_each_job_once(
    tmp_path, monkeypatch, caplog
):
    n = 3
    procs = _Procs(n)
    act = Actuator(DirSysfs(tmp_path), procs, live_jobs=True, originals=JobOriginals(tmp_path))
    real = jobrestore.write_json_atomic

    def full_disk(path, obj, **kw):
        if any("placed" in r for r in obj["jobs"]):
            raise OSError(28, "No space left on device")
        return real(path, obj, **kw)

    monkeypatch.setattr(jobrestore, "write_json_atomic", full_disk)
    with caplog.at_level(logging.INFO, logger="hidvfs.actuator"):
        for t in (0.0, 6.0, 12.0):
            report = act.apply(jobs(n), obs(t=t))
            assert report.errors == []  # placed all the same
        assert caplog.text.count("event=job_originals_write_failed") == n
        monkeypatch.setattr(jobrestore, "write_json_atomic", real)
        act.apply(jobs(n), obs(t=18.0))
        assert caplog.text.count("event=job_placement_saved") == n
    assert all(r["placed"]["cpus"] == [0] for r in _on_disk(tmp_path).values())


def test_a_stop_releases_every_job_and_writes_the_store_once(tmp_path, writes):
    """release_all: every job gets its settings back, and the store is written once at the
    end (a stop with N jobs rewrote it N times, and a failing write midway left the jobs
    after it unreleased)."""
    procs = _Procs(5)
    act = Actuator(DirSysfs(str(tmp_path)), procs, live_jobs=True, originals=JobOriginals(tmp_path))
    act.apply(jobs(5), obs())
    assert set(_on_disk(tmp_path)) == set(procs.starts)
    writes.clear()
    act.release_all()
    assert len(writes) <= 1 and not os.path.exists(jobs_path(tmp_path))
    assert all(procs.aff[pid] == (0, 1, 2) for pid in procs.starts)  # given back
    assert all(procs.prio[pid] == (0, 0) for pid in procs.starts)
