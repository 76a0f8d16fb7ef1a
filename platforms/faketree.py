"""Realistic fake sysfs/procfs trees for tests, demos and ``hidvfs fake-sysfs``.

:func:`write_fake_tree` writes what a board's kernel shows (``daemons.md`` section 11.6): values
end in ``\\n``; ``related_cpus`` is space-separated while ``online``/``present`` use ranges;
offline CPUs have no ``cpuN/cpufreq``; ``scaling_setspeed`` reads ``<unsupported>`` unless the
governor is ``userspace``; modular governors are missing from the available list; read-only
files are mode 0444 and ``cpuinfo_cur_freq`` is 0400; ``hwmonN``/``iio:deviceN`` numbers are
not 0; ``proc/device-tree/compatible`` is NUL-separated.

Sensor quirks (``quirks=True``), by the spec zone's ``quirk``:

- ``stuck100``: ``temp`` reads ``100000`` (TX2 ``PMIC-Die``);
- ``blank``: ``temp`` reads an empty line (TX2 ``PLL-therm``);
- ``eagain``: ``temp`` is made a *directory*, so every read fails portably (a FIFO would block
  ``open``). A test that needs the real errno injects it at the :class:`DirSysfs` boundary with
  :func:`inject_read_error` (a pytest ``monkeypatch`` shadows the ``open`` that
  ``platforms.sysfs`` calls, and the returned file's ``read`` raises ``OSError(EAGAIN)``).

Zones whose quirk is ``not-temperature`` always report a current or a level, as on the board.
:class:`FakeWriter` changes the tree over time (temperatures, power, ``proc/stat`` ticks, CPU
hotplug) and can emulate what the kernel does after a write (:meth:`FakeWriter.settle`).
"""

from __future__ import annotations

import builtins
import contextlib
import os
import random
import shutil
import tempfile
from collections.abc import Iterable

from platforms import paths
from platforms.spec import RAIL_UNITS_MW, BoardSpec, ClusterSpec, RailSpec
from platforms.sysfs import DirSysfs

MARKER = ".hidvfs-fake-tree"
MODES = ("all-online", "default")
USER_HZ = 100
#: policy files a privileged controller may write (mode 0644); the rest are 0444
RW_POLICY_FILES = ("scaling_governor", "scaling_min_freq", "scaling_max_freq", "scaling_setspeed")
_TOP_DIRS = ("devices", "class", "bus", "proc")
_RAIL_MV = {"total": 5000, "cpu": 5000, "sub": 5000}


# -- low-level file writing -------------------------------------------------------------------


class _Files:
    """Writes below a root with kernel-like modes; replaces files atomically (readers may run)."""

    def __init__(self, root: str):
        self.root = os.path.abspath(root)
        self._dirs: set[str] = set()  # folders known to exist (creating files is the slow part)

    def _mkdir(self, folder: str) -> None:
        if folder not in self._dirs:
            os.makedirs(folder, exist_ok=True)
            self._dirs.add(folder)

    def abs(self, rel: str) -> str:
        return os.path.join(self.root, rel)

    def put(self, rel: str, text: str, mode: int = 0o444, *, newline: bool = True) -> None:
        full = self.abs(rel)
        data = (text + ("\n" if newline else "")).encode()
        if not os.path.lexists(full):  # first write: nobody can be reading it yet
            self._mkdir(os.path.dirname(full))
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
            try:
                fd = os.open(full, flags, mode)
            except FileNotFoundError:  # the folder went away behind the cache (a test moved it)
                os.makedirs(os.path.dirname(full), exist_ok=True)
                fd = os.open(full, flags, mode)
            try:
                os.write(fd, data)
                os.fchmod(fd, mode)  # the umask must not change the kernel-like mode
            finally:
                os.close(fd)
            return
        if os.path.isdir(full) and not os.path.islink(full):
            shutil.rmtree(full)  # an ``eagain`` temp being ungated
        # a name of mkstemp's (O_EXCL, never an existing link) and the mode on the descriptor:
        # a predictable name opened by path let a user who can write the folder redirect it
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(full)}.", dir=os.path.dirname(full))
        try:
            try:
                os.write(fd, data)
                os.fchmod(fd, mode)
            finally:
                os.close(fd)
            os.replace(tmp, full)  # atomic: a concurrent reader sees the old or the new value
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise

    def link(self, rel: str, target_rel: str) -> None:
        """Relative symlink ``rel`` -> ``target_rel`` (both relative to the root)."""
        full = self.abs(rel)
        self._mkdir(os.path.dirname(full))
        if os.path.lexists(full):
            os.unlink(full)
        os.symlink(os.path.relpath(self.abs(target_rel), os.path.dirname(full)), full)

    def remove(self, rel: str) -> None:
        full = self.abs(rel)
        if os.path.islink(full) or os.path.isfile(full):
            os.unlink(full)
        elif os.path.isdir(full):
            shutil.rmtree(full)
            self._dirs = {d for d in self._dirs if d != full and not d.startswith(full + os.sep)}

    def read(self, rel: str) -> str:
        with open(self.abs(rel), encoding="utf-8") as f:
            return f.read().strip()


