"""``hidvfs trace record|replay|info``."""

from __future__ import annotations

import os

import click

from tools.common import (
    FiniteFloatRange,
    Friendly,
    emit_json,
    ensure_parent,
    fail,
    trusted_sysfs_root,
)


@click.group("trace", cls=Friendly)
def trace() -> None:
    """Record what the daemon reads on a board, and replay it without hardware.

    A trace is JSON lines (optionally gzipped): a header naming the board, then one sample per
    period with every file read (and what the daemon wrote).
    """


def _out_problem(out: str, trees: list[str]) -> str | None:
    """Why ``--out`` cannot take the trace, said before anything is recorded (open() names
    neither the option nor the fix), else None. ``trees``: the folders being recorded; a
    trace written in one would overwrite, or be sampled as, a file of the board. A missing
    folder is no problem: :func:`platforms.outputs.ensure_parent` makes it before the recording."""
    if not out:
        return "--out: empty path; give the trace file to write (.jsonl or .jsonl.gz)"
    real = os.path.realpath(out)  # a symlink into the tree is inside it
    for tree in trees:
        if os.path.commonpath([real, tree]) == tree:
            return (
                f"--out {out} is inside the tree it records ({tree}); write the trace "
                "outside --sysfs-root"
            )
    return None


@trace.command("record")
@click.option(
    "--out",
    "out",
    required=True,
    type=click.Path(dir_okay=False),
    help="Trace file (.jsonl or .jsonl.gz).",
)
@click.option(
    "--sysfs-root",
    default="/",
    show_default=True,
    type=click.Path(exists=True, file_okay=False),
    callback=trusted_sysfs_root,
    help="Tree to sample.",
)
@click.option(
    "--period-ms",
    default=100,
    show_default=True,
    type=click.IntRange(1, 60000),
    help="Sampling period.",
)
@click.option(
    "--duration",
    "duration_s",
    default=10.0,
    show_default=True,
    type=FiniteFloatRange(min=0.001),
    help="Seconds to record.",
)
@click.option(
    "--board",
    default=None,
    help="Board name for the header: a shipped board or 'unknown' (default: detected).",
    metavar="BOARD",
)
def record_cmd(
    out: str, sysfs_root: str, period_ms: int, duration_s: float, board: str | None
) -> None:
    """Sample every file the daemon reads (cpufreq, thermal, rails, /proc/stat) into a trace.

    This records the board alone; `hidvfs daemon --record FILE` records what a running daemon
    read and wrote on each tick, so a replay can check its decisions. SIGINT, SIGTERM or SIGHUP
    end the recording early with a complete file (exit 0).
    """
    from daemon.stopsignals import StopOnSignals
    from platforms import paths
    from platforms.clock import MonotonicClock
    from platforms.cpufreq import list_policies
    from platforms.probe import detect_board
    from platforms.spec import board_names
    from platforms.sysfs import DirSysfs
    from platforms.trace import record

    if board is not None and board not in (*board_names(), "unknown"):
        raise click.BadParameter(
            f"{board!r} is not a known board ({', '.join(board_names())}, or unknown)",
            param_hint="--board",
        )
    sysfs = DirSysfs(sysfs_root)
    # what is recorded: the tree itself, or a full root's sys/ and proc/ (not the whole of /)
    trees = sorted({os.path.realpath(sysfs.abspath(p)) for p in ("", "proc")})
    problem = _out_problem(out, trees)
    if problem:
        fail(problem)
    if not list_policies(sysfs):  # as the daemon refuses it: a trace of nothing to control
        fail(
            f"--sysfs-root {sysfs_root}: no cpufreq policy found under "
            f"{sysfs.abspath(paths.CPUFREQ)}: nothing to record (give the root of a board's "
            f"tree; try `hidvfs probe --sysfs-root {sysfs_root}`)"
        )
    detected = detect_board(sysfs)
    if board not in (None, "unknown") and detected and detected != board:
        raise click.BadParameter(
            f"{board!r}, but the board under {sysfs.root} is detected as {detected!r} (leave "
            "--board out: it is detected)",
            param_hint="--board",
        )
    board = board or detected or "unknown"
    # its folder made (or refused) now, not when the trace opens; a file there is written over
    ensure_parent("--out", out, replace="open")
    clock = MonotonicClock()
    started = clock.now()
    # a signal stops the recording and the file is closed as at the end (a SIGTERM's default
    # would leave a .gz without its trailer, which replay refuses)
    with StopOnSignals() as signals:
        n = record(
            sysfs,
            clock,
            out,
            period_s=period_ms / 1000.0,
            duration_s=duration_s,
            board=board,
            stop=signals.stop,
        )
    early = (
        f" (stopped by {signals.received} after {clock.now() - started:.1f} of {duration_s:g} s)"
        if signals.received
        else ""
    )
    click.echo(f"recorded {n} samples of board {board} to {out}{early}")


