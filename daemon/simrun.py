"""Run the control loop on the simulated board with a given workload (virtual clock).

This is what ``hidvfs daemon --sim``, the sim campaign and agent evaluation share: one plant,
one job table fed by the workload, the real :class:`ControlLoop`, and exact metrics read from
the plant at the end.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from agents.policy import Policy
from daemon.actuator import Actuator
from daemon.guard import ThermalGuard
from daemon.jobs import JobTable
from daemon.loop import ControlLoop, Stage, TickResult
from daemon.simfeed import SimFeeder
from platforms.observation import JobProfile
from platforms.sim import make_sim_platform
from platforms.sim.plant import SimJob

log = logging.getLogger("hidvfs.simrun")


@dataclass
class SimJobResult:
    pid: int
    name: str
    criticality: str
    release_t: float
    finish_t: float | None
    deadline_s: float | None

    @property
    def makespan_s(self) -> float | None:
        return None if self.finish_t is None else self.finish_t - self.release_t

    @property
    def deadline_met(self) -> bool | None:
        if self.deadline_s is None:
            return None
        return self.finish_t is not None and self.makespan_s <= self.deadline_s + 1e-9


@dataclass
class SimRunResult:
    board: str
    policy: str
    seed: int
    t_end: float
    energy_j: float  # exact integral of the plant's total rail
    cpu_energy_j: float
    daemon_energy_j: float  # what the daemon integrated from its own samples
    peak_temp_c: float
    ticks: int
    interventions: int
    jobs: list[SimJobResult] = field(default_factory=list)
    status: dict = field(default_factory=dict)
    history: list[dict] = field(default_factory=list)
    #: the DAG each job actually ran (the plant adds seeded per-task jitter), by pid
    executed_dags: dict = field(default_factory=dict, repr=False)
    #: (t, plant total energy J, plant CPU energy J) at every tick: the exact meter a training
    #: harness may use for rewards on boards that expose no power monitor
    energy_trace: tuple[tuple[float, float, float], ...] = field(default=(), repr=False)
    #: energy from t = 0 to the last job's finish (None unless every job finished): what
    #: running the jobs cost, without the idle tail to the controller's next tick, which is
    #: up to one period long and so depends on the policy's period, not on its decisions
    jobs_energy_j: float | None = None
    jobs_cpu_energy_j: float | None = None
    #: time some cluster ran under the kernel's thermal cap (the plant's throttling)
    throttled_s: float = 0.0
    #: time some cluster's frequency was capped for temperature, by the daemon's thermal guard
    #: or the kernel (from tick to tick)
    capped_s: float = 0.0
    #: whether the run applied the board's real-time cover rules (``run_sim(rt_cover_rules)``)
    rt_cover_rules: bool = False
    #: ticks in which they ran a job the decision gave SCHED_FIFO under SCHED_OTHER, the
    #: pids of those jobs, and those of the best-effort jobs they niced below one (none
    #: without the rules)
    fifo_dropped_ticks: int = 0
    fifo_dropped_jobs: tuple[int, ...] = ()
    niced_below_jobs: tuple[int, ...] = ()

    @property
    def makespan_s(self) -> float | None:
        """Wall time from the first release to the last finish (None if a job did not finish)."""
        if not self.jobs or any(j.finish_t is None for j in self.jobs):
            return None
        return max(j.finish_t for j in self.jobs) - min(j.release_t for j in self.jobs)

    def jobs_energy(self) -> tuple[float, float]:
        """(total, CPU) energy in J the run's jobs cost: to the last finish when every job
        finished, else the whole run."""
        if self.jobs_energy_j is None or self.jobs_cpu_energy_j is None:
            return self.energy_j, self.cpu_energy_j
        return self.jobs_energy_j, self.jobs_cpu_energy_j

    def miss_counts(self) -> dict[str, tuple[int, int]]:
        """Per criticality: (misses, jobs with a deadline)."""
        out = {"hi": [0, 0], "lo": [0, 0]}
        for j in self.jobs:
            if j.deadline_s is None:
                continue
            out[j.criticality][1] += 1
            if not j.deadline_met:
                out[j.criticality][0] += 1
        return {k: (v[0], v[1]) for k, v in out.items()}


def run_sim(
    board: str,
    policy: Policy,
    items: list[tuple[SimJob, JobProfile | None]],
    *,
    seed: int = 0,
    period_s: float | None = None,
    duration_s: float | None = None,
    stages: list[Stage] | None = None,
    guard: ThermalGuard | None = None,
    deadline_margin: float = 0.0,
    until_idle: bool = True,
    max_t: float = 3600.0,
    on_tick: Callable[[TickResult], None] | None = None,
    history_every_s: float | None = None,
    ambient_c: float | None = None,
    start_c: float | None = None,
    status_cb: Callable[[dict], None] | None = None,
    status_every_s: float = 1.0,
    stop: threading.Event | None = None,
    keep_energy_trace: bool = True,
    rt_cover_rules: bool = False,
) -> SimRunResult:
    """Run ``policy`` on a fresh simulated ``board`` until the workload is done (or
    ``duration_s``, or until ``stop`` is set: the result is then the run so far).

    ``ambient_c`` and ``start_c`` set the board's thermal start: the air around it, and the
    temperature it is soaked at (default: idle at the board's ambient).
    ``keep_energy_trace``: keep the plant's meter at every tick (``energy_trace``, what the
    agents' training and metering read, ~150 B a tick); without it only the final reading
    is kept, so a day-long ``daemon --sim`` does not grow by hundreds of MB.
    ``rt_cover_rules``: actuate as the daemon does on a board, where no job is SCHED_FIFO on
    every online CPU and the real-time jobs together leave one free (:class:`Actuator`); a job
    that loses SCHED_FIFO so runs SCHED_OTHER, best-effort jobs on its CPUs niced below it.
    Off (the default), the plant runs every decision as given."""
    from platforms.spec import load_board

    spec = load_board(board)
    # Simulated boards run with every core online (the TX2's MAXN mode, Orin NX MAXN): the
    # default power modes take cores offline, which would hide half of the DVFS problem.
    platform = make_sim_platform(
        spec, seed=seed, ambient_c=ambient_c, start_c=start_c, online=spec.cpus
    )
    plant = platform.sysfs.plant
    table = JobTable()
    feeder = SimFeeder(plant, table, items)
    policy.reset(seed)
    if period_s is None:  # each policy decides at its own natural rate (governor sampling rate)
        period_s = max(float(getattr(policy, "period_s", 0.05) or 0.05), 0.005)
    loop = ControlLoop(
        platform,
        policy,
        period_s=period_s,
        jobs=table,
        stages=stages,
        guard=guard,
        progress=feeder.progress,
        deadline_margin=deadline_margin,
        actuator=Actuator(platform.sysfs, platform.procs, rt_cover_rules=rt_cover_rules),
    )
    loop.before_tick.append(feeder)
    history: list[dict] = []
    trace: list[tuple[float, float, float]] = []
    if keep_energy_trace:
        loop.on_tick.append(lambda res: trace.append((res.t, plant.energy_j, plant.cpu_energy_j)))
    capped = [0.0, 0.0, False]  # seconds capped, and the last tick's (t, capped)

    def count_caps(res: TickResult) -> None:
        if capped[2]:
            capped[0] += res.t - capped[1]
        capped[1] = res.t
        capped[2] = bool(loop.guard.levels) or any(map(plant.throttled, plant.clusters))

    loop.on_tick.append(count_caps)
    cover = [0, set(), set()]  # ticks with a job off SCHED_FIFO, those jobs, the niced ones

    def count_cover(res: TickResult) -> None:
        if res.report.fifo_dropped:
            cover[0] += 1
            cover[1].update(res.report.fifo_dropped)
        cover[2].update(res.report.niced_below)

    if rt_cover_rules:
        loop.on_tick.append(count_cover)
    if on_tick is not None:
        loop.on_tick.append(on_tick)
    if history_every_s:
        nxt = [0.0]

        def record(res: TickResult) -> None:
            if res.t + 1e-12 >= nxt[0]:
                nxt[0] = res.t + history_every_s
                history.append(
                    {
                        "t": round(res.t, 4),
                        "freq_khz": {c.name: c.cur_khz for c in res.obs.clusters},
                        "temp_c": res.obs.max_cpu_temp_c,
                        "power_w": res.obs.total_power_w,
                    }
                )

        loop.on_tick.append(record)

    if status_cb is not None:
        last = [-1e18]

        def push_status(res: TickResult) -> None:
            if res.t - last[0] >= status_every_s:
                last[0] = res.t
                status_cb(loop.status())

        loop.on_tick.append(push_status)

    def done() -> bool:
        return (
            until_idle
            and feeder.exhausted
            and len(table) == 0
            and all(js.finish_t is not None for js in plant.jobs.values())
        )

    loop.run(duration_s=duration_s if duration_s is not None else max_t, stop=stop, until=done)
    jobs = [
        SimJobResult(pid, js.name, js.criticality, js.release_t, js.finish_t, js.deadline_s)
        for pid, js in sorted(plant.jobs.items())
    ]
    meter = plant.finish_meter
    done_all = bool(jobs) and all(j.finish_t is not None for j in jobs) and meter is not None
    return SimRunResult(
        board=platform.spec.name,
        policy=policy.name,
        seed=seed,
        t_end=plant.t,
        energy_j=plant.energy_j,
        cpu_energy_j=plant.cpu_energy_j,
        daemon_energy_j=loop.energy_j,
        peak_temp_c=plant.peak_temp_c,
        ticks=loop.ticks,
        interventions=loop.events_total,
        jobs=jobs,
        status=loop.status(),
        history=history,
        energy_trace=tuple(trace) + ((plant.t, plant.energy_j, plant.cpu_energy_j),),
        executed_dags={pid: plant.job_dag(pid) for pid in plant.jobs},
        jobs_energy_j=meter[1] if done_all else None,
        jobs_cpu_energy_j=meter[2] if done_all else None,
        throttled_s=plant.throttled_s,
        capped_s=capped[0] + (plant.t - capped[1] if capped[2] else 0.0),
        rt_cover_rules=rt_cover_rules,
        fifo_dropped_ticks=cover[0],
        fifo_dropped_jobs=tuple(sorted(cover[1])),
        niced_below_jobs=tuple(sorted(cover[2])),
    )
