"""Actuation: turn a Decision into sysfs writes and process settings.

Frequency goes through the ``userspace`` governor + ``scaling_setspeed`` where the policy offers
it, otherwise through min/max bounds written in an order that keeps min <= max. Only values of
the policy's frequency table are written; redundant writes are skipped. Job placement uses the
platform's ProcessControl (CPU affinity of every thread, SCHED_FIFO or nice). Every failure is
logged and counted, never raised into the loop: a vanished pid or a refused write must not stop
the daemon.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field, replace

from agents.governors import ClusterView
from agents.policy import Decision, JobSetting, nearest_freq
from daemon.logs import log_event
from daemon.restore import detect_drift
from platforms import cpufreq, paths
from platforms.errors import SysfsUnavailable, SysfsWriteError
from platforms.observation import Observation
from platforms.procs import ProcessControl, ProcessGone
from platforms.sysfs import SysfsBackend

log = logging.getLogger("hidvfs.actuator")


@dataclass
class ActuationReport:
    writes: list[tuple[str, str]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    gone: list[int] = field(default_factory=list)
    #: what each error is about (the file for a sysfs error, whatever value was written), so
    #: a failure that persists while the values change is still one failure
    error_keys: dict[str, str] = field(default_factory=dict)
    #: the real-time cover rules this round (``Actuator.rt_cover_rules``): jobs the decision
    #: gave SCHED_FIFO that run SCHED_OTHER (they, or they with the other real-time jobs,
    #: would hold every online CPU), and best-effort jobs niced below one of them
    fifo_dropped: list[int] = field(default_factory=list)
    niced_below: list[int] = field(default_factory=list)


#: the highest SCHED_FIFO priority a live job gets: below the kernel's threaded interrupt
#: handlers (50), so a busy real-time job cannot keep an interrupt from being served
MAX_JOB_RT_PRIORITY = 40
#: a live job's placement is written again this often (s) even when the decision is the
#: same: the job (or someone) may have changed its own affinity or scheduling class
REAPPLY_S = 5.0
#: processes below one job whose settings are given back even after they leave its tree
MAX_MEMBERS = 256


def fifo_levels(priorities: set[int] | frozenset[int]) -> dict[int, int]:
    """The live SCHED_FIFO priority of each decided one (1..99): scaled to
    1..``MAX_JOB_RT_PRIORITY`` and strictly in the same order. Plain scaling merges
    neighbours (89 and 90 both become 36), and two jobs the gate ordered on shared CPUs would
    then run first come, first served; more distinct priorities than levels share the lowest."""
    ups = sorted(p for p in priorities if p > 0)
    out: list[int] = []
    for p in ups:  # upwards: at or above the scaled value, above the one below
        out.append(max(1, round(p * MAX_JOB_RT_PRIORITY / 99), out[-1] + 1 if out else 1))
    for i in range(len(out) - 1, -1, -1):  # downwards: under the ceiling, below the one above
        cap = MAX_JOB_RT_PRIORITY if i == len(out) - 1 else out[i + 1] - 1
        out[i] = max(1, min(out[i], cap))
    return dict(zip(ups, out))


#: how far below a real-time job the daemon had to run under SCHED_OTHER a best-effort job
#: sharing its CPUs is niced: 10 steps weigh about 1:10 in CFS, the nearest SCHED_OTHER has
#: to the decision's "runs only when the deadline job waits"
DEMOTED_NICE_GAP = 10
#: how far below such a job another one the decision ran real-time under it on shared CPUs
#: is niced when both run SCHED_OTHER: as DEMOTED_NICE_GAP, about 1:10, the nearest to the
#: decided order (the gate's deadline order; 5 steps, about 1:3, still missed the tighter
#: deadline on tx2's two-core cluster); best-effort work below the pair stops at nice 19
DEMOTED_ORDER_GAP = 10


def _share_cpus(a: JobSetting, b: JobSetting) -> bool:
    return not a.cpus or not b.cpus or bool(set(a.cpus) & set(b.cpus))


def below_demoted(
    decided: dict[int, JobSetting], safe: dict[int, JobSetting]
) -> dict[int, JobSetting]:
    """``safe`` with the decision's order kept where SCHED_FIFO could not be: jobs the
    decision ran real-time but that run SCHED_OTHER live (they cover every online CPU, or
    their owner may not take real-time priority) would share their CPUs as equals, with each
    other and with best-effort jobs. A demoted job is niced ``DEMOTED_ORDER_GAP`` below each
    demoted job decided above it on shared CPUs, and a best-effort job ``DEMOTED_NICE_GAP``
    below each demoted job on its CPUs (pure: nothing is written here)."""
    demoted = sorted(
        (pid for pid, s in safe.items() if decided[pid].rt_priority > 0 and s.rt_priority == 0),
        key=lambda pid: (-decided[pid].rt_priority, pid),
    )
    if not demoted:
        return safe
    out = dict(safe)
    for i, pid in enumerate(demoted):
        above = [
            out[q].nice
            for q in demoted[:i]
            if decided[q].rt_priority > decided[pid].rt_priority and _share_cpus(out[q], out[pid])
        ]
        if above:
            nice = max(out[pid].nice, min(19, max(above) + DEMOTED_ORDER_GAP))
            out[pid] = replace(out[pid], nice=nice)
    for pid, s in safe.items():
        if decided[pid].rt_priority > 0:
            continue
        shared = [out[d].nice for d in demoted if _share_cpus(out[d], s)]
        if shared:
            out[pid] = replace(s, nice=max(s.nice, min(19, max(shared) + DEMOTED_NICE_GAP)))
    return out


def fifo_off_every_cpu(setting: JobSetting, online: set[int] | frozenset[int]) -> JobSetting:
    """``setting`` under SCHED_OTHER (rt 0) if it is real-time on every online CPU (its CPU
    set covers them, or it is empty: any CPU): a busy real-time job there starves the daemon
    and the kernel's own threads (pure: nothing is written here)."""
    if setting.rt_priority > 0 and online and set(online) <= set(setting.cpus or online):
        return replace(setting, rt_priority=0)
    return setting


def _not_saved(err: OSError) -> str:
    return f"its settings could not be saved for a crash restore, so it is not steered ({err})"


