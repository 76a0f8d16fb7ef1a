"""Board specs: one YAML per board in ``platforms/boards/``, loaded into frozen dataclasses.

A spec names the board, how to detect it, its clusters (frequency domains), thermal zones and
power rails, plus the ``sim`` parameters the plant simulator reads (parsed by
``platforms.sim.params``). ``hidvfs probe`` builds the same structure from a live or fake tree,
so an unknown board still works. A malformed spec fails with the file, the key and what was
expected (:class:`SpecError`).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from platforms.errors import SpecError, UnknownBoard
from platforms.yamlfile import load_yaml

BOARDS_DIR = Path(__file__).with_name("boards")
CPUFREQ = "devices/system/cpu/cpufreq"
CPU = "devices/system/cpu"
THERMAL = "class/thermal"

ZONE_ROLES = ("cpu", "gpu", "soc", "board", "other", "ignore")
ZONE_QUIRKS = ("blank", "stuck100", "eagain", "not-temperature")
TRIP_TYPES = ("passive", "active", "hot", "critical")
RAIL_ROLES = ("total", "cpu", "sub")
RAIL_DRIVERS = ("iio", "hwmon")
#: what one count of a rail's power file is worth in mW, by the spec's ``unit``
RAIL_UNITS_MW = {"mW": 1.0, "W": 1000.0, "uW": 0.001, "µW": 0.001}


@dataclass(frozen=True)
class Trip:
    temp_mc: int
    type: str
    hyst_mc: int = 0


@dataclass(frozen=True)
class ClusterSpec:
    """One cpufreq policy (frequency domain)."""

    name: str
    policy: int
    cpus: tuple[int, ...]
    core_type: str
    #: compute speed per Hz relative to the board's reference core (capacity-dmips-mhz ratio)
    capacity: float
    freqs_khz: tuple[int, ...]
    transition_latency_ns: int
    governors: tuple[str, ...]
    default_governor: str
    #: governors that appear only after ``modprobe`` (RUBIK Pi: powersave, conservative)
    modular_governors: tuple[str, ...] = ()
    scaling_driver: str = "cpufreq-dt"
    #: CPUs that the board's default power mode takes offline (TX2 Denver, Orin NX cpu4-7)
    offline_by_default: tuple[int, ...] = ()

    @property
    def policy_dir(self) -> str:
        return f"{CPUFREQ}/policy{self.policy}"

    @property
    def fmin_khz(self) -> int:
        return self.freqs_khz[0]

    @property
    def fmax_khz(self) -> int:
        return self.freqs_khz[-1]


@dataclass(frozen=True)
class ZoneSpec:
    type: str
    role: str
    clusters: tuple[str, ...] = ()
    trips: tuple[Trip, ...] = ()
    quirk: str | None = None
    #: other ``type`` strings of the same sensor on other BSPs (JetPack 5's ``CPU-therm`` for
    #: mainline ``cpu-thermal``): the zone is matched by ``type`` first, then by these in order
    aliases: tuple[str, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        """Every ``type`` this zone may carry on a board, in the order they are tried."""
        return (self.type, *self.aliases)

    @property
    def is_temperature(self) -> bool:
        return self.quirk != "not-temperature" and self.role != "ignore"

    @property
    def passive_trip_mc(self) -> int | None:
        temps = [t.temp_mc for t in self.trips if t.type == "passive"]
        return min(temps) if temps else None


@dataclass(frozen=True)
class RailSpec:
    """A power rail. ``device`` is the sensor's folder relative to the root.

    ``iio``: ``device`` is the channel folder looked in first (``iio:deviceN``; N varies and L4T
    28 names it ``iio_device``, so its siblings and every ina3221x monitor are scanned next),
    values are ``in_powerN_input`` in ``unit`` (one of :data:`RAIL_UNITS_MW`; L4T's ina3221x
    reports mW).
    ``hwmon``: ``device`` is the folder holding ``hwmon/hwmonN`` (N varies), the rail is found by
    its ``inN_label``; mW = mV * mA / 1000 (the hwmon ABI fixes the units: ``unit`` is mW).
    """

    name: str
    role: str
    driver: str
    device: str
    channel: int
    unit: str = "mW"


@dataclass(frozen=True)
class BoardSpec:
    name: str
    title: str
    compatible: tuple[str, ...]
    model: tuple[str, ...]
    clusters: tuple[ClusterSpec, ...]
    zones: tuple[ZoneSpec, ...]
    rails: tuple[RailSpec, ...]
    sim: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    source: str = ""
    #: device-tree compatibles that other boards share (the SoC's, a reference design's):
    #: they identify the board only with a ``model`` match (boards.md section 7)
    soc_compatible: tuple[str, ...] = ()

    @property
    def cpus(self) -> tuple[int, ...]:
        return tuple(sorted(c for cl in self.clusters for c in cl.cpus))

    @property
    def ncpus(self) -> int:
        return len(self.cpus)

    def cluster(self, name: str) -> ClusterSpec:
        for c in self.clusters:
            if c.name == name:
                return c
        raise KeyError(f"board {self.name} has no cluster {name!r}")

    def cluster_of_cpu(self, cpu: int) -> ClusterSpec:
        for c in self.clusters:
            if cpu in c.cpus:
                return c
        raise KeyError(f"board {self.name} has no cpu {cpu}")

    def zone(self, type_: str) -> ZoneSpec:
        """The zone of this ``type``, else the one that lists it among its ``aliases``."""
        for z in self.zones:
            if z.type == type_:
                return z
        for z in self.zones:
            if type_ in z.aliases:
                return z
        raise KeyError(f"board {self.name} has no thermal zone {type_!r}")

    @property
    def reference_cluster(self) -> ClusterSpec:
        """The cluster with the largest compute capacity (cores x capacity x f_max): job
        profiles are measured on it at its top OPP, and their work counts its seconds."""
        return max(self.clusters, key=lambda c: len(c.cpus) * c.capacity * c.fmax_khz)

    @property
    def total_rail(self) -> RailSpec | None:
        return next((r for r in self.rails if r.role == "total"), None)

    @property
    def cpu_rail(self) -> RailSpec | None:
        return next((r for r in self.rails if r.role == "cpu"), None)


# --------------------------------------------------------------------------------------------
# Parsing with precise errors


class _Reader:
    """Typed access into a YAML mapping that raises SpecError naming file and key path."""

    def __init__(self, file: str):
        self.file = file

    def req(self, d: Any, key: str, where: str, typ: type | tuple[type, ...], desc: str) -> Any:
        if not isinstance(d, dict):
            raise SpecError(self.file, where or "<top>", "a mapping", d)
        path = f"{where}.{key}" if where else key
        if key not in d:
            raise SpecError(self.file, path, f"{desc} (missing)")
        return self.check(d[key], path, typ, desc)

    def opt(self, d: dict, key: str, where: str, typ, desc: str, default: Any) -> Any:
        if key not in d or d[key] is None:
            return default
        path = f"{where}.{key}" if where else key
        return self.check(d[key], path, typ, desc)

    def check(self, v: Any, path: str, typ, desc: str) -> Any:
        if typ is float and isinstance(v, int) and not isinstance(v, bool):
            return float(v)
        if isinstance(v, bool) and typ is not bool:
            raise SpecError(self.file, path, desc, v)
        if not isinstance(v, typ):
            raise SpecError(self.file, path, desc, v)
        return v

    def int_list(
        self, d: dict, key: str, where: str, desc: str, required: bool = True
    ) -> tuple[int, ...]:
        path = f"{where}.{key}"
        if key not in d:
            if required:
                raise SpecError(self.file, path, f"{desc} (missing)")
            return ()
        v = d[key]
        if not isinstance(v, list) or not all(
            isinstance(x, int) and not isinstance(x, bool) for x in v
        ):
            raise SpecError(self.file, path, desc, v)
        return tuple(v)

    def str_list(
        self, d: dict, key: str, where: str, desc: str, required: bool = True
    ) -> tuple[str, ...]:
        path = f"{where}.{key}" if where else key
        if key not in d:
            if required:
                raise SpecError(self.file, path, f"{desc} (missing)")
            return ()
        v = d[key]
        if isinstance(v, str):
            v = [v]
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise SpecError(self.file, path, desc, v)
        return tuple(v)


_ALIASES_DESC = "a list of other type strings of this zone (non-empty, no surrounding spaces)"


def _zone_aliases(r: _Reader, z: dict, where: str, ztype: str) -> tuple[str, ...]:
    """A zone's ``aliases``: distinct type strings other than its ``type``. A blank or padded
    one could never equal a ``type`` file's content, so it is refused, not silently unused."""
    aliases = r.str_list(z, "aliases", where, _ALIASES_DESC, required=False)
    for j, a in enumerate(aliases):
        if not a.strip() or a != a.strip():
            raise SpecError(r.file, f"{where}.aliases[{j}]", _ALIASES_DESC, a)
        if a == ztype or a in aliases[:j]:
            raise SpecError(
                r.file, f"{where}.aliases[{j}]", f"a type other than {ztype!r} and not repeated", a
            )
    return aliases


