"""``hidvfs trace record|replay|info``."""

from __future__ import annotations

import contextlib
import math
import os
import stat
import sys

import click

from tools.common import (
    FiniteFloatRange,
    Friendly,
    emit_json,
    ensure_parent,
    fail,
    not_empty,
    same_file,
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
    if out == "-":  # no hidvfs output takes '-' for stdout: it wrote a file named '-'
        return (
            "--out -: '-' is not stdout here; give --out /dev/stdout to write the trace to "
            "stdout, or ./- for a file named '-'"
        )
    real = os.path.realpath(out)  # a symlink into the tree is inside it
    for tree in trees:
        if os.path.commonpath([real, tree]) == tree:
            return (
                f"--out {out} is inside the tree it records ({tree}); write the trace "
                "outside --sysfs-root"
            )
    return None


def writes_to_stdout(path: str) -> bool:
    """Whether an output ``path`` lands where ``click.echo`` prints (``--out /dev/stdout``,
    ``> trace.jsonl`` with the same file): a line printed there would corrupt it."""
    return same_file(path, sys.stdout)


def summary_to_stderr(out: str) -> bool:
    """A command's summary line goes to stderr when its trace ``out`` is a stream (/dev/stdout,
    a FIFO, a pipe) or stdout's own file, unless that stream is stderr's: the trace alone is
    then what its reader gets."""
    from platforms.outputs import is_stream_path

    if writes_to_stdout(out):
        return True
    return is_stream_path(out) and not same_file(out, sys.stderr)


def _stop_once_open():
    """The stop signals of ``trace record``: until :meth:`opened` is called (its first sample
    is in), SIGTERM, SIGINT and SIGHUP raise KeyboardInterrupt ("interrupted", exit 130);
    after it they set ``stop``, which ends the recording with a complete file (exit 0).

    An open() that waits (a FIFO with no reader) is retried by Python after a handler that
    returns, so only a handler that raises ends it; once the file is open, a clean stop is
    what keeps its gzip trailer."""
    from daemon.stopsignals import StopOnSignals

    class StopOnceOpen(StopOnSignals):
        is_open = False

        def opened(self, *_args: object) -> None:
            self.is_open = True

        def _handle(self, signum: int, frame: object) -> None:
            super()._handle(signum, frame)
            if not self.is_open:
                raise KeyboardInterrupt(self.received)

    return StopOnceOpen()


@contextlib.contextmanager
def _interrupting(stopped: str):
    """While active, SIGTERM, SIGINT and SIGHUP raise KeyboardInterrupt (the CLI says
    "interrupted: <what>" and exits 130; ``stopped`` says what), SIGINT also when it was
    ignored at the start (``cmd &`` in a script), as the stop handlers of `trace record` take
    it. Yields the installed :class:`daemon.stopsignals.InterruptOnSignals`: its ``stop`` is
    set too, so a loop whose own handling swallowed the interrupt still ends, and is
    interrupted then."""
    from daemon.stopsignals import STOP_SIGNALS, InterruptOnSignals

    class InterruptOnStopSignals(InterruptOnSignals):
        SIGNALS = STOP_SIGNALS

    signals = InterruptOnStopSignals()
    try:
        with signals:
            yield signals
            if signals.received:
                raise KeyboardInterrupt(signals.received)
    except KeyboardInterrupt as err:
        err.hint = f"{signals.received or 'SIGINT'}: {stopped}"
        raise


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
    help="Sampling period. A sample takes as long as reading the tree; where that is longer, "
    "the grid points it overran are skipped (never caught up in a burst) and the summary "
    "says how many.",
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
    end the recording early with a complete file (exit 0); before its first sample (an --out
    FIFO that no reader has opened) they interrupt it (exit 130). An existing --out file is
    kept under its name with .prev before its extensions (one previous recording). With
    --out /dev/stdout (or a FIFO) the summary line goes to stderr.
    """
    from platforms import paths
    from platforms.clock import MonotonicClock
    from platforms.cpufreq import list_policies
    from platforms.probe import detect_board
    from platforms.spec import board_names
    from platforms.sysfs import DirSysfs
    from platforms.trace import (
        is_recording_to_keep,
        keep_previous_recording,
        previous_name,
        record,
    )

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
    # its folder made (or refused) now, not when the trace opens. An earlier recording there
    # (a non-empty regular file) is moved to its .prev name, as `daemon --record` keeps it;
    # an empty file is written over, a stream (/dev/stdout, a FIFO) written as it is
    moved = is_recording_to_keep(out)
    ensure_parent("--out", out, replace="rename" if moved else "open")
    if moved:
        ensure_parent("--out", previous_name(out), replace="rename")
    clock = MonotonicClock()
    started = clock.now()
    kept = keep_previous_recording(out)
    if kept:
        click.echo(f"hidvfs: the previous {out} is kept as {kept}", err=True)
    # a signal stops the recording and the file is closed as at the end (a SIGTERM's default
    # would leave a .gz without its trailer, which replay refuses); before the first sample
    # (an open waiting for a FIFO's reader) it interrupts: exit 130
    signals = _stop_once_open()
    last_t = 0.0

    def on_sample(count: int, t: float) -> None:
        nonlocal last_t
        last_t = t
        signals.opened(count, t)

    try:
        with signals:
            n = record(
                sysfs,
                clock,
                out,
                period_s=period_ms / 1000.0,
                duration_s=duration_s,
                board=board,
                stop=signals.stop,
                on_sample=on_sample,
            )
    except KeyboardInterrupt as err:
        waiting = os.path.exists(out) and stat.S_ISFIFO(os.stat(out).st_mode)
        err.hint = (  # what the CLI's "interrupted" line says
            f"{signals.received or 'SIGINT'} before the first sample; nothing recorded to {out}"
            + (" (no reader opened the FIFO)" if waiting and not signals.is_open else "")
        )
        raise
    early = (
        f" (stopped by {signals.received} after {clock.now() - started:.1f} of {duration_s:g} s)"
        if signals.received
        else ""
    )
    slow = "" if signals.received else skipped_samples_note(n, last_t, duration_s, period_ms)
    # the trace alone on stdout when it is written there (--out /dev/stdout)
    click.echo(
        f"recorded {n} samples of board {board} to {out}{early}{slow}",
        err=summary_to_stderr(out),
    )


def skipped_samples_note(n: int, last_t: float, duration_s: float, period_ms: int) -> str:
    """What the summary adds when a sample took longer than the period, so the recorder
    skipped grid points (it never bursts to catch up): how many, and the spacing the trace
    has instead. Empty when at most a tenth of the grid was skipped."""
    grid = max(1, math.ceil(duration_s * 1000.0 / period_ms - 1e-9))
    if n >= 0.9 * grid:
        return ""
    spacing = f", {last_t / (n - 1) * 1000:.1f} ms apart on average" if n > 1 else ""
    return (
        f"; {grid - n} of the {grid} sample times of a {period_ms} ms period were skipped: "
        f"reading the tree took longer{spacing} (a longer --period-ms samples evenly)"
    )


@trace.command("info")
@click.argument("trace_file", type=click.Path(exists=True, dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def info_cmd(trace_file: str, as_json: bool) -> None:
    """Summarise a trace: board, who recorded it (a daemon: its policy), length, files, sample
    rate, temperature and frequency ranges.

    A recording cut short (a crash, kill -9) is summarised up to its last whole sample and
    said so (TRUNCATED; "truncated" in --json), exit 0: `trace replay` refuses it without
    --allow-truncated.
    """
    from platforms.trace import RECORDED_BY, format_info, read_trace, trace_info

    tr = read_trace(trace_file, allow_truncated=True)
    info = trace_info(tr)  # says TRUNCATED if so
    by = tr.header.extra.get(RECORDED_BY)
    policy = tr.header.extra.get("policy") if by == "daemon" else None
    info.setdefault(RECORDED_BY, by if isinstance(by, str) else None)
    info.setdefault("policy", policy if isinstance(policy, str) else None)
    if as_json:
        emit_json(info)
        return
    lines = format_info(info).splitlines()
    for i, line in enumerate(lines):
        if line.startswith("TRUNCATED"):
            lines[i] = f"{line} (replay it with --allow-truncated)"
    lines.insert(min(2, len(lines)), f"recorded  {_recorded_by(info)}")
    click.echo("\n".join(lines))


def _recorded_by(info: dict) -> str:
    """Who made the trace, as `trace info` says it: the daemon (and its policy) or `trace
    record`, and whether `trace replay --check` has writes to compare."""
    by, policy = info.get("recorded_by"), info.get("policy")
    if by == "daemon":
        text = f"by the daemon (daemon --record), policy {policy or 'not named'}"
        if not info.get("writes"):
            text += "; no writes (a --dry-run): nothing for replay --check to compare"
        return text
    if by:
        return f"by {by}"
    return "by trace record (the board alone, no daemon writes for replay --check)"


@trace.command("replay")
@click.argument("trace_file", type=click.Path(exists=True, dir_okay=False))
@click.option(
    "--policy",
    default=None,
    help="Policy to run against the trace (default: the recording daemon's, else schedutil).",
    metavar="POLICY",
    callback=not_empty,  # '' (an unset variable) is refused, not read as "the default"
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
@click.option(
    "--config",
    "config_path",
    default=None,
    type=click.Path(exists=True, dir_okay=False),
    help="A daemon config file whose decision settings (thermal, deadline_slack, "
    "mixed_criticality, shield) replace those the recording stores (default: those, else the "
    "defaults); its policy and period_ms are not read (--policy, --period-ms).",
    metavar="FILE",
)
def replay_cmd(
    trace_file: str,
    policy: str | None,
    period_ms: int | None,
    allow_truncated: bool,
    check: bool,
    as_json: bool,
    config_path: str | None,
) -> None:
    """Run the daemon's control loop on a recorded trace and show its decisions.

    The daemon reads the recorded files on a virtual clock; its writes are captured, never
    applied, and compared with what the recording daemon wrote (a trace from
    `hidvfs daemon --record` is replayed at its tick times, so every write compares).
    SIGINT, SIGTERM or SIGHUP interrupt it (exit 130), also while it waits for the writer of
    a FIFO.
    """
    from platforms.trace_io import TraceError
    from tools.common import fail
    from tools.replay import replay_trace

    config = None
    if config_path:
        from daemon.config import load_config

        config = load_config(config_path)
    if check and period_ms is not None:  # a fixed grid misplaces writes against the samples
        fail(
            "--check replays at the recorded ticks, so it takes no --period-ms; leave "
            "--period-ms out (or --check, to see the decisions at another period)"
        )
    # SIGTERM and SIGHUP end a replay as Ctrl-C does ("interrupted", exit 130): it writes
    # nothing, so nothing is left to finish; and an open() waiting for a FIFO's writer is
    # retried after a handler that only sets a flag, so only one that raises ends it
    stopped = f"the replay of {trace_file} stopped before the trace's end" + (
        "; nothing checked" if check else ""
    )
    with _interrupting(stopped) as signals:
        try:
            result = replay_trace(
                trace_file,
                policy,
                period_ms,
                config,
                allow_truncated=allow_truncated,
                stop=signals.stop,
            )
        except TraceError as err:
            if "truncated" in str(err) and not allow_truncated:
                fail(f"{err}; replay the complete part with --allow-truncated")
            raise
    if check and not result["recorded_writes"]:
        fail(
            f"{trace_file}: holds no writes (recorded by `trace record`, or by a daemon with "
            "--dry-run), so --check has nothing to compare; record with `hidvfs daemon "
            "--record` without --dry-run"
        )
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
        n = len(result["mismatches"])
        fail(f"{n} {'write differs' if n == 1 else 'writes differ'} from the recording", code=1)