def fifo_cover_kept(
    decided: dict[int, JobSetting],
    safe: dict[int, JobSetting],
    online: set[int] | frozenset[int],
    hi: set[int] | frozenset[int] = frozenset(),
    held: set[int] | frozenset[int] = frozenset(),
) -> dict[int, JobSetting]:
    """``safe`` with SCHED_FIFO taken from each job that would complete the cover: the CPUs of
    all the jobs a round gives real-time priority leave at least one online CPU without one
    (a job on CPU 0 and another on CPU 1 of a two-CPU machine would hold every CPU between
    them, as one job on both may not). ``held``: CPUs real-time jobs not in the round hold.

    Jobs keep FIFO in this order: HI jobs first, then the decided priority, highest first,
    then the lower pid; a job whose CPUs would complete the cover goes SCHED_OTHER (rt 0:
    :func:`below_demoted` nices best-effort work on its CPUs below it), those after it may
    still keep theirs. The order is the decision's alone, so the same decision gives the
    same result every tick (pure: nothing is written here)."""
    if not online:
        return safe
    covered = set(held) & set(online)
    out = dict(safe)
    fifo = [pid for pid, s in safe.items() if s.rt_priority > 0]
    fifo.sort(key=lambda pid: (pid not in hi, -decided[pid].rt_priority, pid))
    for pid in fifo:
        cpus = set(safe[pid].cpus or online) & set(online)
        if covered | cpus >= set(online):
            out[pid] = replace(safe[pid], rt_priority=0)
        else:
            covered |= cpus
    return out


def _as_read(placed: tuple) -> tuple[int, int]:
    """A placement's (rt, nice) as get_priority reads it back: nice does not apply to FIFO."""
    _, rt, nice = placed
    return (rt, 0) if rt > 0 else (0, nice)


#: placements of one job kept besides the current one while a change has not fully gone
#: through (a failed priority write after the affinity went, say): its processes may hold any
MAX_UNSETTLED = 4


def still_placed(
    placements, affinity: tuple[int, ...], priority: tuple[int, int]
) -> tuple[bool, bool]:
    """Whether a process still has the CPUs and the priority of one of ``placements`` (each
    (cpus, rt, nice): the last one, and any a change was still moving the job away from):
    only those are given back, one it set itself since is its own (release and crash restore
    alike)."""
    cpus = set(affinity)
    prio = tuple(priority)
    return (
        any(cpus == set(p[0]) for p in placements),
        any(prio == _as_read(p) for p in placements),
    )


