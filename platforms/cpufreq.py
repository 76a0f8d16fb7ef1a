"""Typed access to cpufreq policies and CPU hotplug state on any :class:`SysfsBackend`.

Readers turn every unreadable file into ``None`` (unavailable, never 0). Writers are what the
actuator uses: they check what the kernel would refuse (a governor that is not loaded, a
``scaling_setspeed`` write outside ``userspace``, ``min > max``) and order limit writes so
that ``scaling_min_freq <= scaling_max_freq`` holds after every single write, which the 4.9
kernels of L4T 32 enforce with ``EINVAL`` (``boards.md`` section 1.1).
"""

from __future__ import annotations

import errno
import re
from dataclasses import dataclass

from platforms import paths
from platforms.errors import HidvfsError, SysfsUnavailable, SysfsWriteError
from platforms.sysfs import SysfsBackend

_POLICY_RE = re.compile(r"^policy(\d+)$")
_CPU_RE = re.compile(r"^cpu(\d+)$")

#: the policy files a controller writes (probe reports whether each is writable)
WRITABLE_FILES = ("scaling_governor", "scaling_setspeed", "scaling_min_freq", "scaling_max_freq")


class InvalidLimits(HidvfsError, ValueError):
    """A requested (min, max) pair that no kernel accepts, refused before any write."""


@dataclass(frozen=True)
class PolicyState:
    """One snapshot of ``policyN/``; ``None`` marks a file that could not be read."""

    policy: int
    related_cpus: tuple[int, ...] | None
    affected_cpus: tuple[int, ...] | None
    driver: str | None
    governor: str | None
    available_governors: tuple[str, ...] | None
    available_frequencies: (
        tuple[int, ...] | None
    )  # ascending kHz; None when the driver has no table
    min_khz: int | None
    max_khz: int | None
    cur_khz: int | None
    #: None unless the governor is userspace; also None when the file reads ``<unsupported>``
    setspeed_khz: int | None
    cpuinfo_min_khz: int | None
    cpuinfo_max_khz: int | None
    transition_latency_ns: int | None
    errors: tuple[str, ...] = ()

    @property
    def synthesized(self) -> bool:
        """No table of the driver's, but hardware bounds to span a grid between."""
        lo, hi = self.cpuinfo_min_khz, self.cpuinfo_max_khz
        return not self.available_frequencies and bool(lo and hi and lo < hi)

    @property
    def freq_table(self) -> tuple[int, ...]:
        """The frequency table; for a driver without one, a grid between the hardware bounds
        (:func:`frequency_grid`), else the bounds that could be read."""
        if self.available_frequencies:
            return self.available_frequencies
        lo, hi = self.cpuinfo_min_khz, self.cpuinfo_max_khz
        if lo and hi and lo < hi:
            return frequency_grid(lo, hi)
        return tuple(sorted({f for f in (lo, hi) if f}))


#: grid step of a synthesized table: drivers without a table (intel_pstate, amd-pstate, cppc)
#: take any kHz between their bounds, and intel_pstate's P-states are 100 MHz apart
GRID_STEP_KHZ = 100_000
#: most points in a synthesized table: an absurd range widens the step instead
GRID_MAX_OPPS = 64


