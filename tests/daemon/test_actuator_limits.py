"""Without a ``userspace`` governor the actuator pins min = max = target; the policy must still
see the limits the daemon found, or it could never change the frequency again."""

from __future__ import annotations

import errno

import pytest

from agents.governors import make_governor
from daemon.actuator import Actuator
from platforms import paths
from platforms.errors import SysfsWriteError
from platforms.faketree import write_fake_tree
from platforms.procs import NoProcesses
from platforms.sense import Sensor
from platforms.spec import load_board
from platforms.sysfs import DirSysfs


class KernelLimits(DirSysfs):
    """A fake tree that refuses, as cpufreq does (EINVAL), a limit write that would leave
    scaling_min_freq above scaling_max_freq: a write order that passes through an inverted
    pair then leaves the wrong limits, which the tests see."""

    def write(self, path: str, value: str) -> None:
        name = path.rsplit("/", 1)[-1]
        if name in ("scaling_min_freq", "scaling_max_freq"):
            base = path.rsplit("/", 1)[0]
            lo = (
                int(value)
                if name == "scaling_min_freq"
                else self.read_int(f"{base}/scaling_min_freq")
            )
            hi = (
                int(value)
                if name == "scaling_max_freq"
                else self.read_int(f"{base}/scaling_max_freq")
            )
            if lo > hi:
                raise SysfsWriteError(path, value, errno.EINVAL, f"min {lo} > max {hi}")
        super().write(path, value)


@pytest.fixture
def no_userspace(tmp_path):
    spec = load_board("tx2")
    write_fake_tree(spec, tmp_path)
    sysfs = KernelLimits(tmp_path)
    for c in spec.clusters:
        f = tmp_path / paths.policy_file(c.policy, "scaling_available_governors")
        f.write_text(" ".join(g for g in f.read_text().split() if g != "userspace") + "\n")
    return spec, sysfs


def limits(sysfs, policy):
    return tuple(
        sysfs.read_int(paths.policy_file(policy, n))
        for n in ("scaling_min_freq", "scaling_max_freq")
    )


def run(spec, sysfs, act, sensor, name, ticks=2):
    pol = make_governor(name)
    for t in range(ticks):
        o = act.envelope(sensor.read(float(t)))
        act.apply(pol.decide(o), o)
    return {c.name: limits(sysfs, c.policy) for c in spec.clusters}


def test_pinned_limits_do_not_trap_the_policy(no_userspace):
    spec, sysfs = no_userspace
    a57 = spec.cluster("a57")
    found = limits(sysfs, a57.policy)
    act, sensor = Actuator(sysfs, NoProcesses()), Sensor(spec, sysfs)
    lo, hi = a57.freqs_khz[0], a57.fmax_khz
    assert run(spec, sysfs, act, sensor, "maxfreq")["a57"] == (hi, hi)
    assert run(spec, sysfs, act, sensor, "powersave")["a57"] == (lo, lo)
    assert run(spec, sysfs, act, sensor, "maxfreq")["a57"] == (hi, hi)
    seen = next(c for c in act.envelope(sensor.read(9.0)).clusters if c.name == "a57")
    assert (seen.min_khz, seen.max_khz) == found  # the policy sees what was there before us


def test_a_lower_ceiling_found_at_start_is_kept(no_userspace):
    spec, sysfs = no_userspace
    a57 = spec.cluster("a57")
    ceiling = a57.freqs_khz[10]
    sysfs.write(paths.policy_file(a57.policy, "scaling_max_freq"), str(ceiling))  # nvpmodel
    act, sensor = Actuator(sysfs, NoProcesses()), Sensor(spec, sysfs)
    assert run(spec, sysfs, act, sensor, "maxfreq")["a57"] == (ceiling, ceiling)
    run(spec, sysfs, act, sensor, "powersave")
    assert run(spec, sysfs, act, sensor, "maxfreq")["a57"] == (ceiling, ceiling)