def _check_alias_clashes(file: str, zones: list[ZoneSpec]) -> None:
    """An alias must name one zone only: one that is another zone's type or alias would make
    a live zone match two specs (two types alike stay allowed, as before aliases)."""
    owner: dict[str, int] = {}
    for i, z in enumerate(zones):
        owner.setdefault(z.type, i)
    for i, z in enumerate(zones):
        for j, a in enumerate(z.aliases):
            other = owner.setdefault(a, i)
            if other != i:
                raise SpecError(
                    file,
                    f"thermal.zones[{i}].aliases[{j}]",
                    f"a type no other zone uses (thermal.zones[{other}], {zones[other].type!r}, has it)",
                    a,
                )


def parse_board(data: Any, file: str = "<spec>") -> BoardSpec:
    """Build a :class:`BoardSpec` from a parsed YAML mapping, validating every key."""
    r = _Reader(file)
    if not isinstance(data, dict):
        raise SpecError(file, "<top>", "a mapping with name, clusters, thermal, power", data)
    name = r.req(data, "name", "", str, "a board name (string)")
    title = r.opt(data, "title", "", str, "a string", name)
    detect = r.opt(data, "detect", "", dict, "a mapping with compatible/model lists", {})
    compatible = r.str_list(detect, "compatible", "detect", "a list of strings", required=False)
    model = r.str_list(detect, "model", "detect", "a list of strings", required=False)
    soc_compatible = r.str_list(
        detect, "soc_compatible", "detect", "a list of strings", required=False
    )
    if soc_compatible and not model:
        raise SpecError(
            file, "detect.model", "model strings to confirm detect.soc_compatible (missing)"
        )
    both = sorted(set(compatible) & set(soc_compatible))
    if both:
        raise SpecError(
            file, "detect.soc_compatible", "entries not also in detect.compatible", both
        )

    raw_clusters = r.req(data, "clusters", "", list, "a non-empty list of clusters")
    if not raw_clusters:
        raise SpecError(file, "clusters", "a non-empty list of clusters", raw_clusters)
    clusters = []
    seen_cpus: set[int] = set()
    for i, c in enumerate(raw_clusters):
        w = f"clusters[{i}]"
        cname = r.req(c, "name", w, str, "a cluster name")
        policy = r.req(c, "policy", w, int, "the policy number (int)")
        cpus = r.int_list(c, "cpus", w, "a list of CPU ids")
        if not cpus:
            raise SpecError(file, f"{w}.cpus", "at least one CPU id", list(cpus))
        if policy not in cpus:
            raise SpecError(
                file, f"{w}.policy", f"the first CPU of the domain (one of {list(cpus)})", policy
            )
        dup = seen_cpus.intersection(cpus)
        if dup:
            raise SpecError(file, f"{w}.cpus", "CPU ids not used by another cluster", sorted(dup))
        seen_cpus.update(cpus)
        freqs = r.int_list(c, "freqs_khz", w, "a list of frequencies in kHz")
        if not freqs or list(freqs) != sorted(set(freqs)) or freqs[0] <= 0:
            raise SpecError(
                file,
                f"{w}.freqs_khz",
                "a strictly increasing list of positive kHz values",
                list(freqs),
            )
        governors = r.str_list(c, "governors", w, "a list of governor names")
        default_gov = r.req(c, "default_governor", w, str, "a governor name")
        modular = r.str_list(c, "modular_governors", w, "a list of governor names", required=False)
        if default_gov not in governors:
            raise SpecError(file, f"{w}.default_governor", f"one of {list(governors)}", default_gov)
        offline = r.int_list(c, "offline_by_default", w, "a list of CPU ids", required=False)
        if not set(offline) <= set(cpus):
            raise SpecError(
                file,
                f"{w}.offline_by_default",
                f"CPU ids of this cluster {list(cpus)}",
                list(offline),
            )
        capacity = r.req(c, "capacity", w, float, "relative speed per Hz (number > 0)")
        if capacity <= 0:
            raise SpecError(file, f"{w}.capacity", "a number > 0", capacity)
        clusters.append(
            ClusterSpec(
                name=cname,
                policy=policy,
                cpus=tuple(sorted(cpus)),
                core_type=r.req(c, "core_type", w, str, "a core type name"),
                capacity=capacity,
                freqs_khz=freqs,
                transition_latency_ns=r.req(
                    c, "transition_latency_ns", w, int, "nanoseconds (int)"
                ),
                governors=governors,
                default_governor=default_gov,
                modular_governors=modular,
                scaling_driver=r.opt(c, "scaling_driver", w, str, "a driver name", "cpufreq-dt"),
                offline_by_default=offline,
            )
        )
    cluster_names = [c.name for c in clusters]
    if len(set(cluster_names)) != len(cluster_names):
        raise SpecError(file, "clusters", "unique cluster names", cluster_names)

    thermal = r.req(data, "thermal", "", dict, "a mapping with a 'zones' list")
    raw_zones = r.req(thermal, "zones", "thermal", list, "a list of zones")
    zones = []
    for i, z in enumerate(raw_zones):
        w = f"thermal.zones[{i}]"
        role = r.req(z, "role", w, str, f"one of {ZONE_ROLES}")
        if role not in ZONE_ROLES:
            raise SpecError(file, f"{w}.role", f"one of {ZONE_ROLES}", role)
        quirk = r.opt(z, "quirk", w, str, f"one of {ZONE_QUIRKS}", None)
        if quirk is not None and quirk not in ZONE_QUIRKS:
            raise SpecError(file, f"{w}.quirk", f"one of {ZONE_QUIRKS}", quirk)
        zcl = r.str_list(z, "clusters", w, "a list of cluster names", required=False)
        for cn in zcl:
            if cn not in cluster_names:
                raise SpecError(file, f"{w}.clusters", f"cluster names from {cluster_names}", cn)
        trips = []
        for j, t in enumerate(r.opt(z, "trips", w, list, "a list of trips", [])):
            tw = f"{w}.trips[{j}]"
            ttype = r.req(t, "type", tw, str, f"one of {TRIP_TYPES}")
            if ttype not in TRIP_TYPES:
                raise SpecError(file, f"{tw}.type", f"one of {TRIP_TYPES}", ttype)
            trips.append(
                Trip(
                    temp_mc=r.req(t, "temp_mc", tw, int, "a temperature in m°C (int)"),
                    type=ttype,
                    hyst_mc=r.opt(t, "hyst_mc", tw, int, "m°C (int)", 0),
                )
            )
        ztype = r.req(z, "type", w, str, "the zone's type string")
        zones.append(
            ZoneSpec(
                type=ztype,
                role=role,
                clusters=zcl,
                trips=tuple(trips),
                quirk=quirk,
                aliases=_zone_aliases(r, z, w, ztype),
            )
        )
    _check_alias_clashes(file, zones)

    power = r.opt(data, "power", "", dict, "a mapping with a 'rails' list", {})
    rails = []
    for i, p in enumerate(r.opt(power, "rails", "power", list, "a list of rails", [])):
        w = f"power.rails[{i}]"
        role = r.req(p, "role", w, str, f"one of {RAIL_ROLES}")
        if role not in RAIL_ROLES:
            raise SpecError(file, f"{w}.role", f"one of {RAIL_ROLES}", role)
        driver = r.req(p, "driver", w, str, f"one of {RAIL_DRIVERS}")
        if driver not in RAIL_DRIVERS:
            raise SpecError(file, f"{w}.driver", f"one of {RAIL_DRIVERS}", driver)
        units = list(RAIL_UNITS_MW) if driver == "iio" else ["mW"]
        unit = r.opt(p, "unit", w, str, f"one of {units}", "mW")
        if unit not in units:
            why = "" if driver == "iio" else " (hwmon rails read mV x mA: always mW)"
            raise SpecError(file, f"{w}.unit", f"one of {units}{why}", unit)
        rails.append(
            RailSpec(
                name=r.req(p, "name", w, str, "the rail label"),
                role=role,
                driver=driver,
                device=r.req(p, "device", w, str, "the sensor folder relative to the root"),
                channel=r.req(p, "channel", w, int, "the channel number (int)"),
                unit=unit,
            )
        )
    if sum(1 for x in rails if x.role == "total") > 1:
        raise SpecError(file, "power.rails", "at most one rail with role 'total'")
    sim = r.opt(data, "sim", "", dict, "a mapping of simulator parameters", {})
    return BoardSpec(
        name=name,
        title=title,
        compatible=compatible,
        model=model,
        clusters=tuple(sorted(clusters, key=lambda c: c.policy)),
        zones=tuple(zones),
        rails=tuple(rails),
        sim=sim,
        source=file,
        soc_compatible=soc_compatible,
    )


def load_board_file(path: str | os.PathLike[str]) -> BoardSpec:
    path = os.fspath(path)
    data = load_yaml(path)
    return parse_board(data, path)


def board_names() -> list[str]:
    return sorted(p.stem for p in BOARDS_DIR.glob("*.yaml"))


#: a shipped board's name (also what a trace header or a config may name): no path parts
_BOARD_NAME = re.compile(r"[a-z0-9][a-z0-9._-]*")


@cache
def load_board(name: str) -> BoardSpec:
    """Load a shipped board spec by name (``tx2``, ``orin-nx``, ``rubikpi3``)."""
    path = BOARDS_DIR / f"{name}.yaml"
    if not isinstance(name, str) or not _BOARD_NAME.fullmatch(name) or not path.exists():
        raise UnknownBoard(f"unknown board {name!r}; known boards: {', '.join(board_names())}")
    return load_board_file(path)
