"""The kernel's sysfs/procfs layout, relative to a root. One place, so the readers, the fake
tree writer, the simulator and the trace recorder agree on every path.

Layout (``boards.md`` section 1):

- ``devices/system/cpu/{online,present,possible}``: range syntax ``0-3,5``
- ``devices/system/cpu/cpuN/online``: ``1``/``0``; often absent for cpu0 (then online)
- ``devices/system/cpu/cpuN/cpufreq``: exists only while cpuN is online
- ``devices/system/cpu/cpufreq/policyP/<file>``: see :data:`POLICY_FILES`
- ``class/thermal/thermal_zoneN/{type,temp,trip_point_K_temp,trip_point_K_type,trip_point_K_hyst}``
- IIO ina3221x: ``<device>/{rail_name_K,in_powerK_input,in_currentK_input,in_voltageK_input}``
- hwmon ina3221: ``<device>/hwmon/hwmonN/{name,inK_label,inK_input,currK_input}`` (N varies)
- ``proc/stat``: Linux format, ``cpuN user nice system idle iowait irq softirq steal ...`` in USER_HZ
- ``proc/device-tree/compatible`` (NUL-separated) and ``proc/device-tree/model``
- ``proc/sys/kernel/sched_rt_{runtime,period}_us``: RT throttling (runtime ``-1`` = none)
"""

from __future__ import annotations

CPU = "devices/system/cpu"
CPUFREQ = f"{CPU}/cpufreq"
THERMAL = "class/thermal"
PROC_STAT = "proc/stat"
DT_COMPATIBLE = "proc/device-tree/compatible"
DT_MODEL = "proc/device-tree/model"
DT_DTSFILENAME = "proc/device-tree/nvidia,dtsfilename"
RT_RUNTIME = "proc/sys/kernel/sched_rt_runtime_us"
RT_PERIOD = "proc/sys/kernel/sched_rt_period_us"

POLICY_FILES = (
    "related_cpus",
    "affected_cpus",
    "scaling_driver",
    "scaling_governor",
    "scaling_available_governors",
    "scaling_available_frequencies",
    "scaling_min_freq",
    "scaling_max_freq",
    "scaling_cur_freq",
    "scaling_setspeed",
    "cpuinfo_min_freq",
    "cpuinfo_max_freq",
    "cpuinfo_transition_latency",
)


def policy_dir(policy: int) -> str:
    return f"{CPUFREQ}/policy{policy}"


def policy_file(policy: int, name: str) -> str:
    return f"{CPUFREQ}/policy{policy}/{name}"


def cpu_online(cpu: int) -> str:
    return f"{CPU}/cpu{cpu}/online"


def cpu_cpufreq(cpu: int) -> str:
    return f"{CPU}/cpu{cpu}/cpufreq"


def zone_dir(index: int) -> str:
    return f"{THERMAL}/thermal_zone{index}"


def zone_file(index: int, name: str) -> str:
    return f"{THERMAL}/thermal_zone{index}/{name}"


def iio_power(device: str, channel: int) -> str:
    return f"{device}/in_power{channel}_input"


def iio_rail_name(device: str, channel: int) -> str:
    return f"{device}/rail_name_{channel}"


def hwmon_root(device: str) -> str:
    return f"{device}/hwmon"


#: the kernel's largest NR_CPUS (CONFIG_NR_CPUS is at most 8192): a range past it is garbage
MAX_CPUS = 8192


def parse_cpu_ranges(text: str) -> tuple[int, ...]:
    """``0-3,5`` -> (0, 1, 2, 3, 5); also accepts the space-separated ``related_cpus`` form."""
    cpus: set[int] = set()
    for part in text.replace(",", " ").split():
        lo, _, hi = part.partition("-")
        first, last = int(lo), int(hi or lo)
        if not 0 <= first <= last < MAX_CPUS:
            raise ValueError(f"CPU range {part!r} is not within 0-{MAX_CPUS - 1}")
        cpus.update(range(first, last + 1))
    return tuple(sorted(cpus))


def format_cpu_ranges(cpus) -> str:
    """(0, 1, 2, 3, 5) -> ``0-3,5``."""
    cpus = sorted(set(cpus))
    out, i = [], 0
    while i < len(cpus):
        j = i
        while j + 1 < len(cpus) and cpus[j + 1] == cpus[j] + 1:
            j += 1
        out.append(str(cpus[i]) if i == j else f"{cpus[i]}-{cpus[j]}")
        i = j + 1
    return ",".join(out)
