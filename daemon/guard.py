"""Thermal guard: hard frequency caps from trip points, independent of the agents.

When a cluster's hottest zone reaches (passive trip - margin) the cap drops one OPP per tick,
from the cap in force (a static ceiling included), as the kernel's step_wise governor steps;
it rises one OPP per tick once the zone is below (trip - margin - hysteresis). Zones without a
trip (or unavailable readings) never relax a cap, so a failing sensor keeps the last cap.
Static ceilings (config ``thermal.cap_khz``) hold at all times, whatever the temperature. The
guard always wins over the policy, the gate and the shield; the actuator enforces its caps
under a kernel governor too (as ``scaling_max_freq``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from agents.policy import Decision, nearest_freq
from platforms.errors import SpecError
from platforms.observation import Observation
from platforms.spec import BoardSpec

if TYPE_CHECKING:
    from daemon.config import Config


def static_caps(spec: BoardSpec, caps_khz: Mapping[str, int], source: str = "config") -> dict:
    """Check ``thermal.cap_khz`` against the board: every key a cluster, every cap at or above
    the cluster's lowest OPP (a cap below it could not be honoured). Returns the caps."""
    names = [c.name for c in spec.clusters]
    for name, khz in caps_khz.items():
        key = f"thermal.cap_khz.{name}"
        if name not in names:
            raise SpecError(source, key, f"a cluster of {spec.name} ({', '.join(names)})", name)
        low = spec.cluster(name).freqs_khz[0]
        if khz < low:
            raise SpecError(source, key, f"at least the cluster's lowest OPP, {low} kHz", khz)
    return dict(caps_khz)


@dataclass
class ThermalGuard:
    margin_c: float = 5.0
    hysteresis_c: float = 3.0
    #: cap level (index into the cluster's table) per cluster; absent = uncapped
    levels: dict[str, int] = field(default_factory=dict)
    #: static ceilings in kHz per cluster (config ``thermal.cap_khz``), always applied
    static_khz: dict[str, int] = field(default_factory=dict)

    def view(self, obs: Observation) -> Observation:
        """``obs`` with the caps folded into each cluster's limits (the static ceilings and
        the thermal caps in force since the last tick), so that the policy, the gate and the
        shield plan with the frequencies they can actually get."""
        if not self.static_khz and not self.levels:
            return obs
        clusters = []
        for c in obs.clusters:
            fixed = self.static_khz.get(c.name)
            level = self.levels.get(c.name)
            if (fixed is None and level is None) or not c.freqs_khz:
                clusters.append(c)
                continue
            top = len(c.freqs_khz) - 1
            if fixed is not None:
                top = min(top, _floor_level(c.freqs_khz, fixed))
            if level is not None:
                top = min(top, level)
            cap = c.freqs_khz[top]
            hi = cap if c.max_khz is None else min(c.max_khz, cap)
            lo = None if c.min_khz is None else min(c.min_khz, hi)
            clusters.append(replace(c, min_khz=lo, max_khz=hi))
        return replace(obs, clusters=tuple(clusters))

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
            fixed = self.static_khz.get(c.name)
            ceiling = top if fixed is None else _floor_level(c.freqs_khz, fixed)
            if temp is not None and trip is not None:
                limit = trip - self.margin_c
                if temp >= limit:
                    # one OPP below the cap in force, as the kernel's step_wise governor steps
                    # its cooling state; not below the current frequency: a cluster idling at
                    # its lowest OPP would be capped there at once, and stay so until the zone
                    # is below limit - hysteresis, whatever it is asked to run next
                    before = level
                    level = max(0, min(level, ceiling) - 1)
                    if level < before:  # at the floor already: nothing new to report each tick
                        out.events.append(
                            f"thermal_cap cluster={c.name} temp_c={temp:.1f} "
                            f"limit_c={limit:.1f} cap_khz={c.freqs_khz[level]}"
                        )
                elif temp < limit - self.hysteresis_c and level < top:
                    level += 1
            if level >= top:
                self.levels.pop(c.name, None)
            else:
                self.levels[c.name] = level
            level = min(level, ceiling)
            if level >= top:
                continue
            cap = c.freqs_khz[level]
            out.cap_khz[c.name] = min(cap, out.cap_khz.get(c.name, cap))
            if c.name in out.freq_khz and out.freq_khz[c.name] > cap:
                out.freq_khz[c.name] = cap
        out.events.extend(hi_needs_capped(decision.events, out.cap_khz))
        return out


#: a high-criticality job's frequency need, as the reservation states it (agents.mixed)
_HI_NEED = re.compile(r"^(?:reserve|share) cluster=(\S+) pid=(\d+)\b.*\bneed_khz=(\d+)")


def hi_needs_capped(events: list[str], caps_khz: Mapping[str, int]) -> list[str]:
    """The guard wins over the reservation: where its cap falls below what a HI job's
    reservation needs (a cap stepped down after the gate planned), the job's deadline is at
    risk, said as its own event (``hi_need_capped``) rather than only as a thermal one."""
    out = []
    for ev in events:
        m = _HI_NEED.match(ev)
        if m is None:
            continue
        name, pid, need = m.group(1), int(m.group(2)), int(m.group(3))
        cap = caps_khz.get(name)
        if cap is not None and cap < need:
            out.append(f"hi_need_capped cluster={name} pid={pid} need_khz={need} cap_khz={cap}")
    return out


def _floor_level(table: tuple[int, ...], khz: int) -> int:
    """Index of the highest OPP at or below ``khz`` (0 when every OPP is above it)."""
    return table.index(nearest_freq(table, khz, mode="floor"))


def config_guard(spec: BoardSpec, config: Config | None) -> ThermalGuard:
    """The guard a config asks for (its margin and checked static caps; defaults without one)."""
    if config is None:
        return ThermalGuard()
    return ThermalGuard(
        margin_c=config.thermal.margin_c,
        static_khz=static_caps(spec, config.thermal.cap_khz, config.source),
    )
