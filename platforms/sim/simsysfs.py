"""The plant seen through sysfs: the layout of ``platforms.paths`` for the plant's board spec.

Reads are generated from the plant's state on each call; writes act on the plant the way the
kernel reacts to them:

- ``scaling_governor``: only the spec's governors (others: EINVAL; RUBIK Pi's modular governors
  are absent until loaded). ``userspace`` enables ``scaling_setspeed``; under any other governor
  it reads ``<unsupported>`` and refuses writes (EINVAL). ``performance``/``powersave`` pin the
  policy maximum/minimum; ``ondemand``, ``conservative``, ``schedutil`` and ``interactive`` keep
  the current frequency (the daemon's policies emulate them in user space).
- ``scaling_setspeed``: snapped to the table entry at or below the value, within min/max (the
  kernel's userspace governor resolves with CPUFREQ_RELATION_L, at or above; the two agree on
  table values, which is what the daemon writes). Reads give the current frequency.
- ``scaling_min_freq``/``scaling_max_freq``: clamped to the cpuinfo range; a write that would
  leave min > max fails with EINVAL. Reads show the user limits; a thermal cap shows up in
  ``scaling_cur_freq`` only.
- ``cpuN/online``: ``0``/``1`` (EINVAL otherwise, EBUSY for the last online CPU); cpu0 has no
  ``online`` file, as on most arm64 boards. ``cpuN/cpufreq`` exists only while cpuN is online.
- Everything else is read-only (EACCES), an unknown path is ENOENT.

Thermal ``temp`` is in m°C, quantised to ``sim.sensor_resolution_mc``; zones with a quirk in the
spec reproduce it (``blank``: empty, ``eagain``: read fails, ``stuck100``: 100000,
``not-temperature``: 0). Rails follow the spec's driver (IIO ina3221x or hwmon ina3221) with the
bus voltages of ``sim.rail_voltage_mv``. ``proc/stat`` carries per-CPU ticks (USER_HZ = 100)
from the plant's per-core busy time.
"""

from __future__ import annotations

import errno
import math
from collections.abc import Callable

from platforms import paths
from platforms.errors import SysfsUnavailable, SysfsWriteError
from platforms.sim.plant import Plant
from platforms.spec import RAIL_UNITS_MW
from platforms.sysfs import SysfsBackend, check_value

USER_HZ = 100
HWMON_FIRST_INDEX = 2

Reader = Callable[[], str]
Writer = Callable[[str], None]


