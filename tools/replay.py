"""Replay a trace through the real control loop (used by ``hidvfs trace replay`` and CI)."""

from __future__ import annotations

import logging
import re
import threading
from dataclasses import replace
from typing import Any

from agents.factory import make_policy_stack
from agents.mixed import daemon_stages
from daemon.config import Config, parse_config, policy_options
from daemon.guard import config_guard
from daemon.jobs import JobEntry, JobExit, JobOutcome, JobTable
from daemon.logs import log_event
from daemon.loop import ControlLoop
from platforms.clock import VirtualClock
from platforms.errors import HidvfsError, TraceError
from platforms.observation import JobProfile
from platforms.platform import Platform
from platforms.probe import detect_board, probe
from platforms.procs import NoProcesses
from platforms.rtbandwidth import planning_margin, rt_share
from platforms.spec import BoardSpec, load_board
from platforms.trace import (
    CONFIG_KEY,
    RECORDED_BY,
    RECORDS_JOBS,
    RECORDS_RECHECKS,
    TIME_EPS_S,
    RecheckReads,
    RecordedProcesses,
    ReplaySysfs,
    Sample,
    Trace,
    compare_writes,
    header_board,
    header_note,
    read_trace,
)

log = logging.getLogger("hidvfs.replay")

#: a replay longer than this many ticks is refused: it is a sparse or mistimed trace, and it
#: would run for hours
MAX_TICKS = 10_000_000


class ReplayError(HidvfsError):
    """A trace that cannot be replayed (no samples, or far too many ticks)."""


def recorded_policy(trace: Trace) -> str | None:
    """The policy of the daemon that recorded ``trace`` (``daemon --record``), else None."""
    if trace.header.extra.get(RECORDED_BY) != "daemon":
        return None
    name = trace.header.extra.get("policy")
    return name if isinstance(name, str) else None


def recorded_config(trace: Trace) -> Config | None:
    """The decision settings a daemon recording stores in its header (None: none stored, a
    recording of an older hidvfs or a `trace record` trace)."""
    data = trace.header.extra.get(CONFIG_KEY)
    if data is None:
        return None
    # a bad value is a ConfigError naming the file and the key (thermal.cap_khz, ...)
    return parse_config(data, f"{trace.path}: line 1: header {CONFIG_KEY!r}")


def records_jobs(trace: Trace) -> bool:
    """Whether the samples of ``trace`` carry the jobs the recording daemon's loop saw."""
    return trace.header.extra.get(RECORDS_JOBS) is True


def _profile(row: dict[str, Any] | None, where: str) -> JobProfile | None:
    if row is None:
        return None
    try:
        return JobProfile(**row)
    except TypeError as err:
        raise ReplayError(f"{where}: a job's profile: {err}") from None


class RecordedJobs(JobTable):
    """The job table as the recording daemon's control loop saw it, tick by tick
    (:meth:`feed` a sample's ``"j"`` before its tick): the same registrations in the same
    order, and the same ends reported by the registry, so the policy, the gate, the shield,
    the reservation and the guard see the jobs they saw. A job the loop finds gone is
    finished as the daemon's was (:meth:`JobTable.finish`)."""

    def __init__(self, path: str):
        super().__init__()
        self._path = path
        self._seen: dict[int, JobEntry] = {}  # the registrations of the last tick fed

    def feed(self, s: Sample) -> None:
        j = s.j or {}
        where = f"{self._path}: t={s.t:.6f}"
        known = dict(self._seen)
        for row in j.get("new", ()):
            adopter = row.get("adopter")
            known[row["pid"]] = JobEntry(
                pid=row["pid"],
                name=row["name"],
                release_t=float(row["release_t"]),
                deadline_s=row.get("deadline_s"),
                criticality=row["criticality"],
                profile=_profile(row.get("profile"), where),
                registrant_uid=row.get("registrant_uid"),
                start_time=row.get("start_time"),
                adopter=(adopter[0], adopter[1]) if adopter else None,
            )
        seen = {}
        for fact in j.get("jobs", ()):
            entry = known.get(fact["pid"])
            if entry is None:
                raise ReplayError(
                    f"{where}: job pid {fact['pid']} was never registered in the recording "
                    "(an edited or cut trace)"
                )
            seen[entry.pid] = entry
        self._seen = seen
        with self._lock:
            self._jobs = dict(seen)
        for row in j.get("ended", ()):
            exit = None
            if row.get("exit") is not None:  # how it ended, as its launcher said
                try:
                    exit = JobExit(**row["exit"])
                except TypeError as err:
                    raise ReplayError(f"{where}: a job's exit: {err}") from None
            out = JobOutcome(
                row["pid"],
                row["name"],
                row["criticality"],
                float(row["release_t"]),
                float(row["finish_t"]),
                row.get("deadline_s"),
                exit,
            )
            # a job the loop saw end while its launcher lived waited for this word
            with self._lock:
                self._held.pop(out.pid, None)
            # reported through the registry, as the daemon's table counted it
            self.record_outcome(out, seen=False)


