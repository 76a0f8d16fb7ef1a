"""Measure a real program's reference profile on a board (``hidvfs profile measure``).

Three timed runs on the board's reference cluster: all its cores at the top OPP (the reference
makespan), one core at the top OPP (the work C) and all cores at about half the top (the
frequency sensitivity, beta). :func:`agents.deadlines.profile_from_runs` turns them into the
profile the gate and the shield plan deadlines with. The frequencies are pinned through the
daemon's own actuator, after the same restore snapshot the daemon takes, and given back
afterwards whatever happens (a crash leaves the snapshot for the next daemon start).

Each measurement can record its provenance (:func:`measure`'s ``provenance``), which the store
keeps beside the profile for ``hidvfs profile show``: when, on what and with which hidvfs.
"""

from __future__ import annotations

import datetime as _dt
import logging
import os
import platform
import statistics
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from agents.deadlines import profile_from_runs
from agents.policy import Decision, nearest_freq
from bots_bench.reference import reference_cluster
from daemon.actuator import Actuator
from daemon.restore import Session, begin_session, restore_snapshot
from platforms import cpufreq
from platforms.clock import MonotonicClock
from platforms.liveprocs import LiveProcessControl, exit_status, kill_job
from platforms.observation import JobProfile
from platforms.sense import Sensor
from platforms.spec import BoardSpec, ClusterSpec
from platforms.sysfs import DirSysfs
from platforms.treelock import TreeLock

log = logging.getLogger("hidvfs.profile")
_CLOCK = MonotonicClock()


class MeasureError(RuntimeError):
    """A run failed or could not be timed; nothing is stored."""


@dataclass(frozen=True)
class Run:
    """One timed configuration: which cores, at which frequency."""

    label: str
    cpus: tuple[int, ...]
    khz: int


def measured_cluster(spec: BoardSpec, online: Sequence[int]) -> tuple[ClusterSpec, tuple[int, ...]]:
    """The reference cluster and its online CPUs (a power mode may have taken some offline;
    timing on an offline core would only oversubscribe the others). When none of its CPUs is
    online, the cluster with the most online capacity stands in."""
    live = set(online)
    ref = reference_cluster(spec)
    cpus = tuple(c for c in ref.cpus if c in live)
    if cpus:
        return ref, cpus
    best = max(
        spec.clusters,
        key=lambda c: sum(1 for x in c.cpus if x in live) * c.capacity * c.fmax_khz,
    )
    cpus = tuple(c for c in best.cpus if c in live)
    if not cpus:
        raise MeasureError(f"{spec.name}: no online CPU to measure on")
    return best, cpus


def plan_runs(cluster: ClusterSpec, cpus: Sequence[int] | None = None) -> list[Run]:
    top = cluster.fmax_khz
    low = nearest_freq(cluster.freqs_khz, top / 2, mode="ceil")
    if low >= top:  # a one-entry table cannot tell beta
        raise MeasureError(f"cluster {cluster.name} has a single OPP: beta cannot be measured")
    cpus = tuple(cluster.cpus if cpus is None else cpus)
    return [
        Run("all cores, top", cpus, top),
        Run("one core, top", cpus[:1], top),
        Run("all cores, low", cpus, low),
    ]


def command_timer(
    env: Mapping[str, str] | None = None, check: Callable[[str], str | None] | None = None
) -> Callable[[Sequence[str], Sequence[int], float], float]:
    """A timer for :func:`measure`: runs ``argv`` confined to the given CPUs with ``env``
    (default: this process's at the time of each run) and as many OpenMP threads;
    ``check(stdout)`` names what makes a run that exited 0 a failure (e.g. a BOTS
    verification), or returns None."""
    base = None if env is None else dict(env)

    def timer(argv: Sequence[str], cpus: Sequence[int], timeout_s: float) -> float:
        run_env = dict(os.environ if base is None else base, OMP_NUM_THREADS=str(len(cpus)))
        t0 = _CLOCK.now()
        try:
            proc = subprocess.Popen(
                list(argv),
                env=run_env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                preexec_fn=lambda: os.sched_setaffinity(0, set(cpus)),
            )
        except OSError as err:
            raise MeasureError(f"cannot launch {argv[0]!r}: {err.strerror}") from None
        try:
            out, err_out = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            kill_job(proc)
            proc.communicate()
            raise MeasureError(f"{argv[0]} ran past {timeout_s:g} s; killed") from None
        except BaseException:
            # Ctrl-C, or a SIGTERM/SIGHUP turned into it: the command is in its own session,
            # so nothing else would stop it; it must not run on under the restored board
            kill_job(proc)
            proc.wait()
            raise
        elapsed = _CLOCK.now() - t0
        if proc.returncode != 0:
            tail = (err_out or b"").decode(errors="replace").strip().splitlines()[-1:]
            raise MeasureError(  # "killed by SIGSEGV (11)", not "status -11"
                f"{argv[0]} failed: {exit_status(proc.returncode)}"
                + (f": {tail[0]}" if tail else "")
            )
        if check is not None:
            problem = check((out or b"").decode(errors="replace"))
            if problem:
                raise MeasureError(f"{argv[0]}: {problem}")
        return elapsed

    return timer


