"""Native BOTS runs: the real binaries, under a policy acting through the daemon's control loop.

One campaign opens the board once (live ``/`` or a ``--sysfs-root`` tree), saves the original
cpufreq settings before its first write and restores them at the end (a crash leaves the
snapshot for the next start). Each run: cool down to a start temperature, launch the binary in
its own session, register it with the loop, sample the power rails in a separate thread at
>= 100 Hz, wait (killing it past its timeout), then parse and verify its output. A kernel
whose ``-c`` also runs the sequential version is timed without it and verified by one untimed
``-c`` run per campaign (binary, input and thread count) before its first timed run.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import subprocess
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from bots_bench import registry
from bots_bench.parser import BotsParseError, parse_output, run_error
from bots_bench.spec import MeasuredOn, RunConfig
from daemon.actuator import Actuator
from daemon.jobs import JobEntry, JobTable
from daemon.loop import ControlLoop
from daemon.restore import Session, begin_session, restore_snapshot
from platforms import cpufreq
from platforms.clock import MonotonicClock
from platforms.errors import HidvfsError
from platforms.liveprocs import (
    LiveProcessControl,
    exit_status,
    forget_job,
    kill_job,
    kill_leftovers,
    kill_orphaned_jobs,
    spawn_job,
)
from platforms.observation import JobProfile
from platforms.platform import Platform
from platforms.probe import detect_board, probe
from platforms.sampler import RailSampler, SampleSummary
from platforms.sense import Sensor
from platforms.spec import load_board
from platforms.sysfs import DirSysfs
from platforms.treelock import TreeLock

log = logging.getLogger("hidvfs.native")


class BoardMismatchError(HidvfsError):
    """The board a campaign names is not the board it runs on."""


@dataclass
class NativeBoard:
    platform: Platform
    can_set_frequency: bool
    state_dir: str
    #: the board's originals while the campaign drives it (daemon.restore.Session)
    session: Session | None = None
    notes: list[str] = field(default_factory=list)
    sample_hz: float = 200.0
    #: (bench, class, variant, label, threads) -> the failure of its untimed ``-c`` run, or
    #: None when it verified: run once per campaign (see :func:`verify_once`)
    verified: dict[tuple, str | None] = field(default_factory=dict)
    #: the board's lock while the campaign drives its frequencies (no daemon at the same time)
    lock: TreeLock | None = None
    #: the caller's OpenMP variables a run left out, already warned about (once each)
    ignored_env: set[str] = field(default_factory=set)
    #: ``state_dir`` is the per-tree default (:func:`native_state_dir`), not one the user
    #: gave: :meth:`close` removes it when a clean end left it empty
    owns_state_dir: bool = False
    #: where a campaign's notes go while it runs (the cool-down's wait); its progress bar
    #: takes them over, above the bar
    say: Callable[[str], None] = field(default=log.info, repr=False)

    def settle(self) -> None:
        """Give the board its own settings back between runs, keeping the snapshot (and
        ``restore.json``) for the rest of the campaign: the cool-down and the next run's
        check start from the board's state, not from the last policy's pins."""
        if self.session is not None:
            report = restore_snapshot(self.platform.sysfs, self.session.snapshot, log)
            if not report.ok:
                log.warning("event=settle_failed detail=%r", report.summary())

    def close(self) -> None:
        if self.session is not None:
            report = restore_snapshot(
                self.platform.sysfs, self.session.snapshot, log, state_dir=self.state_dir
            )
            log.info("event=restored ok=%s detail=%r", report.ok, report.summary())
            self.session = None
        if self.lock is not None:
            self.lock.release()
            self.lock = None
        if self.owns_state_dir:
            # an empty default folder is all a clean campaign leaves: without this every
            # fake tree a campaign ever ran on keeps one under /tmp. A folder that still
            # holds a snapshot or a job record (a failed restore) is not empty and stays
            try:
                os.rmdir(self.state_dir)
            except OSError:
                pass


#: how much of a kernel's output is kept to parse (its result block comes last); a kernel
#: that prints hundreds of megabytes must not take as much memory
OUTPUT_TAIL_BYTES = 1 << 20


def _tail(f) -> str:
    """The last :data:`OUTPUT_TAIL_BYTES` of the file ``f``, as text."""
    size = f.seek(0, os.SEEK_END)
    f.seek(max(0, size - OUTPUT_TAIL_BYTES))
    return f.read().decode("utf-8", errors="replace")


def native_state_dir(root: str) -> str:
    """The state dir of native campaigns on the tree at ``root``: one per tree (a hash of its
    real path), so a snapshot a killed campaign left on one tree is never put back on another
    (a fake tree's onto the board, say)."""
    real = os.path.realpath(root)
    tag = hashlib.sha256(real.encode()).hexdigest()[:16]
    # one per user too: under /tmp another user's folder of the same name is refused
    # (platforms.privatedir), not shared
    return os.path.join(tempfile.gettempdir(), f"hidvfs-native-{os.geteuid()}-{tag}")


def open_board(
    sysfs_root: str = "/",
    board: str | None = None,
    state_dir: str | None = None,
    say: Callable[[str], None] = print,
) -> NativeBoard:
    """Open the board under ``sysfs_root`` for a campaign. The spec is the detected board's;
    ``board`` names the board the caller expects: a different detected board is refused
    (driving one board's tree with another's spec would write wrong OPPs and store runs
    under the wrong name), and it is used as given only when nothing is detected."""
    sysfs = DirSysfs(sysfs_root)
    detected = detect_board(sysfs)
    if board and detected and board != detected:
        raise BoardMismatchError(
            f"--board {board} was asked for, but the board under {sysfs.root} is detected as "
            f"{detected}; "
            f"leave --board out (the board is detected) or run on a {board}"
        )
    if board and not detected:
        say(
            f"warning: no board detected under {sysfs.root}: using --board {board}'s spec as "
            f"given; results are stored as {board}"
        )
    name = detected or board
    spec = load_board(name) if name else probe(sysfs).spec
    platform = Platform(
        spec,
        sysfs,
        LiveProcessControl(),
        MonotonicClock(),
        kind="live" if sysfs_root == "/" else "fake",
    )
    policies = cpufreq.list_policies(sysfs)
    writable = bool(policies) and all(
        sysfs.writable(f"devices/system/cpu/cpufreq/policy{p}/scaling_max_freq") for p in policies
    )
    owns_state_dir = not state_dir
    state_dir = state_dir or native_state_dir(sysfs.root)
    # a kernel a SIGKILLed campaign left running would share the board with every run
    for pid in kill_orphaned_jobs(state_dir):
        say(f"note: killed pid {pid}, a BOTS kernel left running by a campaign that was killed")
    nb = NativeBoard(
        platform,
        can_set_frequency=writable,
        state_dir=state_dir,
        owns_state_dir=owns_state_dir,
        say=say,
    )
    if not writable:
        say(
            f"note: this machine cannot set CPU frequencies ({'no cpufreq policy' if not policies else 'cpufreq files are read-only'} "
            f"under {sysfs.root}); runs go on with CPU affinity and priority only"
        )
    else:
        nb.lock = TreeLock(sysfs).acquire()  # a running daemon would undo the campaign's pins
        try:
            nb.session = Session(
                sysfs, begin_session(sysfs, spec, state_dir, log), state_dir, log, spec
            )
        except BaseException:
            nb.close()
            raise
    return nb


def file_sha256(path: str | os.PathLike[str]) -> str | None:
    """Hex SHA-256 of a file's content; None when it cannot be read (missing, a folder, no
    permission): the run then fails on its own, with the registry's message."""
    try:
        with open(path, "rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()
    except OSError:
        return None


def measured_on(
    cfg: RunConfig, nb: NativeBoard, digests: dict[str, str | None] | None = None
) -> MeasuredOn:
    """What ``cfg`` measures on ``nb`` beyond its spec (see :class:`MeasuredOn`).
    ``digests`` caches the binaries' hashes by path over a campaign's runs."""
    path = os.path.join(cfg.bots_bin or "", registry.binary_name(cfg.bench, cfg.variant, cfg.label))
    if digests is None:
        digests = {}
    if path not in digests:
        digests[path] = file_sha256(path)
    return MeasuredOn(
        sysfs_root=nb.platform.sysfs.root,
        frequency_control=nb.can_set_frequency,
        binary_sha256=digests[path],
    )


def cool_down(
    nb: NativeBoard, start_temp_c: float, max_wait_s: float
) -> tuple[float | None, float]:
    """Wait until the hottest CPU zone is at or below ``start_temp_c`` (or ``max_wait_s``).
    A wait is said when it starts and, when the zone is still hot at its end, that the run
    starts hot: minutes of silence looked like a hang."""
    clock = nb.platform.clock
    sensor = Sensor(nb.platform.spec, nb.platform.sysfs)
    t0 = clock.now()
    said = False
    while True:
        temp = sensor.read(clock.now()).max_cpu_temp_c
        waited = clock.now() - t0
        if temp is None or temp <= start_temp_c:
            return temp, waited
        if waited >= max_wait_s:
            nb.say(
                f"note: the CPU is still at {temp:.1f} °C after {waited:.0f} s of cool-down "
                f"(start below {start_temp_c:g} °C): the run starts hot (its start_temp_c "
                "is stored)"
            )
            return temp, waited
        if not said:
            said = True
            nb.say(
                f"cooling down: the hottest CPU zone is at {temp:.1f} °C; waiting up to "
                f"{max_wait_s:g} s for {start_temp_c:g} °C before the run"
            )
        clock.sleep(0.5)


def needs_separate_check(cfg: RunConfig) -> bool:
    """Whether the timed runs go without ``-c`` although the kernel can verify itself: for
    the kernels whose check also runs the sequential version in the same process, ``-c``
    would put that time into the measured makespan (an explicit ``check`` decides alone).
    Not for a serial build: it is the sequential version, and those kernels' serial builds
    cannot check (they print ``Verification = n/a``)."""
    return cfg.check is None and registry.needs_separate_check(cfg.bench, cfg.variant)


#: the untimed ``-c`` run also runs the sequential version: it gets this many timeouts
VERIFY_TIMEOUT_FACTOR = 4.0


def verify_once(cfg: RunConfig, nb: NativeBoard, build_policy: Callable) -> str | None:
    """The failure of one untimed ``-c`` run of ``cfg``'s binary and input, or None if it
    verified; done once per campaign for each binary, input and thread count, so a kernel
    that computes wrong results is never timed as a success. It runs under ``maxfreq`` (not
    at whatever the previous run's policy left), with a longer timeout."""
    key = (cfg.bench, cfg.cls, cfg.variant, cfg.label, cfg.threads)
    if key not in nb.verified:
        nb.verified[key] = _verification_run(cfg, nb, build_policy)
    return nb.verified[key]


def _verification_run(cfg: RunConfig, nb: NativeBoard, build_policy: Callable) -> str | None:
    check_cfg = replace(
        cfg,
        policy="maxfreq",
        check=True,
        deadline_s=None,
        cooldown=None,
        timeout_s=cfg.timeout_s * VERIFY_TIMEOUT_FACTOR,
    )
    rec = run_native(check_cfg, nb, build_policy)
    if rec["ok"]:
        return None
    hint = (
        "; raise --timeout (timeout_s in a spec), or set check: false in a spec to time it "
        "unverified"
        if str(rec["error"]).startswith("timeout")
        else ""
    )
    return f"verification run (-c, which also runs the sequential version): {rec['error']}{hint}"


def _command(cfg: RunConfig, threads: int, check: bool | None) -> registry.Command:
    return registry.command_for(
        cfg.bench,
        cfg.cls,
        cfg.bots_bin,
        threads,
        variant=cfg.variant,
        label=cfg.label,
        check=check,
        base_env=dict(os.environ),
    )


#: an energy integral that covers less of the run than this (its rail failed to read for the
#: rest) is an undercount: stored as unavailable, with the reason in ``energy_note``
MIN_ENERGY_COVERAGE = 0.9


def _round_or_none(x: float | None, digits: int = 4) -> float | None:
    return None if x is None else round(x, digits)


def usable_energy(samples: SampleSummary) -> tuple[float | None, float | None, list[str]]:
    """``(energy_j, cpu_energy_j, notes)`` of a run's sampling: an integral that covers less
    than :data:`MIN_ENERGY_COVERAGE` of the run is None (unavailable), and a note says why."""
    notes: list[str] = []

    def keep(label: str, energy: float | None, coverage: float | None) -> float | None:
        if energy is None or coverage is None or coverage >= MIN_ENERGY_COVERAGE:
            return energy
        notes.append(
            f"{label} unavailable: the rail was read for only {coverage:.0%} of the run "
            f"(< {MIN_ENERGY_COVERAGE:.0%}); its {energy:.3f} J would be an undercount"
        )
        return None

    return (
        keep("energy", samples.energy_j, samples.energy_coverage),
        keep("cpu energy", samples.cpu_energy_j, samples.cpu_energy_coverage),
        notes,
    )


def run_native(
    cfg: RunConfig, nb: NativeBoard, build_policy: Callable, profile: JobProfile | None = None
) -> dict:
    """One native run -> a run record (failures are recorded, never raised). ``profile``: the
    job's reference profile (``hidvfs profile measure``), so the gate and the shield can plan
    its deadline as the daemon does for a registered job."""
    spec = nb.platform.spec
    rec: dict = {
        "bench": cfg.bench,
        "class": cfg.cls,
        "policy": cfg.policy,
        "seed": cfg.seed,
        # the board this run was measured on (the detected one), whatever the spec said
        "board": spec.name,
        "backend": "native",
        "rep": cfg.rep,
        "makespan_s": None,
        "energy_j": None,
        "cpu_energy_j": None,
        "edp": None,
        "peak_temp_c": None,
        "deadline_s": cfg.deadline_s,
        "deadline_met": None,
        # the job registers as LO (one job at a time: nothing to reserve against)
        "criticality": "lo" if cfg.deadline_s is not None else None,
        "lower_bound_s": None,
        "graham_bound_s": None,
        "ok": False,
        "error": None,
        "time_program_s": None,
    }
    if not cfg.bots_bin:
        rec["error"] = "no BOTS binary folder given (--bots-bin or bots_bin in the spec)"
        return rec
    online = tuple(sorted(c for cl in spec.clusters for c in cl.cpus)) or tuple(
        range(os.cpu_count() or 1)
    )
    threads = cfg.threads or min(len(online), os.cpu_count() or 1)
    try:
        cmd = _command(cfg, threads, check=cfg.check)
    except (registry.RegistryError, OSError) as err:
        rec["error"] = str(err)
        return rec
    # the OpenMP variables the kernel is launched with, exactly (bots.md section 8): the
    # caller's own OMP_*, GOMP_* and KMP_* never reach it, and are named when left out or
    # replaced
    rec["omp_env"] = registry.openmp_env(cmd.env)
    ignored = [k for k, v in registry.openmp_env(os.environ).items() if rec["omp_env"].get(k) != v]
    if ignored:
        rec["omp_env_ignored"] = ignored
        if set(ignored) - nb.ignored_env:
            nb.ignored_env.update(ignored)
            log.warning(
                "event=openmp_env_ignored names=%s detail=%r",
                ",".join(ignored),
                "the campaign sets the kernels' OpenMP environment; these are not passed on",
            )
    if needs_separate_check(cfg):
        problem = verify_once(cfg, nb, build_policy)
        rec["verified_separately"] = problem is None
        if problem:
            rec["error"] = problem
            return rec
    if cfg.cooldown is not None:
        temp, waited = cool_down(nb, cfg.cooldown.start_temp_c, cfg.cooldown.max_wait_s)
        rec["start_temp_c"], rec["cooldown_s"] = temp, round(waited, 3)
    policy, stages = build_policy(cfg.policy, spec)
    table = JobTable()
    procs = nb.platform.procs
    actuator = Actuator(nb.platform.sysfs, procs)
    if nb.session is not None:  # only what the campaign writes is given back
        nb.session.attach(actuator)
    loop = ControlLoop(
        nb.platform,
        policy,
        period_s=max(getattr(policy, "period_s", 0.1), 0.01),
        jobs=table,
        stages=stages,
        actuator=actuator,
    )
    stop = threading.Event()
    sampler = RailSampler(spec, nb.platform.sysfs, rate_hz=nb.sample_hz)
    out = tempfile.TemporaryFile(mode="w+b")
    proc = worker = None
    try:
        sampler.start()
        t_launch = nb.platform.clock.now()
        proc = spawn_job(
            list(cmd.argv),
            dict(cmd.env),
            out,
            unlimited_stack=registry.input_class(cfg.bench, cfg.cls).unlimited_stack,
            record_in=nb.state_dir,
        )
        table.register(
            JobEntry(
                pid=proc.pid,
                name=registry.job_name(cfg.bench, cfg.cls, cfg.variant, cfg.label),  # its profile's
                release_t=t_launch,
                deadline_s=cfg.deadline_s,
                criticality="lo",
                profile=profile,
            )
        )
        worker = threading.Thread(
            target=loop.run, kwargs={"stop": stop}, name="hidvfs-loop", daemon=True
        )
        worker.start()
        timed_out = False
        try:
            proc.wait(timeout=cfg.timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            kill_job(proc)
            proc.wait()
        t_exit = nb.platform.clock.now()
        if kill_leftovers(proc):  # a background child would take the next run's cores
            log.warning("event=leftovers_killed pid=%d", proc.pid)
    except OSError as err:
        rec["error"] = str(err)
        stop.set()
        if worker is not None:
            worker.join(timeout=5.0)
        sampler.stop()
        nb.settle()
        return rec
    except BaseException:
        # Ctrl-C (or any other error) while the kernel runs: it is in its own session, so
        # nothing else would stop it; kill its group and stop our threads before going up
        if proc is not None and proc.returncode is None:
            kill_job(proc)
            proc.wait()
        stop.set()
        if worker is not None:
            worker.join(timeout=5.0)
        sampler.stop()
        out.close()
        raise
    finally:
        stop.set()
        forget_job(nb.state_dir)
    worker.join(timeout=5.0)
    samples = sampler.stop()
    nb.settle()
    text = _tail(out)
    out.close()
    makespan = t_exit - t_launch
    energy_j, cpu_energy_j, energy_notes = usable_energy(samples)
    rec.update(
        makespan_s=makespan,
        energy_j=energy_j,
        cpu_energy_j=cpu_energy_j,
        energy_coverage=_round_or_none(samples.energy_coverage),
        cpu_energy_coverage=_round_or_none(samples.cpu_energy_coverage),
        peak_temp_c=samples.peak_temp_c,
        sample_rate_hz=round(samples.rate_hz, 1),
        power_samples=samples.samples,
        series=samples.series,
        stdout=text[-20000:],
        returncode=proc.returncode,
        argv=list(cmd.argv),
        threads=threads,
        frequency_control=nb.can_set_frequency,
    )
    if energy_notes:
        rec["energy_note"] = "; ".join(energy_notes)
        log.warning("event=energy_unavailable detail=%r", rec["energy_note"])
    if energy_j is not None:
        rec["edp"] = energy_j * makespan
    if cfg.deadline_s is not None:
        rec["deadline_met"] = makespan <= cfg.deadline_s
    if timed_out:
        rec["error"] = f"timeout: killed after {cfg.timeout_s:g} s"
        return rec
    try:
        result = parse_output(text)
    except BotsParseError as err:
        rec["error"] = f"{exit_status(proc.returncode)}; {err}"
        return rec
    # a non-finite time is refused below; kept out of the record so JSON stays standard
    if math.isfinite(result.time_program_s):
        rec["time_program_s"] = result.time_program_s
    rec["verification"] = result.verification
    problem = run_error(result, cfg.bench, cmd.check)
    if problem:
        rec["error"] = problem
    elif proc.returncode != 0:
        rec["error"] = exit_status(proc.returncode)
    else:
        rec["ok"] = True
    return rec