class _JobFeed:
    """Hands the recorded jobs of every sample up to the clock to the table and the process
    backend, in order, before each tick (in lockstep, exactly the tick's sample)."""

    def __init__(self, trace: Trace, jobs: RecordedJobs, procs: RecordedProcesses):
        self.samples = trace.samples
        self.jobs = jobs
        self.procs = procs
        self.next = 0

    def __call__(self, now: float) -> None:
        while self.next < len(self.samples) and self.samples[self.next].t <= now + TIME_EPS_S:
            s = self.samples[self.next]
            self.jobs.feed(s)
            self.procs.feed(s.j)
            self.next += 1


def unchecked(trace: Trace, config: Config | None) -> list[str]:
    """What a replay of a daemon recording cannot reproduce, and why: said with ``--check``
    so a difference is not taken for a wrong decision."""
    if recorded_policy(trace) is None:
        return []
    out = []
    if config is None and recorded_config(trace) is None:
        out.append(
            "the recording stores no config (an older hidvfs): it is replayed with the default "
            "config, so writes that a config file changed (thermal caps or margin, "
            "deadline_slack, mixed_criticality, shield) cannot be reproduced; give it with --config"
        )
    if not records_jobs(trace):
        out.append(
            "the recording stores no jobs (an older hidvfs): it is replayed without any, so "
            "writes decided for a registered job cannot be reproduced"
        )
    return out


def trace_board(trace: Trace, sysfs: ReplaySysfs) -> BoardSpec:
    """The spec to replay ``trace`` on: the header's board, else (``unknown``, null) the one
    its recording describes.

    A shipped header board other than the one its recorded device tree is detected as is
    refused: its clusters and zones are not in the trace (writes to missing policies, zones
    unwatched). A name hidvfs does not ship is described from the recording, with a warning.
    """
    name = header_board(trace)
    if name is None:  # describe it from the recording
        note = header_note(trace)
        if note:
            logging.getLogger("hidvfs.replay").warning("%s", note)
        return probe(sysfs).spec
    detected = detect_board(sysfs)
    if detected and detected != name:
        raise TraceError(
            trace.path,
            1,
            f"header board {name!r}, but the board its recorded files show is detected as "
            f"{detected!r}; set the header's board to {detected!r}",
        )
    return load_board(name)


_POLICY_FILE_RE = re.compile(r"devices/system/cpu/cpufreq/(policy\d+)/[^/]+")


def unrecorded_policies(trace: Trace, spec: BoardSpec) -> str | None:
    """Why the board described from ``trace`` (:func:`trace_board`) lacks a policy the trace
    has: the header files of that policy that no sample holds a value of (a daemon recording
    of an older hidvfs, whose samples hold only what the daemon read on its ticks: a driver
    without a frequency table has its grid from ``cpuinfo_min_freq``/``cpuinfo_max_freq``,
    read at the start only). None when the board is a shipped one or lacks no such policy."""
    if header_board(trace) is not None:
        return None
    controlled = {f"policy{c.policy}" for c in spec.clusters}
    recorded = {p.strip("/") for s in trace.samples for p in s.r}
    missing: dict[str, list[str]] = {}
    for path in sorted(trace.header.files):
        m = _POLICY_FILE_RE.fullmatch(path.strip("/"))
        if m and m.group(1) not in controlled and path.strip("/") not in recorded:
            missing.setdefault(m.group(1), []).append(path)
    if not missing:
        return None
    return (
        f"{', '.join(sorted(missing, key=lambda p: int(p[len('policy') :])))} cannot be "
        "described from the recording, so the replay does not control them and their writes "
        "cannot be reproduced: the header lists files no sample holds a value of (a recording "
        "of an older hidvfs, which recorded only what the daemon read on its ticks): "
        + ", ".join(f for files in missing.values() for f in files)
    )