# -- the tree ---------------------------------------------------------------------------------


def _prepare_root(root: str) -> None:
    root = os.path.abspath(root)
    if root == os.path.abspath(os.sep):
        raise ValueError("refusing to write a fake tree over /")
    if os.path.isdir(root) and os.listdir(root):
        if not os.path.exists(os.path.join(root, MARKER)):
            raise FileExistsError(
                f"{root}: not empty and not a hidvfs fake tree (no {MARKER}); choose an empty folder"
            )
        for d in _TOP_DIRS:
            shutil.rmtree(os.path.join(root, d), ignore_errors=True)
    os.makedirs(root, exist_ok=True)


def write_fake_tree(
    spec: BoardSpec,
    root: str | os.PathLike[str],
    *,
    mode: str = "all-online",
    quirks: bool = True,
    seed: int = 0,
) -> FakeWriter:
    """Write ``spec``'s tree under ``root`` and return a :class:`FakeWriter` for it.

    ``mode="default"`` takes the spec's ``offline_by_default`` CPUs offline (no ``cpufreq``
    link; a policy folder is kept only while one of its CPUs is online). ``seed`` varies the
    readings and the ``hwmonN`` number. Rewriting an earlier fake tree replaces it.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    root = os.fspath(root)
    _prepare_root(root)
    rng = random.Random(seed)
    files = _Files(root)
    files.put(MARKER, f"board={spec.name} mode={mode} quirks={quirks} seed={seed}", 0o644)
    offline = set()
    if mode == "default":
        offline = {c for cl in spec.clusters for c in cl.offline_by_default}
    online = [c for c in spec.cpus if c not in offline]
    if not online:
        raise ValueError(f"{spec.name}: mode {mode!r} leaves no CPU online")
    writer = FakeWriter(spec, root, seed=seed, quirks=quirks)
    _write_cpus(writer, online, rng)
    _write_zones(writer, rng)
    _write_rails(writer, rng)
    _write_proc(writer, online, rng)
    return writer


def _write_cpus(w: FakeWriter, online: list[int], rng: random.Random) -> None:
    f, spec = w.files, w.spec
    cpus = spec.cpus
    f.put(f"{paths.CPU}/possible", paths.format_cpu_ranges(cpus))
    f.put(f"{paths.CPU}/present", paths.format_cpu_ranges(cpus))
    f.put(f"{paths.CPU}/online", paths.format_cpu_ranges(online))
    for cpu in cpus:
        os.makedirs(f.abs(f"{paths.CPU}/cpu{cpu}"), exist_ok=True)
        if cpu != 0:  # cpu0 usually has no online file (it cannot be unplugged)
            f.put(paths.cpu_online(cpu), "1" if cpu in online else "0", 0o644)
    for cl in spec.clusters:
        if any(c in online for c in cl.cpus):
            w._write_policy(cl, online, rng)


def _zone_reading(zone_type: str, rng: random.Random) -> str:
    if "ibat" in zone_type:
        return str(rng.randint(1200, 2400))  # battery current, mA
    return "0"  # BCL level


def _write_zones(w: FakeWriter, rng: random.Random) -> None:
    f = w.files
    os.makedirs(f.abs(paths.THERMAL), exist_ok=True)
    for i, z in enumerate(w.spec.zones):
        f.put(paths.zone_file(i, "type"), z.type)
        for k, t in enumerate(z.trips):
            f.put(paths.zone_file(i, f"trip_point_{k}_temp"), str(t.temp_mc), 0o644)
            f.put(paths.zone_file(i, f"trip_point_{k}_type"), t.type)
            f.put(paths.zone_file(i, f"trip_point_{k}_hyst"), str(t.hyst_mc), 0o644)
        temp = paths.zone_file(i, "temp")
        if z.quirk == "not-temperature":
            f.put(temp, _zone_reading(z.type, rng))
        elif w.quirks and z.quirk == "stuck100":
            f.put(temp, "100000")
        elif w.quirks and z.quirk == "blank":
            f.put(temp, "")
        elif w.quirks and z.quirk == "eagain":
            w.gate_zone(z.type)
        else:
            f.put(temp, str(rng.randint(38000, 52000)))
    # A cooling device shares the folder; readers must skip it.
    f.put(f"{paths.THERMAL}/cooling_device0/type", "pwm-fan")
    f.put(f"{paths.THERMAL}/cooling_device0/max_state", "255")
    f.put(f"{paths.THERMAL}/cooling_device0/cur_state", "0", 0o644)


def _write_rails(w: FakeWriter, rng: random.Random) -> None:
    f = w.files
    iio_seen: dict[str, int] = {}
    hwmon_of: dict[str, int] = {}
    next_hwmon = 3 + w.seed % 4  # hwmon0..2 belong to other devices; never 0
    for rail in w.spec.rails:
        mw = {"total": 4200, "cpu": 900}.get(rail.role, 400) + rng.randint(-150, 150)
        if rail.driver == "iio":
            dev = rail.device
            if dev not in iio_seen:
                iio_seen[dev] = len(iio_seen)
                f.put(f"{dev}/name", "ina3221x")
                f.link(f"bus/iio/devices/{dev.rsplit('/', 1)[-1]}", dev)
            f.put(paths.iio_rail_name(dev, rail.channel), rail.name)
        else:
            if rail.device not in hwmon_of:
                n = next_hwmon
                next_hwmon += 1
                hwmon_of[rail.device] = n
                folder = f"{paths.hwmon_root(rail.device)}/hwmon{n}"
                f.put(f"{folder}/name", "ina3221")
                f.put(f"{folder}/in7_label", "sum of shunt voltages")
                f.put(f"{folder}/in7_input", "0")
                f.put(f"{folder}/samples", "512", 0o644)
                f.put(f"{folder}/update_interval", "2254", 0o644)
                f.link(f"class/hwmon/hwmon{n}", folder)
                f.link(f"{folder}/device", rail.device)
            folder = f"{paths.hwmon_root(rail.device)}/hwmon{hwmon_of[rail.device]}"
            ch = rail.channel
            f.put(f"{folder}/in{ch}_label", rail.name)
            f.put(f"{folder}/shunt{ch}_resistor", "5000", 0o644)
        w.set_power(rail.name, mw)


def _write_proc(w: FakeWriter, online: list[int], rng: random.Random) -> None:
    for cpu in w.spec.cpus:
        user, system = rng.randint(20000, 90000), rng.randint(5000, 30000)
        w._ticks[cpu] = [
            user,
            rng.randint(0, 500),
            system,
            rng.randint(200000, 900000),
            rng.randint(100, 2000),
            rng.randint(0, 300),
            rng.randint(100, 900),
            0,
        ]
    w._online = set(online)
    w.write_stat()
    compatible = list(w.spec.compatible) + list(w.spec.soc_compatible) or [f"hidvfs,{w.spec.name}"]
    w.files.put(paths.DT_COMPATIBLE, "\0".join(compatible) + "\0", newline=False)
    w.files.put(paths.DT_MODEL, _model_string(w.spec) + "\0", newline=False)
    # the kernel's default RT throttling: SCHED_FIFO threads get 95 % of each second
    w.files.put(paths.RT_RUNTIME, "950000")
    w.files.put(paths.RT_PERIOD, "1000000")


def _model_string(spec: BoardSpec) -> str:
    """The board's title if a detection model string is part of it, else the first one."""
    if any(m.lower() in spec.title.lower() for m in spec.model) or not spec.model:
        return spec.title
    return spec.model[0]


