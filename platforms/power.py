"""Power rails from INA3221 monitors, found by label because device numbers vary.

Two drivers (``boards.md`` sections 1.3 and 2.7):

- legacy IIO ``ina3221x`` (L4T <= 32, TX2): ``iio:deviceN/rail_name_K`` + ``in_powerK_input``
  (mW, or the spec's ``unit``); ``iio:deviceN`` numbering varies and L4T 28 names the folder
  ``iio_device`` (section 2.7), so every folder of either name is scanned;
- mainline hwmon ``ina3221`` (JetPack 5+, Orin): ``<dev>/hwmon/hwmonN`` with ``name`` ==
  ``ina3221`` (N varies), rails by ``inK_label``, mW = mV * mA / 1000. Labels containing an
  ``NC`` (not connected) token and the ``in7`` shunt-sum channel are not rails.

A rail that cannot be read is ``None`` (unavailable), never 0.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from platforms import paths
from platforms.errors import SpecError, SysfsUnavailable
from platforms.spec import RAIL_UNITS_MW, RailSpec
from platforms.sysfs import SysfsBackend

IIO_DRIVER_DIR = "bus/i2c/drivers/ina3221x"
IIO_BUS_DIR = "bus/iio/devices"
HWMON_DRIVER_DIR = "bus/i2c/drivers/ina3221"
HWMON_CLASS_DIR = "class/hwmon"
HWMON_NAME = "ina3221"
#: hwmon ina3221 channel 7 is the sum of the shunt voltages, not a rail
HWMON_SUM_CHANNEL = 7

#: an ina3221x channel folder: ``iio:deviceN`` (L4T 32, N varies per boot), or ``iio_device``
#: (L4T 28: what zTT's PowerLogger reads, boards.md section 2.7)
IIO_FOLDER_RE = re.compile(r"^iio(?::device\d+|_device)$")
_HWMON_RE = re.compile(r"^hwmon\d+$")
_RAIL_NAME_RE = re.compile(r"^rail_name_(\d+)$")
_LABEL_RE = re.compile(r"^in(\d+)_label$")


@dataclass(frozen=True)
class RailSource:
    """Where one rail is read. ``folder`` is the iio channel folder (``iio:deviceN`` or
    ``iio_device``) or the ``hwmonN`` folder."""

    name: str
    driver: str  # "iio" | "hwmon"
    folder: str
    channel: int
    #: the sensor folder in :class:`RailSpec` terms (iio: the channel folder; hwmon: the
    #: folder that holds ``hwmon/hwmonN``)
    device: str
    #: the unit of an iio ``in_powerN_input`` (the spec's; hwmon is always mV x mA = mW)
    unit: str = "mW"

    @property
    def files(self) -> tuple[str, ...]:
        if self.driver == "iio":
            return (paths.iio_power(self.folder, self.channel),)
        return (
            f"{self.folder}/in{self.channel}_input",
            f"{self.folder}/curr{self.channel}_input",
        )


def is_not_connected(label: str) -> bool:
    """A label with an ``NC`` token (``NC``, ``NC_2``, ``VDD_NC``) names an unconnected channel."""
    return "NC" in re.split(r"[^A-Za-z0-9]+", label.strip().upper())


# -- IIO ina3221x -----------------------------------------------------------------------------


def _iio_channels(sysfs: SysfsBackend, folder: str, device: str) -> list[RailSource]:
    out = []
    for entry in sysfs.list(folder):
        m = _RAIL_NAME_RE.match(entry)
        if not m:
            continue
        ch = int(m.group(1))
        label = sysfs.read_or(paths.iio_rail_name(folder, ch))
        if label is None or is_not_connected(label):
            continue
        out.append(RailSource(label, "iio", folder, ch, device))
    return sorted(out, key=lambda r: r.channel)


def is_iio_folder(name: str) -> bool:
    """Whether a folder name is an ina3221x channel folder (``iio:deviceN`` or L4T 28's
    ``iio_device``): scanners must not hard-code one spelling."""
    return IIO_FOLDER_RE.match(name) is not None


def iio_folders(sysfs: SysfsBackend, parent: str) -> list[str]:
    return [f"{parent}/{n}" for n in sysfs.list(parent) if is_iio_folder(n)]


def discover_iio_rails(sysfs: SysfsBackend) -> list[RailSource]:
    """Every ina3221x rail: ``bus/i2c/drivers/ina3221x/<addr>/<iio folder>``, else the IIO
    bus (:func:`is_iio_folder` names both spellings)."""
    out = []
    for addr in sysfs.list(IIO_DRIVER_DIR):
        for folder in iio_folders(sysfs, f"{IIO_DRIVER_DIR}/{addr}"):
            out.extend(_iio_channels(sysfs, folder, folder))
    if not out:  # the same devices through the IIO bus (what some tools glob)
        for folder in iio_folders(sysfs, IIO_BUS_DIR):
            out.extend(_iio_channels(sysfs, folder, folder))
    return out


# -- hwmon ina3221 ----------------------------------------------------------------------------


def _hwmon_channels(sysfs: SysfsBackend, folder: str, device: str) -> list[RailSource]:
    out = []
    for entry in sysfs.list(folder):
        m = _LABEL_RE.match(entry)
        if not m:
            continue
        ch = int(m.group(1))
        if ch >= HWMON_SUM_CHANNEL:
            continue
        label = sysfs.read_or(f"{folder}/{entry}")
        if label is None or is_not_connected(label):
            continue
        out.append(RailSource(label, "hwmon", folder, ch, device))
    return sorted(out, key=lambda r: r.channel)


def ina3221_hwmon_folders(sysfs: SysfsBackend, device: str) -> list[str]:
    """``<device>/hwmon/hwmonN`` folders whose ``name`` is ina3221 (N varies per boot)."""
    root = paths.hwmon_root(device)
    out = []
    for n in sysfs.list(root):
        if _HWMON_RE.match(n) and sysfs.read_or(f"{root}/{n}/name") == HWMON_NAME:
            out.append(f"{root}/{n}")
    return out


def discover_hwmon_rails(sysfs: SysfsBackend) -> list[RailSource]:
    """Every ina3221 rail under ``bus/i2c/drivers/ina3221/<addr>``, else ``class/hwmon``."""
    out = []
    for addr in sysfs.list(HWMON_DRIVER_DIR):
        device = f"{HWMON_DRIVER_DIR}/{addr}"
        for folder in ina3221_hwmon_folders(sysfs, device):
            out.extend(_hwmon_channels(sysfs, folder, device))
    if not out:
        for n in sysfs.list(HWMON_CLASS_DIR):
            folder = f"{HWMON_CLASS_DIR}/{n}"
            if _HWMON_RE.match(n) and sysfs.read_or(f"{folder}/name") == HWMON_NAME:
                out.extend(_hwmon_channels(sysfs, folder, f"{folder}/device"))
    return out


def discover_rails(sysfs: SysfsBackend) -> list[RailSource]:
    return discover_iio_rails(sysfs) + discover_hwmon_rails(sysfs)


# -- resolving and reading --------------------------------------------------------------------


def _parent(path: str) -> str:
    return path.rsplit("/", 1)[0] if "/" in path else ""


def find_rail(sysfs: SysfsBackend, rail: RailSpec) -> RailSource | None:
    """Locate a spec's rail by its label: the spec's folder first, then its siblings, then any
    monitor of the same driver. None when no channel carries that label. The source reads in
    the spec's ``unit``; a unit that cannot be read is a :class:`SpecError`."""
    units = list(RAIL_UNITS_MW) if rail.driver == "iio" else ["mW"]
    if rail.unit not in units:
        raise SpecError(f"rail {rail.name}", "unit", f"one of {units}", rail.unit)
    src = _find_rail(sysfs, rail)
    return None if src is None else replace(src, unit=rail.unit)


