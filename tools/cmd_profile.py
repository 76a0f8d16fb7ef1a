"""``hidvfs profile measure|list|show|remove``: the reference profiles the gate and the shield plan with.

A job registered by name (``hidvfs run --name``) gets its profile from the store the daemon
reads (config ``profiles``); without one the policy still steers it, but its deadline cannot
be planned. ``measure`` times a real program on the board's reference cluster and records it.

Stack limit of the measured program (``--stack``): some BOTS kernels recurse deep enough to
need ``ulimit -s unlimited`` and segfault without it; ``hidvfs bots profile`` gives it to the
classes that declare it, and ``profile measure`` does the same through :func:`stack_limit`.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Iterator
from contextlib import contextmanager

import click

from tools.common import FiniteFloatRange, Friendly, emit_json, fail, trusted_sysfs_root

DEFAULT_STORE = "/var/lib/hidvfs/profiles.json"
#: the smallest ``--stack SIZE``: this process runs under the limit too while it measures
MIN_STACK_BYTES = 1 << 20
_SIZE = re.compile(r"^(\d+)\s*([kmg]?)$")
_UNIT = {"": 1 << 10, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def parse_stack(text: str) -> str | int:
    """``auto`` | ``inherit`` | ``unlimited`` | a size in bytes (``SIZE`` is KiB when bare,
    as ``ulimit -s`` and ``OMP_STACKSIZE`` read it, or has a K, M or G suffix)."""
    t = str(text).strip().lower()
    if t in ("auto", "inherit", "unlimited"):
        return t
    m = _SIZE.match(t)
    if not m:
        raise ValueError(
            f"{text!r} is not auto, inherit, unlimited or a size such as 65536 (KiB), 64M or 1G"
        )
    size = int(m.group(1)) * _UNIT[m.group(2)]
    if size < MIN_STACK_BYTES:
        raise ValueError(f"{text!r} is below the 1M this command needs to run itself")
    return size


class StackParam(click.ParamType):
    name = "auto|inherit|unlimited|SIZE"

    def convert(self, value, param, ctx):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        try:
            return parse_stack(value)
        except ValueError as err:
            self.fail(str(err), param, ctx)


@contextmanager
def stack_limit(stack: str | int | None) -> Iterator[int]:
    """Run the block with the soft RLIMIT_STACK ``stack`` asks for, and put it back after;
    yields the soft limit in force (``resource.RLIM_INFINITY`` for unlimited).

    ``None`` or ``"inherit"`` keeps this process's limit; ``"unlimited"`` raises the soft limit
    to the hard one (:func:`platforms.liveprocs.raise_stack_limit`, what ``hidvfs bots`` gives
    the classes that declare ``unlimited_stack``; unlimited unless a lower hard limit forbids
    it); a size in bytes sets the soft limit to it, capped at the hard one. Children started
    inside the block inherit it (the measured program gets it from fork to exec)."""
    import resource

    from platforms.liveprocs import raise_stack_limit

    old = resource.getrlimit(resource.RLIMIT_STACK)
    if stack in (None, "inherit"):
        yield old[0]
        return
    if stack == "unlimited":
        raise_stack_limit()
    elif isinstance(stack, int) and not isinstance(stack, bool):
        hard = old[1]
        soft = stack if hard == resource.RLIM_INFINITY else min(stack, hard)
        resource.setrlimit(resource.RLIMIT_STACK, (soft, hard))
    else:
        raise ValueError(f"stack must be None, 'inherit', 'unlimited' or bytes, got {stack!r}")
    try:
        yield resource.getrlimit(resource.RLIMIT_STACK)[0]
    finally:
        resource.setrlimit(resource.RLIMIT_STACK, old)


def bots_stack(name: str) -> tuple[str, str | None] | None:
    """For a job named like a BOTS run (``BENCH.CLASS``, e.g. ``concom.small``): the stack
    ``hidvfs bots`` gives that class (``unlimited`` or ``inherit``) and its OMP_STACKSIZE;
    None for any other name."""
    from bots_bench import registry

    bench, _, cls = name.rpartition(".")
    try:
        ic = registry.input_class(bench, cls)
    except registry.RegistryError:
        return None
    return ("unlimited" if ic.unlimited_stack else "inherit"), ic.stacksize


def _stack_text(soft: int) -> str:
    import resource

    return "unlimited" if soft == resource.RLIM_INFINITY else f"{soft // 1024} KiB"


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
                metavar="FILE",
            ),
            click.option(
                "--sysfs-root",
                default="/",
                show_default=True,
                type=click.Path(exists=True, file_okay=False),
                callback=trusted_sysfs_root,
                help="Tree to drive (a fake tree to try it).",
            ),
            click.option(
                "--board",
                default=None,
                help="Board spec name or .yaml (default: detect).",
                metavar="BOARD",
            ),
            click.option(
                "--state-dir",
                default="/var/lib/hidvfs",
                show_default=True,
                help="Where the restore snapshot is kept during the measurement.",
                metavar="DIR",
            ),
            click.option(
                "--socket",
                "socket_path",
                default="/run/hidvfs/hidvfs.sock",
                show_default=True,
                help="The daemon's socket (the daemon must not run during a measurement).",
                metavar="SOCKET",
            ),
            click.option(
                "--timeout",
                "timeout_s",
                type=FiniteFloatRange(0.1),
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
@click.option(
    "--name", default=None, help="Job name (default: the command's basename).", metavar="NAME"
)
@measure_options
@click.option(
    "--repeat",
    type=click.IntRange(1, 20),
    default=1,
    show_default=True,
    help="Runs per configuration; their median counts (the deadline is set from a usual run, not the luckiest).",
)
@click.option(
    "--stack",
    type=StackParam(),
    default="auto",
    show_default=True,
    help="Stack limit (soft RLIMIT_STACK) of CMD: 'unlimited' raises it to the hard limit "
    "(ulimit -s unlimited), SIZE sets it (KiB, or with K/M/G; capped at the hard limit), "
    "'inherit' keeps yours. 'auto': for a --name BENCH.CLASS of BOTS, what `hidvfs bots` "
    "gives that class (unlimited for the deep-recursion ones, and its OMP_STACKSIZE unless "
    "you set one), else 'inherit'.",
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
    stack,
    as_json,
    command,
) -> None:
    """Time CMD three times on the reference cluster (all cores and one core at the top OPP,
    all cores at about half) and store its profile.

    Example: sudo hidvfs profile measure --name fib -- ./fib.gcc.omp-tasks -n 30
    """
    import resource
    from dataclasses import asdict

    name = name or os.path.basename(command[0])
    timer = None
    if stack == "auto":
        known = bots_stack(name)
        stack = known[0] if known else "inherit"
        if known and known[1]:
            from tools.profile_measure import command_timer

            env = dict(os.environ)
            env.setdefault("OMP_STACKSIZE", known[1])  # one the user set wins
            timer = command_timer(env)
    session = MeasureSession(sysfs_root, board, state_dir, socket_path, store)
    try:
        prof, times = session.measure(
            list(command), name, timeout_s, repeat, replace, timer, stack=stack
        )
    except Exception as err:  # noqa: BLE001 - a failed run, a bad store, a refused write
        msg = str(err)
        if "SIGSEGV" in msg and stack != "unlimited":  # often a stack overflow
            msg += " (if it recurses deeply, try --stack unlimited)"
        fail(msg)
    soft, unlimited = session.stack_soft, resource.RLIM_INFINITY
    if soft is not None and (
        (stack == "unlimited" and soft != unlimited)
        or (isinstance(stack, int) and soft != unlimited and soft < stack)
    ):
        click.echo(f"note: the hard stack limit capped --stack at {_stack_text(soft)}", err=True)
    if os.path.realpath(sysfs_root) != "/":
        click.echo(
            f"note: {sysfs_root} is not this machine's sysfs, so the frequency pins did not "
            "change how fast the command ran: beta measures run-to-run noise here, and C and "
            "L are this machine's times; measure on the board itself for a profile to rely on",
            err=True,
        )
    out = {
        "board": session.spec.name,
        **asdict(prof),
        "provenance": session.db.provenance_of(prof.name, session.spec.name),
        "times_s": times,
        "store": store,
        "stack_limit": _stack_text(session.stack_soft),
    }
    if as_json:
        emit_json(out)
        return
    for label, t in times.items():
        click.echo(f"  {label:<16} {t:.3f} s")
    click.echo(f"  {'stack limit':<16} {out['stack_limit']}")
    click.echo(
        f"{name} on {session.spec.name}: C {prof.work_s:.3f} s, L {prof.span_s:.3f} s, beta "
        f"{prof.beta:.2f}, reference makespan {prof.ref_makespan_s:.3f} s on {prof.ref_cores} "
        f"cores at {prof.ref_khz // 1000} MHz (version {prof.version}) -> {store}\n"
        f"run it with a deadline: hidvfs run --name {shlex.quote(name)} --deadline "
        f"{1.5 * prof.ref_makespan_s:.3g} -- {shlex.join(command)}"
    )


class StoreUnwritable(ValueError):
    """The profile store could not be saved: said before any run, not after the last."""


def check_store_writable(store: str) -> None:
    """Refuse a store the measurement could not save (:func:`agents.deadlines.update` locks
    ``STORE.lock`` and replaces the file through a temporary one in the same folder), before
    any run: its folder is made now if missing (:func:`platforms.outputs.ensure_parent`), a file
    must be makeable in it, and a lock file already there must be writable."""
    from tools.common import OutputFolderError, ensure_parent

    full = os.path.abspath(store)
    if os.path.isdir(full):
        raise StoreUnwritable(f"--store {store}: is a folder; give a file (.json)")
    try:
        ensure_parent("--store", store, replace="rename")
    except OutputFolderError as err:
        raise StoreUnwritable(str(err)) from None
    lock = full + ".lock"
    if os.path.islink(lock):  # the lock is opened without following links: say it now
        raise StoreUnwritable(
            f"--store {store}: its lock file {lock} is a symbolic link; hidvfs opens no lock "
            "through one (remove it)"
        )
    if os.path.lexists(lock) and not os.access(lock, os.W_OK):
        raise StoreUnwritable(
            f"--store {store}: its lock file {lock} is not writable; "
            "run as root (sudo) or give a --store you can write"
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
            check_store_writable(store)  # its folder made now, before minutes of timed runs
            self.db = deadlines.load(store, missing_ok=True)
            self.sysfs = DirSysfs(sysfs_root)
            self.spec = resolve_board(Config(board=board), self.sysfs)
        except Exception as err:  # noqa: BLE001 - a bad store or an unknown board: one line
            fail(str(err))
        self.store, self.state_dir = store, state_dir
        #: the soft RLIMIT_STACK of the last measurement's runs
        self.stack_soft: int | None = None

    def measure(
        self, argv, name, timeout_s, repeat, replace, timer=None, *, stack=None, verify=None
    ):
        """Measure, record (versioned) and save; the stored profile and the run times
        (``verify``: see :func:`tools.profile_measure.measure`). The runs happen under :func:`stack_limit` ``(stack)`` (the soft limit they had is kept in
        ``stack_soft``); this process's limit is put back after."""
        from agents import deadlines
        from tools.profile_measure import measure, time_command

        deadlines.check_name(name)  # before minutes of timed runs, not after
        if (name, self.spec.name) in self.db.profiles and not replace:
            raise ValueError(
                f"{name!r} already has a profile on {self.spec.name} (version "
                f"{self.db.profiles[(name, self.spec.name)].version}); measure it again with "
                "--replace to record a new version"
            )
        from daemon.stopsignals import InterruptOnSignals

        # SIGTERM and SIGHUP end a measurement as Ctrl-C does: the command killed, the board
        # given back (they used to kill hidvfs with the board pinned and the command running)
        provenance: dict[str, str] = {}
        with InterruptOnSignals(), stack_limit(stack) as self.stack_soft:
            prof, times = measure(
                self.spec,
                self.sysfs,
                argv,
                name,
                state_dir=self.state_dir,
                timeout_s=timeout_s,
                repeat=repeat,
                timer=timer or time_command,
                verify=verify,
                provenance=provenance,
            )
        prof = deadlines.update(
            self.store, self.spec.name, prof, replace_existing=replace, provenance=provenance
        )
        self.db.profiles[(prof.name, self.spec.name)] = prof
        self.db.provenance[(prof.name, self.spec.name)] = provenance
        return prof, times


