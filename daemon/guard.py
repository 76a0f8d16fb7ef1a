"""Thermal guard: hard frequency caps from trip points, independent of the agents.

When a cluster's hottest zone reaches (passive trip - margin) the cap drops one OPP per tick;
it rises one OPP per tick once the zone is below (trip - margin - hysteresis). Zones without a
trip (or unavailable readings) never relax a cap, so a failing sensor keeps the last cap. The
guard always wins over the policy, the gate and the shield.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from agents.policy import Decision
from platforms.observation import Observation


@dataclass
class ThermalGuard:
    margin_c: float = 5.0
    hysteresis_c: float = 3.0
    #: cap level (index into the cluster's table) per cluster; absent = uncapped
    levels: dict[str, int] = field(default_factory=dict)

    def trips(self, obs: Observation) -> dict[str, tuple[float | None, float | None]]:
        """Per cluster: (hottest temperature, lowest passive trip) over its zones."""
        out: dict[str, tuple[float | None, float | None]] = {}
        for c in obs.clusters:
            temps, trips = [], []
            for z in obs.zones:
                if c.name not in z.clusters:
                    continue
                if z.temp_c is not None:
                    temps.append(z.temp_c)
                if z.passive_trip_c is not None:
                    trips.append(z.passive_trip_c)
            out[c.name] = (max(temps) if temps else None, min(trips) if trips else None)
        return out

    def apply(self, decision: Decision, obs: Observation) -> Decision:
        out = decision.copy()
        hot = self.trips(obs)
        for c in obs.clusters:
            if not c.freqs_khz:
                continue
            temp, trip = hot.get(c.name, (None, None))
            top = len(c.freqs_khz) - 1
            level = self.levels.get(c.name, top)
            if temp is not None and trip is not None:
                limit = trip - self.margin_c
                if temp >= limit:
                    current = c.level if c.level is not None else top
                    level = max(0, min(level, current) - 1)
                    out.events.append(
                        f"thermal_cap cluster={c.name} temp_c={temp:.1f} limit_c={limit:.1f} "
                        f"cap_khz={c.freqs_khz[level]}"
                    )
                elif temp < limit - self.hysteresis_c and level < top:
                    level += 1
            if level >= top:
                self.levels.pop(c.name, None)
                continue
            self.levels[c.name] = level
            cap = c.freqs_khz[level]
            out.cap_khz[c.name] = min(cap, out.cap_khz.get(c.name, cap))
            if c.name in out.freq_khz and out.freq_khz[c.name] > cap:
                out.freq_khz[c.name] = cap
        return out
