"""Replay a trace through the real control loop (used by ``hidvfs trace replay`` and CI)."""

from __future__ import annotations

from agents.factory import make_policy
from daemon.config import Config
from daemon.guard import config_guard
from daemon.loop import ControlLoop
from platforms.clock import VirtualClock
from platforms.platform import Platform
from platforms.procs import NoProcesses
from platforms.spec import load_board
from platforms.trace import ReplaySysfs, compare_writes, read_trace


def replay_trace(
    path: str, policy_name: str, period_ms: int | None = None, config: Config | None = None
) -> dict:
    trace = read_trace(path)
    try:
        spec = load_board(trace.header.board)
    except Exception:  # noqa: BLE001 - an unknown board: describe it from the recording
        from platforms.probe import probe

        spec = probe(
            ReplaySysfs(trace, VirtualClock(trace.samples[0].t if trace.samples else 0.0))
        ).spec
    clock = VirtualClock(trace.samples[0].t if trace.samples else 0.0)
    sysfs = ReplaySysfs(trace, clock)
    platform = Platform(spec, sysfs, NoProcesses(), clock, kind="replay")
    period = period_ms / 1000.0 if period_ms else trace.header.period_s
    loop = ControlLoop(
        platform, make_policy(policy_name, spec), period_s=period, guard=config_guard(spec, config)
    )
    duration = (trace.samples[-1].t - trace.samples[0].t) if trace.samples else 0.0
    loop.run(duration_s=max(duration, period))
    recorded = [(s.t, p, v) for s in trace.samples for p, v in (s.w or {}).items()]
    ours = [(t, p, v) for (t, p, v) in sysfs.writes]
    mismatches = compare_writes(trace, ours) if recorded else []
    return {
        "board": spec.name,
        "policy": policy_name,
        "ticks": loop.ticks,
        "writes": ours,
        "recorded_writes": len(recorded),
        "mismatches": [str(m) for m in mismatches],
        "matching_writes": max(0, len(recorded) - len(mismatches)) if recorded else 0,
        "status": loop.status(),
    }
