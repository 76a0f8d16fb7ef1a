"""No garbage collection between a tick's readings and its writes; the garbage still goes."""

from __future__ import annotations

import gc
import weakref

import pytest

from agents.governors import make_governor
from daemon.gchold import collector_held, start_frozen
from daemon.loop import ControlLoop
from platforms.clock import VirtualClock
from platforms.faketree import write_fake_tree
from platforms.platform import Platform
from platforms.procs import NoProcesses
from platforms.spec import load_board
from platforms.sysfs import DirSysfs


class Node:
    """A container the collector tracks; weak-referenceable to see it freed."""

    def __init__(self):
        self.me = self  # a cycle: only the collector frees it


def fake_loop(tmp_path, stage) -> ControlLoop:
    spec = load_board("tx2")
    write_fake_tree(spec, tmp_path / "tree")
    return ControlLoop(
        Platform(spec, DirSysfs(tmp_path / "tree"), NoProcesses(), VirtualClock(0.0), kind="fake"),
        make_governor("performance", native=True),
        period_s=0.1,
        stages=[stage],
    )


@pytest.fixture
def collections():
    """Every collection's start, with whether it ran inside the watched window."""
    state = {"inside": False, "starts": []}

    def cb(phase, info):
        if phase == "start":
            state["starts"].append((info["generation"], state["inside"]))

    assert gc.isenabled()
    gc.callbacks.append(cb)
    try:
        yield state
    finally:
        gc.callbacks.remove(cb)
        gc.enable()


def test_no_collection_runs_from_the_readings_to_the_writes(tmp_path, collections):
    refs = []

    def garbage(decision, obs):  # each tick leaves 3000 cycles behind: 4x the gen-0 threshold
        for _ in range(3000):
            refs.append(weakref.ref(Node()))
        return decision

    loop = fake_loop(tmp_path, garbage)
    read, apply = loop.sensor.read, loop.actuator.apply

    def watched_read(t):
        collections["inside"] = True
        return read(t)

    def watched_apply(decision, obs):
        report = apply(decision, obs)
        collections["inside"] = False
        return report

    loop.sensor.read, loop.actuator.apply = watched_read, watched_apply
    for _ in range(10):
        loop.tick()
    gc.collect(0)  # whatever the last tick made due (its deferred collection may be pending)
    starts = collections["starts"]
    assert starts, "the ticks' garbage was never collected"
    assert not [g for g, inside in starts if inside]
    assert sum(r() is not None for r in refs) == 0  # every tick's cycles were freed


def test_without_the_hold_the_same_ticks_collect_inside(tmp_path, collections, monkeypatch):
    """The test above can fail: the loop's own hold is what keeps the window clear."""
    import daemon.loop

    monkeypatch.setattr(daemon.loop, "collector_held", lambda: _NoHold())

    def garbage(decision, obs):
        for _ in range(3000):
            Node()
        return decision

    loop = fake_loop(tmp_path, garbage)
    read = loop.sensor.read

    def watched_read(t):
        collections["inside"] = True
        return read(t)

    loop.sensor.read = watched_read
    for _ in range(3):
        loop.tick()
    assert [g for g, inside in collections["starts"] if inside]


class _NoHold:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def test_a_tick_that_raises_gives_the_collector_back(tmp_path, collections):
    def broken(decision, obs):
        raise RuntimeError("stage failed")

    loop = fake_loop(tmp_path, broken)
    with pytest.raises(RuntimeError, match="stage failed"):
        loop.tick()
    assert gc.isenabled()


def test_a_collector_the_program_disabled_stays_disabled(tmp_path, collections):
    loop = fake_loop(tmp_path, lambda d, o: d)
    gc.disable()
    loop.tick()
    assert not gc.isenabled()
    with collector_held():
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_start_frozen_freezes_for_the_run_and_gives_the_objects_back():
    assert gc.get_freeze_count() == 0
    with start_frozen() as frozen:
        assert frozen > 1000  # the modules, classes and objects of the process
        assert gc.get_freeze_count() > 1000  # (less any freed since, by reference count)
    assert gc.get_freeze_count() == 0


def test_the_daemon_runs_its_loop_frozen(tmp_path, monkeypatch):
    import daemon.service
    from daemon.service import run_live

    monkeypatch.setattr(daemon.service, "setup_logging", lambda *a, **k: None)
    spec = load_board("tx2")
    write_fake_tree(spec, tmp_path / "tree")
    (tmp_path / "state").mkdir()
    seen = []
    tick = ControlLoop.tick

    def counting(self):
        seen.append(gc.get_freeze_count())
        return tick(self)

    monkeypatch.setattr(ControlLoop, "tick", counting)
    run_live(
        sysfs_root=str(tmp_path / "tree"),
        policy="maxfreq",
        state_dir=str(tmp_path / "state"),
        duration_s=0.3,
        socket_path=str(tmp_path / "state" / "s.sock"),
    )
    assert seen and min(seen) > 1000
    assert gc.get_freeze_count() == 0  # given back when the run ended


def test_an_exception_inside_the_loop_still_gives_the_tree_back(tmp_path, monkeypatch):
    """Restore is tested for signals and for kill -9 and a restart; an error raised by a tick
    must also leave every setting as it was, and no snapshot behind."""
    import daemon.service
    from daemon.service import run_live
    from platforms import paths

    monkeypatch.setattr(daemon.service, "setup_logging", lambda *a, **k: None)
    spec = load_board("tx2")
    tree = tmp_path / "tree"
    write_fake_tree(spec, tree)
    (tmp_path / "state").mkdir()
    # scaling_setspeed is not a setting: the kernel shows <unsupported> again once the governor
    # is no longer userspace, which a fake tree does not emulate
    names = ("scaling_governor", "scaling_min_freq", "scaling_max_freq")
    files = [tree / paths.policy_file(c.policy, n) for c in spec.clusters for n in names]
    before = {f: f.read_text().strip() for f in files if f.exists()}
    calls = []
    tick = ControlLoop.tick

    def failing(self):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("a tick failed")
        return tick(self)

    monkeypatch.setattr(ControlLoop, "tick", failing)
    with pytest.raises(RuntimeError, match="a tick failed"):
        run_live(
            sysfs_root=str(tree),
            policy="powersave",
            state_dir=str(tmp_path / "state"),
            duration_s=5.0,
            socket_path=str(tmp_path / "state" / "s.sock"),
        )
    assert len(calls) == 3
    assert {f: f.read_text().strip() for f in before} == before
    assert not (tmp_path / "state" / "restore.json").exists()