@trace.command("info")
@click.argument("trace_file", type=click.Path(exists=True, dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def info_cmd(trace_file: str, as_json: bool) -> None:
    """Summarise a trace: board, length, files, sample rate, temperature and frequency ranges."""
    from platforms.trace import format_info, read_trace, trace_info

    info = trace_info(read_trace(trace_file, allow_truncated=True))  # says TRUNCATED if so
    if as_json:
        emit_json(info)
    else:
        click.echo(format_info(info))


@trace.command("replay")
@click.argument("trace_file", type=click.Path(exists=True, dir_okay=False))
@click.option(
    "--policy",
    default=None,
    help="Policy to run against the trace (default: the recording daemon's, else schedutil).",
    metavar="POLICY",
)
@click.option(
    "--period-ms",
    default=None,
    type=click.IntRange(1, 60000),
    help="Decision period (default: the trace's).",
)
@click.option(
    "--allow-truncated",
    is_flag=True,
    help="Replay the complete samples of a recording that was cut short (a crash, kill -9).",
)
@click.option(
    "--check",
    is_flag=True,
    help="Exit 1 unless every write matches the recording (a trace from `daemon --record`).",
)
@click.option(
    "--json", "as_json", is_flag=True, help="Print the writes, the comparison and the status."
)
def replay_cmd(
    trace_file: str,
    policy: str | None,
    period_ms: int | None,
    allow_truncated: bool,
    check: bool,
    as_json: bool,
) -> None:
    """Run the daemon's control loop on a recorded trace and show its decisions.

    The daemon reads the recorded files on a virtual clock; its writes are captured, never
    applied, and compared with what the recording daemon wrote (a trace from
    `hidvfs daemon --record` is replayed at its tick times, so every write compares).
    """
    from daemon.stopsignals import StopOnSignals
    from platforms.trace_io import TraceError
    from tools.common import fail
    from tools.replay import replay_trace

    with StopOnSignals() as signals:
        try:
            result = replay_trace(
                trace_file, policy, period_ms, allow_truncated=allow_truncated, stop=signals.stop
            )
        except TraceError as err:
            if "truncated" in str(err) and not allow_truncated:
                fail(f"{err}; replay the complete part with --allow-truncated")
            raise
    if signals.received:
        click.echo(f"hidvfs: {signals.received}: replay stopped before the trace's end", err=True)
        if check:
            fail(f"{trace_file}: the replay was stopped ({signals.received}); nothing checked")
    if check and not result["recorded_writes"]:
        fail(f"{trace_file}: --check needs a trace with the daemon's writes (daemon --record)")
    same = not result["mismatches"]
    if as_json:
        emit_json(result)
    else:
        click.echo(
            f"replayed {result['ticks']} ticks of {result['board']} under {result['policy']}: "
            f"{len(result['writes'])} writes; {result['recorded_writes']} recorded writes, "
            f"{result['matching_writes']} identical, {result['extra_writes']} extra"
        )
        if result["truncated"]:
            click.echo(f"  the recording was cut short ({result['truncated']})")
        for m in result["mismatches"][:20]:
            click.echo(f"  differs: {m}")
        if not result["recorded_writes"]:
            for t, path, value in result["writes"][:20]:
                click.echo(f"  t={t:8.3f}s {path} <- {value}")
    if check and not same:
        fail(f"{len(result['mismatches'])} writes differ from the recording", code=1)
