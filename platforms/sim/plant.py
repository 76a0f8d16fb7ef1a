"""The plant simulator: DVFS, power, RC thermal network and DAG execution on a virtual clock.

Time advances by events: task completions (``platforms.sim.executor``), job releases, frequency
transitions (a request takes effect ``transition_latency_ns`` later) and a fixed thermal step of
``sim.thermal_step_s`` (10 ms by default).

Power is piecewise constant between events, so energy is integrated exactly: the executor keeps
the integral of each core's switching activity and its busy time, and the plant books energy
whenever a coefficient changes (a frequency or online change, or the thermal step). Leakage is
exponential in the die temperature; it is held constant over each thermal step at the value of a
fixed-point iteration on the step's mean temperature (predictor: the previous step's dynamic
power), and follows a frequency change's voltage at once, so the power the plant reports is the
power it integrates. The network is stepped with
the exact zero-order hold of the step's average node powers (``platforms.sim.thermal``).

Idle cores: an online core with no thread is in WFI (clock-gated: activity ``idle_activity``,
full leakage). Where the cluster sets ``gate_after_s`` (cpuidle's deepest core power-down
state), a core idle that long is power-gated until it next runs: no activity and
``gated_leak`` of its leakage. This is cpuidle seen as a timeout (a real governor predicts the
idle length and may gate sooner); the state's exit latency is not charged to the woken task.

Governors: ``performance``/``powersave`` pin the maximum/minimum of the policy limits (and
re-apply when the limits change); ``userspace`` follows ``set_freq``/``scaling_setspeed``; every
other governor (``ondemand``, ``conservative``, ``schedutil``, ``interactive``) keeps the current
frequency: the daemon's policies emulate them in user space. Thermal throttling follows the
kernel's step_wise governor: every ``throttle_period_s``, a cluster whose zone is at or above its
lowest passive trip loses one OPP of its cap; below ``trip − hyst`` it regains one.
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass, field
from operator import mul

import numpy as np

from platforms.dag import DAG
from platforms.sim.executor import Executor
from platforms.sim.params import SimParams, parse_sim
from platforms.sim.power import ClusterPowerTable
from platforms.sim.thermal import ThermalNetwork
from platforms.spec import BoardSpec, ClusterSpec

FIRST_PID = 10000
PINNING_GOVERNORS = ("performance", "powersave")
INF = math.inf


@dataclass
class SimJob:
    dag: DAG
    name: str
    deadline_s: float | None = None
    criticality: str = "lo"
    release_t: float = 0.0


@dataclass
class JobState:
    """Public record of a submitted job; ``busy_s`` is CPU seconds (shared cores count a share)."""

    pid: int
    name: str
    release_t: float
    deadline_s: float | None
    criticality: str
    n_tasks: int
    start_t: float | None = None
    finish_t: float | None = None
    done_tasks: int = 0
    busy_s: float = 0.0
    cpus: tuple[int, ...] = ()
    rt_priority: int = 0
    nice: int = 0
    released: bool = False
    peak_temp_c: float | None = None

    @property
    def done(self) -> bool:
        return self.finish_t is not None

    @property
    def makespan_s(self) -> float | None:
        return None if self.finish_t is None else self.finish_t - self.release_t

    @property
    def deadline_met(self) -> bool | None:
        if self.deadline_s is None or self.finish_t is None:
            return None
        return self.finish_t - self.release_t <= self.deadline_s


@dataclass
class History:
    """Down-sampled time series; power is the average over each sample period."""

    period_s: float
    t: list[float] = field(default_factory=list)
    freq_khz: dict[str, list[int]] = field(default_factory=dict)
    temp_c: dict[str, list[float]] = field(default_factory=dict)
    power_w: list[float] = field(default_factory=list)
    cpu_w: list[float] = field(default_factory=list)


class ClusterState:
    """DVFS state of one cpufreq policy (what its sysfs files show)."""

    def __init__(self, spec: ClusterSpec, table: ClusterPowerTable, cores: list[int], node: int):
        self.spec = spec
        self.name = spec.name
        self.table = table
        self.cores = cores  # core indices
        self.node = node  # thermal node index
        self.freqs = spec.freqs_khz
        self.latency_s = spec.transition_latency_ns * 1e-9
        self.governor = spec.default_governor
        self.min_khz = spec.fmin_khz
        self.max_khz = spec.fmax_khz
        self.target_khz = spec.fmax_khz
        self.cur_khz = spec.fmax_khz
        self.k = len(self.freqs) - 1  # OPP index of cur_khz
        self.pend_khz: int | None = None
        self.pend_t = INF
        self.cap_state = 0  # thermal cooling state: cap = freqs[-1 - cap_state]
        self.n_online = len(cores)
        self.leak_core_w = 0.0  # leakage per online core, held over the current thermal step
        self.gated_leak = 1.0  # fraction of a core's leakage left while it is power-gated
        self.step_gated_s = 0.0  # core-seconds gated in the current thermal step
        self.trips: list[tuple[int, float, float]] = []  # (zone index, trip °C, hyst °C)

    @property
    def cap_khz(self) -> int:
        return self.freqs[len(self.freqs) - 1 - self.cap_state]


def resolve_freq(table: tuple[int, ...], target: float, lo: float, hi: float) -> int:
    """Highest table entry at or below ``target`` within [lo, hi]; the lowest in range if none.

    An upper limit below every entry in range (thermal cap under the user minimum) wins.
    """
    cands = [f for f in table if lo <= f <= hi]
    if not cands:
        below = [f for f in table if f <= hi]
        return below[-1] if below else table[0]
    at_or_below = [f for f in cands if f <= target]
    return at_or_below[-1] if at_or_below else cands[0]


def _nice_weight(nice: int) -> float:
    """CFS load weight: 1024 at nice 0, about 1.25x per nice level."""
    return 1024.0 / (1.25**nice)


class Plant:
    """A simulated board. See the module docstring for the model."""

    def __init__(
        self,
        spec: BoardSpec,
        *,
        seed: int = 0,
        ambient_c: float | None = None,
        governor: str | None = None,
        params: SimParams | None = None,
        online: tuple[int, ...] | None = None,
        start_c: float | None = None,
    ):
        self.spec = spec
        self.params = p = params or parse_sim(spec)
        self.rng = np.random.default_rng(seed)
        self.seed = seed
        self.t = 0.0
        self.ambient_c = p.ambient_c if ambient_c is None else float(ambient_c)
        self.net = ThermalNetwork.from_params(p, self.ambient_c)
        self._dt = p.thermal_step_s
        self._phi, self._gamma = self.net.zoh(self._dt)
        nn = self.net.n

        # cores and clusters
        self.cpu_ids: tuple[int, ...] = spec.cpus
        self._core_of = {cpu: i for i, cpu in enumerate(self.cpu_ids)}
        self.clusters: dict[str, ClusterState] = {}
        self._core_cluster: list[ClusterState] = [None] * len(self.cpu_ids)  # type: ignore[list-item]
        for cs in spec.clusters:
            cp = p.cluster(cs.name)
            cl = ClusterState(
                cs,
                ClusterPowerTable.build(cs, cp),
                [self._core_of[c] for c in cs.cpus],
                self.net.index(cp.node),
            )
            if governor is not None:
                if governor not in cs.governors:
                    raise ValueError(
                        f"{spec.name}: cluster {cs.name} has no governor {governor!r} (available: {list(cs.governors)})"
                    )
                cl.governor = governor
            if cl.governor == "powersave":
                cl.target_khz = cl.cur_khz = cl.min_khz
                cl.k = 0
            self.clusters[cs.name] = cl
            for c in cl.cores:
                self._core_cluster[c] = cl
        self._cl_list = list(self.clusters.values())

        self._exe = Executor(
            len(self.cpu_ids),
            p.mem_activity,
            p.idle_activity,
            ref_hz=spec.reference_cluster.fmax_khz * 1e3,
        )
        caps = {c: cs.capacity for cs in spec.clusters for c in cs.cpus}
        self._exe.set_core_order(
            sorted(range(len(self.cpu_ids)), key=lambda i: (-caps.get(self.cpu_ids[i], 1.0), i))
        )
        for cl in self._cl_list:
            self._exe.set_speed(cl.cores, self._inv_speed(cl), 0.0)
            cp = p.cluster(cl.name)
            cl.gated_leak = cp.gated_leak
            for c in cl.cores:
                self._exe.set_gate_after(c, cp.gate_after_s)
        if online is None:
            off = {c for cs in spec.clusters for c in cs.offline_by_default}
        else:
            unknown = set(online) - set(self.cpu_ids)
            if unknown:
                raise ValueError(f"{spec.name}: no CPU {sorted(unknown)}")
            off = set(self.cpu_ids) - set(online) - {self.cpu_ids[0]}
        for cpu in sorted(off):
            i = self._core_of[cpu]
            self._exe.set_online(i, False, 0.0)
            self._core_cluster[i].n_online -= 1
        self._online_since = [0.0] * len(self.cpu_ids)
        self._online_acc = [0.0] * len(self.cpu_ids)

        # rails: the CPU rail carries the CPU model plus its own loads; "other" is unmetered
        self._cpu_rail = spec.cpu_rail.name if spec.cpu_rail else None
        self._total_rail = spec.total_rail.name if spec.total_rail else None
        self._loads = [(r.name, r.base_w, r.busy_core_w, self.net.index(r.node)) for r in p.rails]
        self._uncore_node = self.net.index(p.cpu_uncore_node)
        self._uncore_w = p.cpu_uncore_w
        self._energy_j = 0.0
        self._cpu_energy_j = 0.0
        #: (t, total J, CPU J) when the latest job finished: a run's energy ends there, not at
        #: the controller's next tick (which comes up to one period later)
        self.finish_meter: tuple[float, float, float] | None = None
        self._rail_energy_j: dict[str, float] = {r.name: 0.0 for r in spec.rails}
        self._node_e = [0.0] * nn  # energy per node in the current thermal step
        self._node_leak_e = [0.0] * nn
        self._t_flush = 0.0
        self._busy_snap = [0.0] * len(self.cpu_ids)
        self._gated_snap = [0.0] * len(self.cpu_ids)

        # thermal zones and throttling
        self._zones = list(p.zones)
        self._zone_nodes = [tuple(self.net.index(n) for n in z.nodes) for z in self._zones]
        zone_pos = {z.type: i for i, z in enumerate(self._zones)}
        for z in spec.zones:
            trip = z.passive_trip_mc
            if trip is None or z.type not in zone_pos:
                continue
            hyst = next(
                (t.hyst_mc for t in z.trips if t.type == "passive" and t.temp_mc == trip), 0
            )
            for cname in z.clusters:
                self.clusters[cname].trips.append((zone_pos[z.type], trip / 1000.0, hyst / 1000.0))
        self._cpu_zones = [
            i for i, z in enumerate(self._zones) if spec.zone(z.type).role == "cpu"
        ] or list(range(len(self._zones)))
        self._throttle_every = max(1, round(p.throttle_period_s / self._dt))
        hp = p.history_period_s
        self._history_every = max(1, round(hp / self._dt)) if hp > 0 else 0
        self.history = (
            History(
                hp,
                freq_khz={c: [] for c in self.clusters},
                temp_c={z.type: [] for z in self._zones},
            )
            if hp > 0
            else None
        )
        self._hist_e = (0.0, 0.0)
        self._ticks = 0
        self._next_tick = self._dt

        # start from the idle steady state of a board that has been on for a while, or, with
        # ``start_c``, soaked at that temperature (a board that was just busy, or sat in a hot
        # enclosure): every node at start_c, heat sink and board included
        self._pg = [a + b for a, b in zip(self._phi, self._gamma)]  # rows of [Φ | Γ]
        self._pg_cl = [self._pg[cl.node] for cl in self._cl_list]
        self._g_cc = [[self._gamma[a.node][b.node] for b in self._cl_list] for a in self._cl_list]
        if start_c is None:
            self._rise = self._idle_steady_rise()
        else:
            if not math.isfinite(start_c) or not -40.0 <= start_c <= 150.0:
                raise ValueError(f"start_c {start_c!r}: a temperature in -40..150 C")
            self._rise = [float(start_c) - self.ambient_c] * nn
        self._set_leakage(self._rise)
        self._zone_t: list[float] = []
        self._zone_tick = -1
        self.peak_temp_c = -INF
        #: time some cluster ran under the kernel's thermal cap (at its polling period)
        self.throttled_s = 0.0
        self._sample_peak()

        # jobs
        self.jobs: dict[int, JobState] = {}
        self.events: list[tuple[float, str, int]] = []
        self._pids = itertools.count(FIRST_PID)
        self._pending: list[tuple[float, int]] = []  # (release_t, pid)
        self._pending_dags: dict[int, DAG] = {}
        self._realised: dict[int, DAG] = {}
        self._next_freq = INF

    # ------------------------------------------------------------------------------------------
    # jobs

    def submit(self, job: SimJob) -> int:
        """Queue ``job``; it is released at ``job.release_t`` (a time in the past means now)."""
        if job.criticality not in ("hi", "lo"):
            raise ValueError(
                f"job {job.name!r}: criticality must be 'hi' or 'lo', got {job.criticality!r}"
            )
        pid = next(self._pids)
        rel = max(float(job.release_t), self.t)
        st = JobState(
            pid, job.name, rel, job.deadline_s, job.criticality, job.dag.n, cpus=self.cpu_ids
        )
        self.jobs[pid] = st
        self._pending_dags[pid] = job.dag
        if rel <= self.t:
            self._release(pid)
        else:
            heapq.heappush(self._pending, (rel, pid))
        return pid

    def job_dag(self, pid: int) -> DAG:
        """The job's DAG as executed (after the per-task jitter; as submitted until released)."""
        self._job(pid)
        if pid in self._pending_dags:
            return self._pending_dags[pid]
        return self._realised[pid]

    def _release(self, pid: int) -> None:
        st = self.jobs[pid]
        dag = self._pending_dags.pop(pid)
        sigma = self.params.exec_jitter
        if sigma > 0 and dag.n:
            f = self.rng.lognormal(-0.5 * sigma * sigma, sigma, dag.n)
            cyc, mem = dag.cycles * f, dag.mem_s * f
            run = DAG(dag.name, cyc, mem, dag.succ_ptr, dag.succ_idx, dag.npred, dict(dag.meta))
        else:
            cyc, mem, run = dag.cycles, dag.mem_s, dag
        self._realised[pid] = run
        st.released = True
        st.peak_temp_c = self._cpu_temp_now()
        self.events.append((self.t, "release", pid))
        cores = [self._core_of[c] for c in st.cpus]
        prio, weight = self._prio(st)
        self._exe.add_job(
            st,
            pid,
            cyc.tolist(),
            mem.tolist(),
            dag.succ_ptr.tolist(),
            dag.succ_idx.tolist(),
            dag.npred.tolist(),
            cores,
            prio,
            weight,
            self.t,
        )
        self._log_finished()

    def _log_finished(self) -> None:
        fin = self._exe.finished
        if fin:
            peak = self._cpu_temp_now()
            self.peak_temp_c = max(self.peak_temp_c, peak)
            for st in fin:
                self.events.append((st.finish_t, "finish", st.pid))
                st.peak_temp_c = peak if st.peak_temp_c is None else max(st.peak_temp_c, peak)
            fin.clear()
            self._flush(self.t)
            self.finish_meter = (self.t, self._energy_j, self._cpu_energy_j)

    def _cpu_temp_now(self) -> float:
        zt = self._zone_temps()
        return max((zt[i] for i in self._cpu_zones), default=self.ambient_c)

    @staticmethod
    def _prio(st: JobState) -> tuple[int, float]:
        if st.rt_priority > 0:
            return st.rt_priority, 1.0
        return 0, _nice_weight(st.nice)

    def set_affinity(self, pid: int, cpus) -> None:
        st = self._job(pid)
        cpus = tuple(sorted(set(int(c) for c in cpus)))
        bad = [c for c in cpus if c not in self._core_of]
        if not cpus or bad:
            raise ValueError(
                f"pid {pid}: invalid CPU set {list(cpus)} (board CPUs {list(self.cpu_ids)})"
            )
        if not any(self._exe.online[self._core_of[c]] for c in cpus):
            raise ValueError(f"pid {pid}: none of CPUs {list(cpus)} is online")
        st.cpus = cpus
        if st.released and not st.done:
            self._flush(self.t)
            self._exe.set_affinity(pid, [self._core_of[c] for c in cpus], self.t)
            self._log_finished()

    def set_priority(self, pid: int, rt_priority: int = 0, nice: int = 0) -> None:
        st = self._job(pid)
        if not 0 <= int(rt_priority) <= 99:
            raise ValueError(f"pid {pid}: rt_priority must be 0..99, got {rt_priority}")
        if not -20 <= int(nice) <= 19:
            raise ValueError(f"pid {pid}: nice must be -20..19, got {nice}")
        st.rt_priority, st.nice = int(rt_priority), int(nice)
        if st.released and not st.done:
            prio, weight = self._prio(st)
            self._flush(self.t)
            self._exe.set_priority(pid, prio, weight, self.t)

    def _job(self, pid: int) -> JobState:
        st = self.jobs.get(pid)
        if st is None:
            raise KeyError(f"no job with pid {pid}")
        return st

    def job_cpu_time(self, pid: int) -> float:
        st = self._job(pid)
        live = self._exe.job_cpu_time(pid, self.t)
        return st.busy_s if live is None else live

    def job_progress(self, pid: int) -> float:
        """Share of the job's work done (0 before its release, 1 once it ended), counted as
        a job profile counts work (reference seconds, memory stalls included); what a job
        that reports its progress would report, and what the gate's remaining work means."""
        st = self._job(pid)
        if st.done:
            return 1.0
        live = self._exe.job_work_fraction(pid, self.t) if st.released else None
        return 0.0 if live is None else live

    def job_running_cpus(self, pid: int) -> tuple[int, ...]:
        """CPUs on which the job has a task running right now."""
        return tuple(self.cpu_ids[c] for c in self._exe.job_cores(pid))

    @property
    def n_task_events(self) -> int:
        """Task completions simulated so far."""
        return self._exe.n_events

    def active_jobs(self) -> list[JobState]:
        return [st for st in self.jobs.values() if not st.done]

    # ------------------------------------------------------------------------------------------
    # time

    def advance(self, until: float) -> float:
        """Run to ``until`` or to the first job release/completion, whichever comes first."""
        if until <= self.t:
            return self.t
        exe = self._exe
        while True:
            if (
                until == INF
                and not self._pending
                and self._next_freq == INF
                and exe.next_time() == INF
            ):
                # nothing can ever happen again: refuse to tick forever
                if exe.jobs:
                    raise RuntimeError(
                        f"jobs {sorted(exe.jobs)} can make no progress (a cycle in the DAG?)"
                    )
                return self.t
            t_ctrl = min(
                until,
                self._next_tick,
                self._next_freq,
                self._pending[0][0] if self._pending else INF,
            )
            stop = exe.run(t_ctrl)
            if stop is not None:
                self.t = stop
                self._log_finished()
                return stop
            self.t = t_ctrl
            if self._next_freq <= t_ctrl:
                self._apply_freqs(t_ctrl)
            if self._next_tick <= t_ctrl:
                self._tick(t_ctrl)
            released = False
            while self._pending and self._pending[0][0] <= t_ctrl:
                _, pid = heapq.heappop(self._pending)
                self._release(pid)
                released = True
            if released or t_ctrl >= until:
                return self.t

    def run_until_idle(self, max_t: float = INF) -> float:
        """Advance until every submitted job has finished (or ``max_t``)."""
        while (self._exe.jobs or self._pending) and self.t < max_t:
            self.advance(max_t)
        return self.t

    # ------------------------------------------------------------------------------------------
    # DVFS

    def _inv_speed(self, cl: ClusterState) -> float:
        return 1.0 / (cl.spec.capacity * cl.cur_khz * 1e3)

    def _cluster(self, name: str) -> ClusterState:
        cl = self.clusters.get(name)
        if cl is None:
            raise KeyError(
                f"{self.spec.name} has no cluster {name!r} (clusters: {list(self.clusters)})"
            )
        return cl

    def effective_request(self, cl: ClusterState) -> int:
        """The frequency the policy asks for now: target within limits, under the thermal cap."""
        hi = min(cl.max_khz, cl.cap_khz)
        return resolve_freq(cl.freqs, cl.target_khz, min(cl.min_khz, hi), hi)

    def _request(self, cl: ClusterState) -> None:
        want = self.effective_request(cl)
        if want == cl.cur_khz:
            cl.pend_khz, cl.pend_t = None, INF
        elif want != cl.pend_khz:
            cl.pend_khz, cl.pend_t = want, self.t + cl.latency_s
            if cl.latency_s <= 0:
                self._apply_cluster(cl, self.t)
        self._next_freq = min(c.pend_t for c in self._cl_list)

    def _apply_cluster(self, cl: ClusterState, t: float) -> None:
        self._flush(t)
        cl.cur_khz = cl.pend_khz
        k_old, cl.k = cl.k, cl.table.index(cl.cur_khz)
        if cl.k != k_old and cl.table.leak_ref_w[k_old] > 0.0:
            # leakage follows the new voltage at once (it is V x exp(kT T): the temperature
            # factor of the held value stays until the next thermal step)
            cl.leak_core_w *= cl.table.leak_ref_w[cl.k] / cl.table.leak_ref_w[k_old]
        cl.pend_khz, cl.pend_t = None, INF
        self._exe.set_speed(cl.cores, self._inv_speed(cl), t)

    def _apply_freqs(self, t: float) -> None:
        for cl in self._cl_list:
            if cl.pend_t <= t:
                self._apply_cluster(cl, t)
        self._next_freq = min(c.pend_t for c in self._cl_list)

    def set_freq(self, cluster: str, khz: int) -> None:
        """Request ``khz`` (snapped to the table at or below, within the limits)."""
        cl = self._cluster(cluster)
        if cl.governor in PINNING_GOVERNORS:
            raise ValueError(
                f"cluster {cluster}: governor {cl.governor!r} pins the frequency; select 'userspace' first"
            )
        if isinstance(khz, bool) or not isinstance(khz, (int, float)) or khz <= 0:
            raise ValueError(
                f"cluster {cluster}: frequency must be a positive kHz value, got {khz!r}"
            )
        cl.target_khz = int(khz)
        self._request(cl)

    def set_governor(self, cluster: str, name: str) -> None:
        cl = self._cluster(cluster)
        if name not in cl.spec.governors:
            raise ValueError(
                f"cluster {cluster}: governor {name!r} is not available ({list(cl.spec.governors)})"
            )
        cl.governor = name
        self._governor_target(cl, keep=True)
        self._request(cl)

    def _governor_target(self, cl: ClusterState, keep: bool) -> None:
        if cl.governor == "performance":
            cl.target_khz = cl.max_khz
        elif cl.governor == "powersave":
            cl.target_khz = cl.min_khz
        elif keep:  # userspace starts at the current frequency; the others keep it
            cl.target_khz = cl.cur_khz

    def set_limits(
        self, cluster: str, min_khz: int | None = None, max_khz: int | None = None
    ) -> None:
        """Set scaling_min/max_freq (clamped to the cpuinfo range; min > max is refused)."""
        cl = self._cluster(cluster)
        lo_hw, hi_hw = cl.spec.fmin_khz, cl.spec.fmax_khz
        new_min = cl.min_khz if min_khz is None else min(max(int(min_khz), lo_hw), hi_hw)
        new_max = cl.max_khz if max_khz is None else min(max(int(max_khz), lo_hw), hi_hw)
        if new_min > new_max:
            raise ValueError(
                f"cluster {cluster}: scaling_min_freq {new_min} > scaling_max_freq {new_max}"
            )
        if not any(new_min <= f <= new_max for f in cl.freqs):  # the kernel's table verify
            new_max = next(f for f in cl.freqs if f >= new_min)
        cl.min_khz, cl.max_khz = new_min, new_max
        self._governor_target(cl, keep=False)
        self._request(cl)

    def freq_khz(self, cluster: str) -> int:
        return self._cluster(cluster).cur_khz

    # ------------------------------------------------------------------------------------------
    # CPU hotplug

    def set_online(self, cpu: int, online: bool) -> None:
        if cpu not in self._core_of:
            raise ValueError(f"{self.spec.name}: no CPU {cpu}")
        if cpu == self.cpu_ids[0] and not online:
            raise ValueError(f"cpu{cpu} cannot be taken offline")
        i = self._core_of[cpu]
        exe = self._exe
        if exe.online[i] == bool(online):
            return
        if not online and sum(exe.online) <= 1:
            raise ValueError("cannot take the last online CPU offline")
        self._flush(self.t)
        cl = self._core_cluster[i]
        if online:
            self._online_since[i] = self.t
            cl.n_online += 1
        else:
            self._online_acc[i] += self.t - self._online_since[i]
            cl.n_online -= 1
        exe.set_online(i, bool(online), self.t)
        self._log_finished()

    def is_online(self, cpu: int) -> bool:
        return self._exe.online[self._core_of[cpu]]

    def cpu_running(self, cpu: int) -> bool:
        """True while a task runs on ``cpu``."""
        return bool(self._exe.on_core[self._core_of[cpu]])

    def cpu_busy_s(self, cpu: int) -> float:
        return self._exe.busy_total(self._core_of[cpu], self.t)

    def cpu_online_s(self, cpu: int) -> float:
        i = self._core_of[cpu]
        return self._online_acc[i] + (
            self.t - self._online_since[i] if self._exe.online[i] else 0.0
        )

    # ------------------------------------------------------------------------------------------
    # power

    def _flush(self, t: float) -> None:
        """Book the energy of the piecewise-constant power since the last flush."""
        dt = t - self._t_flush
        if dt <= 0.0:
            return
        exe = self._exe
        accs = exe.take_activity(t)
        busy_time, busy_since, on_core = exe.busy_time, exe.busy_since, exe.on_core
        snap = self._busy_snap
        busy = 0.0
        for c in range(exe.n):
            b = busy_time[c] + (t - busy_since[c] if on_core[c] else 0.0)
            busy += b - snap[c]
            snap[c] = b
        gsnap, gated_total, idle_act = self._gated_snap, exe.gated_total, exe.idle_activity
        node_e, leak_e = self._node_e, self._node_leak_e
        cpu_e = 0.0
        for cl in self._cl_list:
            gated = 0.0  # a gated core has no clock (no idle activity) and leaks gated_leak
            for c in cl.cores:
                g = gated_total(c, t)
                gated += g - gsnap[c]
                gsnap[c] = g
            cl.step_gated_s += gated
            coef = cl.table.coef_w[cl.k]
            dyn = coef * (sum([accs[c] for c in cl.cores]) - idle_act * gated)
            stat = cl.leak_core_w * (cl.n_online * dt - (1.0 - cl.gated_leak) * gated)
            node_e[cl.node] += dyn + stat
            leak_e[cl.node] += stat
            cpu_e += dyn + stat
        unc = self._uncore_w * dt  # cpu0 is never offline: the CPU complex is always powered
        node_e[self._uncore_node] += unc
        cpu_e += unc
        rest_e = 0.0
        rails = self._rail_energy_j
        for name, base, per_busy, node in self._loads:
            e = base * dt + per_busy * busy
            node_e[node] += e
            if name == self._cpu_rail:
                cpu_e += e
            else:
                rest_e += e
                if name in rails:
                    rails[name] += e
        if self._cpu_rail is not None:
            rails[self._cpu_rail] += cpu_e
        total = cpu_e + rest_e
        if self._total_rail is not None:
            rails[self._total_rail] += total
        self._cpu_energy_j += cpu_e
        self._energy_j += total
        self._t_flush = t

    @property
    def energy_j(self) -> float:
        """Energy of the total input rail (CPU + rest of the board) since t = 0, exact."""
        self._flush(self.t)
        return self._energy_j

    @property
    def cpu_energy_j(self) -> float:
        """Energy of the CPU rail since t = 0, exact."""
        self._flush(self.t)
        return self._cpu_energy_j

    @property
    def rail_energy_j(self) -> dict[str, float]:
        """Energy per spec rail since t = 0 (the total rail equals ``energy_j``)."""
        self._flush(self.t)
        return dict(self._rail_energy_j)

    def rail_power_w(self) -> dict[str, float]:
        """Instantaneous power per spec rail, plus ``"_cpu"`` (CPU model) and ``"_total"``."""
        exe = self._exe
        act = exe.act
        cpu = 0.0
        for cl in self._cl_list:
            ng = self._n_gated(cl)
            cpu += cl.table.coef_w[cl.k] * (
                sum(act[c] for c in cl.cores) - exe.idle_activity * ng
            ) + cl.leak_core_w * (cl.n_online - (1.0 - cl.gated_leak) * ng)
        cpu += self._uncore_w
        nb = exe.n_busy()
        out: dict[str, float] = {}
        rest = 0.0
        for name, base, per_busy, _ in self._loads:
            w = base + per_busy * nb
            if name == self._cpu_rail:
                cpu += w
            else:
                rest += w
                out[name] = w
        if self._cpu_rail is not None:
            out[self._cpu_rail] = cpu
        if self._total_rail is not None:
            out[self._total_rail] = cpu + rest
        out["_cpu"] = cpu
        out["_total"] = cpu + rest
        return out

    def power_w(self) -> tuple[float, float]:
        """(total input rail, CPU rail) in W right now."""
        r = self.rail_power_w()
        return r["_total"], r["_cpu"]

    # ------------------------------------------------------------------------------------------
    # thermal

    def _n_gated(self, cl: ClusterState) -> int:
        """How many of the cluster's cores are power-gated right now."""
        is_gated, t = self._exe.is_gated, self.t
        return sum(1 for c in cl.cores if is_gated(c, t))

    def _nonleak_node_power(self) -> list[float]:
        """Node powers without leakage, for the current busy state (W)."""
        exe = self._exe
        p = [0.0] * self.net.n
        for cl in self._cl_list:
            act = sum(exe.act[c] for c in cl.cores) - exe.idle_activity * self._n_gated(cl)
            p[cl.node] += cl.table.coef_w[cl.k] * act
        p[self._uncore_node] += self.params.cpu_uncore_w
        nb = exe.n_busy()
        for _, base, per_busy, node in self._loads:
            p[node] += base + per_busy * nb
        return p

    def _leak_node_power(self, rise: list[float]) -> list[float]:
        p = [0.0] * self.net.n
        amb = self.ambient_c
        for cl in self._cl_list:
            n = cl.n_online - (1.0 - cl.gated_leak) * self._n_gated(cl)
            p[cl.node] += n * cl.table.leak_w(cl.k, amb + rise[cl.node])
        return p

    def _set_leakage(self, rise: list[float]) -> None:
        amb = self.ambient_c
        for cl in self._cl_list:
            cl.leak_core_w = cl.table.leak_w(cl.k, amb + rise[cl.node])

    def _idle_steady_rise(self) -> list[float]:
        rise = [0.0] * self.net.n
        base = self._nonleak_node_power()
        for _ in range(50):
            leak = self._leak_node_power(rise)
            new = self.net.steady_rise([a + b for a, b in zip(base, leak)]).tolist()
            if max(abs(a - b) for a, b in zip(new, rise)) < 1e-6:
                return new
            rise = new
        return rise

    def _tick(self, t: float) -> None:
        """One thermal step: book energy, step the network, update leakage, throttle, history."""
        self._flush(t)
        inv_dt = 1.0 / self._dt
        node_e, leak_e = self._node_e, self._node_leak_e
        n = len(node_e)
        x = self._rise + [e * inv_dt for e in node_e]  # [rise; P]
        xnl = [e - le for e, le in zip(node_e, leak_e)]
        for i in range(n):
            node_e[i] = 0.0
            leak_e[i] = 0.0
        rise = [sum(map(mul, row, x)) for row in self._pg]
        self._rise = rise
        # leakage held over the next step: fixed point on the step's mean die temperature, with
        # the dynamic power of the step just ended as the predictor (only die nodes matter)
        xf = rise + [e * inv_dt for e in xnl]
        free = [sum(map(mul, row, xf)) for row in self._pg_cl]
        amb = self.ambient_c
        cls = self._cl_list
        leaks = [cl.leak_core_w for cl in cls]
        # leaking core count of the step just ended (gated cores count gated_leak)
        n_leak = [cl.n_online - (1.0 - cl.gated_leak) * cl.step_gated_s * inv_dt for cl in cls]
        for cl in cls:
            cl.step_gated_s = 0.0
        for _ in range(4):
            lp = [n * lk for n, lk in zip(n_leak, leaks)]
            new = [
                cl.table.leak_w(cl.k, amb + 0.5 * (rise[cl.node] + f + sum(map(mul, g, lp))))
                for cl, f, g in zip(cls, free, self._g_cc)
            ]
            done = all(abs(a - b) <= 1e-9 + 1e-6 * b for a, b in zip(new, leaks))
            leaks = new
            if done:
                break
        for cl, lk in zip(cls, leaks):
            cl.leak_core_w = lk
        self._ticks += 1
        self._next_tick = (self._ticks + 1) * self._dt
        self._zone_tick = -1
        if self._ticks % self._throttle_every == 0:
            self._sample_peak()
            self._throttle()
        if self._history_every and self._ticks % self._history_every == 0:
            self._record(t)

    def _zone_temps(self) -> list[float]:
        """Zone temperatures from the node temperatures of the last thermal step (cached)."""
        if self._zone_tick == self._ticks:
            return self._zone_t
        amb, rise = self.ambient_c, self._rise
        out = []
        for z, idx in zip(self._zones, self._zone_nodes):
            if z.mode == "max":
                r = max(rise[i] for i in idx)
            else:
                r = sum(w * rise[i] for w, i in zip(z.weights, idx))
            out.append(amb + r + z.offset_c)
        self._zone_t = out
        self._zone_tick = self._ticks
        return out

    def _sample_peak(self) -> None:
        """Peak CPU temperature, sampled at the thermal governor's polling period (and at job
        release/completion) so that it does not depend on how often anyone reads."""
        peak = self._cpu_temp_now()
        if peak > self.peak_temp_c:
            self.peak_temp_c = peak
        for job in self._exe.jobs.values():
            st = job.st
            if st.peak_temp_c is None or peak > st.peak_temp_c:
                st.peak_temp_c = peak

    def _throttle(self) -> None:
        if any(cl.cap_state for cl in self._cl_list):  # the period just ended ran capped
            self.throttled_s += self._throttle_every * self._dt
        zt = self._zone_temps()
        for cl in self._cl_list:
            if not cl.trips:
                continue
            hot = any(zt[i] >= trip for i, trip, _ in cl.trips)
            cool = all(zt[i] < trip - hyst for i, trip, hyst in cl.trips)
            old = cl.cap_state
            if hot:
                cl.cap_state = min(cl.cap_state + 1, len(cl.freqs) - 1)
            elif cool and cl.cap_state > 0:
                cl.cap_state -= 1
            if cl.cap_state != old:
                self._request(cl)

    def _record(self, t: float) -> None:
        h = self.history
        e0, c0 = self._hist_e
        per = self._history_every * self._dt
        h.t.append(t)
        h.power_w.append((self._energy_j - e0) / per)
        h.cpu_w.append((self._cpu_energy_j - c0) / per)
        self._hist_e = (self._energy_j, self._cpu_energy_j)
        for name, cl in self.clusters.items():
            h.freq_khz[name].append(cl.cur_khz)
        for z, temp in zip(self._zones, self._zone_temps()):
            h.temp_c[z.type].append(temp)

    def temps_c(self) -> dict[str, float]:
        """Temperature per simulated thermal zone type (°C), as of the last thermal step."""
        return {z.type: temp for z, temp in zip(self._zones, self._zone_temps())}

    def node_temps_c(self) -> dict[str, float]:
        return {n: self.ambient_c + r for n, r in zip(self.net.names, self._rise)}

    def throttled(self, cluster: str) -> bool:
        return self._cluster(cluster).cap_state > 0
