"""The control loop: sense -> decide -> gate -> shield -> thermal guard -> actuate.

No garbage collection runs between the readings and the writes (:mod:`daemon.gchold`).

The same loop runs on every backend (live /sys, a fake tree, a trace replay, the simulator);
only the Platform differs. Decisions are taken on the period and also right after a job
arrives or finishes (the simulator's clock stops at those events; on a board the job table's
``changed`` event wakes the loop).
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from agents.deadlines import ProgressEstimate
from agents.policy import Decision, Policy
from daemon.actuator import ActuationReport, Actuator
from daemon.gchold import collector_held
from daemon.guard import ThermalGuard
from daemon.jobs import REPORT_WAIT_S, JobEntry, JobOutcome, JobTable
from daemon.logs import log_event
from platforms.observation import JobObs, Observation
from platforms.platform import Platform
from platforms.sense import Sensor

log = logging.getLogger("hidvfs.loop")

#: a decision stage after the policy: the federated gate, the conformal shield, ...
Stage = Callable[[Decision, Observation], Decision]

#: the measured quantities an intervention's text carries (a deadline's remaining time
#: ``D=-0.19 s``, the shield's bound ``U=1204 s``, a temperature ``72.4``): they move every
#: tick while the intervention holds
_MEASURED = re.compile(r"(?<=[DU]=)-?[0-9.]+(?:e[-+]?[0-9]+)?|-?\b[0-9]+\.[0-9]+(?:e[-+]?[0-9]+)?")


def intervention_key(event: str) -> str:
    """What makes two ticks' events one held intervention: the text with its measured
    quantities (decimals, a deadline's remaining time) masked, so a job's "no core count
    meets D=..." is one intervention while it lasts, not a new one each tick. Whole numbers
    (pids, cores, kHz) stay: another job or another operating point is another one."""
    return _MEASURED.sub("#", event)


def core_shares(affinities: list[tuple[int, ...]], hw: Observation) -> list[float]:
    """Each job's share of the cores it may run on: a core its affinity allows counts 1 /
    (the jobs allowed there), so jobs sharing a pool (the gate's light jobs) are not each
    credited the whole pool's work (an empty affinity: every online CPU). An approximation
    under fair sharing: a job below others in real-time priority may get less."""
    online = tuple(c for cl in hw.clusters for c in cl.online)
    up = set(online)  # a fake or recorded backend's mask may name offline CPUs
    sets = [tuple(c for c in aff if c in up) or online for aff in affinities]
    count: dict[int, int] = {}
    for cpus in sets:
        for c in cpus:
            count[c] = count.get(c, 0) + 1
    return [sum(1.0 / count[c] for c in cpus) for cpus in sets]


@dataclass
class TickResult:
    t: float
    obs: Observation
    decision: Decision
    report: ActuationReport
    finished: list[JobOutcome] = field(default_factory=list)


class ControlLoop:
    def __init__(
        self,
        platform: Platform,
        policy: Policy,
        *,
        period_s: float = 0.1,
        jobs: JobTable | None = None,
        stages: list[Stage] | None = None,
        guard: ThermalGuard | None = None,
        actuator: Actuator | None = None,
        sensor: Sensor | None = None,
        progress: Callable[[int], float | None] | None = None,
        deadline_margin: float = 0.0,
    ):
        if not period_s > 0:
            raise ValueError(f"period_s must be > 0, got {period_s!r}")
        if not 0.0 <= deadline_margin < 1.0:
            raise ValueError(f"deadline_margin must be in [0, 1), got {deadline_margin!r}")
        #: fraction of every deadline kept back when planning (config ``deadline_slack``): the
        #: policy, gate and shield see ``deadline x (1 - margin)``; misses count the real one
        self.deadline_margin = float(deadline_margin)
        self._estimate = ProgressEstimate()
        self.platform = platform
        self.policy = policy
        self.period_s = float(period_s)
        self.jobs = jobs if jobs is not None else JobTable()
        self.stages = list(stages or [])
        self.guard = guard if guard is not None else ThermalGuard()
        self.actuator = actuator or Actuator(platform.sysfs, platform.procs)
        self.sensor = sensor or Sensor(platform.spec, platform.sysfs)
        self.sensed: Observation | None = None
        self.progress = progress
        self.on_tick: list[Callable[[TickResult], None]] = []
        #: run at the start of every tick with the clock time (e.g. a workload registering jobs)
        self.before_tick: list[Callable[[float], None]] = []
        #: run while the loop waits for its next tick, at least every ``idle_every_s`` (the
        #: systemd watchdog: a period longer than half of WatchdogSec must not get the daemon
        #: killed; pinging from the loop's own thread still proves the loop is alive)
        self.on_idle: list[Callable[[], None]] = []
        self.idle_every_s: float | None = None
        self.ticks = 0
        self.energy_j = 0.0  # trapezoid integral of the total rail, as a board would measure
        self.cpu_energy_j = 0.0
        #: seconds the integrals above miss because a reading failed (the energy is a lower
        #: bound by that much); whether each rail has ever been read
        self.energy_gap_s = 0.0
        self.cpu_energy_gap_s = 0.0
        self._metered = (False, False)
        self._tracked: set[int] = set()  # the jobs of the last observation
        #: how far ahead of now the next tick may be, in periods (None: unbounded). Every tick
        #: woken early (a job arrived or left) pushes the schedule a period; on a board a
        #: burst of registrations must not push it so far that nothing, not even the thermal
        #: guard, decides for seconds. The simulator keeps the schedule it was trained with.
        self.max_lead_periods: float | None = None
        self.events_total = 0
        #: interventions of the last tick and for how many ticks in a row each has held: one
        #: that repeats (a reserved cluster re-planned every tick) is logged when it starts
        #: and when it ends, not at 10 Hz
        self._held_events: dict[str, tuple[int, str]] = {}  # key: (ticks, latest text)
        self.last: TickResult | None = None
        self._last_power: tuple[float, float | None, float | None] | None = None
        self.t0 = platform.clock.now()

    @staticmethod
    def _log_done(out: JobOutcome) -> None:
        # (log_event quotes the name: one with spaces must not read as more fields); a job
        # that failed says how, and its deadline_met is null: neither met nor missed
        failed = {"failed": out.failure} if out.failure is not None else {}
        log_event(
            log,
            "job_done",
            pid=out.pid,
            name=out.name,
            makespan_s=round(out.makespan_s, 3),
            deadline_met=out.deadline_met,
            **failed,
        )

    def _launcher_alive(self, e: JobEntry) -> bool:
        """Whether the process that launched job ``e`` and will say how it ended (its adopter:
        ``hidvfs run``) still lives, so the loop that saw the job end waits for its word."""
        if e.adopter is None:
            return False
        procs = self.platform.procs
        pid, start = e.adopter
        try:
            return procs.alive(pid) and (start is None or procs.start_time(pid) in (None, start))
        except Exception:  # noqa: BLE001 - a launcher that cannot be read is not waited for
            return False

    # -- one tick ----------------------------------------------------------------------------
    def observe(self) -> tuple[Observation, list[JobOutcome]]:
        clock, procs = self.platform.clock, self.platform.procs
        t = clock.now()
        #: the tick's observation as read, before the envelope and the guard fold in limits
        self.sensed = self.sensor.read(t)
        hw = self.guard.view(self.actuator.envelope(self.sensed))
        finished = []
        jobs = []
        # jobs whose end was reported to the registry (`hidvfs run` unregisters its command
        # as soon as it exits, usually before this tick could see it end)
        for out in self.jobs.take_ended():
            self.actuator.forget(out.pid)
            self._estimate.forget(out.pid)
            finished.append(out)
            self._log_done(out)
        # jobs seen to end whose launcher never said how (it died, or took too long): by time
        for out in self.jobs.release_held(t, self._launcher_alive):
            finished.append(out)
            self._log_done(out)
        ended = {(o.pid, o.release_t) for o in finished}
        snapshot = self.jobs.snapshot()
        present = {(e.pid, e.release_t) for e in snapshot}  # a registration, not just a pid
        # (a job whose outcome waits for its launcher is not forgotten: it is scored later)
        present |= {(e.pid, e.release_t) for e in self.jobs.held_jobs()}
        for e in snapshot:  # what `hidvfs run` adopts below it is the job's too
            if e.adopter is not None:
                self.actuator.adopted_by(e.pid, e.adopter)
            # whose job it is bounds its real-time priority (a user's: its RLIMIT_RTPRIO)
            self.actuator.registered_by(e.pid, e.registrant_uid)
        # jobs unregistered while alive: give them back what they had, and forget what was
        # kept about them (a pid registered again, even between two ticks, is a new job)
        for pid in self.actuator.managed() - {e.pid for e in snapshot}:
            self.actuator.release(pid)
        for pid, _release in self._tracked - present - ended:
            self._estimate.forget(pid)
            for stage in self.stages:
                forget = getattr(stage, "forget", None)
                if forget is not None:
                    forget(pid)
        self._tracked = present
        alive: list[tuple] = []  # (entry, its CPUs) of the jobs still running
        for e in snapshot:
            if not procs.alive(e.pid) or (
                e.start_time is not None and procs.start_time(e.pid) not in (None, e.start_time)
            ):  # gone, or its pid now names another process
                if self._launcher_alive(e) and self.jobs.hold(e.pid, t, t + REPORT_WAIT_S):
                    # `hidvfs run` is about to say how it ended (a crash is no deadline met)
                    self.actuator.forget(e.pid)
                    self._estimate.forget(e.pid)
                    continue
                out = self.jobs.finish(e.pid, t, seen=True)
                self.actuator.forget(e.pid)
                self._estimate.forget(e.pid)
                if out is not None:
                    finished.append(out)
                    self._log_done(out)
                continue
            try:
                cpus = procs.get_affinity(e.pid)
            except Exception:  # noqa: BLE001 - a vanished pid is handled next tick
                cpus = ()
            alive.append((e, tuple(cpus)))
        shares = core_shares([cpus for _e, cpus in alive], hw)
        for (e, cpus), share in zip(alive, shares):
            jobs.append(
                JobObs(
                    pid=e.pid,
                    name=e.name,
                    criticality=e.criticality,
                    release_t=e.release_t,
                    elapsed_s=t - e.release_t,
                    deadline_s=(
                        None if e.deadline_s is None else e.deadline_s * (1 - self.deadline_margin)
                    ),
                    cpus=cpus,
                    profile=e.profile,
                    progress=(
                        self.progress(e.pid)
                        if self.progress
                        else self._estimated(e, cpus, hw, t, share)
                    ),
                )
            )
        return hw.with_jobs(tuple(jobs)), finished

    def _estimated(self, e, cpus, hw: Observation, t: float, share: float) -> float | None:
        """Model-based progress where the backend reports none (agents.deadlines), on the
        ``share`` of cores the job has (:func:`core_shares`)."""
        if e.profile is None:
            return None
        # the slowest online cluster it may run on (no affinity known: any), the cautious side
        allowed = set(cpus)
        spans = [
            c for c in hw.clusters if c.online and (not allowed or allowed.intersection(c.online))
        ]
        home = min(spans, key=lambda c: c.capacity * (c.cur_khz or 0), default=None)
        # an unknown frequency (khz 0) adds nothing for the interval: the cautious side
        khz = (home.cur_khz or 0) if home else 0
        return self._estimate.advance(
            e.pid, e.profile, t, khz, home.capacity if home else 1.0, share
        )

    def tick(self) -> TickResult:
        for cb in self.before_tick:
            cb(self.platform.clock.now())
        # from the readings to the writes, no garbage collection (daemon.gchold): what the
        # tick made due runs after the writes
        with collector_held():
            obs, finished = self.observe()
            for out in finished:  # stages that learn from outcomes (the adaptive shield)
                for stage in self.stages:
                    # a failed job's end is no response time to learn from: its bounds are
                    # dropped, as those of a job unregistered alive
                    name = "forget" if out.failure is not None else "job_done"
                    done = getattr(stage, name, None)
                    if done is None:
                        continue
                    if out.failure is not None:
                        done(out.pid)
                    else:
                        done(out.pid, out.finish_t)
            decision = self.policy.decide(obs)
            for stage in self.stages:
                decision = stage(decision, obs)
            decision = self.guard.apply(decision, obs)
            report = self.actuator.apply(decision, obs)
        self._log_interventions(decision.events)
        self.events_total += len(decision.events)
        self._integrate(obs)
        self.ticks += 1
        result = TickResult(obs.t, obs, decision, report, finished)
        self.last = result
        for cb in self.on_tick:
            cb(result)
        return result

    def _log_interventions(self, events: list[str]) -> None:
        """Log each intervention when it starts; one held for several ticks also when it ends
        (with its latest text). Ticks' events are matched by :func:`intervention_key`."""
        held: dict[str, tuple[int, str]] = {}
        for ev in events:
            key = intervention_key(ev)
            if key in held:
                continue
            n, _ = self._held_events.get(key, (0, ev))
            if not n:  # a HI job's need capped by the guard puts its deadline at risk
                (log.warning if ev.startswith("hi_need_capped") else log.info)(
                    "event=intervention %s", ev
                )
            held[key] = (n + 1, ev)
        for key, (n, ev) in self._held_events.items():
            if key not in held and n > 1:
                log.info("event=intervention_ended %s ticks=%d", ev, n)
        self._held_events = held

    def _integrate(self, obs: Observation) -> None:
        p, pc = obs.total_power_w, obs.cpu_power_w
        if self._last_power is not None:
            t_prev, p_prev, pc_prev = self._last_power
            dt = obs.t - t_prev
            if dt > 0:
                if p is not None and p_prev is not None:
                    self.energy_j += 0.5 * (p + p_prev) * dt
                elif self._metered[0]:  # a reading failed at either end: not integrated
                    self.energy_gap_s += dt
                if pc is not None and pc_prev is not None:
                    self.cpu_energy_j += 0.5 * (pc + pc_prev) * dt
                elif self._metered[1]:
                    self.cpu_energy_gap_s += dt
        self._metered = (self._metered[0] or p is not None, self._metered[1] or pc is not None)
        self._last_power = (obs.t, p, pc)

    # -- running -----------------------------------------------------------------------------
    def _sleep_until(self, target: float, stop: threading.Event | None) -> None:
        """Until the next tick, or earlier when a job registers/leaves or a stop is asked."""
        clock = self.platform.clock
        events = [self.jobs.changed] + ([stop] if stop is not None else [])
        while True:
            start = clock.now()
            dt = target - start
            if dt <= 0:
                return
            chunked = self.idle_every_s is not None and self.idle_every_s < dt
            step = self.idle_every_s if chunked else dt
            if clock.wait(step, *events):
                self.jobs.changed.clear()
                return
            # one wait is the whole sleep, unless it is cut for the idle hooks; a clock that
            # stopped early (the simulator at a job's arrival or end) wakes the loop too
            if not chunked or clock.now() < start + step - 1e-9:
                return
            for cb in self.on_idle:
                cb()

    def run(
        self,
        duration_s: float | None = None,
        stop: threading.Event | None = None,
        until: Callable[[], bool] | None = None,
    ) -> None:
        clock = self.platform.clock
        start = clock.now()
        next_tick = start
        while True:
            if stop is not None and stop.is_set():
                break
            now = clock.now()
            if duration_s is not None and now - start >= duration_s - 1e-12:
                break
            if until is not None and until():
                break
            self.tick()
            next_tick += self.period_s
            now = clock.now()
            if next_tick <= now:
                next_tick = now + self.period_s
            if self.max_lead_periods is not None:
                next_tick = min(next_tick, now + self.max_lead_periods * self.period_s)
            if duration_s is not None:
                next_tick = min(next_tick, start + duration_s)
            self._sleep_until(next_tick, stop)

    # -- status --------------------------------------------------------------------------------
    def _stage_report(self, method: str):
        """The first non-None ``method()`` among the stages that have one (else None)."""
        for st in self.stages:
            r = getattr(st, method, lambda: None)()
            if r is not None:
                return r
        return None

    def status(self) -> dict:
        """The JSON status the daemon writes (``--status-file``) and serves."""
        last = self.last
        obs = last.obs if last else None
        return {
            "t": round(self.platform.clock.now() - self.t0, 6),
            "board": self.platform.spec.name,
            "backend": self.platform.kind,
            "policy": self.policy.name,
            "period_s": self.period_s,
            # the share of each deadline kept in hand when planning (deadline_slack, or more
            # under the kernel's RT throttling)
            "deadline_margin": self.deadline_margin,
            "ticks": self.ticks,
            "freq_khz": {c.name: c.cur_khz for c in obs.clusters} if obs else {},
            "temp_c": {z.type: z.temp_c for z in obs.zones if z.temp_c is not None} if obs else {},
            "power_w": {
                "total": obs.total_power_w if obs else None,
                "cpu": obs.cpu_power_w if obs else None,
            },
            # kept through a failed reading once metered; the gap says what it misses
            "energy_j": round(self.energy_j, 6) if self._metered[0] else None,
            "cpu_energy_j": round(self.cpu_energy_j, 6) if self._metered[1] else None,
            "energy_gap_s": round(self.energy_gap_s, 6),
            "cpu_energy_gap_s": round(self.cpu_energy_gap_s, 6),
            "jobs_running": len(self.jobs),
            "jobs_done": self.jobs.done,
            "deadline_misses": self.jobs.misses(),
            # finished jobs whose launcher said they failed (neither met nor missed), and
            # running jobs already past their deadline, per criticality
            "jobs_failed": self.jobs.failed(),
            "jobs_overdue": self.jobs.overdue(self.platform.clock.now()),
            "interventions": self.events_total,
            "last_events": list(last.decision.events[-5:]) if last else [],
            "unavailable": list(obs.errors[:10]) if obs else [],
            # What the fleet coordinator scores a node with (daemon/coordinator.parse_status).
            "clusters": [
                {
                    "name": c.name,
                    "cpus": list(c.cpus),
                    "online": list(c.online),
                    "cur_khz": c.cur_khz,
                    "max_khz": c.freqs_khz[-1] if c.freqs_khz else None,
                    # the ceiling now: policy limits with the thermal and static caps folded
                    # in (what the coordinator scores a node's speed by)
                    "limit_khz": c.max_khz,
                    "capacity": c.capacity,
                    "util": list(c.util),
                }
                for c in obs.clusters
            ]
            if obs
            else [],
            "max_cpu_temp_c": obs.max_cpu_temp_c if obs else None,
            "throttled": bool(self.guard.levels),
            # cluster -> pid of the HI job holding it (agents.mixed); None: reservation off
            "reserved": self._stage_report("reservations"),
            # cluster -> pids of HI jobs without a cluster of their own, running there above
            # its LO work (two HI jobs overlapping on a two-cluster board); None: off
            "shared_hi": self._stage_report("shared_clusters"),
            "shield": self._stage_report("calibration"),
        }
