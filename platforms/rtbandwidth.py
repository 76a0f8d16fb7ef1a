"""RT throttling: the share of each period the kernel lets SCHED_FIFO threads run.

Linux caps real-time threads at ``sched_rt_runtime_us`` per ``sched_rt_period_us`` (by
default 950000 per 1000000), so a job whose SCHED_FIFO threads keep their cores busy can be
held off them for the rest of every period: up to 5 % longer than its bound. ``-1`` lifts the
cap. The daemon plans deadlines with at least ``1 - share`` of margin (:func:`planning_margin`).
"""

from __future__ import annotations

from platforms import paths
from platforms.sysfs import SysfsBackend

#: the largest planning margin the cap may impose: a share below 1 - this (an RT runtime of
#: a few percent) is a misconfigured kernel, not something to plan around
MAX_MARGIN = 0.5


def parse_rt_share(runtime_text: str | None, period_text: str | None) -> float | None:
    """runtime / period in [0, 1]; 1.0 when the cap is off (runtime -1); None when either
    value is missing or malformed (the cap is then unknown)."""
    try:
        runtime = int(str(runtime_text).strip())
        period = int(str(period_text).strip())
    except ValueError:
        return None
    if runtime == -1:
        return 1.0
    if runtime < 0 or period <= 0:
        return None
    return min(runtime / period, 1.0)


def rt_share(sysfs: SysfsBackend) -> float | None:
    """The share SCHED_FIFO threads may take of each CPU (see :func:`parse_rt_share`)."""
    return parse_rt_share(sysfs.read_or(paths.RT_RUNTIME), sysfs.read_or(paths.RT_PERIOD))


def planning_margin(configured: float, share: float | None) -> float:
    """The deadline margin to plan with: the configured one, raised to what the RT cap can
    take from a busy job (``1 - share``, at most :data:`MAX_MARGIN`)."""
    if share is None:
        return configured
    # rounded: 1 - 0.95 is 0.050000000000000044, which must not outbid a configured 0.05
    return max(configured, min(round(1.0 - share, 9), MAX_MARGIN))
