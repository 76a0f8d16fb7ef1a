"""``hidvfs profile measure|list``: the reference profiles the gate and the shield plan with.

A job registered by name (``hidvfs run --name``) gets its profile from the store the daemon
reads (config ``profiles``); without one the policy still steers it, but its deadline cannot
be planned. ``measure`` times a real program on the board's reference cluster and records it.
"""

from __future__ import annotations

import os
import shlex

import click

from tools.common import Friendly, emit_json, fail

DEFAULT_STORE = "/var/lib/hidvfs/profiles.json"


def measure_options(f):
    """The options every measuring command shares (``profile measure``, ``bots profile``):
    the store, the tree and board, the snapshot folder, the daemon's socket, a timeout and
    whether a different profile may replace the stored one."""
    for opt in reversed(
        (
            click.option(
                "--store",
                default=DEFAULT_STORE,
                show_default=True,
                help="Profile store (the daemon's and the native campaigns').",
            ),
            click.option(
                "--sysfs-root",
                default="/",
                show_default=True,
                type=click.Path(exists=True, file_okay=False),
                help="Tree to drive (a fake tree to try it).",
            ),
            click.option(
                "--board", default=None, help="Board spec name or .yaml (default: detect)."
            ),
            click.option(
                "--state-dir",
                default="/var/lib/hidvfs",
                show_default=True,
                help="Where the restore snapshot is kept during the measurement.",
            ),
            click.option(
                "--socket",
                "socket_path",
                default="/run/hidvfs/hidvfs.sock",
                show_default=True,
                help="The daemon's socket (the daemon must not run during a measurement).",
            ),
            click.option(
                "--timeout",
                "timeout_s",
                type=click.FloatRange(0.1),
                default=600.0,
                show_default=True,
                help="Seconds before a run is killed (that measurement then fails).",
            ),
            click.option(
                "--replace", is_flag=True, help="Record a new version where a different one exists."
            ),
        )
    ):
        f = opt(f)
    return f


@click.group("profile", cls=Friendly)
def profile() -> None:
    """Reference profiles: a job's measured cost, from which deadlines are planned."""


@profile.command("measure", context_settings={"ignore_unknown_options": True})
@click.option("--name", default=None, help="Job name (default: the command's basename).")
@measure_options
@click.option(
    "--repeat",
    type=click.IntRange(1, 20),
    default=1,
    show_default=True,
    help="Runs per configuration; the fastest counts (less noise from other load).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the profile as JSON.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def measure_cmd(
    name,
    store,
    sysfs_root,
    board,
    state_dir,
    socket_path,
    repeat,
    timeout_s,
    replace,
    as_json,
    command,
) -> None:
    """Time CMD three times on the reference cluster (all cores and one core at the top OPP,
    all cores at about half) and store its profile.

    Example: sudo hidvfs profile measure --name fib -- ./fib.gcc.omp-tasks -n 30
    """
    from dataclasses import asdict

    name = name or os.path.basename(command[0])
    session = MeasureSession(sysfs_root, board, state_dir, socket_path, store)
    try:
        prof, times = session.measure(list(command), name, timeout_s, repeat, replace)
    except Exception as err:  # noqa: BLE001 - a failed run, a bad store, a refused write
        fail(str(err))
    out = {"board": session.spec.name, **asdict(prof), "times_s": times, "store": store}
    if as_json:
        emit_json(out)
        return
    for label, t in times.items():
        click.echo(f"  {label:<16} {t:.3f} s")
    click.echo(
        f"{name} on {session.spec.name}: C {prof.work_s:.3f} s, L {prof.span_s:.3f} s, beta "
        f"{prof.beta:.2f}, reference makespan {prof.ref_makespan_s:.3f} s on {prof.ref_cores} "
        f"cores at {prof.ref_khz // 1000} MHz (version {prof.version}) -> {store}\n"
        f"run it with a deadline: hidvfs run --name {shlex.quote(name)} --deadline "
        f"{1.5 * prof.ref_makespan_s:.3g} -- {shlex.join(command)}"
    )


class MeasureSession:
    """What every measurement needs first: root (on a real tree), no daemon running (it would
    change the frequencies meanwhile), the board and the store; then one profile per call."""

    def __init__(self, sysfs_root, board, state_dir, socket_path, store):
        from agents import deadlines
        from daemon.client import DaemonUnreachable, RegistryClient
        from daemon.config import Config
        from daemon.service import resolve_board
        from platforms.sysfs import DirSysfs

        if sysfs_root == "/" and os.geteuid() != 0:
            fail("measuring pins cpufreq settings and must run as root (sudo hidvfs ...)")
        try:
            RegistryClient(socket_path).status()
        except DaemonUnreachable:
            pass
        else:
            fail(
                f"the hidvfs daemon is running ({socket_path}): it would change the frequencies "
                "during the measurement; stop it first (systemctl stop hidvfs)"
            )
        try:
            self.db = deadlines.load(store, missing_ok=True)
            self.sysfs = DirSysfs(sysfs_root)
            self.spec = resolve_board(Config(board=board), self.sysfs)
        except Exception as err:  # noqa: BLE001 - a bad store or an unknown board: one line
            fail(str(err))
        self.store, self.state_dir = store, state_dir

    def measure(self, argv, name, timeout_s, repeat, replace, timer=None):
        """Measure, record (versioned) and save; the stored profile and the run times."""
        from agents import deadlines
        from tools.profile_measure import measure, time_command

        deadlines.check_name(name)  # before minutes of timed runs, not after
        if (name, self.spec.name) in self.db.profiles and not replace:
            raise ValueError(
                f"{name!r} already has a profile on {self.spec.name} (version "
                f"{self.db.profiles[(name, self.spec.name)].version}); measure it again with "
                "--replace to record a new version"
            )
        prof, times = measure(
            self.spec,
            self.sysfs,
            argv,
            name,
            state_dir=self.state_dir,
            timeout_s=timeout_s,
            repeat=repeat,
            timer=timer or time_command,
        )
        prof = deadlines.update(self.store, self.spec.name, prof, replace_existing=replace)
        self.db.profiles[(prof.name, self.spec.name)] = prof
        return prof, times


@profile.command("list")
@click.option("--store", default=DEFAULT_STORE, show_default=True, help="Profile store.")
@click.option("--json", "as_json", is_flag=True)
def list_cmd(store, as_json) -> None:
    """The profiles in the store, per board."""
    from dataclasses import asdict

    from agents import deadlines

    try:
        db = deadlines.load(store, missing_ok=True)
    except Exception as err:  # noqa: BLE001
        fail(str(err))
    rows = [{"board": b, **asdict(p)} for b, p in db]
    if as_json:
        emit_json(rows)
        return
    if not rows:
        click.echo(f"no profiles in {store}")
    for r in rows:
        click.echo(
            f"{r['board']:9s} {r['name']:24s} v{r['version']} C {r['work_s']:.3f} s "
            f"L {r['span_s']:.3f} s beta {r['beta']:.2f} ref {r['ref_makespan_s']:.3f} s"
        )


COMMAND = profile