# -- changing the tree over time --------------------------------------------------------------


class FakeWriter:
    """Mutates a fake tree the way a running board would (tests drive it tick by tick)."""

    def __init__(
        self, spec: BoardSpec, root: str | os.PathLike[str], *, seed: int = 0, quirks: bool = True
    ):
        self.spec = spec
        self.root = os.path.abspath(os.fspath(root))
        self.seed = seed
        self.quirks = quirks
        self.files = _Files(self.root)
        self._ticks: dict[int, list[int]] = {c: [0] * 8 for c in spec.cpus}
        self._online: set[int] = set(spec.cpus)
        self._rng = random.Random(seed + 1)

    @property
    def sysfs(self) -> DirSysfs:
        return DirSysfs(self.root)

    def path(self, rel: str) -> str:
        return self.files.abs(rel)

    def put(self, rel: str, text: str, mode: int = 0o644) -> None:
        """Write any file (creating it) with a trailing newline."""
        self.files.put(rel, text, mode)

    # -- thermal ----------------------------------------------------------------------------
    def zone_index(self, zone_type: str) -> int:
        """Current index of the zone with this ``type`` (found by scanning, like the readers)."""
        for name in os.listdir(self.files.abs(paths.THERMAL)):
            if name.startswith("thermal_zone"):
                idx = int(name[len("thermal_zone") :])
                try:
                    if self.files.read(paths.zone_file(idx, "type")) == zone_type:
                        return idx
                except OSError:
                    continue
        raise KeyError(f"no thermal zone of type {zone_type!r} under {self.root}")

    def set_temp(self, zone_type: str, temp_c: float | None) -> None:
        """Set a zone's reading in °C; ``None`` writes a blank line (the Jetson quirk)."""
        text = "" if temp_c is None else str(int(round(temp_c * 1000)))
        self.files.put(paths.zone_file(self.zone_index(zone_type), "temp"), text)

    def set_temp_raw(self, zone_type: str, text: str) -> None:
        self.files.put(paths.zone_file(self.zone_index(zone_type), "temp"), text)

    def gate_zone(self, zone_type: str) -> None:
        """Make the zone's ``temp`` unreadable (a power-gated sensor): it becomes a folder."""
        full = self.files.abs(paths.zone_file(self.zone_index(zone_type), "temp"))
        if os.path.lexists(full) and not os.path.isdir(full):
            os.unlink(full)
        os.makedirs(full, exist_ok=True)

    # -- power ------------------------------------------------------------------------------
    def _rail(self, name: str) -> RailSpec:
        for r in self.spec.rails:
            if r.name == name:
                return r
        raise KeyError(f"board {self.spec.name} has no rail {name!r}")

    def _hwmon_folder(self, rail: RailSpec) -> str:
        root = paths.hwmon_root(rail.device)
        for n in sorted(os.listdir(self.files.abs(root))):
            if n.startswith("hwmon"):
                return f"{root}/{n}"
        raise KeyError(f"no hwmon folder under {root}")

    def set_power(self, rail_name: str, mw: float) -> None:
        """Set a rail's reading. hwmon: a fixed bus voltage and the current giving ``mw``."""
        rail = self._rail(rail_name)
        mv = _RAIL_MV.get(rail.role, 5000)
        ma = int(round(mw * 1000.0 / mv))
        if rail.driver == "iio":
            dev, ch = rail.device, rail.channel
            scale = RAIL_UNITS_MW[rail.unit]  # the file counts in the spec's unit
            self.files.put(paths.iio_power(dev, ch), str(int(round(mw / scale))))
            self.files.put(f"{dev}/in_current{ch}_input", str(ma))
            self.files.put(f"{dev}/in_voltage{ch}_input", str(mv))
        else:
            folder, ch = self._hwmon_folder(rail), rail.channel
            self.files.put(f"{folder}/in{ch}_input", str(mv))
            self.files.put(f"{folder}/curr{ch}_input", str(ma))
            self.files.put(f"{folder}/in{ch + 3}_input", str(ma * 5))  # shunt µV over 5 mΩ

    # -- cpufreq ----------------------------------------------------------------------------
    def _write_policy(self, cl: ClusterSpec, online: Iterable[int], rng: random.Random) -> None:
        f, p = self.files, cl.policy
        online = set(online)
        gov = cl.default_governor
        if gov == "performance":
            cur = cl.fmax_khz
        elif gov == "powersave":
            cur = cl.fmin_khz
        else:
            cur = rng.choice(cl.freqs_khz)
        available = [g for g in cl.governors if g not in cl.modular_governors]
        values = {
            "related_cpus": " ".join(map(str, cl.cpus)),
            "affected_cpus": " ".join(str(c) for c in cl.cpus if c in online),
            "scaling_driver": cl.scaling_driver,
            "scaling_governor": gov,
            "scaling_available_governors": " ".join(available),
            "scaling_available_frequencies": " ".join(map(str, cl.freqs_khz)) + " ",
            "scaling_min_freq": str(cl.fmin_khz),
            "scaling_max_freq": str(cl.fmax_khz),
            "scaling_cur_freq": str(cur),
            "scaling_setspeed": str(cur) if gov == "userspace" else "<unsupported>",
            "cpuinfo_min_freq": str(cl.fmin_khz),
            "cpuinfo_max_freq": str(cl.fmax_khz),
            "cpuinfo_transition_latency": str(cl.transition_latency_ns),
        }
        for name in paths.POLICY_FILES:
            f.put(
                paths.policy_file(p, name),
                values[name],
                0o644 if name in RW_POLICY_FILES else 0o444,
            )
        if self.quirks:
            f.put(paths.policy_file(p, "cpuinfo_cur_freq"), str(cur), 0o400)
        for cpu in cl.cpus:
            if cpu in online:
                f.link(paths.cpu_cpufreq(cpu), paths.policy_dir(p))
            else:
                f.remove(paths.cpu_cpufreq(cpu))

    def set_cur_freq(self, policy: int, khz: int) -> None:
        self.files.put(paths.policy_file(policy, "scaling_cur_freq"), str(khz), 0o444)

    def set_governor_list(self, policy: int, governors: Iterable[str]) -> None:
        """Rewrite ``scaling_available_governors`` (e.g. after a ``modprobe``)."""
        self.files.put(
            paths.policy_file(policy, "scaling_available_governors"), " ".join(governors)
        )

    def set_cpu_online(self, cpu: int, online: bool) -> None:
        """Hotplug a CPU like nvpmodel does: ``online`` files, ``cpufreq`` link, the policy
        folder (removed with its last online CPU, recreated with defaults) and ``proc/stat``."""
        if cpu == 0 and not online:
            raise ValueError("cpu0 cannot be taken offline")
        cl = self.spec.cluster_of_cpu(cpu)
        if online:
            self._online.add(cpu)
        else:
            self._online.discard(cpu)
        f = self.files
        if cpu != 0:
            f.put(paths.cpu_online(cpu), "1" if online else "0", 0o644)
        f.put(f"{paths.CPU}/online", paths.format_cpu_ranges(sorted(self._online)))
        cl_online = [c for c in cl.cpus if c in self._online]
        if not cl_online:
            f.remove(paths.policy_dir(cl.policy))
            f.remove(paths.cpu_cpufreq(cpu))
        elif not os.path.isdir(f.abs(paths.policy_dir(cl.policy))):
            self._write_policy(cl, self._online, self._rng)
        else:
            f.put(paths.policy_file(cl.policy, "affected_cpus"), " ".join(map(str, cl_online)))
            if online:
                f.link(paths.cpu_cpufreq(cpu), paths.policy_dir(cl.policy))
            else:
                f.remove(paths.cpu_cpufreq(cpu))
        self.write_stat()

    def settle(self) -> None:
        """Do what the kernel does after writes: ``scaling_cur_freq`` follows the governor
        (userspace: the setspeed target) within [min, max], snapped to the table at or below;
        ``scaling_setspeed`` reads ``<unsupported>`` outside userspace."""
        s = self.sysfs
        for cl in self.spec.clusters:
            if not s.exists(paths.policy_dir(cl.policy)):
                continue

            def rd(name: str, policy: int = cl.policy) -> str | None:
                return s.read_or(paths.policy_file(policy, name))

            gov = rd("scaling_governor")
            lo = int(rd("scaling_min_freq") or cl.fmin_khz)
            hi = int(rd("scaling_max_freq") or cl.fmax_khz)
            cur = int(rd("scaling_cur_freq") or cl.fmin_khz)
            speed = rd("scaling_setspeed")
            if gov == "performance":
                cur = hi
            elif gov == "powersave":
                cur = lo
            elif gov == "userspace" and speed is not None and speed.isdigit():
                cur = int(speed)
            cur = max(lo, min(hi, cur))
            table = [x for x in cl.freqs_khz if x <= cur]
            cur = table[-1] if table else cl.fmin_khz
            self.set_cur_freq(cl.policy, cur)
            setspeed_path = paths.policy_file(cl.policy, "scaling_setspeed")
            if gov != "userspace":
                self.files.put(setspeed_path, "<unsupported>", 0o644)
            elif speed is None or not speed.isdigit():
                self.files.put(setspeed_path, str(cur), 0o644)

    # -- proc/stat --------------------------------------------------------------------------
    def write_stat(self) -> None:
        lines = []
        agg = [sum(self._ticks[c][i] for c in self._online) for i in range(8)]
        lines.append("cpu  " + " ".join(map(str, agg)) + " 0 0")
        for c in sorted(self._online):
            lines.append(f"cpu{c} " + " ".join(map(str, self._ticks[c])) + " 0 0")
        lines += [
            "intr 0",
            "ctxt 1234567",
            "btime 1700000000",
            "processes 4242",
            "procs_running 1",
            "procs_blocked 0",
            "softirq 0 0 0 0 0 0 0 0 0 0 0",
        ]
        self.files.put(paths.PROC_STAT, "\n".join(lines))

    def advance_stat(self, seconds: float = 1.0, busy: float | dict[int, float] = 0.5) -> None:
        """Add ``seconds`` of ticks to every online CPU, ``busy`` of them non-idle."""
        ticks = int(round(seconds * USER_HZ))
        for c in self._online:
            frac = busy.get(c, 0.0) if isinstance(busy, dict) else busy
            b = int(round(ticks * min(1.0, max(0.0, frac))))
            t = self._ticks[c]
            t[0] += (b * 4) // 5  # user
            t[2] += b - (b * 4) // 5  # system
            t[3] += ticks - b  # idle
        self.write_stat()