def grid_step_khz(lo_khz: int, hi_khz: int) -> int:
    """The step of :func:`frequency_grid`: 100 MHz, or a multiple of it that keeps the grid
    within :data:`GRID_MAX_OPPS` points."""
    inner = GRID_MAX_OPPS - 2
    return GRID_STEP_KHZ * max(1, -(-(hi_khz - lo_khz) // (GRID_STEP_KHZ * inner)))


def frequency_grid(lo_khz: int, hi_khz: int) -> tuple[int, ...]:
    """A table for a driver without one: both bounds exactly (a policy's limits start there)
    and the multiples of the step between them. Without it every target floored to one of
    the two bounds: ondemand flipped between them, a thermal cap's first step fell to the
    minimum."""
    step = grid_step_khz(lo_khz, hi_khz)
    return (lo_khz, *range((lo_khz // step + 1) * step, hi_khz, step), hi_khz)


# -- CPU sets ---------------------------------------------------------------------------------


def list_policies(sysfs: SysfsBackend) -> list[int]:
    """Numbers of the ``policyN`` folders, ascending (a policy may vanish with its CPUs)."""
    out = []
    for name in sysfs.list(paths.CPUFREQ):
        m = _POLICY_RE.match(name)
        if m:
            out.append(int(m.group(1)))
    return sorted(out)


def _read_ranges(sysfs: SysfsBackend, path: str) -> tuple[int, ...]:
    text = sysfs.read(path)
    try:
        return paths.parse_cpu_ranges(text)
    except ValueError:
        raise SysfsUnavailable(path, f"not a CPU list: {text!r}") from None


def present_cpus(sysfs: SysfsBackend) -> tuple[int, ...]:
    """``cpu/present``, falling back to the ``cpuN`` folders when the file is unreadable."""
    try:
        return _read_ranges(sysfs, f"{paths.CPU}/present")
    except SysfsUnavailable:
        return tuple(
            sorted(int(m.group(1)) for n in sysfs.list(paths.CPU) if (m := _CPU_RE.match(n)))
        )


def is_cpu_online(sysfs: SysfsBackend, cpu: int) -> bool:
    """``cpuN/online`` == 1; a missing file (usual for cpu0) means online, as jetson-stats does."""
    path = paths.cpu_online(cpu)
    try:
        return sysfs.read(path) != "0"
    except SysfsUnavailable:
        if sysfs.exists(path):
            return True  # present but unreadable (permissions): the CPU is there
        return sysfs.exists(f"{paths.CPU}/cpu{cpu}")


def online_cpus(sysfs: SysfsBackend) -> tuple[int, ...]:
    """The online CPUs: ``cpu/online`` (one read), else every present CPU's ``online`` file."""
    try:
        return _read_ranges(sysfs, f"{paths.CPU}/online")
    except SysfsUnavailable:
        return tuple(c for c in present_cpus(sysfs) if is_cpu_online(sysfs, c))


def has_cpufreq(sysfs: SysfsBackend, cpu: int) -> bool:
    """An offline CPU loses its ``cpuN/cpufreq`` entry."""
    return sysfs.exists(paths.cpu_cpufreq(cpu))


# -- policy reads -----------------------------------------------------------------------------


def read_policy(sysfs: SysfsBackend, policy: int) -> PolicyState:
    """Read every file of ``policyN``; raise :class:`SysfsUnavailable` only if the folder is gone."""
    if not sysfs.exists(paths.policy_dir(policy)):
        raise SysfsUnavailable(paths.policy_dir(policy), "no such policy (CPUs offline?)")
    errors: list[str] = []

    def get(name: str, parse):
        path = paths.policy_file(policy, name)
        try:
            return parse(path)
        except SysfsUnavailable as err:
            errors.append(str(err))
            return None

    def ints(path: str) -> tuple[int, ...]:
        return tuple(sysfs.read_ints(path))

    def words(path: str) -> tuple[str, ...]:
        return tuple(sysfs.read(path).split())

    governor = get("scaling_governor", sysfs.read)
    freqs = get("scaling_available_frequencies", ints)
    setspeed = None
    if governor == "userspace":
        setspeed = get("scaling_setspeed", sysfs.read_int)
    return PolicyState(
        policy=policy,
        related_cpus=get("related_cpus", lambda p: tuple(sorted(ints(p)))),
        affected_cpus=get("affected_cpus", lambda p: tuple(sorted(ints(p)))),
        driver=get("scaling_driver", sysfs.read),
        governor=governor,
        available_governors=get("scaling_available_governors", words),
        available_frequencies=tuple(sorted(set(freqs))) if freqs else None,
        min_khz=get("scaling_min_freq", sysfs.read_int),
        max_khz=get("scaling_max_freq", sysfs.read_int),
        cur_khz=get("scaling_cur_freq", sysfs.read_int),
        setspeed_khz=setspeed,
        cpuinfo_min_khz=get("cpuinfo_min_freq", sysfs.read_int),
        cpuinfo_max_khz=get("cpuinfo_max_freq", sysfs.read_int),
        transition_latency_ns=get("cpuinfo_transition_latency", sysfs.read_int),
        errors=tuple(errors),
    )


def read_limits(sysfs: SysfsBackend, policy: int) -> tuple[int | None, int | None]:
    """Current ``(scaling_min_freq, scaling_max_freq)``; None for an unreadable file."""
    out = []
    for name in ("scaling_min_freq", "scaling_max_freq"):
        try:
            out.append(sysfs.read_int(paths.policy_file(policy, name)))
        except SysfsUnavailable:
            out.append(None)
    return out[0], out[1]


# -- writes -----------------------------------------------------------------------------------


def set_governor(sysfs: SysfsBackend, policy: int, governor: str) -> None:
    """Write ``scaling_governor``, refusing (EINVAL) a governor the kernel has not registered."""
    path = paths.policy_file(policy, "scaling_governor")
    available = sysfs.read_or(paths.policy_file(policy, "scaling_available_governors"))
    if available is not None and governor not in available.split():
        raise SysfsWriteError(
            path,
            governor,
            errno.EINVAL,
            f"governor '{governor}' not available on policy{policy} "
            f"(available: {', '.join(available.split())}); it may need modprobe cpufreq_{governor}",
        )
    sysfs.write(path, governor)


def _check_khz(path: str, khz: object) -> int:
    if isinstance(khz, bool) or not isinstance(khz, int) or khz <= 0:
        raise SysfsWriteError(path, str(khz), errno.EINVAL, "a frequency is a positive integer kHz")
    return khz


def set_setspeed(
    sysfs: SysfsBackend, policy: int, khz: int, *, check_governor: bool = True
) -> None:
    """Write ``scaling_setspeed``; the kernel accepts it only under the userspace governor."""
    path = paths.policy_file(policy, "scaling_setspeed")
    _check_khz(path, khz)
    if check_governor:
        gov = sysfs.read_or(paths.policy_file(policy, "scaling_governor"))
        if gov is not None and gov != "userspace":
            raise SysfsWriteError(
                path,
                str(khz),
                errno.EINVAL,
                f"policy{policy} runs governor '{gov}'; scaling_setspeed needs 'userspace'",
            )
    sysfs.write(path, str(khz))


def limit_write_order(
    cur_min: int | None, cur_max: int | None, new_min: int, new_max: int, hw_max: int | None
) -> list[tuple[str, int]]:
    """The (file, kHz) writes taking (cur_min, cur_max) to (new_min, new_max) with min <= max
    after each one: raise the range max first, lower it min first.

    With an unknown current minimum the range is first opened to ``hw_max`` (three writes),
    which is safe from any state. Writes that would not change a known value are skipped.
    """
    if cur_min is None:
        if hw_max is None:
            raise ValueError("current scaling_min_freq and the hardware maximum are both unknown")
        top = max(hw_max, new_max)
        return [
            ("scaling_max_freq", top),
            ("scaling_min_freq", new_min),
            ("scaling_max_freq", new_max),
        ]
    if new_max >= cur_min:
        order = [("scaling_max_freq", new_max), ("scaling_min_freq", new_min)]
    else:
        order = [("scaling_min_freq", new_min), ("scaling_max_freq", new_max)]
    known = {"scaling_min_freq": cur_min, "scaling_max_freq": cur_max}
    return [(f, v) for f, v in order if known[f] != v]


def set_limits(
    sysfs: SysfsBackend, policy: int, min_khz: int, max_khz: int
) -> list[tuple[str, str]]:
    """Set ``scaling_min_freq``/``scaling_max_freq`` keeping min <= max after every write.

    Returns the writes made, as (path, value). Refuses ``min_khz > max_khz`` before writing.
    """
    _check_khz(paths.policy_file(policy, "scaling_min_freq"), min_khz)
    _check_khz(paths.policy_file(policy, "scaling_max_freq"), max_khz)
    if min_khz > max_khz:
        raise InvalidLimits(
            f"policy{policy}: refusing limits min {min_khz} kHz > max {max_khz} kHz"
        )
    cur_min, cur_max = read_limits(sysfs, policy)
    hw_max = None
    if cur_min is None:
        try:
            hw_max = sysfs.read_int(paths.policy_file(policy, "cpuinfo_max_freq"))
        except SysfsUnavailable:
            hw_max = None
    try:
        plan = limit_write_order(cur_min, cur_max, min_khz, max_khz, hw_max)
    except ValueError:
        raise SysfsUnavailable(
            paths.policy_file(policy, "scaling_min_freq"),
            "current limits and cpuinfo_max_freq unreadable; cannot order the writes safely",
        ) from None
    done: list[tuple[str, str]] = []
    for name, value in plan:
        path = paths.policy_file(policy, name)
        sysfs.write(path, str(value))
        done.append((path, str(value)))
    return done