def test_limits_changed_behind_our_back_become_the_envelope(no_userspace):
    spec, sysfs = no_userspace
    a57 = spec.cluster("a57")
    act, sensor = Actuator(sysfs, NoProcesses()), Sensor(spec, sysfs)
    run(spec, sysfs, act, sensor, "maxfreq")
    new_lo, new_hi = a57.freqs_khz[2], a57.freqs_khz[8]
    sysfs.write(paths.policy_file(a57.policy, "scaling_min_freq"), str(new_lo))
    sysfs.write(paths.policy_file(a57.policy, "scaling_max_freq"), str(new_hi))
    assert run(spec, sysfs, act, sensor, "maxfreq")["a57"] == (new_hi, new_hi)
    assert run(spec, sysfs, act, sensor, "powersave")["a57"] == (new_lo, new_lo)


def test_the_control_loop_decides_on_the_envelope(no_userspace):
    from daemon.loop import ControlLoop
    from platforms.clock import VirtualClock
    from platforms.platform import Platform

    spec, sysfs = no_userspace
    a57 = spec.cluster("a57")
    loop = ControlLoop(
        Platform(spec, sysfs, NoProcesses(), VirtualClock(0.0), kind="fake"),
        make_governor("maxfreq"),
        period_s=0.1,
    )
    loop.tick()
    assert limits(sysfs, a57.policy) == (a57.fmax_khz, a57.fmax_khz)
    loop.policy = make_governor("powersave")
    loop.tick()
    assert limits(sysfs, a57.policy) == (a57.freqs_khz[0], a57.freqs_khz[0])


def test_drift_elsewhere_does_not_trap_the_policy(no_userspace):
    """The loop's drift check forgets the actuator's modes (e.g. the governor was changed);
    the limits it had pinned must still be known as its own."""
    spec, sysfs = no_userspace
    a57 = spec.cluster("a57")
    act, sensor = Actuator(sysfs, NoProcesses()), Sensor(spec, sysfs)
    run(spec, sysfs, act, sensor, "maxfreq")
    act.overridden(paths.policy_file(a57.policy, "scaling_governor"))
    assert run(spec, sysfs, act, sensor, "powersave")["a57"] == (a57.freqs_khz[0],) * 2
    assert run(spec, sysfs, act, sensor, "maxfreq")["a57"] == (a57.fmax_khz,) * 2


def test_dry_run_pins_nothing_and_sees_the_tree(no_userspace):
    spec, sysfs = no_userspace
    a57 = spec.cluster("a57")
    before = limits(sysfs, a57.policy)
    act, sensor = Actuator(sysfs, NoProcesses(), dry_run=True), Sensor(spec, sysfs)
    run(spec, sysfs, act, sensor, "powersave")
    assert limits(sysfs, a57.policy) == before
    assert act.envelope(o := sensor.read(5.0)) is o
    assert (paths.policy_file(a57.policy, "scaling_max_freq"), str(a57.freqs_khz[0])) in act.planned


def test_a_kernel_governor_gets_the_limits_back(no_userspace):
    from agents.policy import Decision

    spec, sysfs = no_userspace
    a57 = spec.cluster("a57")
    found = limits(sysfs, a57.policy)
    act, sensor = Actuator(sysfs, NoProcesses()), Sensor(spec, sysfs)
    run(spec, sysfs, act, sensor, "powersave")
    o = act.envelope(sensor.read(3.0))
    act.apply(Decision({}, governor={c.name: "schedutil" for c in spec.clusters}), o)
    assert limits(sysfs, a57.policy) == found


def test_a_pin_never_leaves_the_limits_found(no_userspace):
    """nvpmodel's ceiling holds even if a decision asks for more: no kernel clamps a pin."""
    from agents.policy import Decision

    spec, sysfs = no_userspace
    a57 = spec.cluster("a57")
    ceiling = a57.freqs_khz[9]
    sysfs.write(paths.policy_file(a57.policy, "scaling_max_freq"), str(ceiling))
    act, sensor = Actuator(sysfs, NoProcesses()), Sensor(spec, sysfs)
    for t in range(2):
        o = act.envelope(sensor.read(float(t)))
        act.apply(Decision({"a57": a57.fmax_khz}), o)
    assert limits(sysfs, a57.policy) == (ceiling, ceiling)