class Actuator:
    """Applies decisions; remembers what it last wrote so it never repeats a write."""

    def __init__(
        self,
        sysfs: SysfsBackend,
        procs: ProcessControl,
        *,
        dry_run: bool = False,
        live_jobs: bool = False,
        rt_cover_rules: bool | None = None,
        originals=None,
    ):
        self.sysfs = sysfs
        self.procs = procs
        self.dry_run = dry_run
        #: real processes (the board daemon): keep their originals to give back, cap and
        #: vet real-time priority, re-apply now and then (a job may change its own settings)
        self.live_jobs = live_jobs
        if rt_cover_rules is None:
            rt_cover_rules = live_jobs
        if live_jobs and not rt_cover_rules:
            raise ValueError(
                "live jobs always run under the real-time cover rules: SCHED_FIFO on every "
                "online CPU would starve the daemon and the kernel's own threads"
            )
        #: the real-time cover rules a board run applies (None: as ``live_jobs``): no job is
        #: SCHED_FIFO on every online CPU (:func:`fifo_off_every_cpu`), nor do the round's
        #: real-time jobs together hold them all (:func:`fifo_cover_kept`); a job that loses
        #: SCHED_FIFO so runs SCHED_OTHER with best-effort work on its CPUs niced below it
        #: (:func:`below_demoted`). A simulated run may apply them too (no real process: no
        #: RLIMIT_RTPRIO ceiling, no scaling of the priorities to the live range)
        self.rt_cover_rules = bool(rt_cover_rules)
        self._job_originals: dict[int, tuple[tuple[int, ...], tuple[int, int]]] = {}
        #: where the originals and the last placement also go on disk
        #: (daemon.jobrestore.JobOriginals), so the next start gives them back after a crash
        self._originals_store = originals
        self._applied_at: dict[int, float] = {}
        #: pid -> {descendant pid: its start time} seen under the job when it was placed: a
        #: child the job leaves behind (reparented to init) keeps the job's settings, and is
        #: given the originals back too, if it is still the same process
        self._members: dict[int, dict[int, float]] = {}
        self._members_full: set[int] = set()  # jobs whose member cap was logged
        #: pid -> (pid, start time) of the process that launched the job and adopts what it
        #: leaves behind (``hidvfs run``, a child subreaper): its other descendants are the
        #: job's too, a helper that double-forked out of the job's tree included
        self._adopters: dict[int, tuple[int, float | None]] = {}
        self._placed_unsaved: set[int] = set()  # jobs whose placement write failed, logged
        #: jobs kept off SCHED_FIFO so that the real-time jobs leave a CPU free (logged)
        self._cover_fallback: set[int] = set()
        self._rt_allowed: dict[int, int] = {}  # pid -> its RLIMIT_RTPRIO ceiling, read once
        #: pid -> the uid that registered the job (None or 0: root, or in-process)
        self._registrants: dict[int, int | None] = {}
        #: pid -> (its identity, the lowest RLIMIT_RTPRIO of its tree, when read) for a job a
        #: user registered: read again when the job execs and at every re-apply
        self._rt_vetted: dict[int, tuple[tuple | None, int, float]] = {}
        #: pid -> its start time when its originals were taken: a pid that names another
        #: process by the time they are given back is left alone
        self._job_started: dict[int, float | None] = {}
        self._narrowed: dict[int, tuple] = {}  # pid -> (CPU set asked, what the kernel gave)
        self._mode: dict[int, str] = {}  # policy -> "setspeed" | "limits" | "governor:<name>"
        #: policies whose scaling_setspeed took a write this run; those where the first one
        #: failed (missing, read-only) are pinned with min = max for the rest of the run
        self._setspeed_ok: set[int] = set()
        self._setspeed_refused: set[int] = set()
        self._last_freq: dict[int, int] = {}
        #: policy -> the frequency the kernel held it at after we wrote the target again
        #: (a thermal or firmware cap): the same reading again means writing changes nothing
        self._clamped_at: dict[int, int] = {}
        #: the errors the last apply logged: one that persists is logged once, not every tick
        self._logged_errors: set[str] = set()
        self._last_jobs: dict[int, tuple] = {}
        #: pid -> earlier placements its processes may still hold: a change in flight or one
        #: that failed partway (cleared once a placement fully goes through)
        self._unsettled: dict[int, list[tuple]] = {}
        #: policy -> (min, max) limits replaced to enforce a cap under a kernel governor
        self._held: dict[int, tuple[int, int]] = {}
        self._planned_limits: dict[int, tuple[int, int]] = {}  # last limits written for a cap
        #: policy -> (min, max) found before we pinned min = max ("limits" mode), and the
        #: frequency pinned there now (only what is really written: never in a dry run)
        self._envelope: dict[int, tuple[int, int]] = {}
        self._pinned: dict[int, int] = {}
        #: policy -> every limit value hidvfs set or tried to set there (a write that failed
        #: partway leaves one behind: never mistaken for someone else's)
        self._limit_values: dict[int, set[int]] = {}
        self.planned: list[tuple[str, str]] = []  # dry-run: what would have been written
        self._dry_limits: dict[int, tuple[int, int]] = {}  # dry-run: limits after the plan
        #: real path -> value we last wrote, so the loop can notice changes made behind our back
        self.expected: dict[str, str] = {}
        #: called as ``before_write(policy, file names)`` before any cpufreq write, which it
        #: may refuse by raising (:meth:`daemon.restore.Session.cover`: the originals are on
        #: disk before the first write to a file)
        self.before_write = None
        #: called as ``outside_limits(policy, {file name: value})`` when limits someone else
        #: set replace our pins (:meth:`daemon.restore.Session.adopt`: the stop gives those
        #: back, not the start's)
        self.outside_limits = None

    def _may_write(self, policy: int, *names: str) -> None:
        if self.before_write is not None and not self.dry_run:
            self.before_write(policy, names)

    # -- frequency ---------------------------------------------------------------------------
    def _record(self, report: ActuationReport, writes: list[tuple[str, str]]) -> None:
        report.writes.extend(writes)
        if self.dry_run:
            self.planned.extend(writes)
        else:
            self.expected.update(writes)

    def _set_governor(self, policy: int, gov: str, report: ActuationReport) -> None:
        self._may_write(policy, "scaling_governor")
        if not self.dry_run:
            cpufreq.set_governor(self.sysfs, policy, gov)
            for name in ("scaling_setspeed", "scaling_min_freq", "scaling_max_freq"):
                self.expected.pop(paths.policy_file(policy, name), None)
        self._record(report, [(paths.policy_file(policy, "scaling_governor"), gov)])

    def _set_speed(self, policy: int, khz: int, report: ActuationReport) -> None:
        self._may_write(policy, "scaling_setspeed")
        if not self.dry_run:
            # We selected userspace ourselves; a change behind our back shows up as drift.
            cpufreq.set_setspeed(self.sysfs, policy, khz, check_governor=False)
        self._record(report, [(paths.policy_file(policy, "scaling_setspeed"), str(khz))])

    def _write_limits(self, policy: int, lo: int, hi: int, report: ActuationReport) -> None:
        """Set min/max (min <= max at every step), or plan it in a dry run; both are then
        what the drift check expects (set_limits skips no-op writes)."""
        if self.dry_run:  # the writes set_limits would make, against what it would have made
            cur = self._dry_limits.get(policy) or cpufreq.read_limits(self.sysfs, policy)
            order = cpufreq.limit_write_order(cur[0], cur[1], lo, hi, hi)
            writes = [(paths.policy_file(policy, n), str(v)) for n, v in order]
            self._dry_limits[policy] = (lo, hi)
        else:
            self._may_write(policy, "scaling_min_freq", "scaling_max_freq")
            self._limit_values.setdefault(policy, set()).update((lo, hi))
            writes = cpufreq.set_limits(self.sysfs, policy, lo, hi)
        self._record(report, list(writes))
        if not self.dry_run:
            for n, v in (("scaling_min_freq", lo), ("scaling_max_freq", hi)):
                self.expected[paths.policy_file(policy, n)] = str(v)

    def _pin_limits(self, policy: int, khz: int, report: ActuationReport) -> None:
        self._write_limits(policy, khz, khz, report)

    def envelope(self, obs: Observation) -> Observation:
        """``obs`` with the limits the daemon found instead of the ones it pinned.

        Without a ``userspace`` governor every write sets min = max = target; a policy that
        read those back could never move again. Limits someone else changed since our last
        pin (nvpmodel, an administrator) are theirs: they become the new envelope."""
        if not self._pinned:
            return obs
        clusters, changed = [], False
        for c in obs.clusters:
            pin = self._pinned.get(c.policy)
            if pin is None:
                clusters.append(c)
                continue
            if (c.min_khz, c.max_khz) != (pin, pin):
                del self._pinned[c.policy]
                if c.min_khz is not None and c.max_khz is not None:
                    log.warning(
                        "event=drift detail=policy%d limits set to %s-%s kHz by someone else; "
                        "deciding within them",
                        c.policy,
                        c.min_khz,
                        c.max_khz,
                    )
                    self._adopt(c.policy, c.min_khz, c.max_khz)
                clusters.append(c)
                continue
            lo, hi = self._envelope[c.policy]
            clusters.append(replace(c, min_khz=lo, max_khz=hi))
            changed = True
        return replace(obs, clusters=tuple(clusters)) if changed else obs

    def _adopt(self, policy: int, lo: int, hi: int) -> None:
        """Pass on the limits another tool set (a value hidvfs never wrote there), so that the
        stop gives back nvpmodel's new ceiling instead of the one found at the start."""
        ours = self._limit_values.get(policy, set())
        theirs = {
            n: str(v)
            for n, v in (("scaling_min_freq", lo), ("scaling_max_freq", hi))
            if v not in ours
        }
        if theirs and self.outside_limits is not None:
            self.outside_limits(policy, theirs)

    def _unpin(self, policy: int, report: ActuationReport) -> None:
        """Put back the limits found before we pinned them."""
        self._write_limits(policy, *self._envelope[policy], report)
        del self._pinned[policy]

    def _cap_governed(self, c, cap: int | None, report: ActuationReport) -> None:
        """Enforce ``cap`` under a kernel governor by lowering ``scaling_max_freq`` (and the
        min with it if needed, min <= max always); when the cap lifts, put back the limits it
        replaced. The guard's caps must hold whoever picks the frequency."""
        held = self._held.get(c.policy)
        if cap is None and held is None:
            return
        # the files themselves: the loop's observation shows the caps folded into the limits
        cur_min, cur_max = cpufreq.read_limits(self.sysfs, c.policy)
        base = held or (cur_min or c.freqs_khz[0], cur_max or c.freqs_khz[-1])
        if cap is None:
            want = base
        else:
            hi = min(nearest_freq(c.freqs_khz, cap, mode="floor"), base[1])
            want = (min(base[0], hi), hi)
        observed = (cur_min, cur_max)
        if observed == want or (self.dry_run and self._planned_limits.get(c.policy) == want):
            if cap is None:
                self._held.pop(c.policy, None)
                self._planned_limits.pop(c.policy, None)
            return
        try:
            self._write_limits(c.policy, *want, report)
            self._planned_limits[c.policy] = want
        except (SysfsWriteError, SysfsUnavailable, ValueError) as err:
            report.errors.append(f"policy{c.policy}: cap {cap} kHz not applied ({err})")
            return
        if cap is None:
            self._held.pop(c.policy, None)
        else:
            self._held[c.policy] = base

    def _ensure_userspace(self, policy: int, governors: tuple[str, ...], report) -> str:
        mode = self._mode.get(policy)
        if mode in ("setspeed", "limits"):
            return mode
        mode = "limits"
        if "userspace" in governors and policy not in self._setspeed_refused:
            # a write the snapshot refuses (an original it cannot save) is refused for every
            # file of the policy: not "userspace refused, bounds instead", none at all
            self._may_write(policy, "scaling_governor")
            try:
                self._set_governor(policy, "userspace", report)
                mode = "setspeed"
            except (SysfsWriteError, SysfsUnavailable, ValueError) as err:
                report.errors.append(
                    f"policy{policy}: userspace governor refused ({err}); using min/max bounds"
                )
        self._mode[policy] = mode
        return mode

    def _speed_or_limits(self, policy: int, khz: int, report: ActuationReport) -> str:
        """Write the setspeed; the mode to go on in. A policy whose setspeed never took a
        write (missing, read-only) falls back to min/max bounds for the rest of the run:
        retrying it re-selected userspace every tick and applied no frequency, nor any cap.
        One that worked before raises as any failure (retried: the governor may have moved)."""
        try:
            self._set_speed(policy, khz, report)
        except SysfsWriteError as err:
            if policy in self._setspeed_ok:
                raise
            self._setspeed_refused.add(policy)
            self._mode[policy] = "limits"
            report.errors.append(
                f"policy{policy}: scaling_setspeed refused ({err}); using min/max bounds"
            )
            return "limits"
        if not self.dry_run:
            self._setspeed_ok.add(policy)
        return "setspeed"

    def apply(self, decision: Decision, obs: Observation) -> ActuationReport:
        report = ActuationReport()
        for c in obs.clusters:
            if not c.online or not c.freqs_khz:
                continue
            gov = decision.governor.get(c.name)
            if gov and gov != "userspace":
                if c.policy in self._pinned:  # hand the governor the limits we found
                    try:
                        self._unpin(c.policy, report)
                    except (SysfsWriteError, SysfsUnavailable, ValueError) as err:
                        report.errors.append(str(err))
                if self._mode.get(c.policy) != f"governor:{gov}":
                    try:
                        self._set_governor(c.policy, gov, report)
                        self._mode[c.policy] = f"governor:{gov}"
                        self._last_freq.pop(c.policy, None)
                    except (SysfsWriteError, SysfsUnavailable, ValueError) as err:
                        report.errors.append(str(err))
                        continue
                self._cap_governed(c, decision.cap_khz.get(c.name), report)
                continue
            if c.policy in self._held:  # a kernel governor's cap held them: give them back
                try:
                    self._write_limits(c.policy, *self._held[c.policy], report)
                    self._planned_limits.pop(c.policy, None)
                except (SysfsWriteError, SysfsUnavailable, ValueError) as err:
                    report.errors.append(f"policy{c.policy}: limits not given back ({err})")
                del self._held[c.policy]
            target = decision.freq_khz.get(c.name)
            if target is None:
                continue
            cap = decision.cap_khz.get(c.name)
            if cap is not None:
                target = min(target, cap)
            # a min = max pin is clamped by no kernel, unlike a setspeed: stay in the limits
            target = nearest_freq(ClusterView.of(c).allowed, target, mode="floor")
            # (a dry run writes nothing, so the frequency read back never follows)
            if self._last_freq.get(c.policy) == target:
                if self.dry_run or c.cur_khz == target:
                    continue
                # the kernel holds the cluster elsewhere: write once more, then leave it while
                # it holds at the same value (under userspace the kernel re-applies setspeed
                # when its limits move; it used to be rewritten every tick)
                if self._clamped_at.get(c.policy) == c.cur_khz:
                    continue
                self._clamped_at[c.policy] = c.cur_khz
            else:
                self._clamped_at.pop(c.policy, None)
            try:
                mode = self._ensure_userspace(c.policy, c.governors, report)
                if mode == "setspeed":
                    if c.policy in self._pinned:  # our old pins would clamp the setspeed
                        self._unpin(c.policy, report)
                    mode = self._speed_or_limits(c.policy, target, report)
                if mode == "limits":
                    if c.policy not in self._pinned and None not in (c.min_khz, c.max_khz):
                        self._envelope[c.policy] = (c.min_khz, c.max_khz)  # not ours: keep
                    self._pin_limits(c.policy, target, report)
                    if not self.dry_run and c.policy in self._envelope:
                        self._pinned[c.policy] = target
                self._last_freq[c.policy] = target
            except (SysfsWriteError, SysfsUnavailable, ValueError) as err:
                report.errors.append(str(err))
                report.error_keys[str(err)] = f"{type(err).__name__} {getattr(err, 'path', err)}"
                self._mode.pop(c.policy, None)
        # -- jobs ------------------------------------------------------------------------------
        if decision.jobs:
            # every tree walk of this round shares one look at the processes (one pass over
            # /proc), not several per job: the cost of a tick must not grow as jobs x processes
            with self.procs.process_map():
                self._apply_jobs(decision, obs, report)
        keys = [report.error_keys.get(err, err) for err in report.errors]
        for err, key in zip(report.errors, keys):
            if key not in self._logged_errors:
                log.warning("event=actuation_error detail=%r", err)
        if self._logged_errors and not report.errors:
            log.info("event=actuation_recovered errors_before=%d", len(self._logged_errors))
        self._logged_errors = set(keys)
        return report

    def _apply_jobs(self, decision: Decision, obs: Observation, report: ActuationReport) -> None:
        online = {cpu for c in obs.clusters for cpu in c.online}
        settings = decision.jobs
        if self.rt_cover_rules and settings:
            if self.live_jobs:
                # a live process's affinity lands on the CPUs of the machine it runs on: on a
                # fake tree those are not the tree's, and "never on every online CPU" is
                # about them
                machine = self.procs.machine_cpus()
                if machine is not None and machine != online:
                    online = set(machine)
                levels = fifo_levels({s.rt_priority for s in settings.values()})
                safe = {
                    pid: self._safe(pid, s, online, levels, obs.t) for pid, s in settings.items()
                }
            else:  # simulated processes: the decided priorities, no RLIMIT_RTPRIO to vet
                safe = {pid: fifo_off_every_cpu(s, online) for pid, s in settings.items()}
            # the round's real-time jobs together leave a CPU free too, with those earlier
            # rounds left real-time (not in this decision)
            held = {
                cpu
                for pid, (cpus, rt, _) in self._last_jobs.items()
                if rt > 0 and pid not in settings
                for cpu in (cpus or online)
            }
            hi = {j.pid for j in obs.jobs if j.criticality == "hi"}
            kept = fifo_cover_kept(settings, safe, online, hi, held)
            self._note_cover(settings, safe, kept)
            placed = below_demoted(settings, kept)
            report.fifo_dropped.extend(
                pid
                for pid, s in settings.items()
                if s.rt_priority > 0
                and kept[pid].rt_priority == 0
                and (safe[pid].rt_priority > 0 or fifo_off_every_cpu(s, online).rt_priority == 0)
            )
            report.niced_below.extend(
                pid
                for pid, s in placed.items()
                if settings[pid].rt_priority == 0 and s.nice != kept[pid].nice
            )
            settings = placed
        due: list[tuple[int, JobSetting, tuple]] = []
        for pid, setting in settings.items():
            key = (setting.cpus, setting.rt_priority, setting.nice)
            stale = self.live_jobs and obs.t - self._applied_at.get(pid, obs.t) >= REAPPLY_S
            if self._last_jobs.get(pid) == key and not stale:
                continue
            if self.dry_run:
                self.planned.append((f"pid {pid} affinity", ",".join(map(str, setting.cpus))))
                self._last_jobs[pid] = key
                continue
            due.append((pid, setting, key))
        if not due:
            return
        # jobs.json is written a few times a round, not a few times per job (at 1000 jobs the
        # rewrites took most of a minute): 1. the originals of the jobs steered for the first
        # time, 2. every new placement with the one it replaces, both before the round's
        # first write to a process, 3. what the writes left (members, settled placements)
        failed: set[int] = set()
        if self.live_jobs:
            self._take_originals(due, failed, report)
            moved = []
            with self._saves_deferred():
                for pid, _, key in due:
                    if pid not in failed and self._last_jobs.get(pid) != key:
                        self._moving(pid, key)
                        moved.append(pid)
            self._flush_saves(moved)
        with self._saves_deferred():
            for pid, setting, key in due:
                if pid not in failed:
                    self._place(pid, setting, key, obs.t, report)
        if self.live_jobs:
            self._flush_saves([pid for pid, _, _ in due if pid not in failed])

    def _take_originals(self, due, failed: set[int], report: ActuationReport) -> None:
        """Read the originals of the jobs ``due`` steered for the first time, and put them on
        disk (one write): a job is never steered while a crash would leave it without them.
        Those that fail go in ``failed`` (not placed this round; a failed write is tried
        again at the next decision)."""
        store = self._originals_store
        new: dict[int, tuple] = {}
        with self._saves_deferred():
            for pid, _, key in due:
                if pid in self._job_originals:
                    continue
                try:
                    started = self.procs.start_time(pid)
                    orig = (self.procs.get_affinity(pid), self.procs.get_priority(pid))
                    if store is not None:
                        try:
                            store.record(pid, started, *orig)
                        except OSError as err:
                            raise OSError(_not_saved(err)) from err
                except ProcessGone:
                    failed.add(pid)
                    self._gone(pid, report)
                    continue
                except (PermissionError, OSError, ValueError) as err:
                    failed.add(pid)
                    self._failed(pid, key, err, report)
                    continue
                new[pid] = (orig, started, key)
        try:
            flush = getattr(store, "flush", None)
            if new and flush is not None:
                flush()
        except OSError as err:
            with self._saves_deferred():  # not on disk: not kept either
                for pid in new:
                    store.drop(pid)
            for pid, (_, _, key) in new.items():
                failed.add(pid)
                self._failed(pid, key, OSError(_not_saved(err)), report)
            return
        for pid, (orig, started, _) in new.items():
            self._job_originals[pid] = orig
            self._job_started[pid] = started

    def _place(self, pid: int, setting: JobSetting, key: tuple, t: float, report) -> None:
        """Write job ``pid``'s placement (its originals and the placement it is about to get
        are kept already). The process is checked to be the one whose originals were read:
        a round's phases (and their writes to disk) lie between, and a pid reused meanwhile
        must not get the job's CPUs or its real-time priority."""
        started = self._job_started.get(pid) if self.live_jobs else None
        if started is not None and self.procs.start_time(pid) != started:
            self._gone(pid, report)
            return
        try:
            if setting.cpus:
                self.procs.set_affinity(pid, setting.cpus)
            self.procs.set_priority(pid, setting.rt_priority, setting.nice)
            self._last_jobs[pid] = key
            self._applied_at[pid] = t
            self._unsettled.pop(pid, None)  # every process of the job has this one now
            if self.live_jobs:
                self._note_members(pid)
                if setting.cpus:
                    self._check_affinity(pid, setting.cpus, report)
                self._save_placement(pid)
        except ProcessGone:
            self._gone(pid, report)
        except (PermissionError, OSError, ValueError) as err:
            self._failed(pid, key, err, report)

    def _gone(self, pid: int, report: ActuationReport) -> None:
        report.gone.append(pid)
        self._last_jobs.pop(pid, None)

    def _failed(self, pid: int, key: tuple, err: Exception, report: ActuationReport) -> None:
        # Remember the attempt: retrying the same refused setting every tick only floods the
        # log. A new decision for this job tries again. (ValueError: a CPU set the kernel
        # refuses, e.g. CPUs offline or a cpuset.)
        self._last_jobs[pid] = key
        self._applied_at.pop(pid, None)  # not re-applied every 5 s: logged once
        report.errors.append(f"pid {pid}: placement failed ({err})")

    def _saves_deferred(self):
        """The store's writes in the block wait for :meth:`_flush_saves` (a store that cannot
        defer writes each change at once)."""
        deferred = getattr(self._originals_store, "deferred", None)
        return contextlib.nullcontext() if deferred is None else deferred()

    def _flush_saves(self, pids) -> None:
        """Write what the store kept back; a failure is logged once per job of ``pids`` (the
        placements went through: keep them going), the next flush tries again."""
        flush = getattr(self._originals_store, "flush", None)
        if flush is None:
            return
        try:
            flush()
        except OSError as err:
            for pid in pids:
                self._placement_unsaved(pid, err)
            return
        for pid in sorted(self._placed_unsaved):  # all of it is on disk now
            log.info("event=job_placement_saved pid=%d", pid)
        self._placed_unsaved.clear()

    def _placement_unsaved(self, pid: int, err: OSError) -> None:
        if pid not in self._placed_unsaved:  # retried every re-apply: logged once
            self._placed_unsaved.add(pid)
            log.warning("event=job_originals_write_failed pid=%d detail=%r", pid, str(err))

    def _note_cover(self, decided, safe, kept) -> None:
        """Log a job that loses SCHED_FIFO since the round's real-time jobs would hold every
        online CPU, once when it does (not every tick), and once when it has it back."""
        for pid, s in kept.items():
            lost = safe[pid].rt_priority > 0 and s.rt_priority == 0
            if lost and pid not in self._cover_fallback:
                self._cover_fallback.add(pid)
                log_event(
                    log,
                    "job_fifo_cover_fallback",
                    # a simulated run has no kernel threads to starve: said, not warned of
                    logging.WARNING if self.live_jobs else logging.INFO,
                    pid=pid,
                    cpus=",".join(map(str, s.cpus)),
                    rt_priority=decided[pid].rt_priority,
                    reason="with the other real-time jobs it would hold every online CPU: "
                    "SCHED_OTHER, best-effort work on its CPUs niced below it",
                )
            elif not lost and pid in self._cover_fallback:
                self._cover_fallback.discard(pid)
                if s.rt_priority > 0:
                    log_event(log, "job_fifo_cover_lifted", pid=pid, rt_priority=s.rt_priority)

    def recheck(self, sysfs: SysfsBackend | None = None, only: set[str] | None = None) -> list[str]:
        """After a tick: the files this actuator wrote that another tool has changed since,
        each forgotten (:meth:`overridden`) so that the next decision writes it again
        (nvpmodel wins until then). Returns one message per file, for the log; the daemon and
        the replay of its recordings both call it, so a recording's rewrites replay too
        (``sysfs``: where the replay reads what the daemon's check read; default: the
        actuator's own; ``only``: the files to check, default every one it wrote)."""
        expected = (
            self.expected if only is None else {p: v for p, v in self.expected.items() if p in only}
        )
        drifted = detect_drift(sysfs or self.sysfs, expected)
        for path, _ in drifted:
            self.overridden(path)
        return [msg for _, msg in drifted]

    def overridden(self, path: str) -> None:
        """Someone else changed ``path``: stop expecting our value and rewrite on the next
        decision (the mode is re-established too, since the governor may have moved)."""
        self.expected.pop(path, None)
        self._last_freq.clear()
        self._clamped_at.clear()
        self._mode.clear()

    def forget(self, pid: int) -> None:
        """The job's process has ended: only the children it left behind get theirs back."""
        orig, members, placed = self._drop(pid)
        if orig is not None and not self.dry_run:
            with self.procs.process_map(fresh_recheck=True):  # a give-back, as release's
                self._give_back(pid, orig, members, placed, root=False)
        if orig is not None and self._originals_store is not None:
            self._originals_store.drop(pid)

    def adopted_by(self, pid: int, adopter: tuple[int, float | None]) -> None:
        """Job ``pid`` was launched by ``adopter`` (pid, start time), which keeps what the
        job leaves behind below it (registered as such)."""
        self._adopters.setdefault(pid, adopter)

    def registered_by(self, pid: int, uid: int | None) -> None:
        """Job ``pid`` was registered by ``uid`` (None: in-process, as root). A job a user
        who is not root registered gets no more real-time priority than its processes'
        RLIMIT_RTPRIO, even where one of them runs as root (a setuid program)."""
        if self._registrants.get(pid, -1) != uid:
            self._registrants[pid] = uid
            self._rt_allowed.pop(pid, None)
            self._rt_vetted.pop(pid, None)

    def _below(self, pid: int) -> list[tuple[int, float | None]]:
        """The processes that are the job's now: those below it, and those below its
        adopter but for the job itself (left behind by it, however they got out)."""
        found = self.procs.descendants(pid)
        seen = {child for child, _ in found}
        adopted = self._adopted(self._adopters.get(pid), pid)
        return found + [(child, start) for child, start in adopted if child not in seen]

    def _adopted(self, adopter, pid: int) -> list[tuple[int, float | None]]:
        """The processes below job ``pid``'s adopter (pid, start time) but the job itself;
        none while the adopter is not that same process."""
        if adopter is None or self.procs.start_time(adopter[0]) != adopter[1]:
            return []
        try:
            return [(c, s) for c, s in self.procs.descendants(adopter[0]) if c != pid]
        except ProcessGone:
            return []

    def managed(self) -> set[int]:
        """Pids the actuator has steered and not yet released or forgotten."""
        return set(self._last_jobs) | set(self._job_originals)

    def release(self, pid: int) -> None:
        """A live job left the registry (unregistered, or the daemon stops): give it back the
        affinity and priority it had before the first placement."""
        started = self._job_started.get(pid)
        orig, members, placed = self._drop(pid)
        if orig is None or self.dry_run:
            return
        if self._originals_store is not None:
            self._originals_store.drop(pid)
        # the recheck of each walk reads the tree anew: a child forked while the job is given
        # back would otherwise keep its real-time priority for good (no round follows)
        with self.procs.process_map(fresh_recheck=True):
            now = self.procs.start_time(pid)
            # the job's process is still the one whose originals these are (not known: as
            # before); a pid that names another process now (the job ended and its pid was
            # reused before the loop saw it) is left alone, its members still get theirs
            same = started is None or now == started
            if not same and now is not None:
                log_event(
                    log,
                    "job_release_skipped",
                    pid=pid,
                    reason="the pid names another process now",
                    started=started,
                    now=now,
                )
            self._give_back(pid, orig, members, placed, root=same)

    def release_all(self) -> None:
        """Give every job its settings back (the daemon stops), then write the store once:
        a stop with N jobs rewrote the shrinking file N times, and a write that failed
        midway left the jobs after it unreleased. The rows stay on disk until every job had
        its settings back, so a crash meanwhile has the next start give back the rest."""
        with self.procs.process_map(fresh_recheck=True), self._saves_deferred():
            for pid in sorted(self.managed()):
                self.release(pid)
        flush = getattr(self._originals_store, "flush", None)
        if flush is not None:
            flush()  # OSError to the caller, who logs it: every job is released already

    def _drop(self, pid: int) -> tuple[tuple | None, dict[int, float], tuple | None]:
        """Forget all kept about job ``pid``: its originals and members, to give back, and
        the placement it had (cpus, rt, nice)."""
        placed = self._placement(pid)
        unsettled = self._unsettled.pop(pid, [])
        members = self._members.pop(pid, {})
        adopter = self._adopters.pop(pid, None)
        if placed is not None:  # what it left with its adopter since the last look (a
            # helper forked and orphaned between two placements): given back like any member,
            # only the settings it still has from the placement
            members.update(
                (child, start)
                for child, start in self._adopted(adopter, pid)
                if start is not None and members.get(child) != start
            )
        for kept in (
            self._last_jobs,
            self._narrowed,
            self._applied_at,
            self._rt_allowed,
            self._rt_vetted,
            self._registrants,
            self._job_started,
        ):
            kept.pop(pid, None)
        self._members_full.discard(pid)
        self._placed_unsaved.discard(pid)
        self._cover_fallback.discard(pid)
        placements = None if placed is None else [*unsettled, placed]
        return self._job_originals.pop(pid, None), members, placements

    def _placement(self, pid: int) -> tuple | None:
        """Job ``pid``'s last placement (cpus, rt, nice) as its processes read it back: the
        CPUs the kernel really gave where it narrowed the set."""
        placed = self._last_jobs.get(pid)
        narrowed = self._narrowed.get(pid)
        if placed is not None and narrowed is not None and narrowed[0] == placed[0]:
            placed = (narrowed[1], *placed[1:])
        return placed

    def _moving(self, pid: int, new: tuple) -> None:
        """Job ``pid`` is about to get placement ``new``: its processes hold the one it has
        now until the writes are done (and after, if one fails), so that one is kept with the
        new one, in memory and on disk before the first write: a crash in between leaves
        the file naming both, and the next start gives back whichever a process has."""
        placed = self._placement(pid)
        if placed is not None and placed != new:
            unsettled = self._unsettled.setdefault(pid, [])
            if placed not in unsettled:
                unsettled.append(placed)
                del unsettled[:-MAX_UNSETTLED]
        self._save_placement(pid, new)

    def _save_placement(self, pid: int, placed: tuple | None = None) -> None:
        """The placement to disk too (the store writes only a change), so a restore after a
        crash leaves a member the settings it set itself: ``placed`` about to be applied, with
        the ones still unsettled, or by default the one the job has now."""
        if placed is None:
            placed = self._placement(pid)
        if self._originals_store is None or placed is None:
            return
        try:
            self._originals_store.placed(pid, *placed, before=self._unsettled.get(pid, ()))
        except OSError as err:  # the placement itself went through: keep it going
            self._placement_unsaved(pid, err)
            return
        if hasattr(self._originals_store, "flush"):
            return  # written (and said so) at the round's flush
        if pid in self._placed_unsaved:
            self._placed_unsaved.discard(pid)
            log.info("event=job_placement_saved pid=%d", pid)

    def _check_affinity(self, pid: int, cpus: tuple[int, ...], report: ActuationReport) -> None:
        """The kernel drops CPUs outside the job's cpuset (a container, a cgroup) or offline
        without a word: say so once per placement, since the job then has fewer cores than
        the decision counted on."""
        try:
            got = self.procs.get_affinity(pid)
        except (ProcessGone, PermissionError, OSError):
            return
        if set(got) == set(cpus):
            self._narrowed.pop(pid, None)
        elif self._narrowed.get(pid) != (cpus, got):  # not again on every re-apply
            self._narrowed[pid] = (cpus, got)
            report.errors.append(
                f"pid {pid}: the kernel narrowed CPU set {sorted(cpus)} to {sorted(got)} "
                "(its cpuset or CPUs gone offline): it has fewer cores than decided"
            )

    def _note_members(self, pid: int) -> None:
        """Remember the processes now below ``pid`` (they have just taken its placement)."""
        try:
            found = self._below(pid)
        except ProcessGone:
            return
        known = self._members.setdefault(pid, {})
        grown = False
        for child, start in found:
            if start is None or known.get(child) == start:
                continue  # without a start time a later process with its pid looks the same
            if len(known) >= MAX_MEMBERS:  # a job running command after command: drop the
                for old, old_start in list(known.items()):  # ended ones, then still full?
                    if self.procs.start_time(old) != old_start:
                        del known[old]
                if len(known) >= MAX_MEMBERS:
                    if pid not in self._members_full:
                        self._members_full.add(pid)
                        log.warning(
                            "event=job_members_full pid=%d detail=%r",
                            pid,
                            f"more than {MAX_MEMBERS} live processes below the job: the "
                            "others keep its placement if they outlive it",
                        )
                    break
            known[child] = start
            grown = True
        if grown and self._originals_store is not None:
            try:
                self._originals_store.members(pid, known)
            except OSError as err:  # the placement itself went through: keep it going
                log.warning("event=job_originals_write_failed pid=%d detail=%r", pid, str(err))

    def _give_back(
        self, pid: int, orig, members: dict[int, float], placed: list | None, *, root: bool
    ) -> None:
        """The originals to ``pid``'s tree (``root``), and to each remembered member that is
        still the same process and no longer below it: its own threads only (its children
        are members of their own), and only the settings it still has from the placement
        (a process that set its own affinity or priority since keeps them)."""
        cpus, (rt, nice) = orig
        if root:
            self._restore(pid, pid, cpus, rt, nice, tree=True)
        if not members:
            return
        below: set[int] = set()
        if root:
            try:
                below = {child for child, _ in self.procs.descendants(pid)}
            except ProcessGone:
                pass
        if placed is not None:
            members = {**members, **self._below_members(members, below | {pid})}
        for child, start in sorted(members.items()):
            if child in below or self.procs.start_time(child) != start:
                continue
            try:
                aff_ours, prio_ours = (
                    (True, True)
                    if placed is None
                    else still_placed(
                        placed, self.procs.get_affinity(child), self.procs.get_priority(child)
                    )
                )
            except ProcessGone:
                continue
            except (PermissionError, OSError) as err:
                log.warning("event=job_release_failed pid=%d detail=%r", child, str(err))
                continue
            self._restore(
                child, pid, cpus if aff_ours else (), rt, nice, tree=False, priority=prio_ours
            )

    def _below_members(self, members: dict[int, float], known: set[int]) -> dict[int, float]:
        """The processes below the remembered members that are not members themselves: a
        child a member forked after the last placement inherited the job's settings and was
        never seen (it kept the job's SCHED_FIFO for good). They get back what they still have
        of the placement, like the members (:func:`still_placed`)."""
        seen = set(members) | known
        extra: dict[int, float] = {}
        for member, start in sorted(members.items()):
            if self.procs.start_time(member) != start:
                continue
            try:
                below = self.procs.descendants(member)
            except ProcessGone:
                continue
            for child, child_start in below:
                if child not in seen and child_start is not None:
                    seen.add(child)
                    extra[child] = child_start
        return extra

    def _restore(self, target, job, cpus, rt, nice, *, tree: bool, priority: bool = True) -> None:
        if not cpus and not priority:
            return
        try:
            if cpus:
                (self.procs.set_affinity if tree else self.procs.set_own_affinity)(target, cpus)
            if priority:
                (self.procs.set_priority if tree else self.procs.set_own_priority)(target, rt, nice)
            log.info(
                "event=job_released pid=%d%s cpus=%s rt_priority=%s nice=%s",
                target,
                "" if target == job else f" job={job}",
                cpus or "(its own)",
                rt if priority else "(its own)",
                nice if priority else "(its own)",
            )
        except ProcessGone:
            pass
        except (PermissionError, OSError, ValueError) as err:
            log.warning("event=job_release_failed pid=%d detail=%r", target, str(err))

    def _safe(
        self,
        pid: int,
        setting: JobSetting,
        online: set[int],
        levels: dict[int, int],
        t: float = 0.0,
    ) -> JobSetting:
        """The placement a live process may get: real-time priority scaled below the kernel's
        threaded IRQ handlers (FIFO 50), never above what the process could take itself
        (RLIMIT_RTPRIO of a non-root owner; for a job a user registered, the lowest of its
        processes', whoever they run as), and never on every online CPU (a busy real-time
        job there starves the daemon and the kernel's own threads)."""
        rt = setting.rt_priority
        if rt <= 0:
            return setting
        rt = levels[rt]
        try:
            allowed = self._rt_ceiling(pid, t)
        except ProcessGone:  # placed next, it fails as gone: nothing real-time meanwhile
            return replace(setting, rt_priority=0)
        return fifo_off_every_cpu(replace(setting, rt_priority=min(rt, allowed)), online)

    def _rt_ceiling(self, pid: int, t: float) -> int:
        """The highest SCHED_FIFO priority job ``pid`` may get (ProcessGone when it has gone).

        Registered by root (or in-process): what its process could take itself, read once
        (:meth:`ProcessControl.rt_allowed`: any for a process running as root). Registered by
        a user: the lowest RLIMIT_RTPRIO of the processes the placement sets, root's counting
        for nothing (a setuid program the user started gives the user no real-time priority),
        read again when the job's process execs and at every re-apply (REAPPLY_S)."""
        if self._registrants.get(pid) in (None, 0):
            allowed = self._rt_allowed.get(pid)
            if allowed is None:  # a process's owner and limit do not change tick to tick
                allowed = self._rt_allowed[pid] = self.procs.rt_allowed(pid)
            return allowed
        ident = self.procs.identity(pid)
        if ident is None:
            raise ProcessGone(pid)
        kept = self._rt_vetted.get(pid)
        if kept is not None and kept[0] == ident and 0 <= t - kept[2] < REAPPLY_S:
            return kept[1]
        allowed = self.procs.rt_limit(pid)
        if kept is not None and kept[1] != allowed:
            log_event(
                log,
                "job_rt_limit_changed",
                pid=pid,
                rt_limit=allowed,
                before=kept[1],
                execed=kept[0] != ident,
            )
        self._rt_vetted[pid] = (ident, allowed, t)
        return allowed
