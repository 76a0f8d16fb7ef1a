"""The policy contract: an observation in, a decision out. No I/O.

Every policy (the hidvfs agents, GearDVFS and zTT ports, Linux governor rules, maxfreq) maps an
:class:`~platforms.observation.Observation` to a :class:`Decision` using only what a real
daemon can see and write.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from platforms.observation import Observation


@dataclass(frozen=True)
class JobSetting:
    cpus: tuple[int, ...]
    rt_priority: int = 0  # 1..99 -> SCHED_FIFO, 0 -> SCHED_OTHER
    nice: int = 0


@dataclass
class Decision:
    """Per-cluster target frequency (a value of the cluster's table) and per-job placement.

    ``governor`` optionally names a kernel governor per cluster for native baselines; when it
    is set (and not ``userspace``) the actuator writes it and ignores ``freq_khz`` there.
    ``cap_khz`` is an upper bound added by the thermal guard; the actuator applies
    ``min(freq, cap)``.
    """

    freq_khz: dict[str, int]
    jobs: dict[int, JobSetting] = field(default_factory=dict)
    governor: dict[str, str] = field(default_factory=dict)
    cap_khz: dict[str, int] = field(default_factory=dict)
    events: list[str] = field(default_factory=list)  # gate/shield/guard interventions

    def copy(self) -> Decision:
        return Decision(
            dict(self.freq_khz),
            dict(self.jobs),
            dict(self.governor),
            dict(self.cap_khz),
            list(self.events),
        )


class Policy(ABC):
    """Maps observations to decisions. ``reset`` is called at the start of a run."""

    name: str = "abstract"
    #: preferred decision period in seconds (the loop may use its own)
    period_s: float = 0.1

    def reset(self, seed: int | None = None) -> None:  # noqa: B027 - optional hook
        """Forget history (e.g. between runs)."""

    @abstractmethod
    def decide(self, obs: Observation) -> Decision: ...


def nearest_freq(table: tuple[int, ...], khz: float, mode: str = "ceil") -> int:
    """Snap ``khz`` to the table: ``ceil`` = lowest entry >= khz, ``floor`` = highest <= khz."""
    if mode == "ceil":
        for f in table:
            if f >= khz:
                return f
        return table[-1]
    best = table[0]
    for f in table:
        if f <= khz:
            best = f
    return best


def all_cpus_setting(obs: Observation) -> dict[int, JobSetting]:
    """Every job may run on every online CPU at normal priority (what the kernel does)."""
    online = tuple(sorted(c for cl in obs.clusters for c in cl.online))
    return {j.pid: JobSetting(online) for j in obs.jobs}