def test_limits_put_back_are_what_the_drift_check_expects(no_userspace):
    """Giving the limits back (to a kernel governor) updates what the drift check compares
    with: the daemon's own restore is not reported as someone else's change."""
    from agents.policy import Decision
    from daemon.restore import detect_drift

    spec, sysfs = no_userspace
    act, sensor = Actuator(sysfs, NoProcesses()), Sensor(spec, sysfs)
    run(spec, sysfs, act, sensor, "powersave")
    o = act.envelope(sensor.read(3.0))
    act.apply(Decision({}, governor={c.name: "schedutil" for c in spec.clusters}), o)
    assert detect_drift(sysfs, act.expected) == []


def test_a_dry_run_shows_each_write_once_and_only_those_the_real_run_makes(no_userspace):
    """A dry run prints the writes a real run would make: a value already in place is not
    written, and a repeated decision writes nothing (it printed every tick before)."""
    spec, sysfs = no_userspace
    a57 = spec.cluster("a57")
    lo, hi = a57.freqs_khz[0], a57.freqs_khz[2]
    for n, v in (("scaling_min_freq", lo), ("scaling_max_freq", hi)):
        sysfs.write(paths.policy_file(a57.policy, n), str(v))
    act, sensor = Actuator(sysfs, NoProcesses(), dry_run=True), Sensor(spec, sysfs)
    run(spec, sysfs, act, sensor, "maxfreq", ticks=5)  # maxfreq in limits: pins min = max = hi
    mine = [(p, v) for p, v in act.planned if f"policy{a57.policy}/" in p]
    assert mine == [(paths.policy_file(a57.policy, "scaling_min_freq"), str(hi))]


def test_a_cluster_the_kernel_holds_below_the_target_is_not_rewritten_every_tick(tmp_path):
    """A thermal or firmware cap keeps scaling_cur_freq below the setspeed: one more write
    when it is first seen, then none while it holds; a new reading or target writes again."""
    spec = load_board("tx2")
    write_fake_tree(spec, tmp_path)
    sysfs = DirSysfs(tmp_path)
    a57 = spec.cluster("a57")
    cur = paths.policy_file(a57.policy, "scaling_cur_freq")
    setspeed = paths.policy_file(a57.policy, "scaling_setspeed")
    act, sensor = Actuator(sysfs, NoProcesses()), Sensor(spec, sysfs)
    t = [0.0]

    def tick(name: str) -> int:
        t[0] += 1.0
        o = act.envelope(sensor.read(t[0]))
        return sum(
            1 for p, _ in act.apply(make_governor(name).decide(o), o).writes if p == setspeed
        )

    capped = a57.freqs_khz[5]
    sysfs.write(cur, str(capped))
    assert tick("maxfreq") == 1  # the target
    assert tick("maxfreq") == 1  # held elsewhere: once more
    assert [tick("maxfreq") for _ in range(3)] == [0, 0, 0]  # still held there: left alone
    sysfs.write(cur, str(a57.freqs_khz[7]))  # the cap moved
    assert tick("maxfreq") == 1 and tick("maxfreq") == 0
    sysfs.write(cur, str(a57.fmax_khz))  # the cap lifted: the kernel re-applied the setspeed
    assert tick("maxfreq") == 0
    assert tick("powersave") == 1  # a new target is always written
    assert sysfs.read(setspeed).strip() == str(a57.freqs_khz[0])