def _find_rail(sysfs: SysfsBackend, rail: RailSpec) -> RailSource | None:
    if rail.driver == "iio":
        candidates = [rail.device] + [
            f for f in iio_folders(sysfs, _parent(rail.device)) if f != rail.device
        ]
        for folder in candidates:
            for src in _iio_channels(sysfs, folder, folder):
                if src.name == rail.name:
                    return src
        pool = discover_iio_rails(sysfs)
    else:
        for folder in ina3221_hwmon_folders(sysfs, rail.device):
            for src in _hwmon_channels(sysfs, folder, rail.device):
                if src.name == rail.name:
                    return src
        pool = discover_hwmon_rails(sysfs)
    return next((s for s in pool if s.name == rail.name), None)


def read_power_mw(sysfs: SysfsBackend, src: RailSource) -> float:
    """Power in mW; raises :class:`SysfsUnavailable` naming the file that failed.

    Values may carry a unit suffix (``"32760 ma"``); only the leading integer counts. An iio
    power file is scaled by the source's ``unit`` (the spec's: mW, W or uW).
    """
    if src.driver == "iio":
        path = paths.iio_power(src.folder, src.channel)
        try:
            scale = RAIL_UNITS_MW[src.unit]
        except KeyError:
            raise SpecError(
                f"rail {src.name}", "unit", f"one of {list(RAIL_UNITS_MW)}", src.unit
            ) from None
        return _plausible_mw(path, float(sysfs.read_int(path)) * scale)
    if src.unit != "mW":
        raise SpecError(f"rail {src.name}", "unit", "mW (hwmon rails read mV x mA)", src.unit)
    vpath = f"{src.folder}/in{src.channel}_input"
    ipath = f"{src.folder}/curr{src.channel}_input"
    mv = sysfs.read_int(vpath)
    ma = sysfs.read_int(ipath)
    if mv < 0:  # a bus voltage is never negative (and -V x -A would pass as power)
        raise SysfsUnavailable(vpath, f"implausible bus voltage {mv} mV")
    if ma < -RAIL_NOISE_MA:
        raise SysfsUnavailable(ipath, f"implausible current {ma} mA")
    return _plausible_mw(f"{vpath} x {ipath}", mv * max(ma, 0) / 1000.0)


