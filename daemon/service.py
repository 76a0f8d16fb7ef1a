"""The board daemon as a service: the one composition root for a live (or fake) tree.

Order of a run: config -> logging -> board -> safety checks (root, a cpufreq policy, writable
tree, policy) -> lock the state dir -> restore a stale snapshot and save the originals (before
the first write) -> job registry socket -> optional metrics/telemetry -> READY -> control loop
(watchdog, drift check, status) -> on SIGTERM/SIGINT/SIGHUP/exit: STOPPING, stop servers,
restore every setting it changed. When a crashed run left its snapshot, the lock and its restore
come first instead, so that a refused start still gives the board its settings back.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from dataclasses import asdict, dataclass, replace

from agents.factory import LEARNED_POLICIES, make_policy_stack
from agents.mixed import daemon_stages
from agents.policy import Policy
from daemon.actuator import Actuator
from daemon.config import (
    DEFAULT_PATH,
    Config,
    ConfigError,
    ConfigSyntaxError,
    config_to_dict,
    load_config,
    parse_listen,
    policy_options,
    read_token,
)
from daemon.gchold import start_frozen
from daemon.guard import config_guard
from daemon.jobrestore import JobOriginals, jobs_path, restore_stale_jobs
from daemon.jobs import JobEntry, JobOutcome, JobTable
from daemon.logs import SensorErrorLog, log_event, setup_logging
from daemon.loop import ControlLoop, TickResult
from daemon.notify import Notifier, WatchdogPinger
from daemon.profiles import DeadlineCheck, ProfileLookup
from daemon.restore import (
    Session,
    SnapshotError,
    begin_session,
    recover_stale,
    restore_snapshot,
    snapshot_path,
)
from daemon.statelock import StateLock
from daemon.statusfile import write_status
from daemon.stopsignals import StopOnSignals
from platforms import cpufreq, paths
from platforms.clock import MonotonicClock
from platforms.errors import HidvfsError
from platforms.liveprocs import LiveProcessControl, boot_id, rival_daemons
from platforms.observation import Observation
from platforms.outputs import OutputFolderError, ensure_parent
from platforms.platform import Platform
from platforms.probe import detect_board, probe
from platforms.rtbandwidth import planning_margin, rt_share
from platforms.spec import BoardSpec, board_names, load_board, load_board_file
from platforms.sysfs import DirSysfs
from platforms.trace import (
    TickRecorder,
    is_recording_to_keep,
    keep_previous_recording,
    previous_name,
)
from platforms.treelock import TreeLock
from platforms.yamlfile import read_yaml

log = logging.getLogger("hidvfs.daemon")


class DaemonError(HidvfsError):
    """The daemon cannot start safely; the message says why and what to do."""


def resolve_board(cfg: Config, sysfs: DirSysfs) -> BoardSpec:
    """The board spec: the config's (a spec file as given, unless it names another shipped
    board than the one detected; a shipped name only if the tree is not detected as another
    shipped board: its OPPs and rails would be wrong there, and a profile measured under it
    stored under the wrong board), else detected, else probed."""
    if cfg.board:
        if cfg.board.endswith((".yaml", ".yml")):
            spec = load_board_file(cfg.board)
            detected = detect_board(sysfs) if sysfs is not None else None
            if detected and spec.name != detected and spec.name in board_names():
                # a copy of another shipped board's spec: the same mistake as its name
                raise DaemonError(
                    f"board file {cfg.board} is a spec of {spec.name!r}, but the board under "
                    f"{sysfs.root} is detected as {detected!r}; leave the board out (it is "
                    f"detected) or give a spec of {detected}"
                )
            return spec
        spec = load_board(cfg.board)  # an unknown name first: it lists the known boards
        detected = detect_board(sysfs)
        if detected and detected != cfg.board:
            raise DaemonError(
                f"board {cfg.board!r} was asked for, but the board under {sysfs.root} is "
                f"detected as {detected!r}; leave the board out (it is detected) or run on a "
                f"{cfg.board}"
            )
        return spec
    name = detect_board(sysfs)
    if name:
        return load_board(name)
    result = probe(sysfs)
    if not result.spec.clusters:
        raise DaemonError(
            f"no cpufreq policy found under {sysfs.root}: nothing to control "
            "(is this a board with a cpufreq driver? try `hidvfs probe`)"
        )
    log_event(
        log, "board_unknown", detail="using the probed topology", clusters=len(result.spec.clusters)
    )
    return result.spec


def check_writable(sysfs: DirSysfs, spec: BoardSpec) -> None:
    """Refuse to start when some policy could not be driven at all. The actuator sets a
    frequency by pinning min = max, or through the userspace governor and its setspeed: a
    policy needs the files of one of them, not of both (a read-only governor is fine with
    writable limits)."""
    bad = []
    for c in spec.clusters:
        base = f"devices/system/cpu/cpufreq/policy{c.policy}"
        if not sysfs.exists(base):
            continue
        can = {n: sysfs.writable(f"{base}/{n}") for n in cpufreq.WRITABLE_FILES}
        if can["scaling_min_freq"] and can["scaling_max_freq"]:
            continue
        governors = (sysfs.read_or(f"{base}/scaling_available_governors") or "").split()
        if "userspace" in governors and can["scaling_governor"] and can["scaling_setspeed"]:
            continue
        why = [
            f"{n} {'read-only' if sysfs.exists(f'{base}/{n}') else 'missing'}"
            for n, ok in can.items()
            if not ok
        ]
        if "userspace" not in governors:
            why.append("no userspace governor")
        bad.append(f"{base} ({', '.join(why)})")
    if bad:
        hint = (
            "read-only tree: root cannot write them either (a read-only mount, or files no one "
            "may write); check the tree"
            if os.geteuid() == 0
            else "read-only tree or missing permission; run as root or give this user write "
            "access to them"
        )
        raise DaemonError(
            f"cannot set a frequency on {bad[0]} under {sysfs.root}: neither min = max limits "
            "nor the userspace governor and its setspeed can be written "
            f"({len(bad)} policy folder(s)); {hint}, or use --dry-run to see what would be written"
        )


def _state_dir_for(config_path: str | None, state_dir: str | None) -> str:
    """The state dir a start will use, known even when the config is broken (its restore
    snapshot must be put back before the start is refused)."""
    if state_dir:
        return os.path.abspath(state_dir)
    try:
        return load_config(config_path).state_dir
    except HidvfsError:
        pass
    # a config with an error elsewhere still names its state dir: read that key alone
    try:
        data = read_yaml(config_path or DEFAULT_PATH, ConfigError, ConfigSyntaxError)
    except (HidvfsError, OSError):
        data = None
    raw = data.get("state_dir") if isinstance(data, dict) else None
    if isinstance(raw, str) and os.path.isabs(raw):
        return raw
    return Config().state_dir


def _left_by_a_crash(state_dir: str) -> bool:
    """A snapshot (or job originals) that a run which did not stop cleanly left behind."""
    return any(os.path.lexists(p) for p in (snapshot_path(state_dir), jobs_path(state_dir)))


#: run_live's keywords that only the run itself takes (the others are checked first)
_SERVE_KEYS = ("duration_s", "status_file", "stop", "record", "record_max_bytes", "plan_out")


def run_live(
    *,
    config_path: str | None = None,
    sysfs_root: str = "/",
    state_dir: str | None = None,
    dry_run: bool = False,
    **kwargs,
) -> dict:
    """Run the daemon on a live or fake tree until stopped (see the module docstring).

    It locks the state dir (one daemon per state dir, StateDirBusy otherwise) and restores a
    snapshot a crashed run left before its first write. When a crash left one, lock and
    restore come before anything else: a start refused afterwards (a config typo, a file that
    vanished) must not leave the board with the dead run's settings. Otherwise the checks that
    need no lock (config, root, board, a cpufreq policy, a writable tree, the policy) come
    first, so a refused start creates no state dir and no lock file.
    A dry run, or a non-root user on the live tree, writes nothing and takes no lock.
    Then the folders of its output files (status file, recording, socket) are made, or the
    start refused (:func:`platforms.outputs.ensure_parent`), before anything else is written.
    """
    serve = {k: kwargs.pop(k) for k in _SERVE_KEYS if k in kwargs}

    def prepare() -> _Prepared:
        prepared = _prepare(
            config_path=config_path,
            sysfs_root=sysfs_root,
            state_dir=state_dir,
            dry_run=dry_run,
            **kwargs,
        )
        # how each is written over: the status renamed over; the recording opened, or (a
        # non-empty one) moved to its .prev name, over the one there (keep_previous_recording);
        # the socket judged when it is bound (a live one is another daemon's, said then)
        record = serve.get("record")
        moved = record and is_recording_to_keep(record)
        for flag, path, how in (
            ("--status-file", serve.get("status_file"), "rename"),
            ("--record", record, "rename" if moved else "open"),
            ("--record", previous_name(record) if moved else None, "rename"),
            ("--socket", kwargs.get("socket_path"), None),
        ):
            if path:
                try:
                    ensure_parent(flag, path, replace=how)
                except OutputFolderError as err:
                    raise DaemonError(str(err)) from None
        return prepared

    writes = not dry_run and not (sysfs_root == "/" and os.geteuid() != 0)
    if not writes:
        return _serve(prepare(), **serve)
    state = _state_dir_for(config_path, state_dir)
    prepared = None
    if _left_by_a_crash(state):
        setup_logging()  # the config's logging comes once it has loaded
        refuse_untrusted_tree(sysfs_root)  # the restore below writes into it
    else:
        prepared = prepare()
    with StateLock(state), TreeLock(DirSysfs(sysfs_root)):
        # again when there was none a moment ago: a daemon on this state dir may just have died
        recover_stale(DirSysfs(sysfs_root), state, log)
        restore_stale_jobs(state, LiveProcessControl(), log)
        return _serve(prepared or prepare(), **serve)


@dataclass
class _Prepared:
    """What a start has checked and built before it touches anything."""

    cfg: Config
    sysfs: DirSysfs
    kind: str  # "live" or "fake"
    spec: BoardSpec
    policy: Policy
    stages: list
    dry_run: bool


def _prepare(
    *,
    config_path: str | None = None,
    sysfs_root: str = "/",
    policy: str | None = None,
    period_ms: int | None = None,
    state_dir: str | None = None,
    socket_path: str | None = None,
    dry_run: bool = False,
) -> _Prepared:
    """Every check that may refuse the start and needs neither the lock nor a write: config,
    root, board, a cpufreq policy, a writable tree, the policy stack."""
    cfg = load_config(config_path)
    if policy:
        cfg = replace(cfg, policy=policy)
    if period_ms:
        cfg = replace(cfg, period_ms=period_ms)
    if state_dir:
        cfg = replace(cfg, state_dir=state_dir)
    if socket_path:
        cfg = replace(cfg, socket=replace(cfg.socket, path=socket_path))
    setup_logging(cfg.logging.level, cfg.logging.format)

    if sysfs_root == "/" and os.geteuid() != 0 and not dry_run:
        raise DaemonError(
            "the daemon writes cpufreq settings and must run as root "
            "(sudo hidvfs daemon ..., or `sudo hidvfs service install`); "
            "use --dry-run to see what it would write"
        )
    refuse_untrusted_tree(sysfs_root)
    sysfs = DirSysfs(sysfs_root)
    spec = resolve_board(cfg, sysfs)
    if not cpufreq.list_policies(sysfs):
        raise DaemonError(
            f"no cpufreq policy under {sysfs.root}/devices/system/cpu/cpufreq: nothing to control"
        )
    if not dry_run:
        check_writable(sysfs, spec)
    pol, stages = policy_stack(cfg, spec)
    stages = daemon_stages(stages, cfg.mixed_criticality.reserve)
    # the config checks that need the board, here, before the state dir is locked: the thermal
    # caps against its clusters, and the HTTP endpoints' token files
    config_guard(spec, cfg)
    if cfg.metrics.enabled:
        read_token(cfg.metrics, "metrics")
        _check_listen_host(cfg.metrics.listen, "metrics.listen")
    if cfg.telemetry.listen:
        read_token(cfg.telemetry)
        _check_listen_host(cfg.telemetry.listen, "telemetry.listen")
    kind = "live" if sysfs_root == "/" else "fake"
    return _Prepared(cfg, sysfs, kind, spec, pol, stages, dry_run)


def refuse_untrusted_tree(sysfs_root: str) -> None:
    """Before the first read or write of a tree (a crashed run's restore included): root
    following a link planted in another user's tree writes a frequency into a file of the
    link's choosing (or reads one into the trace)."""
    from platforms.sysfs import UNTRUSTED_TREE_ADVICE, untrusted_tree_entry

    untrusted = untrusted_tree_entry(sysfs_root)
    if untrusted:
        raise DaemonError(f"--sysfs-root {sysfs_root}: {untrusted}, {UNTRUSTED_TREE_ADVICE}")


def policy_stack(cfg: Config, spec: BoardSpec) -> tuple[Policy, list]:
    """The config's policy and its stages. A learned policy on a board hidvfs ships no agents
    for is refused with what to run instead: the loader's "run `hidvfs agents train`" cannot
    help there, since training needs the board's plant parameters."""
    from agents.learned import boards_with_agents

    try:
        return make_policy_stack(cfg.policy, spec, **policy_options(cfg))
    except FileNotFoundError:
        if cfg.policy in LEARNED_POLICIES and spec.name not in boards_with_agents():
            raise DaemonError(no_agents_message(cfg.policy, spec)) from None
        raise


def no_agents_message(policy: str, spec: BoardSpec) -> str:
    """Why a learned policy cannot run on ``spec`` (a probed board or a spec file of a board
    hidvfs has no agents for), and what runs instead."""
    from agents.learned import boards_with_agents

    what = f"{spec.name}, probed" if spec.name == "unknown" else spec.name
    if spec.model:
        what += f": {spec.model[0]}"
    return (
        f"policy {policy!r} runs agents trained for one board, and hidvfs ships them for "
        f"{', '.join(boards_with_agents())} only; this board ({what}) is not one of them. Run a "
        "kernel-governor policy here: --policy schedutil, or `policy: schedutil` in the "
        "config (hidvfs still saves and restores the board's settings, applies the thermal "
        "caps, records traces and serves status, but plans no deadlines). Agents for a new "
        "board are trained in the plant simulator from a board spec with its plant "
        "parameters (platforms/boards/*.yaml, `sim:`)"
    )


def warn_rivals(log: logging.Logger, find=rival_daemons) -> list[tuple[int, str]]:
    """Name every running rival cpufreq daemon (daemons.md 8): the unit's Conflicts= stops
    them only when systemd starts hidvfs, and two daemons writing the same files undo each
    other silently until the drift warnings start."""
    try:
        found = find()
    except Exception as err:  # noqa: BLE001 - a look at /proc must not stop the start
        log_event(log, "rival_check_failed", level=logging.DEBUG, detail=str(err))
        return []
    for pid, name in found:
        log_event(
            log,
            "rival_daemon",
            level=logging.WARNING,
            pid=pid,
            name=name,
            detail=f"{name} writes the same cpufreq files; stop it (systemctl stop {name}) "
            "or the two undo each other's settings",
        )
    return found


def _check_listen_host(listen: str, key: str) -> None:
    """A listen host that is a name must resolve now: an IP address binds even before the
    network is up (IP_FREEBIND), a name that does not resolve failed the start after the
    snapshot and the socket were set up."""
    import ipaddress
    import socket

    host, port = parse_listen(listen)
    try:
        ipaddress.ip_address(host)
        return
    except ValueError:
        pass
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as err:
        raise DaemonError(
            f"{key}: host {host!r} does not resolve ({err.strerror or err}); give an IP "
            "address, which binds even before the network is up"
        ) from None


def _take_up_jobs(table: JobTable, state_dir: str, procs, profiles, tree: str, now):
    """Register again the jobs an earlier run of this boot on this tree had, still running
    and still their registrant's to steer (a restart used to drop them:
    :mod:`daemon.jobpersist`), then keep the table on disk. Returns the file's keeper, to
    close at the stop."""
    from daemon.jobpersist import RegistrationsFile, take_up

    boot = boot_id()
    store = RegistrationsFile(state_dir, boot, log, tree=tree)
    for entry in take_up(state_dir, boot, procs.start_time, log, tree=tree, refuse=_refusal(procs)):
        table.register(replace(entry, profile=profiles(entry.name)))
        log_event(
            log,
            "job_taken_up",
            pid=entry.pid,
            name=entry.name,
            criticality=entry.criticality,
            deadline_s=entry.deadline_s,
            registered_s_ago=round(now() - entry.release_t, 3),
        )
    store.write_now(table.snapshot())  # what did not come back leaves the file now
    table.on_change = store.save
    return store


def _refusal(procs):
    """Why a job read back from registrations.json may no longer be steered: what the
    registry checks at a registration (a process the daemon may not steer; for a user's job,
    :func:`daemon.registry.owner_refusal`)."""
    from daemon.registry import owner_refusal

    def refuse(entry: JobEntry) -> str | None:
        why = procs.unmanageable(entry.pid)
        if why is not None:
            return why
        return owner_refusal(entry.pid, entry.registrant_uid, procs.owner_uid)

    return refuse


class _StatusWriter:
    """The status file, or a warning (once per kind of failure, and once when it is written
    again): a status file that cannot be written (its folder removed, the disk full) is no
    reason to stop controlling the board."""

    def __init__(self, path: str):
        self.path = path
        self.failing: str | None = None

    def __call__(self, status: dict) -> None:
        try:  # a FIFO without a reader is not waited on: the loop calls this
            write_status(self.path, status, stream_nonblocking=True)
        except OSError as err:
            why = err.strerror or str(err)
            if why != self.failing:
                log_event(
                    log, "status_file_unwritable", level=logging.WARNING, path=self.path, detail=why
                )
            self.failing = why
            return
        if self.failing is not None:
            log_event(log, "status_file_written", path=self.path)
        self.failing = None


def deadline_margin(sysfs, configured: float) -> float:
    """The margin the loop plans deadlines with: ``deadline_slack``, raised to what the
    kernel's RT throttling can take from a job whose SCHED_FIFO threads keep their cores busy
    (logged when it does; ``sysctl kernel.sched_rt_runtime_us=-1`` lifts the cap)."""
    share = rt_share(sysfs)
    margin = planning_margin(configured, share)
    if margin > configured:
        log_event(
            log,
            "rt_throttling",
            level=logging.WARNING,
            rt_share=round(share, 6),
            deadline_margin=round(margin, 6),
            detail=(
                f"the kernel lets SCHED_FIFO threads run {share:.0%} of each period, so deadlines "
                f"are planned with a {margin:.0%} margin instead of deadline_slack {configured:g}; "
                "sysctl kernel.sched_rt_runtime_us=-1 lifts the cap"
            ),
        )
    return margin


class LimitsWatch:
    """Logs a policy's ``scaling_min_freq``/``scaling_max_freq`` moved by someone else.

    The drift check covers only the files the daemon wrote; with a ``userspace`` governor it
    never writes the limits, yet the kernel clamps its setspeed to them, so a limit lowered by
    nvpmodel (or an administrator, or the kernel's thermal cooling, which shows through
    ``scaling_max_freq``) is obeyed silently. Each tick's sensed limits (the sensor reads them
    anyway, before the tick writes) are compared with what the last tick left: its reading,
    or its own write of that file; a change is logged once (warning), naming the cluster and
    the old and new kHz. A file the daemon wrote itself is left to the drift check, which
    already reports it. A limit that keeps moving (thermal cooling stepping it) is logged at
    most once per ``quiet_s`` per file, the next line counting the changes in between."""

    NAMES = ("scaling_min_freq", "scaling_max_freq")

    def __init__(self, quiet_s: float = 60.0):
        self.seen: dict[str, int] = {}  # path -> kHz the last tick left
        self.quiet_s = quiet_s
        self.logged_at: dict[str, float] = {}  # path -> tick time of its last line
        self.unlogged: dict[str, int] = {}  # path -> changes since its last line

    def check(
        self, sensed: Observation, writes, owned: set[str] = frozenset(), t: float = 0.0
    ) -> list[str]:
        """Compare, log and remember; returns the changed paths. ``sensed``: the tick's
        observation as read (before any write); ``writes``: the tick's (path, value) writes;
        ``owned``: paths the drift check watches; ``t``: the tick's time (s)."""
        written = dict(writes)
        changed = []
        for c in sensed.clusters:
            for file, now in zip(self.NAMES, (c.min_khz, c.max_khz)):
                path = paths.policy_file(c.policy, file)
                before = self.seen.get(path)
                left = now  # what this tick leaves: its own write, else its reading
                if path in written:
                    try:
                        left = int(written[path])
                    except ValueError:
                        pass
                if left is not None:  # unreadable: the sensor log reports it; keep the last
                    self.seen[path] = left
                if now is None or before is None or before == now or path in owned:
                    continue
                changed.append(path)
                last = self.logged_at.get(path)
                if last is not None and t - last < self.quiet_s:
                    self.unlogged[path] = self.unlogged.get(path, 0) + 1
                    continue
                self.logged_at[path] = t
                more = self.unlogged.pop(path, 0)
                log_event(
                    log,
                    "limit_changed",
                    level=logging.WARNING,
                    cluster=c.name,
                    policy=c.policy,
                    file=file,
                    old_khz=before,
                    new_khz=now,
                    detail=f"{c.name} {file} {before} -> {now} kHz, set outside the daemon "
                    "(nvpmodel, jetson_clocks, thermal cooling, another tool); decisions stay "
                    "within it"
                    + (f" ({more} more change(s) in the last {self.quiet_s:g} s)" if more else ""),
                )
        return changed


#: the config keys whose settings shape the decisions (the policy and the period are the
#: recording's own header keys); a recording stores them, and its replay runs with them
DECISION_KEYS = ("deadline_slack", "thermal", "mixed_criticality", "shield")


def recorded_config(cfg: Config) -> dict:
    """The part of ``cfg`` a recording stores (:data:`DECISION_KEYS`), as plain JSON that
    :func:`daemon.config.parse_config` reads back (no socket, paths or tokens)."""
    full = config_to_dict(cfg)
    return {key: full[key] for key in DECISION_KEYS}


class SeenJobs:
    """The job table as the control loop of a recording daemon uses it: the table's own
    (the registry registers into the table itself), with what each tick's observation took
    from it kept for the recording (:meth:`take`): the jobs whose end the registry reported
    and the registered jobs, in the table's order."""

    def __init__(self, table: JobTable):
        self.table = table
        self._ended: list[JobOutcome] = []
        self._snapshot: list[JobEntry] = []
        self._rows: dict[int, tuple[JobEntry, dict]] = {}  # pid -> (entry, its row)

    def __getattr__(self, name: str):
        return getattr(self.table, name)

    def __len__(self) -> int:
        return len(self.table)

    def take_ended(self) -> list[JobOutcome]:
        out = self.table.take_ended()
        self._ended.extend(out)
        return out

    def snapshot(self) -> list[JobEntry]:
        self._snapshot = self.table.snapshot()
        return self._snapshot

    def take(self) -> dict[str, list[dict]]:
        """What the loop took since the last call, as plain dicts (platforms.trace.TickRecorder
        .sample's ``jobs``; clock times)."""
        ended, snap = self._ended, self._snapshot
        self._ended, self._snapshot = [], []
        rows = {}
        for e in snap:  # an entry is converted once, not on every tick it stays
            kept = self._rows.get(e.pid)
            rows[e.pid] = kept if kept is not None and kept[0] is e else (e, _job_row(e))
        self._rows = rows
        return {
            "ended": [
                {
                    "pid": o.pid,
                    "name": o.name,
                    "criticality": o.criticality,
                    "release_t": o.release_t,
                    "finish_t": o.finish_t,
                    "deadline_s": o.deadline_s,
                    # how it exited, when its launcher said (a failed job is not scored)
                    **({"exit": asdict(o.exit)} if getattr(o, "exit", None) is not None else {}),
                }
                for o in ended
            ],
            "snapshot": [rows[e.pid][1] for e in snap],
        }


def _job_row(e: JobEntry) -> dict:
    return {
        "pid": e.pid,
        "name": e.name,
        "criticality": e.criticality,
        "release_t": e.release_t,
        "deadline_s": e.deadline_s,
        "profile": asdict(e.profile) if e.profile is not None else None,
        "start_time": e.start_time,
        "registrant_uid": e.registrant_uid,
        "adopter": list(e.adopter) if e.adopter is not None else None,
    }


def _serve(
    prepared: _Prepared,
    *,
    duration_s: float | None = None,
    status_file: str | None = None,
    stop: threading.Event | None = None,
    record: str | None = None,
    record_max_bytes: int | None = None,
    plan_out=None,
) -> dict:
    """The run itself, once :func:`_prepare` has accepted the start (and the state dir is
    locked, unless nothing is written). A dry run prints its plan to ``plan_out`` (default
    stdout; ``daemon --json`` keeps stdout for the status)."""
    cfg, sysfs, spec, kind = prepared.cfg, prepared.sysfs, prepared.spec, prepared.kind
    pol, stages, dry_run = prepared.policy, prepared.stages, prepared.dry_run
    procs = LiveProcessControl()
    if kind == "live":
        warn_rivals(log)
    clock = MonotonicClock()
    root = sysfs.root
    # last before the run: a start refused earlier must not truncate an earlier recording
    recorder = None
    if record:
        try:
            kept = keep_previous_recording(record)
            if kept:
                log_event(log, "record_previous_kept", path=record, kept=kept)
            recorder = TickRecorder(
                sysfs,
                clock,
                record,
                board=spec.name,
                period_s=cfg.period_ms / 1000.0,
                policy=cfg.policy,
                spec=spec,
                # what a replay needs to take the same decisions: the settings, and the jobs
                config=recorded_config(cfg),
                jobs=True,
                rechecks=cfg.recheck_each_tick and not dry_run,
                max_bytes=record_max_bytes,
                # the daemon goes on controlling the board; only the trace ends here
                on_stop=lambda why: log_event(
                    log,
                    "record_stopped",
                    level=logging.ERROR,
                    path=record,
                    samples=recorder.count,
                    detail=why,
                ),
            )
        except OSError as err:
            raise DaemonError(f"cannot record to {record}: {err.strerror or err}") from None
        sysfs = recorder.sysfs  # everything the daemon reads and writes goes through it
    try:
        # the loop's reads of its jobs' processes are recorded; the actuator's are not
        loop_procs = recorder.watch_processes(procs) if recorder is not None else procs
        platform = Platform(spec, sysfs, loop_procs, clock, kind=kind)
        profiles = ProfileLookup(
            cfg.profiles,
            spec.name,
            on_error=lambda why: log_event(
                log, "profiles_unreadable", level=logging.WARNING, detail=why
            ),
        )
        table = JobTable()
        registrations = (
            None
            if dry_run
            else _take_up_jobs(table, cfg.state_dir, procs, profiles, root, clock.now)
        )
        loop = ControlLoop(
            platform,
            pol,
            period_s=cfg.period_ms / 1000.0,
            jobs=table if recorder is None else SeenJobs(table),
            stages=stages,
            guard=config_guard(spec, cfg),
            deadline_margin=deadline_margin(sysfs, cfg.deadline_slack),
            actuator=Actuator(
                sysfs,
                procs,
                dry_run=dry_run,
                live_jobs=True,
                originals=None if dry_run else JobOriginals(cfg.state_dir),
            ),
        )
    except BaseException:
        if recorder is not None:  # a setup that fails leaves no open recording behind
            recorder.close()
        raise
    notifier = Notifier()
    servers = []
    session = None
    restore = None
    status_writer = _StatusWriter(status_file) if status_file else None
    # SIGTERM, SIGINT and SIGHUP stop the loop (SIGHUP's default would kill the daemon
    # without restoring, e.g. a closed terminal); the finally below restores
    signals = StopOnSignals(stop, lambda name: log_event(log, "signal", signal=name))
    stop = signals.stop
    signals.install()
    try:
        if not dry_run:
            try:
                snapshot = begin_session(sysfs, spec, cfg.state_dir, log)
            except SnapshotError as err:
                raise DaemonError(str(err)) from None
            # only what the daemon writes is given back, and a policy that comes online
            # during the run has its originals saved before its first write
            session = Session(sysfs, snapshot, cfg.state_dir, log, spec)
            session.attach(loop.actuator)
        from daemon.registry import JobRegistry
        from daemon.registryserver import RegistryServer

        registry = JobRegistry(
            table,
            now=clock.now,
            alive=procs.alive,
            status_provider=loop.status,
            pid_owner=procs.owner_uid,
            profile_for=profiles,
            unmanageable=procs.unmanageable,
            start_time=procs.start_time,
            parent_of=procs.parent,
            # a deadline the gate can plan no operating point for is told at registration, not first by
            # the gate once the job runs (the static caps lower the fastest point)
            deadline_check=DeadlineCheck(spec, loop.guard.static_khz),
        )
        try:
            servers.append(
                RegistryServer(
                    registry, cfg.socket.path, group=cfg.socket.group, mode=cfg.socket.mode
                ).start()
            )
        except (OSError, HidvfsError) as err:
            log_event(
                log,
                "registry_unavailable",
                level=logging.WARNING,
                socket=cfg.socket.path,
                detail=str(err),
            )
        if cfg.metrics.enabled:
            from daemon.metrics import MetricsServer, metrics_from_status

            servers.append(
                MetricsServer(
                    cfg.metrics.listen,
                    lambda: metrics_from_status(loop.status()),
                    read_token(cfg.metrics, "metrics"),
                ).start()
            )
        if cfg.telemetry.listen:
            from daemon.telemetry import TelemetryServer

            servers.append(
                TelemetryServer(
                    cfg.telemetry.listen, loop.status, read_token(cfg.telemetry)
                ).start()
            )

        loop.max_lead_periods = 2.0  # a registration burst must not starve the decisions
        pinger = WatchdogPinger(notifier, clock.now)
        if pinger.interval_s:  # ping between ticks too: a long period_ms must not starve it
            loop.idle_every_s = pinger.interval_s / 2.0
            loop.on_idle.append(pinger.tick)
        last_status = [-1e18]

        sensor_log = SensorErrorLog(log, zones=spec.zones)
        limits_watch = LimitsWatch()

        def after_tick(res: TickResult) -> None:
            pinger.tick()
            sensor_log.update(res.obs.errors, cpu_temp=res.obs.max_cpu_temp_c is not None)
            if cfg.recheck_each_tick:  # before recheck() forgets what it reports
                limits_watch.check(
                    loop.sensed,
                    [] if dry_run else res.report.writes,
                    set(loop.actuator.expected),
                    res.t,
                )
            if cfg.recheck_each_tick and not dry_run:
                # what the check reads is recorded apart: the next tick's reads follow it
                with recorder.rechecking() if recorder is not None else contextlib.nullcontext():
                    drifted = loop.actuator.recheck()
                for msg in drifted:  # rewritten by the next decision
                    log_event(log, "drift", level=logging.WARNING, detail=msg)
            if res.report.gone:
                for pid in res.report.gone:
                    # a job that ended between the tick's reading and its writes: routine
                    log_event(log, "job_gone", pid=pid)
            if status_writer is not None and res.t - last_status[0] >= 1.0:
                last_status[0] = res.t
                status_writer(loop.status())
            if dry_run and res.report.writes:
                for path, value in res.report.writes:
                    print(f"dry-run: would write {value} to {path}", file=plan_out, flush=True)

        if recorder is not None:  # first: drift checks after the tick go to the next sample
            loop.on_tick.append(lambda res: recorder.sample(res.t, jobs=loop.jobs.take()))
        loop.on_tick.append(after_tick)
        notifier.ready(f"controlling {spec.name} with {pol.name}")
        log_event(
            log,
            "ready",
            board=spec.name,
            policy=pol.name,
            period_ms=cfg.period_ms,
            root=root,
            dry_run=dry_run,
            profiles=len(profiles),
        )
        # what the start made (models, sessions, servers) lives as long as the daemon: a
        # full collection in the slack of a tick need not walk it again
        with start_frozen():
            loop.run(duration_s=duration_s, stop=stop)
    finally:
        notifier.stopping("restoring cpufreq settings")
        if recorder is not None:
            recorder.close()  # never raises for the file system: the restore below must run
            log_event(
                log,
                "recorded",
                level=logging.INFO if recorder.stopped is None else logging.WARNING,
                samples=recorder.count,
                path=record,
                **({"stopped": recorder.stopped} if recorder.stopped else {}),
            )
        for srv in reversed(servers):
            try:
                srv.stop()
            except Exception as err:  # noqa: BLE001 - stopping must go on
                log_event(log, "server_stop_failed", level=logging.WARNING, detail=str(err))
        if registrations is not None:  # the last change of the table on disk (a thread's)
            registrations.close()
        try:  # jobs that outlive the daemon get back their own affinity and priority
            loop.actuator.release_all()
        except Exception as err:  # noqa: BLE001 - the cpufreq restore must still run
            log_event(log, "job_release_failed", level=logging.WARNING, detail=str(err))
        if session is not None:
            restore = restore_snapshot(sysfs, session.snapshot, log, state_dir=cfg.state_dir)
            log_event(
                log,
                "restored",
                level=logging.INFO if restore.ok else logging.ERROR,
                ok=restore.ok,
                detail=restore.summary(),
            )
        signals.restore()
    status = loop.status()
    if status_writer is not None:
        status_writer(status)
    if restore is not None and not restore.ok:
        # a non-zero exit: systemd shows the failure, and Restart=on-failure starts a run
        # whose first act is to try the kept restore.json again
        raise DaemonError(
            "could not give back "
            + "; ".join(f"{path} ({why})" for path, why in restore.failed)
            + f"; the originals stay in {snapshot_path(cfg.state_dir)} for the next start"
        )
    return status