def test_a_write_that_keeps_failing_is_logged_once_and_its_recovery_too(tmp_path, caplog):
    """A setspeed file that is gone fails every tick: the retry goes on, the log line does not
    (at a 10 Hz tick it would flood the journal)."""
    spec = load_board("tx2")
    write_fake_tree(spec, tmp_path)
    sysfs = DirSysfs(tmp_path)
    act, sensor = Actuator(sysfs, NoProcesses()), Sensor(spec, sysfs)
    setspeed = tmp_path / paths.policy_file(0, "scaling_setspeed")
    pol = make_governor("maxfreq")
    o = act.envelope(sensor.read(0.0))
    act.apply(pol.decide(o), o)  # takes control: userspace and a setspeed
    setspeed.unlink()
    caplog.set_level("INFO", logger="hidvfs")
    for t in range(1, 6):
        o = act.envelope(sensor.read(float(t)))
        d = pol.decide(o)
        d.freq_khz = {k: spec.cluster(k).freqs_khz[t % 3] for k in d.freq_khz}  # keep writing
        report = act.apply(d, o)
        assert report.errors  # still failing, still retried
    errors = [r for r in caplog.records if "actuation_error" in r.getMessage()]
    assert len(errors) == 1, [r.getMessage() for r in errors]
    setspeed.write_text("<unsupported>\n")
    o = act.envelope(sensor.read(9.0))
    assert not act.apply(pol.decide(o), o).errors
    assert any("actuation_recovered" in r.getMessage() for r in caplog.records)


class _Machine(NoProcesses):
    """Live processes on a machine of two CPUs, under a daemon driving a fake six-CPU tree."""

    def __init__(self):
        self.prio: dict[int, int] = {}
        self.aff: dict[int, tuple[int, ...]] = {}

    def alive(self, pid):
        return True

    def set_affinity(self, pid, cpus):
        self.aff[pid] = tuple(c for c in cpus if c in (0, 1))  # the kernel drops the others

    def get_affinity(self, pid):
        return self.aff.get(pid, (0, 1))

    def set_priority(self, pid, rt_priority=0, nice=0):
        self.prio[pid] = rt_priority

    def get_priority(self, pid):
        return self.prio.get(pid, 0), 0

    def machine_cpus(self):
        return frozenset({0, 1})


def test_real_time_is_never_given_on_every_cpu_of_the_machine_the_job_runs_on(tmp_path):
    """On a fake tree the tree's CPUs are not the machine's: a job on tree CPUs 0-2 covers
    both CPUs of this machine, so it runs SCHED_OTHER; one on 0, 3-5 keeps SCHED_FIFO (it
    lands on CPU 0 alone)."""
    from agents.policy import Decision, JobSetting

    spec = load_board("tx2")
    write_fake_tree(spec, tmp_path)
    procs = _Machine()
    act = Actuator(DirSysfs(tmp_path), procs, live_jobs=True)
    o = act.envelope(Sensor(spec, DirSysfs(tmp_path)).read(0.0))
    jobs = {100: JobSetting((0, 1, 2), 90), 200: JobSetting((0, 3, 4, 5), 80)}
    act.apply(Decision({}, jobs), o)
    assert procs.prio[100] == 0
    assert procs.prio[200] > 0