time_command = command_timer()


def run_context(spec: BoardSpec, sysfs: DirSysfs) -> dict[str, str]:
    """Where a measurement runs, as its provenance records it (strings): ``hidvfs_version``
    (the installed package's), ``git_commit`` (of the hidvfs checkout, ``+dirty`` when its
    tracked files differ: :func:`agents.onnx_export.git_commit`; left out without git or
    outside a checkout), ``board``, ``kernel`` (``platform.release()``; left out when Python
    cannot tell) and ``sysfs_root`` (only for a tree other than this machine's ``/``, where the
    pins change no real clock). Never raises: what cannot be read is left out."""
    from agents.onnx_export import git_commit
    from tools import __version__

    out = {"hidvfs_version": str(__version__), "board": spec.name}
    try:
        commit = git_commit()
    except Exception:  # noqa: BLE001 - provenance never costs a measurement
        commit = "unknown"
    if commit and commit != "unknown":
        out["git_commit"] = commit
    kernel = platform.release()
    if kernel:
        out["kernel"] = kernel
    root = getattr(sysfs, "root", "/")
    if root != "/":
        out["sysfs_root"] = str(root)
    return out


def utc_now() -> str:
    """Now in UTC, ISO 8601 to the second (``2025-06-01T12:00:00+00:00``), what
    ``datetime.fromisoformat`` reads back."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def measure(
    spec: BoardSpec,
    sysfs: DirSysfs,
    argv: Sequence[str],
    name: str,
    *,
    state_dir: str,
    timeout_s: float = 600.0,
    repeat: int = 1,
    timer: Callable[[Sequence[str], Sequence[int], float], float] = time_command,
    verify: Callable[[Sequence[int]], object] | None = None,
    provenance: dict[str, str] | None = None,
) -> tuple[JobProfile, dict[str, float]]:
    """Pin, time the three runs (the median of ``repeat`` each), restore; the profile and the
    times. ``timer`` runs one configuration (the tests substitute it). ``verify(cpus)``, when
    given, runs once before the first timed run, pinned as it is (all cores, top), and raises
    :class:`MeasureError` when the program's results are wrong: nothing is timed then.

    ``provenance``, when given, is filled with the measurement's (all strings): the
    :func:`run_context` read before the runs (the code that runs them), then ``measured_at``
    (UTC, ISO 8601, when the timed runs ended), the measured ``cluster``, its ``cpus`` (the
    all-cores runs' CPUs, as many OpenMP threads), ``low_khz`` (the frequency beta is measured
    at; the reference one is the profile's ``ref_khz``) and ``repeat``."""
    cluster, cpus = measured_cluster(spec, cpufreq.online_cpus(sysfs))
    runs = plan_runs(cluster, cpus)
    context = run_context(spec, sysfs) if provenance is not None else None
    # the board's lock for the timed runs: a running daemon would move the pins under them
    with TreeLock(sysfs):
        session = Session(sysfs, begin_session(sysfs, spec, state_dir, log), state_dir, log, spec)
        act = Actuator(sysfs, LiveProcessControl())
        session.attach(act)
        sensor = Sensor(spec, sysfs)
        times: dict[str, float] = {}
        try:
            for run in runs:
                obs = act.envelope(sensor.read(_CLOCK.now()))
                report = act.apply(Decision({cluster.name: run.khz}), obs)
                if report.errors:
                    raise MeasureError(
                        f"cannot pin {cluster.name} at {run.khz} kHz: {report.errors[0]}"
                    )
                if verify is not None and not times:
                    verify(run.cpus)
                # the median (models.md 8): the fastest of a few runs is the luckiest, and a
                # deadline set from it is tighter than the job's usual time
                times[run.label] = statistics.median(
                    timer(argv, run.cpus, timeout_s) for _ in range(repeat)
                )
        finally:
            restore_snapshot(sysfs, session.snapshot, log, state_dir=state_dir)
    if provenance is not None and context is not None:
        provenance.update(
            {
                "measured_at": utc_now(),
                **context,
                "cluster": cluster.name,
                "cpus": ",".join(str(c) for c in runs[0].cpus),
                "low_khz": str(runs[2].khz),
                "repeat": str(repeat),
            }
        )
    profile = profile_from_runs(
        name,
        ref_khz=runs[0].khz,
        low_khz=runs[2].khz,
        cores=len(runs[0].cpus),
        capacity=cluster.capacity,
        t_all_s=times[runs[0].label],
        t_one_s=times[runs[1].label],
        t_low_s=times[runs[2].label],
    )
    return profile, times