class SimSysfs(SysfsBackend):
    kind = "sim"

    def __init__(self, plant: Plant):
        self.plant = plant
        self.spec = plant.spec
        self._files: dict[str, tuple[Reader, Writer | None, Callable[[], bool] | None]] = {}
        self._build()
        self._dirs: dict[str, set[str]] = {}
        preds: dict[str, set] = {}
        for path, (_, _, vis) in self._files.items():
            parts = path.split("/")
            for i in range(len(parts)):
                d = "/".join(parts[:i])
                self._dirs.setdefault(d, set()).add(parts[i])
                preds.setdefault(d, set()).add(vis)
        # a folder exists while any file below it is visible (cpuN/cpufreq vanishes offline)
        self._dir_preds = {d: None if None in ps else tuple(ps) for d, ps in preds.items()}

    def __repr__(self) -> str:
        return f"SimSysfs({self.spec.name})"

    # ------------------------------------------------------------------------------------------
    # SysfsBackend

    def read(self, path: str) -> str:
        key = path.strip("/")
        entry = self._files.get(key)
        if entry is None or (entry[2] is not None and not entry[2]()):
            if self._dir_visible(key):
                raise SysfsUnavailable(path, "is a directory")
            raise SysfsUnavailable(path, "no such file")
        return check_value(path, entry[0]())

    def write(self, path: str, value: str) -> None:
        key = path.strip("/")
        entry = self._files.get(key)
        if entry is None or (entry[2] is not None and not entry[2]()):
            raise SysfsWriteError(path, value, errno.ENOENT, "no such file")
        if entry[1] is None:
            raise SysfsWriteError(path, value, errno.EACCES, "read-only attribute")
        entry[1](str(value).strip())

    def list(self, path: str) -> list[str]:
        key = path.strip("/")
        if not self._dir_visible(key):
            return []
        out = []
        for name in self._dirs[key]:
            child = f"{key}/{name}" if key else name
            if self.exists(child):
                out.append(name)
        return sorted(out)

    def exists(self, path: str) -> bool:
        key = path.strip("/")
        entry = self._files.get(key)
        if entry is not None:
            return entry[2] is None or entry[2]()
        return self._dir_visible(key)

    def writable(self, path: str) -> bool:
        entry = self._files.get(path.strip("/"))
        return entry is not None and entry[1] is not None and self.exists(path)

    def _dir_visible(self, key: str) -> bool:
        if key not in self._dir_preds:
            return False
        preds = self._dir_preds[key]
        return preds is None or any(vis() for vis in preds)

    # ------------------------------------------------------------------------------------------
    # the tree

    def _add(self, path: str, reader: Reader, writer: Writer | None = None, visible=None) -> None:
        self._files[path] = (reader, writer, visible)

    def _build(self) -> None:
        spec, plant = self.spec, self.plant
        cpus = spec.cpus
        self._add(
            f"{paths.CPU}/online",
            lambda: paths.format_cpu_ranges(c for c in cpus if plant.is_online(c)),
        )
        self._add(f"{paths.CPU}/present", lambda: paths.format_cpu_ranges(cpus))
        self._add(f"{paths.CPU}/possible", lambda: paths.format_cpu_ranges(cpus))
        for cpu in cpus:
            if cpu != cpus[0]:
                self._add(paths.cpu_online(cpu), self._online_reader(cpu), self._online_writer(cpu))
        for cs in spec.clusters:
            for name in paths.POLICY_FILES:
                reader, writer = self._policy_file(cs.name, name)
                self._add(paths.policy_file(cs.policy, name), reader, writer)
                for cpu in cs.cpus:
                    self._add(
                        f"{paths.cpu_cpufreq(cpu)}/{name}", reader, writer, self._online_pred(cpu)
                    )
        for i, z in enumerate(spec.zones):
            self._add(paths.zone_file(i, "type"), lambda z=z: z.type)
            self._add(paths.zone_file(i, "temp"), self._temp_reader(z))
            for k, trip in enumerate(z.trips):
                self._add(paths.zone_file(i, f"trip_point_{k}_temp"), lambda t=trip: str(t.temp_mc))
                self._add(paths.zone_file(i, f"trip_point_{k}_type"), lambda t=trip: t.type)
                self._add(paths.zone_file(i, f"trip_point_{k}_hyst"), lambda t=trip: str(t.hyst_mc))
        hwmon_dirs: dict[str, str] = {}
        for rail in spec.rails:
            if rail.driver == "iio":
                dev, ch = rail.device, rail.channel
                self._add(paths.iio_rail_name(dev, ch), lambda r=rail: r.name)
                self._add(  # in the spec's unit, as the reader scales it
                    paths.iio_power(dev, ch),
                    lambda r=rail: str(int(round(self._mw(r.name) / RAIL_UNITS_MW[r.unit]))),
                )
                self._add(f"{dev}/in_current{ch}_input", lambda r=rail: str(self._ma(r.name)))
                self._add(f"{dev}/in_voltage{ch}_input", lambda r=rail: str(self._mv(r.name)))
            else:
                if rail.device not in hwmon_dirs:
                    idx = HWMON_FIRST_INDEX + len(hwmon_dirs)
                    hwmon_dirs[rail.device] = d = f"{paths.hwmon_root(rail.device)}/hwmon{idx}"
                    self._add(f"{d}/name", lambda: "ina3221")
                d, ch = hwmon_dirs[rail.device], rail.channel
                self._add(f"{d}/in{ch}_label", lambda r=rail: r.name)
                self._add(f"{d}/in{ch}_input", lambda r=rail: str(self._mv(r.name)))
                self._add(f"{d}/curr{ch}_input", lambda r=rail: str(self._ma(r.name)))
        self._add(paths.PROC_STAT, self._proc_stat)
        if spec.compatible:
            self._add(paths.DT_COMPATIBLE, lambda: "\0".join(spec.compatible))
        self._add(paths.DT_MODEL, self._model)
        if plant.params.dtsfilename:
            self._add(paths.DT_DTSFILENAME, lambda: plant.params.dtsfilename)

    # -- cpufreq ----------------------------------------------------------------------------------

    def _policy_file(self, cluster: str, name: str) -> tuple[Reader, Writer | None]:
        plant = self.plant
        cl = plant.clusters[cluster]
        cs = cl.spec
        path = paths.policy_file(cs.policy, name)
        readers: dict[str, Reader] = {
            "related_cpus": lambda: " ".join(str(c) for c in cs.cpus),
            "affected_cpus": lambda: " ".join(str(c) for c in cs.cpus if plant.is_online(c)),
            "scaling_driver": lambda: cs.scaling_driver,
            "scaling_governor": lambda: cl.governor,
            "scaling_available_governors": lambda: " ".join(cs.governors),
            "scaling_available_frequencies": lambda: " ".join(str(f) for f in cs.freqs_khz),
            "scaling_min_freq": lambda: str(cl.min_khz),
            "scaling_max_freq": lambda: str(cl.max_khz),
            "scaling_cur_freq": lambda: str(cl.cur_khz),
            "scaling_setspeed": lambda: (
                str(cl.cur_khz) if cl.governor == "userspace" else "<unsupported>"
            ),
            "cpuinfo_min_freq": lambda: str(cs.fmin_khz),
            "cpuinfo_max_freq": lambda: str(cs.fmax_khz),
            "cpuinfo_transition_latency": lambda: str(cs.transition_latency_ns),
        }

        def governor(value: str) -> None:
            if value not in cs.governors:
                raise SysfsWriteError(
                    path, value, errno.EINVAL, f"governor not available ({' '.join(cs.governors)})"
                )
            plant.set_governor(cluster, value)

        def setspeed(value: str) -> None:
            if cl.governor != "userspace":
                raise SysfsWriteError(
                    path, value, errno.EINVAL, f"governor is {cl.governor}, not userspace"
                )
            khz = _parse_khz(path, value)
            if khz <= 0:
                raise SysfsWriteError(path, value, errno.EINVAL, "frequency must be > 0")
            plant.set_freq(cluster, khz)

        def limit(which: str) -> Writer:
            def write(value: str) -> None:
                khz = _parse_khz(path, value)
                try:
                    if which == "min":
                        plant.set_limits(cluster, min_khz=khz)
                    else:
                        plant.set_limits(cluster, max_khz=khz)
                except ValueError as err:
                    raise SysfsWriteError(path, value, errno.EINVAL, str(err)) from None

            return write

        writers: dict[str, Writer] = {
            "scaling_governor": governor,
            "scaling_setspeed": setspeed,
            "scaling_min_freq": limit("min"),
            "scaling_max_freq": limit("max"),
        }
        return readers[name], writers.get(name)

    def _online_pred(self, cpu: int) -> Callable[[], bool]:
        return lambda: self.plant.is_online(cpu)

    def _online_reader(self, cpu: int) -> Reader:
        return lambda: "1" if self.plant.is_online(cpu) else "0"

    def _online_writer(self, cpu: int) -> Writer:
        path = paths.cpu_online(cpu)

        def write(value: str) -> None:
            if value not in ("0", "1"):
                raise SysfsWriteError(path, value, errno.EINVAL, "expected 0 or 1")
            try:
                self.plant.set_online(cpu, value == "1")
            except ValueError as err:
                raise SysfsWriteError(path, value, errno.EBUSY, str(err)) from None

        return write

    # -- thermal ----------------------------------------------------------------------------------

    def _temp_reader(self, zone) -> Reader:
        path = paths.zone_file(self.spec.zones.index(zone), "temp")
        res = self.plant.params.sensor_resolution_mc
        quirk = zone.quirk

        def read() -> str:
            if quirk == "blank":
                return ""
            if quirk == "eagain":
                raise SysfsUnavailable(path, "read failed: EAGAIN")
            if quirk == "stuck100":
                return "100000"
            if quirk == "not-temperature" or zone.role == "ignore":
                return "0"
            temp = self.plant.temps_c().get(zone.type)
            if temp is None:
                raise SysfsUnavailable(path, "read failed: ENODATA")
            return str(int(round(temp * 1000.0 / res)) * res)

        return read

    # -- rails ------------------------------------------------------------------------------------

    def _mw(self, rail: str) -> int:
        return int(round(self.plant.rail_power_w().get(rail, 0.0) * 1000.0))

    def _mv(self, rail: str) -> int:
        return self.plant.params.voltage_mv(rail)

    def _ma(self, rail: str) -> int:
        return int(round(self.plant.rail_power_w().get(rail, 0.0) * 1e6 / self._mv(rail)))

    # -- procfs / device tree ---------------------------------------------------------------------

    def _proc_stat(self) -> str:
        plant = self.plant
        lines = []
        tot_user = tot_idle = 0
        per_cpu = []
        for cpu in self.spec.cpus:
            busy = plant.cpu_busy_s(cpu)
            idle = max(plant.cpu_online_s(cpu) - busy, 0.0)
            user, idle_t = math.floor(busy * USER_HZ), math.floor(idle * USER_HZ)
            tot_user += user
            tot_idle += idle_t
            if plant.is_online(cpu):
                per_cpu.append(f"cpu{cpu} {user} 0 0 {idle_t} 0 0 0 0 0 0")
        lines.append(f"cpu  {tot_user} 0 0 {tot_idle} 0 0 0 0 0 0")
        lines.extend(per_cpu)
        lines.append("intr 0")
        lines.append(f"ctxt {plant.n_task_events}")
        lines.append("btime 0")
        lines.append(f"processes {len(plant.jobs)}")
        lines.append(
            f"procs_running {sum(1 for c in self.spec.cpus if plant.is_online(c) and plant.cpu_running(c))}"
        )
        lines.append("procs_blocked 0")
        return "\n".join(lines)

    def _model(self) -> str:
        spec = self.spec
        if any(m in spec.title for m in spec.model) or not spec.model:
            return spec.title
        return spec.model[0]


def _parse_khz(path: str, value: str) -> int:
    try:
        return int(value.split()[0])
    except (ValueError, IndexError):
        raise SysfsWriteError(path, value, errno.EINVAL, "not an integer") from None