def test_a_ceiling_set_during_the_run_is_what_the_stop_gives_back(no_userspace, tmp_path):
    """With min = max pins, nvpmodel's new limits become the envelope and the snapshot's
    originals for those files: the stop keeps its ceiling instead of raising it again. A
    value hidvfs itself pinned there is never taken for someone else's."""
    import logging

    from daemon.restore import Session, begin_session, load_snapshot, restore_snapshot

    spec, sysfs = no_userspace
    a57 = spec.cluster("a57")
    log = logging.getLogger("test.limits.adopt")
    state = tmp_path / "state"
    found = limits(sysfs, a57.policy)
    session = Session(sysfs, begin_session(sysfs, spec, state, log), state, log, spec)
    act, sensor = Actuator(sysfs, NoProcesses()), Sensor(spec, sysfs)
    session.attach(act)
    run(spec, sysfs, act, sensor, "powersave")
    run(spec, sysfs, act, sensor, "maxfreq")  # pinned at the top
    ceiling = a57.freqs_khz[8]
    sysfs.write(paths.policy_file(a57.policy, "scaling_min_freq"), str(a57.freqs_khz[1]))
    sysfs.write(paths.policy_file(a57.policy, "scaling_max_freq"), str(ceiling))  # nvpmodel
    assert run(spec, sysfs, act, sensor, "maxfreq")["a57"] == (ceiling, ceiling)
    saved = next(p for p in load_snapshot(state).policies if p.policy == a57.policy)
    assert (saved.min_khz, saved.max_khz) == (str(a57.freqs_khz[1]), str(ceiling))
    report = restore_snapshot(sysfs, session.snapshot, log, state_dir=state)
    assert report.ok and limits(sysfs, a57.policy) == (a57.freqs_khz[1], ceiling)
    # someone lowers only the floor: the top still reads our pin, which is not theirs
    session = Session(sysfs, begin_session(sysfs, spec, state, log), state, log, spec)
    act = Actuator(sysfs, NoProcesses())
    session.attach(act)
    start = limits(sysfs, a57.policy)
    run(spec, sysfs, act, sensor, "powersave")
    assert limits(sysfs, a57.policy) == (a57.freqs_khz[1], a57.freqs_khz[1])
    sysfs.write(paths.policy_file(a57.policy, "scaling_min_freq"), str(a57.freqs_khz[0]))
    run(spec, sysfs, act, sensor, "powersave")
    saved = next(p for p in load_snapshot(state).policies if p.policy == a57.policy)
    assert (saved.min_khz, saved.max_khz) == (str(a57.freqs_khz[0]), str(start[1]))
    assert found != start  # the first run's stop kept nvpmodel's limits


def test_a_setspeed_that_never_takes_a_write_falls_back_to_pinned_limits(tmp_path, caplog):
    """userspace listed but scaling_setspeed missing: the first failed write switches the
    policy to min = max pins for the run (it re-selected userspace every tick and applied no
    frequency, not even the guard's cap), said once; the stop gives back governor and limits."""
    import logging

    from agents.policy import Decision
    from daemon.restore import Session, begin_session, restore_snapshot

    spec = load_board("tx2")
    write_fake_tree(spec, tmp_path / "tree")
    sysfs = KernelLimits(tmp_path / "tree")
    a57 = spec.cluster("a57")
    (tmp_path / "tree" / paths.policy_file(a57.policy, "scaling_setspeed")).unlink()
    gov = paths.policy_file(a57.policy, "scaling_governor")
    found = (sysfs.read(gov), limits(sysfs, a57.policy))
    log = logging.getLogger("test.limits.setspeed")
    state = tmp_path / "state"
    session = Session(sysfs, begin_session(sysfs, spec, state, log), state, log, spec)
    act, sensor = Actuator(sysfs, NoProcesses()), Sensor(spec, sysfs)
    session.attach(act)
    caplog.set_level("INFO", logger="hidvfs")
    cap = a57.freqs_khz[5]
    writes = []
    for t in range(4):
        o = act.envelope(sensor.read(float(t)))
        writes += act.apply(Decision({"a57": a57.fmax_khz}, cap_khz={"a57": cap}), o).writes
        assert limits(sysfs, a57.policy) == (cap, cap)  # the cap holds from the first tick
    assert [v for p, v in writes if p == gov] == ["userspace"]  # selected once, not every tick
    said = [r.getMessage() for r in caplog.records if "actuation_error" in r.getMessage()]
    assert len(said) == 1 and "scaling_setspeed refused" in said[0], said
    act.overridden(gov)  # the drift check forgets the modes: still no userspace again
    o = act.envelope(sensor.read(5.0))
    assert not act.apply(Decision({"a57": a57.freqs_khz[0]}), o).errors
    assert limits(sysfs, a57.policy) == (a57.freqs_khz[0],) * 2
    assert restore_snapshot(sysfs, session.snapshot, log, state_dir=state).ok
    assert (sysfs.read(gov), limits(sysfs, a57.policy)) == found