def replay_trace(
    path: str,
    policy_name: str | None,
    period_ms: int | None = None,
    config: Config | None = None,
    *,
    allow_truncated: bool = False,
    stop: threading.Event | None = None,
    duration_s: float | None = None,
) -> dict:
    """Run the control loop on a recorded trace; its writes are kept, never applied.

    ``stop`` (set by a signal handler, :class:`daemon.stopsignals.StopOnSignals`) ends the
    replay at the next tick; the result is then the replay so far, with ``stopped`` true.

    Replay time is trace time (a read at t sees the latest sample at or before t). A trace the
    daemon recorded (``daemon --record``) is replayed tick by tick at its sample times with
    the daemon's policy stack, unless ``period_ms`` is given, so its writes compare one to one.

    ``duration_s`` replays the first S seconds of trace time only: the samples before S, and
    at a period the ticks over [0, S), as ``daemon --sim --duration S`` runs.
    """
    trace = read_trace(path, allow_truncated=allow_truncated)
    if not trace.samples:
        raise ReplayError(f"{path}: the trace has no samples: nothing to replay")
    t_first, t_last = trace.samples[0].t, trace.samples[-1].t
    cut = duration_s is not None and t_last - t_first >= duration_s
    if cut:
        kept = [s for s in trace.samples if s.t - t_first < duration_s - 1e-9]
        trace = replace(trace, samples=kept)
        t_last = t_first + duration_s
    policy_name = policy_name or recorded_policy(trace) or "schedutil"
    lockstep = recorded_policy(trace) is not None and period_ms is None
    period = period_ms / 1000.0 if period_ms else trace.header.period_s
    duration = t_last - t_first
    if not lockstep and duration / period > MAX_TICKS:
        raise ReplayError(
            f"{path}: {duration:g} s at a {period:g} s period is more than {MAX_TICKS} ticks; "
            "give a longer --period-ms"
        )
    clock = VirtualClock(t_first)
    sysfs = ReplaySysfs(trace, clock, t0=0.0)  # replay time is trace time
    spec = trace_board(trace, sysfs)
    # the recording's jobs, fed back tick by tick; a trace without them has no live jobs
    feed = None
    if records_jobs(trace):
        procs = RecordedProcesses()
        jobs = RecordedJobs(trace.path)
        feed = _JobFeed(trace, jobs, procs)
    else:
        procs, jobs = NoProcesses(), None
    platform = Platform(spec, sysfs, procs, clock, kind="replay")
    # the config given, else the one the daemon recorded with, else the defaults
    cfg = config if config is not None else recorded_config(trace) or Config()
    notes = unchecked(trace, config)
    unrecorded = unrecorded_policies(trace, spec)
    if unrecorded is not None:
        notes.append(unrecorded)
    for note in notes:
        log.warning("%s: %s", path, note)
    # the stack the daemon runs (run_live): policy, its stages, the reservation, the guard
    policy, stages = make_policy_stack(policy_name, spec, **policy_options(cfg, policy_name))
    stages = daemon_stages(stages, cfg.mixed_criticality.reserve)
    loop = ControlLoop(
        platform,
        policy,
        period_s=period,
        jobs=jobs,
        stages=stages,
        guard=config_guard(spec, cfg),
        # as the daemon plans: deadline_slack, raised under the recorded RT throttling
        deadline_margin=planning_margin(cfg.deadline_slack, rt_share(sysfs)),
    )
    if feed is not None:
        loop.before_tick.append(feed)
    # the daemon checked its writes after each tick and wrote a changed one again on the
    # next (nvpmodel set it, say): the check runs again before each next tick, reading what
    # the daemon's read (its reads are in the next sample, "c" where the tick's differ). Only
    # a file the replay last wrote as the daemon did is checked: the recording's reads show
    # the daemon's writes, so another policy's (or a diverging replay's) would all read as
    # changed, and be written again every tick
    recheck = lockstep and trace.header.extra.get(RECORDS_RECHECKS) is True
    daemon_wrote: dict[str, str] = {}  # path -> the recording daemon's last write there
    if lockstep:
        for k, s in enumerate(trace.samples):
            if stop is not None and stop.is_set():
                break
            clock.set(max(s.t, clock.now()))
            if recheck and k:
                same = {
                    p
                    for p, v in loop.actuator.expected.items()
                    if daemon_wrote.get(p.strip("/")) == v
                }
                for msg in loop.actuator.recheck(RecheckReads(sysfs, s.c or {}), only=same):
                    log_event(log, "drift", level=logging.WARNING, detail=f"(recorded) {msg}")
            loop.tick()
            daemon_wrote.update((p.strip("/"), v) for p, v in s.w.items())
    else:
        loop.run(duration_s=duration if cut else max(duration, period), stop=stop)
    recorded = [(s.t, p, v) for s in trace.samples for p, v in (s.w or {}).items()]
    ours = list(sysfs.writes)
    mismatches = compare_writes(trace, ours) if recorded else []
    differing = sum(1 for m in mismatches if m.recorded is not None)
    return {
        "board": spec.name,
        "policy": policy_name,
        "lockstep": lockstep,
        "ticks": loop.ticks,
        "writes": ours,
        "recorded_writes": len(recorded),
        "mismatches": [str(m) for m in mismatches],
        # recorded writes the replay repeated with the same value on the same tick
        "matching_writes": len(recorded) - differing,
        # writes the replay made on a tick where the recording made none to that file
        "extra_writes": sum(1 for m in mismatches if m.recorded is None),
        "truncated": trace.truncated,
        # what the comparison cannot vouch for (an older recording), and why
        "unchecked": notes,
        "stopped": stop is not None and stop.is_set(),
        "status": loop.status(),
    }
