"""Thermal zones: discovery by ``type`` (indices are not stable), temperatures and trips.

A reading that fails (EAGAIN/ENODATA from a power-gated sensor, a blank string, text that is
not a number, the CPython text layer's ``TypeError``) is *unavailable* (``None``), never 0 °C.
Zones that are not CPU temperatures at all are skipped: ``PMIC*`` (TX2 ``PMIC-Die`` is stuck at
100 °C) and the RUBIK Pi PM7250B BCL zones, which report battery current or a level.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from platforms import paths
from platforms.errors import SysfsUnavailable
from platforms.spec import TRIP_TYPES, Trip, ZoneSpec
from platforms.sysfs import SysfsBackend

_ZONE_RE = re.compile(r"^thermal_zone(\d+)$")
_TRIP_RE = re.compile(r"^trip_point_(\d+)_temp$")
#: zone types that report something other than a temperature (PM7250B BCL on RUBIK Pi)
_NOT_TEMPERATURE = re.compile(r"^pm\d+[a-z]*-(ibat|vbat|bcl)|(^|-)bcl(-|$)", re.IGNORECASE)


@dataclass(frozen=True)
class ZoneInfo:
    """A discovered zone: its current index (valid until the zone re-registers) and trips."""

    index: int
    type: str
    trips: tuple[Trip, ...] = ()

    @property
    def temp_path(self) -> str:
        return paths.zone_file(self.index, "temp")


def zone_indices(sysfs: SysfsBackend) -> list[int]:
    out = []
    for name in sysfs.list(paths.THERMAL):
        m = _ZONE_RE.match(name)
        if m:
            out.append(int(m.group(1)))
    return sorted(out)


def read_trips(sysfs: SysfsBackend, index: int, *, temperature: bool = True) -> tuple[Trip, ...]:
    """Every usable ``trip_point_K_*`` of a zone, in K order. Left out: an unreadable
    temperature, one no sensor can mean (the kernel's -274000 of a disabled trip, or
    anything at or below 0 °C or past 200 °C: a trip there would cap a board at room
    temperature for good) and a type the kernel does not define (vendor thresholds such as
    ``configurable_lo`` are a userspace engine's, not throttling trips). An unreadable type
    counts as passive: the trip exists, and capping at it is the safe reading. A zone that
    is not a temperature (``temperature=False``: a BCL level) keeps its trips as read."""
    ks = sorted(
        int(m.group(1)) for n in sysfs.list(paths.zone_dir(index)) if (m := _TRIP_RE.match(n))
    )
    trips = []
    for k in ks:
        try:
            temp = sysfs.read_int(paths.zone_file(index, f"trip_point_{k}_temp"))
        except SysfsUnavailable:
            continue
        if temperature and (temp <= 0 or implausible_temp(temp / 1000.0) is not None):
            continue
        ttype = sysfs.read_or(paths.zone_file(index, f"trip_point_{k}_type"), "passive")
        if ttype not in TRIP_TYPES:
            continue
        try:
            hyst = sysfs.read_int(paths.zone_file(index, f"trip_point_{k}_hyst"))
        except SysfsUnavailable:
            hyst = 0
        trips.append(Trip(temp_mc=temp, type=ttype, hyst_mc=hyst))
    return tuple(trips)


def discover_zones(sysfs: SysfsBackend, *, trips: bool = True) -> list[ZoneInfo]:
    """All zones with a readable ``type``, in index order (a type may repeat on some BSPs)."""
    out = []
    for i in zone_indices(sysfs):
        type_ = sysfs.read_or(paths.zone_file(i, "type"))
        if type_ is None:
            continue
        temperature = skip_reason(type_) is None
        out.append(
            ZoneInfo(i, type_, read_trips(sysfs, i, temperature=temperature) if trips else ())
        )
    return out


def zones_by_type(zones: list[ZoneInfo]) -> dict[str, ZoneInfo]:
    """type -> zone; the lowest index wins when a type repeats."""
    out: dict[str, ZoneInfo] = {}
    for z in zones:
        out.setdefault(z.type, z)
    return out


def parse_millicelsius(text: object) -> float | None:
    """m°C text -> °C, or None for anything that is not an integer reading."""
    try:
        return int(str(text).split()[0]) / 1000.0
    except (TypeError, ValueError, IndexError):
        return None


def read_temp_c(sysfs: SysfsBackend, path: str) -> tuple[float | None, str | None]:
    """(°C, None) or (None, reason naming the file). Catches every failure mode per file."""
    try:
        text = sysfs.read(path)
    except SysfsUnavailable as err:
        return None, str(err)
    except (OSError, TypeError, ValueError) as err:  # a backend that leaks the raw error
        return None, f"{path}: unavailable ({type(err).__name__}: {err})"
    value = parse_millicelsius(text)
    if value is None:
        return None, f"{path}: unavailable (not a temperature: {text!r})"
    why = implausible_temp(value)
    if why is not None:
        return None, f"{path}: unavailable ({why}: {str(text).strip()!r})"
    return value, None


#: what a die or a board can really read, °C: a value outside is a broken or gated sensor,
#: never a temperature to act on (a -5 °C glitch must not lift a thermal cap)
TEMP_PLAUSIBLE_C = (-50.0, 200.0)


def implausible_temp(celsius: float) -> str | None:
    """Why a reading in °C is not a temperature, or None when it can be one."""
    lo, hi = TEMP_PLAUSIBLE_C
    if not lo <= celsius < hi:
        return f"implausible {celsius:g} °C"
    if celsius != 0.0 and abs(celsius) < 0.2:
        # thermal zones report m°C; a zone reading "95" is 95 °C in the wrong unit, not 0.095
        return f"{celsius * 1000:g} is likely °C, not the m°C a thermal zone reports"
    return None


def skip_reason(type_: str, spec: ZoneSpec | None = None) -> str | None:
    """Why a zone must not be treated as a temperature, or None when it is one."""
    if type_.upper().startswith("PMIC"):
        return "PMIC zone: constant 100 °C, not a real reading"
    if spec is not None:
        if spec.quirk == "not-temperature":
            return "not a temperature (spec)"
        if spec.role == "ignore":
            return "ignored by the board spec"
        if spec.quirk == "stuck100":
            return "stuck at 100 °C (spec)"
    if _NOT_TEMPERATURE.search(type_):
        return "PMIC BCL zone: battery current or level, not a temperature"
    return None


def trip_c(trips: tuple[Trip, ...], type_: str) -> float | None:
    """Lowest trip of ``type_`` in °C."""
    temps = [t.temp_mc for t in trips if t.type == type_]
    return min(temps) / 1000.0 if temps else None


_ROLE_HINTS = (
    ("ignore", ("pmic",)),
    ("cpu", ("cpu", "bcpu", "mcpu")),
    ("gpu", ("gpu",)),
    ("board", ("board", "skin", "xo-", "quiet", "fan", "tdiode", "diode", "ambient")),
    ("soc", ("soc", "cv", "pll", "tj", "ddr", "aoss", "mdm", "nsp", "video", "camera", "ao-")),
    # CPU package and core-cluster sensors without "cpu" in the name (x86 ``x86_pkg_temp``,
    # RK3588 ``bigcore0-thermal``/``littlecore-thermal``/``package-thermal``): last, so a
    # gpu, board or soc marker in the same name wins
    ("cpu", ("x86_pkg", "package", "bigcore", "midcore", "littlecore", "coretemp")),
)


def guess_zone_role(zone_type: str) -> str:
    """A zone's role from its type alone (for a board no spec describes, or a zone the spec
    does not name): cpu, gpu, board, soc, ignore or other. A CPU zone missed here leaves the
    thermal guard off, so the CPU package names common on x86 and RK35xx count as cpu."""
    low = zone_type.lower()
    if skip_reason(zone_type) is not None:
        return "ignore"
    for role, hints in _ROLE_HINTS:
        if any(h in low for h in hints):
            return role
    return "other"
