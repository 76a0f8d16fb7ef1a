"""``hidvfs daemon``, ``hidvfs status``, ``hidvfs run``."""

from __future__ import annotations

import functools
import io
import os
import shlex
import sys

import click

from tools.common import (
    Failed,
    FiniteFloatRange,
    _quiet_broken_pipe,
    check_outputs,
    emit_json,
    ensure_parent,
    fail,
    guard_errors,
    not_empty,
    same_file,
)


def _tell_systemd_why(fn):
    """A daemon that exits with an error says why in ``STATUS=`` when ``$NOTIFY_SOCKET`` is
    set (systemd shows it in ``systemctl status``): ``start refused: <reason>`` before it was
    ready (a malformed config, a busy state dir, a board it cannot control), ``failed:
    <reason>`` after (a restore that failed at stop). Nothing here claims readiness.

    Outside :func:`guard_errors`, which turns the expected errors into :func:`fail`: every
    refusal then arrives as a :class:`Failed` carrying the one line printed on stderr."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from daemon.notify import Notifier

        readies = Notifier.readies
        try:
            return fn(*args, **kwargs)
        except (Failed, Exception) as err:
            if isinstance(err, Failed):
                why = err.message if err.code else None
            else:  # a bug: its traceback follows on stderr
                why = f"{type(err).__name__}: {err}"
            if why is not None:
                what = "start refused" if Notifier.readies == readies else "failed"
                Notifier().status(f"{what}: {why}")
            raise

    return wrapper


class _DaemonCommand(click.Command):
    """A usage error (a mistyped option in ``ExecStart=``) is raised while click parses, before
    the command runs: say it to systemd as a refused start too, and put the reason on stderr
    at error priority when that is the journal (click's usage text follows at the default)."""

    def make_context(self, info_name, args, parent=None, **extra):
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except click.UsageError as err:
            from daemon.logs import under_journal
            from daemon.notify import Notifier

            why = err.format_message()
            Notifier().status(f"start refused: {why}")
            if under_journal():
                click.echo(f"<3>hidvfs: error: {why}", err=True)
            raise


@click.command("daemon", cls=_DaemonCommand)
@click.option(
    "--config",
    "config_path",
    default=None,
    type=click.Path(dir_okay=False),
    help="Config file (default /etc/hidvfs/config.yaml if present). With --sim or --replay only "
    "a file given here is read: --sim takes its policy, period_ms, deadline_slack, thermal, "
    "shield and mixed_criticality keys. --replay runs a `daemon --record` recording's jobs "
    "with its policy, ticks and config; a file given here sets the policy and period_ms (the "
    "replay then ticks at that period, not at the recorded ticks), and its thermal, "
    "deadline_slack, mixed_criticality and shield replace the recorded config (a key the file "
    "leaves out takes its default, not the recorded value).",
    callback=not_empty,
)
@click.option(
    "--sysfs-root",
    default=None,
    type=click.Path(exists=True, file_okay=False),
    help="Drive a tree under DIR instead of / (e.g. a fake tree).",
    callback=not_empty,
    metavar="DIR",
)
@click.option(
    "--sim",
    "sim_board",
    default=None,
    help="Run on the simulated BOARD with a virtual clock and the built-in BOTS workload.",
    callback=not_empty,
    metavar="BOARD",
)
@click.option(
    "--replay",
    "replay_trace",
    default=None,
    type=click.Path(exists=True, dir_okay=False),
    help="Run on a recorded trace (writes are captured, not applied).",
    callback=not_empty,
    metavar="TRACE",
)
@click.option(
    "--policy",
    default=None,
    help="Policy: hidvfs, geardvfs, ztt, performance, powersave, ondemand, conservative, "
    "schedutil, maxfreq. Default: the config's policy, hidvfs unless the config names another; "
    "--sim without --config: hidvfs; --replay without --config: the policy of the daemon that "
    "recorded the trace, else schedutil.",
    callback=not_empty,
    metavar="POLICY",
)
@click.option(
    "--period-ms",
    default=None,
    type=click.IntRange(1, 60000),
    help="Control period (default: the config's period_ms, 100 ms; with --sim and no --config "
    "50 ms).",
)
@click.option(
    "--duration",
    "duration_s",
    default=None,
    type=FiniteFloatRange(min=0.001),
    help="Stop after S seconds (virtual seconds with --sim, trace seconds from its first "
    "sample with --replay). Default: run until stopped; 60 virtual seconds with --sim, at most "
    "86400 (one day: its workload is built up front); the whole trace with --replay.",
)
@click.option(
    "--status-file",
    default=None,
    type=click.Path(dir_okay=False),
    help="Write a JSON status (time, frequencies, temperatures, power, jobs, energy) here.",
    callback=not_empty,
)
@click.option(
    "--socket",
    "socket_path",
    default=None,
    type=click.Path(dir_okay=False),
    help="Job-registry Unix socket (default /run/hidvfs/hidvfs.sock).",
    callback=not_empty,
)
@click.option(
    "--state-dir",
    default=None,
    type=click.Path(file_okay=False),
    help="Where the restore snapshot lives (default /var/lib/hidvfs).",
    callback=not_empty,
)
@click.option(
    "--dry-run", is_flag=True, help="Read and decide, but only print what would be written."
)
@click.option(
    "--seed",
    default=0,
    show_default=True,
    type=click.IntRange(min=0),
    help="Seed of the simulated workload (--sim only).",
)
@click.option(
    "--load",
    default=0.6,
    show_default=True,
    type=FiniteFloatRange(0.05, 3.0),
    help="Offered load of the simulated workload (--sim only).",
)
@click.option(
    "--record",
    "record_path",
    default=None,
    type=click.Path(dir_okay=False),
    help="Record every file the daemon reads and writes, one sample per tick, to this trace "
    "(.jsonl or .jsonl.gz); `hidvfs trace replay --check` then checks its decisions.",
    callback=not_empty,
)
@click.option(
    "--record-max-mb",
    default=1024.0,
    show_default=True,
    type=FiniteFloatRange(0.0, 1e6),
    help="Stop the --record trace (the daemon goes on) once its file reaches this size; 0: no "
    "limit. A .jsonl.gz takes about 1-2 MB per hour at 100 ms ticks, a plain .jsonl 50 x "
    "more. A recording the disk refuses stops the same way. An existing FILE is kept as "
    "FILE's name with .prev before its extensions (one previous run).",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print the final status as JSON on stdout (on a tree: when the run stops; --dry-run's "
    "plan then goes to stderr).",
)
@_tell_systemd_why
@guard_errors
def daemon_cmd(
    config_path,
    sysfs_root,
    sim_board,
    replay_trace,
    policy,
    period_ms,
    duration_s,
    status_file,
    socket_path,
    state_dir,
    dry_run,
    seed,
    load,
    record_path,
    record_max_mb,
    as_json,
) -> None:
    """Run the DVFS daemon: sense -> decide -> gate -> shield -> thermal guard -> actuate.

    On a board (as root, normally under systemd) it saves the original cpufreq settings, takes
    control, serves the job registry and restores everything on stop. With --sim it drives the
    simulated board faster than real time; with --replay it runs on a recorded trace.
    """
    chosen = [x for x in (sysfs_root, sim_board, replay_trace) if x]
    if len(chosen) > 1:
        fail("choose at most one of --sysfs-root, --sim, --replay")
    check_outputs(
        {"--status-file": status_file, "--record": record_path},
        {"--config": config_path, "--replay": replay_trace},
        sysfs_root,
    )
    if not sim_board:
        ctx = click.get_current_context()
        sim_only = [
            flag
            for flag, param in (("--seed", "seed"), ("--load", "load"))
            if ctx.get_parameter_source(param) is not click.core.ParameterSource.DEFAULT
        ]
        if sim_only:
            where = (
                "--replay replays a recording, it has no workload of its own"
                if replay_trace
                else "a board or a --sysfs-root tree runs the jobs registered with it"
            )
            fail(f"{', '.join(sim_only)}: only for --sim (its simulated workload); {where}")
    cfg = None
    if sim_board or replay_trace:
        board_only = [
            flag
            for flag, value in (
                ("--socket", socket_path),
                ("--state-dir", state_dir),
                ("--dry-run", dry_run),
                ("--record", record_path),
            )
            if value
        ]
        if board_only:
            fail(
                f"{', '.join(board_only)}: only for a board or a --sysfs-root tree; "
                "--sim and --replay write nothing real and serve no socket"
            )
        if config_path:
            from daemon.config import load_config

            cfg = load_config(config_path)

    if sim_board:
        from daemon.stopsignals import StopOnSignals
        from tools import simdaemon

        if duration_s is not None and duration_s > simdaemon.MAX_SIM_DURATION_S:
            fail(
                f"--duration: a --sim run lasts at most {simdaemon.MAX_SIM_DURATION_S:g} "
                f"virtual seconds (one day, its workload is built up front), not {duration_s:g}"
            )
        if status_file:  # its folder made (or refused) now, not at the first status
            ensure_parent("--status-file", status_file, replace="rename")
        # SIGTERM/SIGINT/SIGHUP stop it as they stop the board daemon: the summary of the run
        # so far, exit 0
        signals = StopOnSignals()
        duration_s = duration_s or 60.0
        status = simdaemon.run_sim_daemon(
            sim_board,
            policy or (cfg.policy if cfg else "hidvfs"),
            period_ms=period_ms or (cfg.period_ms if cfg else 50),
            duration_s=duration_s,
            status_file=status_file,
            seed=seed,
            load=load,
            config=cfg,
            signals=signals,
        )
        if signals.received:
            click.echo(
                f"hidvfs: {signals.received}: stopped at t={status['t']:.1f} of "
                f"{duration_s:g} virtual seconds",
                err=True,
            )
        if as_json:
            emit_json(status)
        else:
            _print_status(status)
        return
    if replay_trace:
        from daemon.stopsignals import StopOnSignals
        from tools.replay import replay_trace as run_replay

        replay_period = period_ms or (cfg.period_ms if cfg else None)
        if status_file:  # the status is written at the end: refused now, not then
            ensure_parent("--status-file", status_file, replace="rename")
        # as --sim: a signal ends the replay with the summary of what ran, exit 0
        with StopOnSignals() as signals:
            result = run_replay(
                replay_trace,
                policy or (cfg.policy if cfg else None),
                replay_period,
                config=cfg,
                duration_s=duration_s,
                stop=signals.stop,
            )
        if signals.received:
            click.echo(
                f"hidvfs: {signals.received}: replay stopped at t={result['status']['t']:.1f} s",
                err=True,
            )
        if status_file:
            from daemon.statusfile import write_status

            write_status(status_file, result["status"])
        if as_json:
            emit_json(result["status"])
        else:
            _print_status(result["status"])
        return
    from daemon.service import run_live
    from tools.cmd_trace import writes_to_stdout

    # --record /dev/stdout: stdout is the trace alone, so neither the JSON status nor a dry
    # run's plan may land in it (the status overwrote its header, or ended it with a non-JSON
    # line)
    trace_on_stdout = bool(record_path) and writes_to_stdout(record_path)
    if as_json and trace_on_stdout:
        fail(
            f"--json prints the status on stdout, where --record {record_path} writes the "
            "trace; record to a file or another stream (/dev/fd/3), or leave out --json"
        )
    if (
        record_path
        and same_file(record_path, sys.stderr)
        and os.path.realpath(record_path) != os.devnull  # nothing is kept there to mix
    ):
        # the daemon logs to stderr all run long: its lines would break the trace's JSON lines
        fail(
            f"--record {record_path} is this command's stderr, where the daemon logs; its "
            "lines would land in the trace: record to a file or another stream (/dev/fd/3)"
        )
    status = run_live(
        config_path=config_path,
        sysfs_root=sysfs_root or "/",
        policy=policy,
        period_ms=period_ms,
        duration_s=duration_s,
        status_file=status_file,
        socket_path=socket_path,
        state_dir=state_dir,
        dry_run=dry_run,
        record=record_path,
        record_max_bytes=int(record_max_mb * 1e6) if record_max_mb > 0 else None,
        # stdout is the JSON status (or the trace) alone: the dry run's plan goes to stderr
        plan_out=sys.stderr if as_json or trace_on_stdout else None,
    )
    if as_json:
        emit_json(status)


def _print_status(s: dict) -> None:
    if not s.get("ticks"):  # stopped before its first tick (a signal while --sim built its
        # workload): no frequency, temperature or energy was ever read
        click.echo(
            f"board {s['board']} ({s['backend']}), policy {s['policy']}: stopped before its "
            "first tick; nothing ran"
        )
        return
    freqs = ", ".join(
        f"{k} {v // 1000 if v else '?'} MHz" for k, v in s.get("freq_khz", {}).items()
    )
    temps = s.get("temp_c", {})
    tmax = max(temps.values()) if temps else None
    energy = s.get("energy_j")
    click.echo(
        f"board {s['board']} ({s['backend']}), policy {s['policy']}: t={s['t']:.1f}s ticks={s['ticks']}\n"
        f"  frequencies: {freqs}\n"
        f"  hottest zone: {tmax if tmax is None else round(tmax, 1)} C; "
        f"power: {_power_text(s.get('power_w'))}; "
        f"energy: {'unavailable' if energy is None else f'{energy:.1f} J'}\n"
        f"  jobs done {s['jobs_done']}{_failed_text(s.get('jobs_failed'))}, "
        f"running {s['jobs_running']}{_late_text(s.get('jobs_overdue'))}, "
        f"deadline misses hi={s['deadline_misses']['hi']} lo={s['deadline_misses']['lo']}, "
        f"interventions {s['interventions']}"
    )
    held = s.get("reserved")
    if held:
        click.echo(
            "  reserved for HI jobs: "
            + ", ".join(f"{name} -> pid {pid}" for name, pid in sorted(held.items()))
        )
    sharing = s.get("shared_hi")
    if sharing:
        click.echo(
            "  HI jobs above LO work on: "
            + ", ".join(
                f"{name} -> pid {', '.join(map(str, pids))}"
                for name, pids in sorted(sharing.items())
            )
        )
    sh = s.get("shield")
    if sh:
        rate = "-" if sh["miss_rate"] is None else f"{sh['miss_rate']:.3f}"
        click.echo(
            f"  adaptive shield: alpha {sh['alpha']:g} -> {sh['alpha_t']:.4f} after "
            f"{sh['updates']} bounds scored (miss rate {rate})"
        )


def _failed_text(failed) -> str:
    """`` (2 failed: hi=0 lo=2)`` after the jobs done: those whose command failed (a non-zero
    exit, a signal, stopped), neither met nor missed; nothing when none (or an older daemon)."""
    if not isinstance(failed, dict) or not any(failed.values()):
        return ""
    return f" ({sum(failed.values())} failed: hi={failed.get('hi', 0)} lo={failed.get('lo', 0)})"


def _late_text(overdue) -> str:
    """`` (1 LATE)`` after the running jobs: those past their deadline right now."""
    if not isinstance(overdue, dict) or not any(overdue.values()):
        return ""
    return f" ({sum(overdue.values())} LATE)"


def _power_text(power) -> str:
    """``3.21 W (CPU 1.02 W)``: the board's total input rail and its CPU rail, each only when
    it reads; ``unavailable`` when neither does (a board without a power monitor)."""
    power = power if isinstance(power, dict) else {}
    total, cpu = power.get("total"), power.get("cpu")
    if total is None and cpu is None:
        return "unavailable"
    text = "total unavailable" if total is None else f"{total:.2f} W"
    return text + (f" (CPU {cpu:.2f} W)" if cpu is not None else "")


@click.command("status")
@click.option(
    "--socket",
    "socket_path",
    default="/run/hidvfs/hidvfs.sock",
    show_default=True,
    callback=not_empty,
    help="The daemon's socket.",
    metavar="SOCKET",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@guard_errors
def status_cmd(socket_path: str, as_json: bool) -> None:
    """Show the running daemon's live state (frequencies, temperatures, power, jobs)."""
    from daemon.client import RegistryClient

    status = RegistryClient(socket_path).status()
    if as_json:
        emit_json(status)
        return
    try:
        _print_status(status)
        _print_jobs(status)
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        what = f"no field {err}" if isinstance(err, KeyError) else str(err)
        fail(
            f"the daemon at {socket_path} answered a status this hidvfs cannot read ({what}); "
            "is it another hidvfs version? `hidvfs status --json` shows the answer"
        )


def _print_jobs(status: dict) -> None:
    for j in status.get("jobs", []):
        dl = j.get("deadline_s")
        prof = j.get("profile_version")
        elapsed = j.get("elapsed_s", 0)
        over = j.get("overdue_s")  # (an older daemon does not say: worked out here)
        if over is None and dl is not None:
            over = max(0.0, elapsed - dl)
        click.echo(
            f"  job {j['pid']} {j['name']} ({j['criticality']}): running {elapsed:.1f} s"
            + (f" of a {dl:g} s deadline" if dl is not None else ", no deadline")
            + (f", LATE by {over:.1f} s" if over and over >= 1 else "")
            + (f", LATE by {over:.2f} s" if over and over < 1 else "")
            + (f", profile v{prof}" if prof else (", no profile" if dl is not None else ""))
        )


@click.command("run", context_settings={"allow_interspersed_args": False})
@click.option(
    "--deadline",
    "deadline_s",
    default=None,
    type=FiniteFloatRange(min=0.001),
    help="Soft deadline in seconds.",
)
@click.option(
    "--slack",
    default=None,
    type=FiniteFloatRange(min=1.0, max=1000.0),
    help="Instead of --deadline: the soft deadline is SLACK x the job's reference makespan, "
    "from the profile stored under its --name (`hidvfs profile measure`); a job without one "
    "is refused.",
)
@click.option(
    "--criticality",
    default="lo",
    show_default=True,
    type=click.Choice(["hi", "lo"], case_sensitive=False),
    help="hi jobs get a reserved cluster (HI/LO in any case).",
)
@click.option(
    "--name", default=None, help="Job name (default: the command's basename).", metavar="NAME"
)
@click.option(
    "--socket",
    "socket_path",
    default="/run/hidvfs/hidvfs.sock",
    show_default=True,
    callback=not_empty,
    help="The daemon's socket.",
    metavar="SOCKET",
)
@click.option(
    "--if-no-daemon",
    "if_no_daemon",
    default="fail",
    show_default=True,
    type=click.Choice(["fail", "run"]),
    help="When the daemon cannot be reached: fail (exit 2, nothing launched) or run CMD "
    "unmanaged, with a warning (its deadline is then neither planned nor protected).",
)
@click.option(
    "--json", "as_json", is_flag=True, help="Print the result as JSON (on stderr, after CMD's own)."
)
@click.option(
    "--json-out",
    "json_out",
    default=None,
    metavar="PATH",
    help="Write the result as JSON to PATH instead (a file, or /dev/fd/3 with `3>r.json`), "
    "apart from CMD's stderr, for scripts.",
    callback=not_empty,
)
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@guard_errors
def run_cmd(
    deadline_s, slack, criticality, name, socket_path, if_no_daemon, as_json, json_out, command
) -> None:
    """Launch CMD, register it with the daemon, wait, and report its makespan; exit with
    CMD's status (128 + N when hidvfs run is stopped by signal N, which it passes on to CMD;
    127 when CMD is not found, 126 when it cannot be executed, as a shell).

    CMD's stdin, stdout and stderr are its own: stdout passes through untouched (as with
    `time` or `nice`), and the summary line, or with --json the result object, goes to
    stderr (--json-out PATH writes the object to PATH instead, apart from CMD's stderr). A CMD that fails (non-zero exit, killed by a signal, or stopped by a signal
    hidvfs run got) is not scored against its deadline: the daemon counts it as failed.

    Everything from CMD on is CMD's, options too; `--` before CMD is optional.

    Example: hidvfs run --deadline 5 --criticality hi -- ./fib.gcc.omp-tasks -n 30

    Or with a deadline of 1.5 x the reference makespan measured for the name:
    hidvfs run --name fib --slack 1.5 -- ./fib.gcc.omp-tasks -n 30
    """
    import contextlib
    import signal

    from daemon.client import DaemonUnreachable, NotASocket, run_registered
    from platforms.liveprocs import LaunchError

    criticality = criticality.lower()  # the protocol's hi/lo (--criticality HI is fine)

    if deadline_s is not None and slack is not None:
        fail("give --deadline or --slack, not both")
    if json_out is not None:  # its folder made, or refused, before CMD is launched
        ensure_parent("--json-out", json_out)
        _check_json_out(json_out)

    def warn(text: str) -> None:
        """A warning that cannot be written (stderr closed) must not stop the job."""
        try:
            click.echo(f"hidvfs: warning: {text}", err=True)
        except OSError:
            pass

    def unplanned(job: dict) -> None:
        if deadline_s is not None and job.get("profile_version") is None:
            warn(
                f"no reference profile for {job['name']!r} on this board, so the daemon cannot "
                "plan its deadline; measure one with: sudo hidvfs profile measure --name "
                f"{shlex.quote(job['name'])} -- {shlex.join(command)}"
            )

    def unmanaged(job: dict) -> None:
        warn(f"{job['name']!r} is unmanaged: {job['unmanaged']}")

    try:
        result = run_registered(
            list(command),
            deadline_s=deadline_s,
            criticality=criticality,
            name=name,
            socket_path=socket_path,
            on_registered=unplanned,
            run_if_unreachable=if_no_daemon == "run",
            on_unmanaged=unmanaged,
            slack=slack,
        )
    except LaunchError as err:  # not found (127) or not executable (126), as a shell says
        fail(str(err), code=err.exit_code)
    except DaemonUnreachable as err:
        if isinstance(err, NotASocket):  # a wrong --socket: its own fix, said alone
            raise
        # the way to run it all the same, said where the user is stopped
        fail(
            f"{err}; or add --if-no-daemon run before the command to run it without the "
            "daemon (unmanaged: its deadline neither planned nor protected)"
        )
    stopped_by = result.get("stopped_by")
    # as a shell: a run stopped by a signal exits 128 + its number, whatever CMD made of it
    code = 128 + signal.Signals[stopped_by] if stopped_by else result["returncode"]
    # the report goes to stderr: CMD's stdout is CMD's alone (`hidvfs run -- cmd | consumer`)
    if json_out is not None:
        from platforms.outputs import open_output

        try:  # never through another user's link, nor a file with other hard links
            with (
                io.TextIOWrapper(open_output(json_out, "--json-out"), encoding="utf-8") as f,
                contextlib.redirect_stdout(f),
            ):
                emit_json(result)
        except OSError as err:  # the result is lost, not CMD's status
            warn(f"--json-out {json_out}: cannot write the result ({err.strerror or err})")
        raise SystemExit(code)
    try:
        if as_json:
            with contextlib.redirect_stdout(sys.stderr):
                emit_json(result)
        else:
            click.echo(_run_summary(result), err=True)
    except OSError:  # a closed stderr, a hung-up terminal: the report is lost,
        _quiet_broken_pipe(code)  # not CMD's status
    raise SystemExit(code)


def _check_json_out(path: str) -> None:
    """Refuse a --json-out that is CMD's own stdout or stderr (the result would replace what
    CMD wrote there), and remove an earlier run's result at ``path``, so a run that fails
    before its end (CMD not found, no daemon) leaves no stale result for a script to read."""
    import os
    import stat

    try:
        st = os.stat(path)
    except OSError:
        return  # not there yet: made at the end
    if not stat.S_ISREG(st.st_mode):
        return  # a stream (/dev/fd/3, a FIFO): nothing to remove
    for stream, name in ((sys.stdout, "stdout"), (sys.stderr, "stderr")):
        if same_file(path, stream):
            fail(
                f"--json-out {path} is this command's {name}: the result would replace CMD's {name}"
            )
    try:
        with open(path, "r+b") as f:  # truncated, not unlinked: its mode and owner stay
            f.truncate(0)
    except OSError as err:
        fail(f"--json-out {path}: cannot write it ({err.strerror or err})")


def _run_summary(result: dict) -> str:
    """``NAME: exit N, makespan S s`` and what became of its deadline: met, MISSED, or not
    scored when the command failed or was stopped (so it is neither)."""
    met, dl, failure = result.get("deadline_met"), result.get("deadline_s"), result.get("failure")
    stopped_by = result.get("stopped_by")
    if dl is None:
        tail = ""
    elif failure is not None:
        if failure.startswith("stopped"):
            why = failure
        elif failure.startswith("killed"):
            why = f"the command was {failure}"
        else:
            why = f"the command failed ({failure})"
        tail = f" (deadline {dl:.3f} s: not scored, {why})"
    elif met:
        tail = f" (deadline {dl:.3f} s met)"
    else:
        tail = f" (DEADLINE {dl:.3f} s MISSED)"
    if stopped_by and f"stopped by {stopped_by}" not in tail:
        tail += f" (stopped by {stopped_by})"
    return f"{result['name']}: exit {result['returncode']}, makespan {result['makespan_s']:.3f} s{tail}"
