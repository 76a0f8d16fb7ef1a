"""High-rate power sampling in a background thread, for native runs.

The total input rail (and the CPU rail) is read at ``rate_hz`` (>= 100 Hz by default 200 Hz, or
as fast as the files allow) and integrated with the trapezoid rule; temperatures and frequencies
are sampled at a lower rate for the run's time series. The achieved rate is recorded with the
result, because an energy figure is only as good as its sampling (baselines.md 4.3).

Only an interval whose two ends were both read counts: a failed read leaves the intervals on
either side of it out of the integral. The result says which fraction of the run the integral
covers (``energy_coverage``), and energy is None (unavailable) when no interval was measured,
never 0: a partial integral is an undercount, and the caller decides whether it is usable.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from platforms.power import find_rail, read_power_mw_or_none
from platforms.sense import Sensor
from platforms.spec import BoardSpec
from platforms.sysfs import SysfsBackend


@dataclass
class SampleSummary:
    #: trapezoid integral over the intervals measured at both ends; None when there were none
    energy_j: float | None
    cpu_energy_j: float | None
    duration_s: float
    samples: int
    rate_hz: float
    peak_temp_c: float | None
    series: list[dict] = field(default_factory=list)
    #: fraction of the sampled time that ``energy_j`` covers (1.0: every interval was
    #: measured); None when the energy is None
    energy_coverage: float | None = None
    cpu_energy_coverage: float | None = None


class RailSampler:
    def __init__(
        self,
        spec: BoardSpec,
        sysfs: SysfsBackend,
        *,
        rate_hz: float = 200.0,
        series_hz: float = 10.0,
    ):
        if rate_hz <= 0 or series_hz <= 0:
            raise ValueError("sampling rates must be > 0")
        self.spec = spec
        self.sysfs = sysfs
        self.rate_hz = rate_hz
        self.series_hz = series_hz
        self._total = find_rail(sysfs, spec.total_rail) if spec.total_rail else None
        self._cpu = find_rail(sysfs, spec.cpu_rail) if spec.cpu_rail else None
        self._sensor = Sensor(spec, sysfs)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._result: SampleSummary | None = None

    @property
    def has_power(self) -> bool:
        return self._total is not None

    def start(self) -> RailSampler:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="hidvfs-rail-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> SampleSummary:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        assert self._result is not None
        return self._result

    def _run(self) -> None:
        period = 1.0 / self.rate_hz
        series_period = 1.0 / self.series_hz
        t0 = time.monotonic()
        e_total = e_cpu = 0.0
        # time covered by intervals measured at both ends: an interval next to a failed read
        # is not in the integral, and the result says how much of the run was
        cov_total = cov_cpu = 0.0
        n_total = n_cpu = 0
        last: tuple[float, float | None, float | None] | None = None
        t_first = t0
        n = 0
        peak = None
        series: list[dict] = []
        next_series = t0
        next_t = t0
        while True:
            now = time.monotonic()
            if last is None:
                t_first = now
            p = read_power_mw_or_none(self.sysfs, self._total)
            pc = read_power_mw_or_none(self.sysfs, self._cpu)
            n += 1
            if last is not None:
                dt = now - last[0]
                if p is not None and last[1] is not None:
                    e_total += 0.5 * (p + last[1]) / 1000.0 * dt
                    cov_total += dt
                    n_total += 1
                if pc is not None and last[2] is not None:
                    e_cpu += 0.5 * (pc + last[2]) / 1000.0 * dt
                    cov_cpu += dt
                    n_cpu += 1
            last = (now, p, pc)
            if now >= next_series:
                next_series = now + series_period
                obs = self._sensor.read(now - t0)
                temp = obs.max_cpu_temp_c
                if temp is not None:
                    peak = temp if peak is None else max(peak, temp)
                series.append(
                    {
                        "t": round(now - t0, 4),
                        "temp_c": temp,
                        "power_w": None if p is None else p / 1000.0,
                        "freq_khz": {c.name: c.cur_khz for c in obs.clusters},
                    }
                )
            if self._stop.is_set():
                break
            next_t += period
            delay = next_t - time.monotonic()
            if delay > 0:
                self._stop.wait(delay)
            else:
                next_t = time.monotonic()
        duration = (last[0] - t0) if last else 0.0
        span = (last[0] - t_first) if last else 0.0
        self._result = SampleSummary(
            energy_j=e_total if n_total else None,
            cpu_energy_j=e_cpu if n_cpu else None,
            duration_s=duration,
            samples=n,
            rate_hz=(n - 1) / duration if duration > 0 and n > 1 else 0.0,
            peak_temp_c=peak,
            series=series,
            energy_coverage=_coverage(n_total, n - 1, cov_total, span),
            cpu_energy_coverage=_coverage(n_cpu, n - 1, cov_cpu, span),
        )


def _coverage(measured: int, intervals: int, covered_s: float, span_s: float) -> float | None:
    """Fraction of the sampled span an integral covers; None when no interval was measured."""
    if not measured:
        return None
    if measured >= intervals or span_s <= 0:
        return 1.0
    return min(1.0, covered_s / span_s)
