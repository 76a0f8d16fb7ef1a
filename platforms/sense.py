"""One :class:`Observation` per tick from a board spec and the live files of any backend.

Static facts (zone index by ``type``, rail files, frequency tables, related CPUs, available
governors) are discovered once and cached, so a tick costs only the reads that change: one
``cpu/online``, four files per active policy, one ``proc/stat``, one ``temp`` per zone and one
or two files per rail. Discovery runs again when the online CPU set changes, when a cached file
vanishes (a zone re-registered, a policy went away with its CPUs), and every ``refresh_s`` of
the caller's clock (a ``modprobe``'d governor, a late sensor). A failed read becomes ``None``
plus a line in ``Observation.errors`` naming the file; nothing here raises on a bad reading.
"""

from __future__ import annotations

from dataclasses import dataclass

from platforms import cpufreq, paths, power, thermal
from platforms.errors import SysfsUnavailable
from platforms.observation import ClusterObs, Observation, RailObs, ZoneObs
from platforms.procstat import UtilTracker, parse_proc_stat
from platforms.spec import BoardSpec, ClusterSpec, RailSpec, ZoneSpec
from platforms.sysfs import SysfsBackend


@dataclass
class _ClusterPlan:
    spec: ClusterSpec
    present: bool
    cpus: tuple[int, ...]
    freqs: tuple[int, ...]
    governors: tuple[str, ...]
    cur_path: str
    min_path: str
    max_path: str
    gov_path: str


@dataclass
class _ZonePlan:
    spec: ZoneSpec
    path: str | None  # the zone's temp file; None while no zone has this type
    passive_c: float | None
    critical_c: float | None
    index: int | None = None  # the zone's thermal_zoneN, to re-read its trips

    def set_trips(self, trips) -> None:
        self.passive_c = thermal.trip_c(trips, "passive")
        self.critical_c = thermal.trip_c(trips, "critical")


def _plausible_khz(khz, freqs: tuple[int, ...]) -> bool:
    """A frequency a policy can report: positive and not far past its table (a kernel may
    report a boost or a rounding just outside it, never 0 or 10x its top)."""
    return isinstance(khz, int) and khz > 0 and (not freqs or khz <= 10 * max(freqs))


#: a zone or rail of the spec that is not found is looked for again this often (s): a zone
#: re-registering or a power monitor probing late must not stay unseen until the refresh
MISSING_RETRY_S = 1.0
#: the trips of the zones found are read again this often (s): a trip an administrator or
#: a driver lowers must move the guard's caps without waiting for the refresh
TRIPS_REREAD_S = 5.0


@dataclass
class _RailPlan:
    spec: RailSpec
    src: power.RailSource | None
    files: tuple[str, ...]


