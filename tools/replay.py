"""Replay a trace through the real control loop (used by ``hidvfs trace replay`` and CI)."""

from __future__ import annotations

import logging
import threading
from dataclasses import replace

from agents.factory import make_policy_stack
from agents.mixed import daemon_stages
from daemon.config import Config, policy_options
from daemon.guard import config_guard
from daemon.loop import ControlLoop
from platforms.clock import VirtualClock
from platforms.errors import HidvfsError, TraceError
from platforms.platform import Platform
from platforms.probe import detect_board, probe
from platforms.procs import NoProcesses
from platforms.spec import BoardSpec, load_board
from platforms.trace import (
    RECORDED_BY,
    ReplaySysfs,
    Trace,
    compare_writes,
    header_board,
    header_note,
    read_trace,
)

#: a replay longer than this many ticks is refused: it is a sparse or mistimed trace, and it
#: would run for hours
MAX_TICKS = 10_000_000


class ReplayError(HidvfsError):
    """A trace that cannot be replayed (no samples, or far too many ticks)."""


def recorded_policy(trace: Trace) -> str | None:
    """The policy of the daemon that recorded ``trace`` (``daemon --record``), else None."""
    if trace.header.extra.get(RECORDED_BY) != "daemon":
        return None
    name = trace.header.extra.get("policy")
    return name if isinstance(name, str) else None


def trace_board(trace: Trace, sysfs: ReplaySysfs) -> BoardSpec:
    """The spec to replay ``trace`` on: the header's board, else (``unknown``, null) the one
    its recording describes.

    A shipped header board other than the one its recorded device tree is detected as is
    refused: its clusters and zones are not in the trace (writes to missing policies, zones
    unwatched). A name hidvfs does not ship is described from the recording, with a warning.
    """
    name = header_board(trace)
    if name is None:  # describe it from the recording
        note = header_note(trace)
        if note:
            logging.getLogger("hidvfs.replay").warning("%s", note)
        return probe(sysfs).spec
    detected = detect_board(sysfs)
    if detected and detected != name:
        raise TraceError(
            trace.path,
            1,
            f"header board {name!r}, but the board its recorded files show is detected as "
            f"{detected!r}; set the header's board to {detected!r}",
        )
    return load_board(name)


def replay_trace(
    path: str,
    policy_name: str | None,
    period_ms: int | None = None,
    config: Config | None = None,
    *,
    allow_truncated: bool = False,
    stop: threading.Event | None = None,
    duration_s: float | None = None,
) -> dict:
    """Run the control loop on a recorded trace; its writes are kept, never applied.

    ``stop`` (set by a signal handler, :class:`daemon.stopsignals.StopOnSignals`) ends the
    replay at the next tick; the result is then the replay so far, with ``stopped`` true.

    Replay time is trace time (a read at t sees the latest sample at or before t). A trace the
    daemon recorded (``daemon --record``) is replayed tick by tick at its sample times with
    the daemon's policy stack, unless ``period_ms`` is given, so its writes compare one to one.

    ``duration_s`` replays the first S seconds of trace time only: the samples before S, and
    at a period the ticks over [0, S), as ``daemon --sim --duration S`` runs.
    """
    trace = read_trace(path, allow_truncated=allow_truncated)
    if not trace.samples:
        raise ReplayError(f"{path}: the trace has no samples: nothing to replay")
    t_first, t_last = trace.samples[0].t, trace.samples[-1].t
    cut = duration_s is not None and t_last - t_first >= duration_s
    if cut:
        kept = [s for s in trace.samples if s.t - t_first < duration_s - 1e-9]
        trace = replace(trace, samples=kept)
        t_last = t_first + duration_s
    policy_name = policy_name or recorded_policy(trace) or "schedutil"
    lockstep = recorded_policy(trace) is not None and period_ms is None
    period = period_ms / 1000.0 if period_ms else trace.header.period_s
    duration = t_last - t_first
    if not lockstep and duration / period > MAX_TICKS:
        raise ReplayError(
            f"{path}: {duration:g} s at a {period:g} s period is more than {MAX_TICKS} ticks; "
            "give a longer --period-ms"
        )
    clock = VirtualClock(t_first)
    sysfs = ReplaySysfs(trace, clock, t0=0.0)  # replay time is trace time
    spec = trace_board(trace, sysfs)
    platform = Platform(spec, sysfs, NoProcesses(), clock, kind="replay")
    cfg = config if config is not None else Config()
    # the stack the daemon runs (run_live): policy, its stages, the reservation, the guard
    policy, stages = make_policy_stack(policy_name, spec, **policy_options(cfg, policy_name))
    stages = daemon_stages(stages, cfg.mixed_criticality.reserve)
    loop = ControlLoop(
        platform,
        policy,
        period_s=period,
        stages=stages,
        guard=config_guard(spec, config),
        deadline_margin=cfg.deadline_slack,
    )
    if lockstep:
        for s in trace.samples:
            if stop is not None and stop.is_set():
                break
            clock.set(max(s.t, clock.now()))
            loop.tick()
    else:
        loop.run(duration_s=duration if cut else max(duration, period), stop=stop)
    recorded = [(s.t, p, v) for s in trace.samples for p, v in (s.w or {}).items()]
    ours = list(sysfs.writes)
    mismatches = compare_writes(trace, ours) if recorded else []
    differing = sum(1 for m in mismatches if m.recorded is not None)
    return {
        "board": spec.name,
        "policy": policy_name,
        "lockstep": lockstep,
        "ticks": loop.ticks,
        "writes": ours,
        "recorded_writes": len(recorded),
        "mismatches": [str(m) for m in mismatches],
        # recorded writes the replay repeated with the same value on the same tick
        "matching_writes": len(recorded) - differing,
        # writes the replay made on a tick where the recording made none to that file
        "extra_writes": sum(1 for m in mismatches if m.recorded is None),
        "truncated": trace.truncated,
        "stopped": stop is not None and stop.is_set(),
        "status": loop.status(),
    }
