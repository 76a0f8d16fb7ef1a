"""What the daemon sees on one tick: plain frozen dataclasses, no I/O.

``None`` always means *unavailable* (a failed or missing read), never zero.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ClusterObs:
    name: str
    policy: int
    cpus: tuple[int, ...]  # related_cpus
    online: tuple[int, ...]  # CPUs of this cluster that are online
    freqs_khz: tuple[int, ...]  # available frequency table
    capacity: float  # relative speed per Hz (spec)
    cur_khz: int | None
    min_khz: int | None
    max_khz: int | None
    governor: str | None
    governors: tuple[str, ...] = ()  # scaling_available_governors
    util: tuple[float | None, ...] = ()  # busy fraction per CPU in ``cpus`` since the last tick

    @property
    def mean_util(self) -> float | None:
        vals = [u for c, u in zip(self.cpus, self.util) if u is not None and c in self.online]
        return sum(vals) / len(vals) if vals else None

    @property
    def max_util(self) -> float | None:
        vals = [u for c, u in zip(self.cpus, self.util) if u is not None and c in self.online]
        return max(vals) if vals else None

    @property
    def allowed_khz(self) -> tuple[int, ...]:
        """The table entries within ``min_khz``..``max_khz`` (the limits the kernel holds,
        thermal and static caps folded in): what a decision can really get. The whole table
        when a limit is unknown or none fits between them."""
        lo = self.min_khz if self.min_khz is not None else -1
        hi = self.max_khz if self.max_khz is not None else float("inf")
        return tuple(f for f in self.freqs_khz if lo <= f <= hi) or self.freqs_khz

    @property
    def level(self) -> int | None:
        """Index of the current frequency in the table (nearest at or below)."""
        if self.cur_khz is None or not self.freqs_khz:
            return None
        idx = 0
        for i, f in enumerate(self.freqs_khz):
            if f <= self.cur_khz:
                idx = i
        return idx


@dataclass(frozen=True)
class ZoneObs:
    type: str
    role: str
    temp_c: float | None
    clusters: tuple[str, ...] = ()
    passive_trip_c: float | None = None
    critical_trip_c: float | None = None


@dataclass(frozen=True)
class RailObs:
    name: str
    role: str  # total | cpu | sub
    power_mw: float | None


@dataclass(frozen=True)
class JobProfile:
    """A job's reference cost, measured once at a reference operating point (versioned).

    ``work_s`` (C) and ``span_s`` (L) are seconds at ``ref_khz`` on the reference core type;
    ``beta`` is the memory-bound fraction; ``ref_makespan_s`` the measured reference makespan.
    ``span_cpu_s`` and ``span_mem_s``, when known (a modelled DAG), are the longest paths of
    the compute parts alone and of the memory parts alone: the span at another speed is at
    most ``span_cpu_s * f_ref / (kappa f) + span_mem_s`` (agents.deadlines.span_at), where
    scaling L by the job's mean beta is not a bound (a path may be all compute).
    """

    name: str
    work_s: float
    span_s: float
    beta: float
    ref_makespan_s: float
    ref_khz: int
    ref_cores: int
    version: int = 1
    span_cpu_s: float | None = None
    span_mem_s: float | None = None


@dataclass(frozen=True)
class JobObs:
    pid: int
    name: str
    criticality: str  # "hi" | "lo"
    release_t: float  # clock time of registration
    elapsed_s: float
    deadline_s: float | None  # relative to release; None when the job has none
    cpus: tuple[int, ...] = ()  # current core set
    rt_priority: int = 0
    profile: JobProfile | None = None
    #: fraction of the job's work done, when the backend can tell (simulator); None on a board
    progress: float | None = None

    @property
    def remaining_s(self) -> float | None:
        return None if self.deadline_s is None else self.deadline_s - self.elapsed_s


@dataclass(frozen=True)
class Observation:
    t: float
    board: str
    clusters: tuple[ClusterObs, ...]
    zones: tuple[ZoneObs, ...]
    rails: tuple[RailObs, ...]
    jobs: tuple[JobObs, ...] = ()
    errors: tuple[str, ...] = field(default=(), compare=False)  # unavailable reads this tick

    def cluster(self, name: str) -> ClusterObs:
        for c in self.clusters:
            if c.name == name:
                return c
        raise KeyError(name)

    def rail(self, role: str) -> RailObs | None:
        return next((r for r in self.rails if r.role == role), None)

    @property
    def total_power_w(self) -> float | None:
        r = self.rail("total")
        return None if r is None or r.power_mw is None else r.power_mw / 1000.0

    @property
    def cpu_power_w(self) -> float | None:
        r = self.rail("cpu")
        return None if r is None or r.power_mw is None else r.power_mw / 1000.0

    def cluster_temp_c(self, name: str) -> float | None:
        temps = [z.temp_c for z in self.zones if name in z.clusters and z.temp_c is not None]
        return max(temps) if temps else None

    @property
    def max_cpu_temp_c(self) -> float | None:
        temps = [z.temp_c for z in self.zones if z.role == "cpu" and z.temp_c is not None]
        return max(temps) if temps else None

    def with_jobs(self, jobs: tuple[JobObs, ...]) -> Observation:
        from dataclasses import replace

        return replace(self, jobs=tuple(jobs))