#: ``--store`` of the commands that read the store (``list``, ``show``, ``remove``)
_store_option = click.option(
    "--store",
    default=None,
    help=f"Profile store (default {DEFAULT_STORE}; a store given here must exist).",
    metavar="FILE",
)


def _read_store(store: str | None):
    """``(path, store)``: the default store may not exist yet (nothing measured, an empty
    store); a path given may be a typo (exit 2), as may a file that is not a store."""
    from agents import deadlines

    if store is not None and not os.path.exists(store):
        fail(f"{store}: no such profile store")
    store = store or DEFAULT_STORE
    try:
        return store, deadlines.load(store, missing_ok=True)
    except Exception as err:  # noqa: BLE001
        fail(str(err))


def _board_option(what: str):
    return click.option(
        "--board",
        default=None,
        help=f"Board the profile was measured on, as `profile list` shows it ({what}).",
        metavar="BOARD",
    )


@profile.command("list")
@_store_option
@click.option("--json", "as_json", is_flag=True, help="Print the stored profiles as JSON.")
def list_cmd(store, as_json) -> None:
    """The profiles in the store, per board, with the date each was measured (UTC; ``?``
    for one stored before provenance was recorded)."""
    store, db = _read_store(store)
    rows = [_json_row(db, b, p) for b, p in db]
    if as_json:
        emit_json(rows)
        return
    if not rows:
        click.echo(f"no profiles in {store}")
    for r in rows:
        when = (r["provenance"] or {}).get("measured_at", "")[:10] or "?"
        click.echo(
            f"{r['board']:9s} {r['name']:24s} v{r['version']} C {r['work_s']:.3f} s "
            f"L {r['span_s']:.3f} s beta {r['beta']:.2f} ref {r['ref_makespan_s']:.3f} s "
            f"measured {when}"
        )