class Sensor:
    """Builds observations for ``spec`` from ``sysfs`` (any :class:`SysfsBackend`)."""

    def __init__(self, spec: BoardSpec, sysfs: SysfsBackend, *, refresh_s: float | None = 30.0):
        self.spec = spec
        self.sysfs = sysfs
        self.refresh_s = refresh_s
        self._util = UtilTracker()
        self._online: tuple[int, ...] = ()
        self._clusters: list[_ClusterPlan] = []
        self._zones: list[_ZonePlan] = []
        self._rails: list[_RailPlan] = []
        self._last_refresh: float | None = None
        self._last_retry: float | None = None
        self._last_trips: float | None = None
        #: how many discoveries ran (tests and logs use it to see caching work)
        self.discoveries = 0
        self.rediscover()

    # -- discovery --------------------------------------------------------------------------
    def rediscover(self) -> None:
        """Re-read every static fact (the slow path: tens of reads)."""
        self._online = self._read_online([])
        self._discover_clusters()
        self._discover_zones()
        self._discover_rails()
        self.discoveries += 1

    def _discover_clusters(self) -> None:
        s = self.sysfs
        plans = []
        for cl in self.spec.clusters:
            p = cl.policy
            present = s.exists(paths.policy_dir(p))
            cpus, freqs, govs = cl.cpus, cl.freqs_khz, cl.governors
            if present:
                try:
                    cpus = tuple(sorted(s.read_ints(paths.policy_file(p, "related_cpus")))) or cpus
                except SysfsUnavailable:
                    pass
                try:
                    live = tuple(
                        sorted(
                            set(s.read_ints(paths.policy_file(p, "scaling_available_frequencies")))
                        )
                    )
                    freqs = live or freqs
                except SysfsUnavailable:
                    pass
                avail = s.read_or(paths.policy_file(p, "scaling_available_governors"))
                if avail:
                    govs = tuple(avail.split())
            plans.append(
                _ClusterPlan(
                    spec=cl,
                    present=present,
                    cpus=cpus,
                    freqs=freqs,
                    governors=govs,
                    cur_path=paths.policy_file(p, "scaling_cur_freq"),
                    min_path=paths.policy_file(p, "scaling_min_freq"),
                    max_path=paths.policy_file(p, "scaling_max_freq"),
                    gov_path=paths.policy_file(p, "scaling_governor"),
                )
            )
        self._clusters = plans

    def _discover_zones(self) -> None:
        wanted = [z for z in self.spec.zones if thermal.skip_reason(z.type, z) is None]
        found = (
            thermal.zones_by_type(thermal.discover_zones(self.sysfs, trips=False)) if wanted else {}
        )
        plans = []
        for z in wanted:
            info = found.get(z.type)
            trips = z.trips
            if info is not None:
                live = thermal.read_trips(self.sysfs, info.index)
                trips = live or trips  # trips on the board win over the spec's estimates
            plans.append(
                _ZonePlan(
                    spec=z,
                    path=info.temp_path if info is not None else None,
                    passive_c=thermal.trip_c(trips, "passive"),
                    critical_c=thermal.trip_c(trips, "critical"),
                    index=info.index if info is not None else None,
                )
            )
        self._zones = plans

    def _discover_rails(self) -> None:
        plans = []
        for r in self.spec.rails:
            src = power.find_rail(self.sysfs, r)
            plans.append(_RailPlan(r, src, src.files if src is not None else ()))
        self._rails = plans

    @property
    def zone_paths(self) -> dict[str, str | None]:
        """type -> cached temp file (None when the zone was not found)."""
        return {z.spec.type: z.path for z in self._zones}

    @property
    def rail_sources(self) -> dict[str, power.RailSource | None]:
        return {r.spec.name: r.src for r in self._rails}

    # -- one tick ---------------------------------------------------------------------------
    def _read_online(self, errors: list[str]) -> tuple[int, ...]:
        path = f"{paths.CPU}/online"
        try:
            return paths.parse_cpu_ranges(self.sysfs.read(path))
        except (SysfsUnavailable, ValueError):
            try:
                return cpufreq.online_cpus(self.sysfs)
            except SysfsUnavailable as err:
                errors.append(str(err))
                return self.spec.cpus

    def _vanished(self, path: str) -> bool:
        return not self.sysfs.exists(path)

    def read(self, t: float) -> Observation:
        """Observe the board at clock time ``t`` (``jobs`` empty: the daemon adds them)."""
        s = self.sysfs
        errors: list[str] = []
        if self._last_refresh is not None and t < self._last_refresh:
            self._last_refresh = t  # the clock restarted (a replay from the top)
        if self.refresh_s is not None and (
            self._last_refresh is None or t - self._last_refresh >= self.refresh_s
        ):
            if self._last_refresh is not None:
                self.rediscover()
            self._last_refresh = t
        if self._last_retry is not None and t < self._last_retry:
            self._last_retry = self._last_trips = None  # the clock restarted
        if self._last_retry is None or t - self._last_retry >= MISSING_RETRY_S:
            self._last_retry = t
            missing_zone = any(z.path is None for z in self._zones)
            missing_rail = any(r.src is None for r in self._rails)
            if missing_zone:
                self._discover_zones()
            if missing_rail:
                self._discover_rails()
            if missing_zone or missing_rail:
                self.discoveries += 1
        if self._last_trips is None:
            self._last_trips = t
        elif t - self._last_trips >= TRIPS_REREAD_S:
            self._last_trips = t
            for z in self._zones:
                if z.index is not None:
                    trips = thermal.read_trips(s, z.index)
                    if trips:
                        z.set_trips(trips)
        online = self._read_online(errors)
        if online != self._online:
            self._online = online
            self._discover_clusters()
        online_set = set(online)

        try:
            util = self._util.update(parse_proc_stat(s.read(paths.PROC_STAT)))
        except SysfsUnavailable as err:
            util = {}
            errors.append(str(err))

        dirty_clusters = dirty_zones = dirty_rails = False
        clusters = []
        for plan in self._clusters:
            cl_online = tuple(c for c in plan.cpus if c in online_set)
            values: list[int | str | None] = [None, None, None, None]
            if plan.present and cl_online:
                for i, path in enumerate(
                    (plan.cur_path, plan.min_path, plan.max_path, plan.gov_path)
                ):
                    try:
                        values[i] = s.read(path) if i == 3 else s.read_int(path)
                    except SysfsUnavailable as err:
                        errors.append(str(err))
                        if self._vanished(path):
                            dirty_clusters = True
                        continue
                    if i < 3 and not _plausible_khz(values[i], plan.freqs):
                        errors.append(f"{path}: unavailable (implausible {values[i]} kHz)")
                        values[i] = None
            elif plan.present != s.exists(paths.policy_dir(plan.spec.policy)):
                dirty_clusters = True
            clusters.append(
                ClusterObs(
                    name=plan.spec.name,
                    policy=plan.spec.policy,
                    cpus=plan.cpus,
                    online=cl_online,
                    freqs_khz=plan.freqs,
                    capacity=plan.spec.capacity,
                    cur_khz=values[0],  # type: ignore[arg-type]
                    min_khz=values[1],  # type: ignore[arg-type]
                    max_khz=values[2],  # type: ignore[arg-type]
                    governor=values[3],  # type: ignore[arg-type]
                    governors=plan.governors,
                    util=tuple(util.get(c) if c in online_set else None for c in plan.cpus),
                )
            )

        zones = []
        for z in self._zones:
            temp = None
            if z.path is None:
                errors.append(f"{paths.THERMAL}: no thermal zone of type '{z.spec.type}'")
            else:
                temp, err_text = thermal.read_temp_c(s, z.path)
                if err_text is not None:
                    errors.append(err_text)
                    if self._vanished(z.path):
                        dirty_zones = True
            zones.append(
                ZoneObs(
                    type=z.spec.type,
                    role=z.spec.role,
                    temp_c=temp,
                    clusters=z.spec.clusters,
                    passive_trip_c=z.passive_c,
                    critical_trip_c=z.critical_c,
                )
            )

        rails = []
        for r in self._rails:
            mw = None
            if r.src is None:
                errors.append(
                    f"{r.spec.device}: no {r.spec.driver} channel labelled '{r.spec.name}'"
                )
            else:
                try:
                    mw = power.read_power_mw(s, r.src)
                except SysfsUnavailable as err:
                    errors.append(str(err))
                    if any(self._vanished(f) for f in r.files):
                        dirty_rails = True
            rails.append(RailObs(name=r.spec.name, role=r.spec.role, power_mw=mw))

        if dirty_clusters:
            self._discover_clusters()
        if dirty_zones:
            self._discover_zones()
        if dirty_rails:
            self._discover_rails()
        if dirty_clusters or dirty_zones or dirty_rails:
            self.discoveries += 1
        return Observation(
            t=t,
            board=self.spec.name,
            clusters=tuple(clusters),
            zones=tuple(zones),
            rails=tuple(rails),
            errors=tuple(errors),
        )
