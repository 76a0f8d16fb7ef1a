"""A fixed operating point: busy clusters at a fraction of their table, idle ones at the bottom.

Not a contender: it is the yardstick for what any frequency policy can save on a board
(``hidvfs agents sweep``). Kernel placement (every job may use every online core), normal
priorities, no deadline awareness.
"""

from __future__ import annotations

from agents.policy import Decision, Policy, all_cpus_setting, nearest_freq
from platforms.observation import Observation


class StaticFraction(Policy):
    """``userspace`` at the lowest table entry >= ``fraction`` x the highest allowed one."""

    def __init__(self, fraction: float, *, period_s: float = 0.05):
        if not 0.0 < fraction <= 1.0:
            raise ValueError(f"fraction must be in (0, 1], got {fraction}")
        self.fraction = fraction
        self.period_s = period_s
        self.name = f"static-{fraction:g}"

    def decide(self, obs: Observation) -> Decision:
        freq = {}
        for cl in obs.clusters:
            allowed = tuple(f for f in cl.freqs_khz if cl.min_khz <= f <= cl.max_khz)
            allowed = allowed or (cl.min_khz,)
            # a cluster with no job's thread on it idles at the bottom (as hidvfs does)
            busy = any(not j.cpus or any(c in cl.cpus for c in j.cpus) for j in obs.jobs)
            freq[cl.name] = (
                nearest_freq(allowed, self.fraction * allowed[-1]) if busy else allowed[0]
            )
        return Decision(freq, all_cpus_setting(obs))