#: an INA3221 channel of an idle rail reads a few mA either side of 0; past this, a negative
#: current is a broken reading
RAIL_NOISE_MA = 100
#: no rail of a board this daemon drives draws a kilowatt: above it the reading is garbage
RAIL_MAX_MW = 1_000_000.0


def _plausible_mw(path: str, mw: float) -> float:
    """``mw`` if a rail can read it (noise below 0 counts as 0), else SysfsUnavailable: a
    garbage reading must never be integrated into the energy."""
    if mw < -RAIL_NOISE_MA * 5.0 or mw > RAIL_MAX_MW:
        raise SysfsUnavailable(path, f"implausible power {mw:g} mW")
    return max(mw, 0.0)


def read_power_mw_or_none(sysfs: SysfsBackend, src: RailSource | None) -> float | None:
    if src is None:
        return None
    try:
        return read_power_mw(sysfs, src)
    except SysfsUnavailable:
        return None


#: the module's input rail: a label whose last token is ``IN`` (``VDD_IN`` on TX2/Orin NX,
#: ``POM_5V_IN`` on Nano/TX1), or a bare ``VIN`` / ``VIN_<volts>`` (``VIN``, ``VIN_5V``).
#: ``VIN_SYS_5V0`` (AGX Orin) names the module's system 5 V supply, a sub-rail: jtop, too, takes
#: only VDD_IN / POM_5V_IN as the total and sums the rails of a board that has neither.
_TOTAL_LABEL_RE = re.compile(r"^(?:[A-Z0-9_.-]*[^A-Z0-9]IN|VIN(?:[_-]?\d+V\d*)?)$")


def is_total_label(name: str) -> bool:
    """Whether a rail label names the board's input (total) rail."""
    return _TOTAL_LABEL_RE.fullmatch(name.strip().upper()) is not None


def guess_role(name: str, taken_cpu: bool = False) -> str:
    """Role of a rail found by discovery: the input rail (:func:`is_total_label`: VDD_IN,
    POM_5V_IN, ...) is the total, the first CPU rail is ``cpu``. A board with two labels that
    look like inputs gets one total: the caller demotes the second to ``sub``."""
    upper = name.upper()
    if is_total_label(upper):
        return "total"
    if "CPU" in upper and not taken_cpu:
        return "cpu"
    return "sub"