def _json_row(db, board: str, p) -> dict:
    """A profile as `list --json` and `show --json` print it: its stored row, with
    ``provenance`` null for one stored before provenance was recorded."""
    from dataclasses import asdict

    return {"board": board, **asdict(p), "provenance": db.provenance_of(p.name, board)}


#: ``profile show``'s lines: field, label, unit
_SHOWN = (
    ("version", "version", ""),
    ("ref_makespan_s", "reference makespan", " s"),
    ("ref_khz", "reference frequency", " kHz"),
    ("ref_cores", "reference cores", ""),
    ("work_s", "work C", " s"),
    ("span_s", "span L", " s"),
    ("beta", "memory-bound beta", ""),
    ("span_cpu_s", "compute-only span", " s"),
    ("span_mem_s", "memory-only span", " s"),
)
#: the provenance's lines (key, label) in this order; keys a later hidvfs adds follow, by key
_PROVENANCE_SHOWN = (
    ("measured_at", "measured at"),
    ("hidvfs_version", "hidvfs version"),
    ("git_commit", "git commit"),
    ("board", "board"),
    ("kernel", "kernel"),
    ("cluster", "measured cluster"),
    ("cpus", "measured CPUs"),
    ("low_khz", "beta frequency"),
    ("repeat", "runs per setting"),
    ("sysfs_root", "sysfs tree"),
)
_PROVENANCE_UNITS = {"low_khz": " kHz"}
#: what `profile show` says of a profile stored without provenance
UNKNOWN_PROVENANCE = "unknown (measured before provenance was recorded)"


