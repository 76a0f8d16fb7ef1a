"""One :class:`Observation` per tick from a board spec and the live files of any backend.

Static facts (zone index by ``type``, rail files, frequency tables, related CPUs, available
governors) are discovered once and cached, so a tick costs only the reads that change: one
``cpu/online``, four files per active policy, one ``proc/stat``, one ``temp`` per zone and one
or two files per rail. Discovery runs again when the online CPU set changes, when a cached file
vanishes (a zone re-registered, a policy went away with its CPUs), and every ``refresh_s`` of
the caller's clock (a ``modprobe``'d governor, a late sensor). A failed read becomes ``None``
plus a line in ``Observation.errors`` naming the file (a policy folder missing while its CPUs
are online keeps one per file, unread); nothing here raises on a bad reading.

A spec zone is found by its ``type``, then by its ``aliases`` (the names other BSPs give the
same sensor). When a cluster that the spec watches with a CPU zone is left without any zone
found, the board's unnamed CPU-looking zones (:func:`fallback_cpu_zones`) watch it instead,
logged once: a guard without a temperature never caps.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

from platforms import cpufreq, paths, power, thermal
from platforms.errors import SysfsUnavailable
from platforms.observation import ClusterObs, Observation, RailObs, ZoneObs
from platforms.procstat import UtilTracker, parse_proc_stat
from platforms.spec import BoardSpec, ClusterSpec, RailSpec, ZoneSpec
from platforms.sysfs import SysfsBackend

log = logging.getLogger("hidvfs.sense")


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
    #: found under another name (alias, fallback): the spec's trips bound the live ones
    by_alias: bool = False

    def set_trips(self, trips) -> None:
        self.passive_c = thermal.trip_c(trips, "passive")
        self.critical_c = thermal.trip_c(trips, "critical")
        if self.by_alias:
            self.passive_c = _lower(self.passive_c, thermal.trip_c(self.spec.trips, "passive"))
            self.critical_c = _lower(self.critical_c, thermal.trip_c(self.spec.trips, "critical"))


def find_zone(found: dict[str, thermal.ZoneInfo], spec: ZoneSpec) -> thermal.ZoneInfo | None:
    """The live zone of a spec zone: its ``type`` first, then its ``aliases`` in order (a
    JetPack 5 Orin calls ``cpu-thermal`` ``CPU-therm``, boards.md section 3.6)."""
    return next((found[n] for n in spec.names if n in found), None)


def uncovered_clusters(plans: list[_ZonePlan]) -> tuple[str, ...]:
    """Clusters that a spec CPU zone watches but no zone found on the board does: the guard
    has no temperature for them."""
    covered = {c for p in plans if p.path is not None for c in p.spec.clusters}
    watched = (c for p in plans if p.spec.role == "cpu" for c in p.spec.clusters)
    return tuple(dict.fromkeys(c for c in watched if c not in covered))


def fallback_cpu_zones(
    live: list[thermal.ZoneInfo], spec: BoardSpec, clusters: tuple[str, ...]
) -> list[tuple[thermal.ZoneInfo, ZoneSpec]]:
    """Live zones that no spec zone names and whose type reads as a CPU sensor
    (:func:`platforms.thermal.guess_zone_role`), each made a CPU zone watching ``clusters``:
    which cores it sits by is not in sysfs, and capping every uncovered cluster on it errs on
    the safe side. A zone the spec names (even as ``ignore``) is never taken. Their trips are
    read from the zone; the spec's CPU zones of those clusters give the estimate for a zone
    without readable trips (a temperature without a trip never caps)."""
    named = {n for z in spec.zones for n in z.names}
    estimate = tuple(
        t
        for z in spec.zones
        if z.role == "cpu" and set(z.clusters) & set(clusters)
        for t in z.trips
    )
    return [
        (info, ZoneSpec(type=info.type, role="cpu", clusters=clusters, trips=estimate))
        for info in thermal.zones_by_type(live).values()
        if info.type not in named and thermal.guess_zone_role(info.type) == "cpu"
    ]


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


def _lower(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else min(a, b)


def _policy_missing(plan: _ClusterPlan) -> list[str]:
    """Each file of a policy whose folder is missing while its CPUs are online, keyed as its
    failed read was: a file that is not read must not count as recovered."""
    reason = f"no policy{plan.spec.policy} folder while CPUs of it are online"
    return [
        str(SysfsUnavailable(path, reason))
        for path in (plan.cur_path, plan.min_path, plan.max_path, plan.gov_path)
    ]


#: what a ``key=value`` log field may hold unquoted (as daemon.logs.format_value)
_PLAIN_FIELD = re.compile(r"[A-Za-z0-9_\-.:/,+@%\[\]()]+")


def _log_field(text: str) -> str:
    """``text`` as a log field: as it is when plain, else quoted (a zone type is the tree's
    text: a quote, a backslash or a space in it must not break the line's fields)."""
    return text if _PLAIN_FIELD.fullmatch(text) else repr(text)


def _missing_zone(z: ZoneSpec) -> str:
    also = f" (nor {', '.join(repr(a) for a in z.aliases)})" if z.aliases else ""
    return f"no thermal zone of type '{z.type}'{also}"


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
        #: the fallback zones last logged (type -> clusters), so a rediscovery logs no repeat
        self._fallback_logged: tuple[tuple[str, tuple[str, ...]], ...] = ()
        #: the online CPUs of no known cluster last logged (:meth:`_warn_uncontrolled`)
        self._uncontrolled_logged: tuple[int, ...] = ()
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
        self._warn_uncontrolled(plans)

    def _warn_uncontrolled(self, plans: list[_ClusterPlan]) -> None:
        """Say once per set when online CPUs belong to no cluster of the spec: on a board the
        daemon probed, a cluster whose CPUs were all offline at start had no cpufreq policy
        to find, and its CPUs come online later under their kernel governor, uncontrolled
        (a shipped spec names such clusters, e.g. the TX2's Denver, and is not affected)."""
        known = {c for p in plans for c in p.cpus} | set(self.spec.cpus)
        stray = tuple(c for c in self._online if c not in known)
        if stray and stray != self._uncontrolled_logged:
            log.warning(
                "event=cpus_uncontrolled board=%s cpus=%s detail=%r",
                self.spec.name,
                ",".join(map(str, stray)),
                f"CPUs {list(stray)} are online but belong to no cluster found when hidvfs "
                "started (their cpufreq policy did not exist then): their frequency is left "
                "to the kernel; restart hidvfs to control them",
            )
        self._uncontrolled_logged = stray

    def _discover_zones(self) -> None:
        wanted = [z for z in self.spec.zones if thermal.skip_reason(z.type, z) is None]
        live = thermal.discover_zones(self.sysfs, trips=False) if wanted else []
        found = thermal.zones_by_type(live)
        plans = []
        for z in wanted:
            info = find_zone(found, z)
            plans.append(
                self._zone_plan(z, info, by_alias=info is not None and info.type != z.type)
            )
        uncovered = uncovered_clusters(plans)
        extra = fallback_cpu_zones(live, self.spec, uncovered) if uncovered else []
        plans += [self._zone_plan(z, info, by_alias=True) for info, z in extra]
        self._log_fallback([z for _, z in extra])
        self._zones = plans

    def _zone_plan(
        self, z: ZoneSpec, info: thermal.ZoneInfo | None, by_alias: bool = False
    ) -> _ZonePlan:
        """Trips are read from the zone found; the spec's are only estimates for a zone that
        has none readable. A zone found under another BSP's name (an alias, or a fallback)
        may carry trips for another thermal scheme (downstream ``-usr`` zones trip at 115 C
        for a userspace governor): the lower of its trips and the spec's is kept."""
        trips = z.trips
        if info is not None:
            trips = thermal.read_trips(self.sysfs, info.index) or trips
        plan = _ZonePlan(
            spec=z,
            path=info.temp_path if info is not None else None,
            passive_c=None,
            critical_c=None,
            index=info.index if info is not None else None,
            by_alias=by_alias,
        )
        plan.set_trips(trips)
        return plan

    def _log_fallback(self, zones: list[ZoneSpec]) -> None:
        """One line when the fallback zones start (or change), not one per rediscovery."""
        key = tuple((z.type, z.clusters) for z in zones)
        if not key or key == self._fallback_logged:
            return
        self._fallback_logged = key
        log.warning(
            "event=cpu_zone_fallback board=%s zones=%s clusters=%s detail=%r",
            self.spec.name,
            _log_field(",".join(z.type for z in zones)),
            _log_field(",".join(zones[0].clusters)),
            "no thermal zone of the spec watches these clusters on this board; zones whose "
            "type reads as a CPU sensor watch them instead (add their types as the spec "
            "zones' aliases)",
        )

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
            else:
                if plan.present != s.exists(paths.policy_dir(plan.spec.policy)):
                    dirty_clusters = True
                if cl_online:
                    errors += _policy_missing(plan)
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
                errors.append(f"{paths.THERMAL}: {_missing_zone(z.spec)}")
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
