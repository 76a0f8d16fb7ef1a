"""Metered power for training rewards: the simulator's exact energy, not a sensor sample.

A policy only ever sees what the board exposes (sensor samples of the rails; nothing at all on
the RUBIK Pi 3, which has no power monitor). A reward, though, is computed by the training
harness after an episode, and in the simulator the harness knows the plant's exact energy.
Every learner (hidvfs, GearDVFS, zTT) gets its reward from the same metered observations: the
total and CPU rails carry the mean plant power over the tick that starts at that observation
(an instantaneous sensor sample at the tick is a noisy estimate of that mean, the sampling
pitfall of baselines.md section 4.3). Without a meter (a board, a replay) the observations are
left as they are.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from platforms.observation import Observation, RailObs

#: rail name given to a power value that comes from the simulator's meter, not a sensor
METER_RAIL = "plant-meter"


def tick_power_w(
    times: Sequence[float], trace: Sequence[tuple[float, float, float]]
) -> tuple[np.ndarray, np.ndarray] | None:
    """Mean (total, cpu) plant power over [t_i, t_i+1) for each tick time (last: to the trace end).

    ``trace`` holds ``(t, total_energy_j, cpu_energy_j)`` samples in time order; None when it
    cannot tell (empty trace or fewer than two distinct times).
    """
    if len(trace) < 2 or not len(times):
        return None
    tr = np.asarray(trace, dtype=np.float64)
    tt = tr[:, 0]
    if tt[-1] <= tt[0]:
        return None
    ts = np.asarray(times, dtype=np.float64)
    edges = np.append(ts, max(float(tt[-1]), float(ts[-1])))
    out = []
    for col in (1, 2):
        e = np.interp(edges, tt, tr[:, col])
        dt = np.diff(edges)
        de = np.diff(e)
        with np.errstate(invalid="ignore", divide="ignore"):
            p = np.where(dt > 1e-12, de / np.where(dt > 1e-12, dt, 1.0), np.nan)
        if np.isnan(p).all():
            return None
        # a zero-length last tick takes its neighbour's power
        p = np.where(np.isnan(p), np.nanmean(p), p)
        out.append(p)
    return out[0], out[1]


def metered(obs: Sequence[Observation], result) -> list[Observation]:
    """``obs`` with the total and CPU rails set from ``result.energy_trace`` (the plant's meter).

    Other rails are kept. Without a trace (a real board, a replay) the observations come back
    unchanged.
    """
    obs = list(obs)
    trace = getattr(result, "energy_trace", ()) or ()
    powers = tick_power_w([o.t for o in obs], trace)
    if powers is None:
        return obs
    total, cpu = powers
    out = []
    for o, pt, pc in zip(obs, total, cpu, strict=True):
        rails = [r for r in o.rails if r.role not in ("total", "cpu")]
        rails.append(RailObs(METER_RAIL, "total", float(pt) * 1000.0))
        rails.append(RailObs(METER_RAIL + "-cpu", "cpu", float(pc) * 1000.0))
        out.append(replace(o, rails=tuple(rails)))
    return out