def provenance_lines(prov: dict[str, str] | None) -> list[str]:
    """`profile show`'s provenance lines (field, label, key as the profile's lines)."""
    if prov is None:
        return [f"  {'provenance':<20} {UNKNOWN_PROVENANCE}"]
    known = [k for k, _ in _PROVENANCE_SHOWN]
    labels = dict(_PROVENANCE_SHOWN)
    keys = [k for k in known if k in prov] + sorted(k for k in prov if k not in labels)
    return [
        f"  {labels.get(k, k):<20} {prov[k]}{_PROVENANCE_UNITS.get(k, '')}  (provenance.{k})"
        for k in keys
    ]


@profile.command("show")
@click.argument("name")
@_store_option
@_board_option("default: every board NAME has a profile for")
@click.option(
    "--json", "as_json", is_flag=True, help="Print the profile as JSON (a list, as `list`)."
)
def show_cmd(name, store, board, as_json) -> None:
    """Every stored field of the profile of job NAME: its reference makespan and operating
    point (frequency, cores), work C, span L, beta, the split span when stored, and its
    version. C and L are seconds at the reference frequency on a core of capacity 1.0.

    Then its provenance: when it was measured (UTC), with which hidvfs (version, and git
    commit when run from a checkout), on which board and kernel, on which cluster and CPUs;
    "unknown" for a profile stored before provenance was recorded."""
    from agents import deadlines

    try:
        deadlines.check_name(name)
    except ValueError as err:
        fail(str(err))
    store, db = _read_store(store)
    try:
        found = deadlines.lookup(db, name, board, where=store)
    except deadlines.ProfileNotFound as err:
        fail(str(err))
    if as_json:
        emit_json([_json_row(db, b, p) for b, p in found])
        return
    for i, (b, p) in enumerate(found):
        if i:
            click.echo()
        click.echo(f"{p.name} on {b}")
        for key, label, unit in _SHOWN:
            value = getattr(p, key)
            if value is None:  # a profile measured on a board has no split span
                continue
            shown = f"{value:.6g}" if isinstance(value, float) else str(value)
            click.echo(f"  {label:<20} {shown}{unit}  ({key})")
        for line in provenance_lines(db.provenance_of(p.name, b)):
            click.echo(line)


@profile.command("remove")
@click.argument("name")
@_store_option
@_board_option("needed when NAME has profiles for several boards")
def remove_cmd(name, store, board) -> None:
    """Remove the profile of job NAME from the store (the others stay as they are).

    The store is rewritten atomically, under the lock measurements take, with its mode kept.
    A running daemon need not stop: it rereads the store when the file changes, at the next
    registration by name, so a job registered after the removal gets no profile (the policy
    still steers it, but its deadline is not planned); a job already registered keeps the
    profile it was given at registration.
    """
    from agents import deadlines

    try:
        deadlines.check_name(name)
    except ValueError as err:
        fail(str(err))
    if store is not None and not os.path.exists(store):
        fail(f"{store}: no such profile store")
    store = store or DEFAULT_STORE
    try:
        if os.path.exists(store):  # absent: nothing to remove, said below
            check_store_writable(store)
        gone = deadlines.remove(store, name, board)
    except Exception as err:  # noqa: BLE001 - unknown name, a bad store, a refused write
        fail(str(err))
    for b, p in gone:
        click.echo(f"removed {p.name} (version {p.version}) on {b} from {store}")


COMMAND = profile