# -- error injection for tests ----------------------------------------------------------------


class _FailingFile:
    """A file whose ``read`` fails the way a gated sensor's does after a successful ``open``."""

    def __init__(self, error: BaseException | None):
        self._error = error

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None

    def read(self, *_args):
        if self._error is None:
            return None  # a non-blocking raw read with no data: EAGAIN without an exception
        raise self._error

    def close(self) -> None:
        return None


def inject_read_error(
    monkeypatch, sysfs: DirSysfs, rel_path: str, error: int | BaseException | None
) -> None:
    """Make ``sysfs.read(rel_path)`` fail like the kernel: ``open`` succeeds, ``read`` raises
    ``OSError(errno)`` (an ``int``), the given exception (e.g. ``TypeError``), or returns
    ``None`` (``error=None``). ``monkeypatch`` is pytest's fixture, which undoes the patch.

    It shadows the ``open`` name inside ``platforms.sysfs`` (DirSysfs's only I/O entry for
    reads), so other code and other paths are untouched. Calls stack.
    """
    import platforms.sysfs as sysfs_module

    target = sysfs.abspath(rel_path)
    previous = getattr(sysfs_module, "open", builtins.open)
    if isinstance(error, int):
        exc: BaseException | None = OSError(error, os.strerror(error), target)
    else:
        exc = error

    def fake_open(file, *args, **kwargs):
        if isinstance(file, (str, os.PathLike)) and os.fspath(file) == target:
            if isinstance(exc, PermissionError | FileNotFoundError):
                raise exc
            return _FailingFile(exc)
        return previous(file, *args, **kwargs)

    monkeypatch.setattr(sysfs_module, "open", fake_open, raising=False)


__all__ = [
    "FakeWriter",
    "MARKER",
    "MODES",
    "inject_read_error",
    "write_fake_tree",
]
