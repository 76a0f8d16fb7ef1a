"""Per-CPU utilisation from ``/proc/stat`` deltas.

Each ``cpuN`` line holds cumulative USER_HZ ticks: ``user nice system idle iowait irq softirq
steal guest guest_nice``. ``guest``/``guest_nice`` are already counted in ``user``/``nice``, so
the total is the first eight fields; busy = total - idle - iowait. Offline CPUs have no line.
"""

from __future__ import annotations

from typing import NamedTuple

from platforms import paths
from platforms.errors import SysfsUnavailable
from platforms.sysfs import SysfsBackend


class CpuTimes(NamedTuple):
    """Cumulative ticks of one CPU (a tuple: built for every CPU on every tick)."""

    busy: int
    total: int


def parse_proc_stat(text: str) -> dict[int, CpuTimes]:
    """cpu number -> cumulative ticks, from the ``cpuN`` lines (the aggregate line is skipped).

    Malformed lines are left out, so the CPU reads as unavailable rather than idle.
    """
    out: dict[int, CpuTimes] = {}
    for line in text.splitlines():
        if not line.startswith("cpu"):
            if out:
                break  # the cpu lines come first; stop at the first other line
            continue
        parts = line.split()
        num = parts[0][3:]
        if not num.isdigit():
            continue  # the aggregate "cpu" line
        try:
            vals = list(map(int, parts[1:9]))
        except ValueError:
            continue
        if len(vals) < 4:
            continue
        total = sum(vals)
        idle = vals[3] + (vals[4] if len(vals) > 4 else 0)
        out[int(num)] = CpuTimes(total - idle, total)
    return out


class UtilTracker:
    """Busy fraction of each CPU between two consecutive samples.

    A CPU gets ``None`` on the first sample, when its line is missing (offline), when no tick
    passed, or when its counters went backwards (a reset): unavailable, never 0.
    """

    def __init__(self) -> None:
        self._prev: dict[int, CpuTimes] = {}

    def reset(self) -> None:
        self._prev = {}

    def update(self, times: dict[int, CpuTimes]) -> dict[int, float | None]:
        out: dict[int, float | None] = {}
        for cpu, now in times.items():
            before = self._prev.get(cpu)
            out[cpu] = _fraction(before, now)
        self._prev = times
        return out

    def sample(self, sysfs: SysfsBackend) -> dict[int, float | None]:
        """Read ``proc/stat`` and update; raises :class:`SysfsUnavailable` if it cannot be read
        (the previous sample is then kept, so the next delta spans both periods)."""
        return self.update(parse_proc_stat(sysfs.read(paths.PROC_STAT)))

    def util_of(
        self, util: dict[int, float | None], cpus: tuple[int, ...]
    ) -> tuple[float | None, ...]:
        return tuple(util.get(c) for c in cpus)


def _fraction(before: CpuTimes | None, now: CpuTimes) -> float | None:
    if before is None:
        return None
    dt = now.total - before.total
    db = now.busy - before.busy
    if dt <= 0 or db < 0:
        return None
    return min(1.0, max(0.0, db / dt))


def read_util(
    sysfs: SysfsBackend, tracker: UtilTracker
) -> tuple[dict[int, float | None], str | None]:
    """(per-cpu util, error text or None): the Sensor's non-raising form of :meth:`sample`."""
    try:
        return tracker.sample(sysfs), None
    except SysfsUnavailable as err:
        return {}, str(err)
