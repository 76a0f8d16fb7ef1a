"""Trace record / replay / info: sysfs captured on a board, served again in CI.

``record`` samples every file the daemon reads (:func:`relevant_files`) each period;
``RecordingSysfs`` wraps the daemon's own backend so a live run can log what it read and wrote;
``ReplaySysfs`` serves a trace as a :class:`SysfsBackend` on any clock (a virtual clock replays
faster than real time) and keeps the daemon's writes so CI can compare its decisions with the
recorded ones (:func:`compare_writes`). The file format lives in :mod:`platforms.trace_io`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
import threading
from bisect import bisect_right
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

from platforms import paths, power, thermal
from platforms.clock import Clock
from platforms.errors import HidvfsError, SysfsUnavailable, SysfsWriteError
from platforms.procs import ProcessControl, ProcessGone
from platforms.spec import BoardSpec, ZoneSpec, board_names, load_board
from platforms.sysfs import SysfsBackend
from platforms.trace_io import (
    FORMAT,
    VERSION,
    Sample,
    Trace,
    TraceHeader,
    TraceWriter,
    read_trace,
)

__all__ = [
    "FORMAT",
    "VERSION",
    "TIME_EPS_S",
    "Sample",
    "Trace",
    "TraceHeader",
    "TraceWriter",
    "read_trace",
    "UNKNOWN_BOARD",
    "header_board",
    "header_note",
    "ReplaySysfs",
    "RecordingSysfs",
    "RECORDED_BY",
    "RECORDS_JOBS",
    "RECORDS_RECHECKS",
    "RecheckReads",
    "CONFIG_KEY",
    "TickRecorder",
    "RecordingProcesses",
    "RecordedProcesses",
    "relevant_files",
    "record",
    "trace_info",
    "format_info",
    "WriteMismatch",
    "compare_writes",
]


#: Trace times are stored to the microsecond; a clock within this of a sample time is at it
#: (a virtual clock stepped 10 x 0.1 s reads 0.9999999999999999, which must see the 1.0 sample).
TIME_EPS_S = 1e-6


def _norm(path: str) -> str:
    return path.strip("/")


#: the header board of a trace of a board hidvfs does not ship (`trace record` and the daemon
#: name a probed board so): a replay describes the board from the recording
UNKNOWN_BOARD = "unknown"


def header_board(trace: Trace) -> str | None:
    """The shipped board the header names; None for ``unknown``, null, or a name hidvfs does
    not ship (a daemon run with a board spec file records that spec's name): a replay then
    describes the board from the recording (see :func:`header_note`)."""
    name = trace.header.board
    if name is None or name == UNKNOWN_BOARD or name not in board_names():
        return None
    return name


def header_note(trace: Trace) -> str | None:
    """What to tell the user about a header board that is not shipped (None when it is, or
    ``unknown``): the replay runs on the board the recording describes, not on that name."""
    name = trace.header.board
    if name is None or name == UNKNOWN_BOARD or name in board_names():
        return None
    return (
        f"{trace.path}: header board {name!r} is not a shipped board ({', '.join(board_names())}; "
        "a board spec file's name, or an edit): the board is described from the recording"
    )


# --------------------------------------------------------------------------------------------
# Replay


class ReplaySysfs(SysfsBackend):
    """Serve a trace: a read returns the latest recorded value at ``clock.now() - t0``.

    Per path, the sample times that recorded it and their values are precomputed, so a read is
    one dict lookup and one bisect. Writes are kept in :attr:`writes` as ``(t, path, value)`` and
    never change later reads: the trace is what the board did, not what it would do now.
    """

    kind = "replay"

    def __init__(self, trace: Trace, clock: Clock, t0: float | None = None):
        self.trace = trace
        self.clock = clock
        self.t0 = clock.now() if t0 is None else float(t0)
        self.writes: list[tuple[float, str, str]] = []
        times: dict[str, list[float]] = {}
        values: dict[str, list[str | None]] = {}
        for s in trace.samples:
            for p, v in s.r.items():
                # equal times stay in file order, so bisect_right picks the later line
                times.setdefault(_norm(p), []).append(s.t)
                values.setdefault(_norm(p), []).append(v)
        self._times = times
        self._values = values
        self._files = {_norm(p) for p in trace.paths()}
        self._children: dict[str, set[str]] = {}
        for p in self._files:
            parts = p.split("/")
            for i in range(len(parts)):
                self._children.setdefault("/".join(parts[:i]), set()).add(parts[i])

    def __repr__(self) -> str:
        return f"ReplaySysfs({self.trace.path!r}, t0={self.t0})"

    def elapsed(self) -> float:
        """Trace time now (seconds since ``t0``)."""
        return self.clock.now() - self.t0

    @property
    def end(self) -> float:
        """Trace time of the last sample; a replay past it keeps serving the last values."""
        return self.trace.samples[-1].t if self.trace.samples else 0.0

    def read(self, path: str) -> str:
        key = _norm(path)
        now = self.elapsed()
        times = self._times.get(key)
        i = bisect_right(times, now + TIME_EPS_S) - 1 if times else -1
        if i < 0:
            detail = (
                "" if not times else f" at t={now:.3f} s (first recorded at t={times[0]:.3f} s)"
            )
            raise SysfsUnavailable(path, f"not in trace{detail}")
        value = self._values[key][i]
        if value is None:
            raise SysfsUnavailable(path, f"recorded as unavailable at t={times[i]:.3f} s")
        return value

    def write(self, path: str, value: str) -> None:
        if not self.exists(path):
            raise SysfsWriteError(path, value, errno.ENOENT, "not in trace")
        self.writes.append((self.elapsed(), _norm(path), value))

    def list(self, path: str) -> list[str]:
        return sorted(self._children.get(_norm(path), ()))

    def exists(self, path: str) -> bool:
        key = _norm(path)
        return key in self._files or key in self._children


class RecheckReads(SysfsBackend):
    """The replay's view for the daemon's check of its writes after a tick: a file the
    recording's sample holds under ``"c"`` reads as the check read it (null: unavailable),
    any other as the replay serves it at the sample's time."""

    kind = "replay"

    def __init__(self, sysfs: ReplaySysfs, rechecked: dict[str, str | None]):
        self.sysfs = sysfs
        self.rechecked = {_norm(p): v for p, v in rechecked.items()}

    def read(self, path: str) -> str:
        key = _norm(path)
        if key not in self.rechecked:
            return self.sysfs.read(path)
        value = self.rechecked[key]
        if value is None:
            raise SysfsUnavailable(path, "recorded as unavailable when the daemon checked it")
        return value

    def write(self, path: str, value: str) -> None:
        raise SysfsWriteError(path, value, errno.EROFS, "the check of the writes only reads")

    def list(self, path: str) -> list[str]:
        return self.sysfs.list(path)

    def exists(self, path: str) -> bool:
        return self.sysfs.exists(path)


@dataclass(frozen=True)
class WriteMismatch:
    """One tick where the replayed daemon wrote something else than the recorded one."""

    t: float
    path: str
    recorded: str | None
    replayed: str | None

    def __str__(self) -> str:
        return (
            f"t={self.t:.3f}s {self.path}: recorded {self.recorded or '(nothing)'}, "
            f"replayed {self.replayed or '(nothing)'}"
        )


def compare_writes(trace: Trace, writes: list[tuple[float, str, str]]) -> list[WriteMismatch]:
    """Compare replayed writes with the recorded ``w``, tick by tick (last write per path wins).

    A replayed write belongs to the latest sample at or before its time; writes before the first
    sample are compared with it. An empty list means the decisions agree.
    """
    times = trace.times
    if not times:
        return []
    replayed: list[dict[str, str]] = [{} for _ in times]
    for t, p, v in writes:
        replayed[max(bisect_right(times, t + TIME_EPS_S) - 1, 0)][_norm(p)] = v
    out = []
    for s, got in zip(trace.samples, replayed, strict=True):
        want = {_norm(p): v for p, v in s.w.items()}
        for p in sorted(want.keys() | got.keys()):
            if want.get(p) != got.get(p):
                out.append(WriteMismatch(s.t, p, want.get(p), got.get(p)))
    return out


# --------------------------------------------------------------------------------------------
# Recording


class RecordingSysfs(SysfsBackend):
    """Forward everything to ``inner`` and remember what was read and written since ``take()``.

    A failed read is remembered as None and re-raised; a refused write is not remembered (the
    trace says what reached the board). The last value per path wins within one take.
    """

    kind = "recording"

    def __init__(self, inner: SysfsBackend):
        self.inner = inner
        self._reads: dict[str, str | None] = {}
        self._writes: dict[str, str] = {}
        #: while not None, every read is noted here too (:meth:`TickRecorder.rechecking`)
        self.also: dict[str, str | None] | None = None

    def __repr__(self) -> str:
        return f"RecordingSysfs({self.inner!r})"

    @property
    def root(self) -> str | None:
        """The folder of the tree it records (None when the inner backend has none)."""
        root = getattr(self.inner, "root", None)
        return root if isinstance(root, str) else None

    def read(self, path: str) -> str:
        try:
            value = self.inner.read(path)
        except SysfsUnavailable:
            self._reads[path] = None
            if self.also is not None:
                self.also[path] = None
            raise
        self._reads[path] = value
        if self.also is not None:
            self.also[path] = value
        return value

    def write(self, path: str, value: str) -> None:
        self.inner.write(path, value)
        self._writes[path] = value

    def list(self, path: str) -> list[str]:
        return self.inner.list(path)

    def exists(self, path: str) -> bool:
        return self.inner.exists(path)

    def writable(self, path: str) -> bool:
        return self.inner.writable(path)

    def take(self) -> tuple[dict[str, str | None], dict[str, str]]:
        """(reads, writes) since the last call, then start afresh."""
        out = (self._reads, self._writes)
        self._reads, self._writes = {}, {}
        return out


#: header key of a trace written by the daemon itself (``hidvfs daemon --record``): one sample
#: per tick, so a replay can tick at the same times and compare every write
RECORDED_BY = "recorded_by"
#: header key (true) of a daemon recording whose samples carry the jobs its control loop saw
#: (a sample's ``"j"``, :func:`platforms.trace_io._check_jobs`): a replay feeds them back
RECORDS_JOBS = "records_jobs"
#: header key of a daemon recording: the config settings that shape its decisions (plain
#: JSON, the keys of the daemon's config file), which a replay runs with by default
CONFIG_KEY = "config"
#: header key (true) of a daemon recording that checked its writes after each tick (its
#: ``recheck_each_tick``): a file another tool changed is written again on the next tick,
#: and a replay does the same, with what the check read (a sample's ``"c"``)
RECORDS_RECHECKS = "records_rechecks"


_TRACE_SUFFIXES = (".jsonl.gz", ".json.gz", ".jsonl", ".json", ".gz")


def previous_name(path: str | os.PathLike[str]) -> str:
    """Where :func:`keep_previous_recording` keeps a recording: ``.prev`` before its trace
    extensions (``d.jsonl.gz`` -> ``d.prev.jsonl.gz``, so it still reads as gzip)."""
    folder, base = os.path.split(os.fspath(path))
    for suffix in _TRACE_SUFFIXES:
        if base.endswith(suffix) and len(base) > len(suffix):
            return os.path.join(folder, base[: -len(suffix)] + ".prev" + suffix)
    return os.path.join(folder, base + ".prev")


def is_recording_to_keep(path: str | os.PathLike[str]) -> bool:
    """Whether :func:`keep_previous_recording` will move what is at ``path`` away: a
    non-empty regular file, looked at, not followed (``lstat``). /dev/null, a FIFO, a symlink
    (``/dev/stdout``, or one a user planted) or an empty file is no recording to keep: the
    writer decides whether it may write through it."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_size > 0


def keep_previous_recording(path: str | os.PathLike[str]) -> str | None:
    """Move an existing, non-empty recording at ``path`` to :func:`previous_name` (replacing
    the one kept before) and return that name, else None (:func:`is_recording_to_keep`): a
    daemon restarted after a failure (systemd's Restart=on-failure) with the same
    ``--record`` would otherwise truncate the trace of the run that failed, the one worth
    reading."""
    if not is_recording_to_keep(path):
        return None
    prev = previous_name(path)
    os.replace(path, prev)
    return prev


class TickRecorder:
    """The daemon's own recording (``hidvfs daemon --record``): one sample per control tick
    with every file it read and wrote since the previous one.

    :attr:`sysfs` is the backend to hand the daemon; :meth:`sample` is called after each tick
    with the tick's sense time on ``clock``. The header names the policy and marks the trace
    as the daemon's, so ``trace replay`` ticks at the sample times and compares the writes.

    ``config`` (plain JSON) is stored in the header: the settings the decisions depend on.
    With ``jobs``, the header says the samples carry the jobs the loop saw: give the control
    loop :meth:`watch_processes` as its process backend, and :meth:`sample` the tick's jobs.

    The first sample also holds the value then of every header file the daemon did not read
    since the recorder was made: what the daemon read only at its start, before the recorder
    (a driver's ``cpuinfo_min_freq`` and ``cpuinfo_max_freq``, from which a board without a
    frequency table has its grid), so a replay can probe the board as the daemon did.
    """

    def __init__(
        self,
        inner: SysfsBackend,
        clock: Clock,
        out: str | os.PathLike[str],
        *,
        board: str,
        period_s: float,
        policy: str,
        spec: BoardSpec | None = None,
        max_bytes: int | None = None,
        on_stop: Callable[[str], None] | None = None,
        config: dict[str, Any] | None = None,
        jobs: bool = False,
        rechecks: bool = False,
    ):
        self.sysfs = RecordingSysfs(inner)
        #: what the check of the writes after the last tick read (:meth:`rechecking`)
        self._rechecked: dict[str, str | None] = {}
        self.max_bytes = max_bytes
        self._on_stop = on_stop  # told once, with the reason, when the recording stops early
        #: why the recording stopped before :meth:`close` (a full disk, the size limit)
        self.stopped: str | None = None
        self._clock = clock
        extra: dict[str, Any] = {RECORDED_BY: "daemon", "policy": policy}
        if config is not None:
            extra[CONFIG_KEY] = config
        if jobs:
            extra[RECORDS_JOBS] = True
        if rechecks:
            extra[RECORDS_RECHECKS] = True
        header = TraceHeader(
            board=board,
            period_s=float(period_s),
            files=relevant_files(inner, spec),
            extra=extra,
        )
        #: header files the first sample reads if the daemon did not (None once written)
        self._unread: list[str] | None = list(header.files)
        self._writer = TraceWriter(out, header, option="--record").open()
        self._t0 = clock.now()
        self._procs: RecordingProcesses | None = None
        self._seen: dict[int, dict[str, Any]] = {}  # pid -> registration, as the last tick saw it

    def watch_processes(self, inner: ProcessControl) -> RecordingProcesses:
        """The process backend to hand the control loop: ``inner``, with what the loop read
        of each job's process (alive, start time, affinity) kept for the tick's sample."""
        self._procs = RecordingProcesses(inner)
        return self._procs

    @contextlib.contextmanager
    def rechecking(self) -> Iterator[None]:
        """Around the daemon's check of its writes after a tick: what it reads goes into the
        next sample's ``r`` as every read between two ticks does, and, where the next tick
        reads the file again and finds another value (nvpmodel changed it in between), into
        that sample's ``"c"``, so a replay's check reads what the daemon's read."""
        self.sysfs.also = self._rechecked
        try:
            yield
        finally:
            self.sysfs.also = None

    def sample(self, t: float, jobs: dict[str, list[dict[str, Any]]] | None = None) -> None:
        """Write the tick's sample. A write the file system refuses (a full disk, an I/O
        error) or the size limit stops the recording (:attr:`stopped` says why) instead of
        raising: the daemon's control, and its restore at the end, must not depend on a log
        file. What was written stays a readable trace up to its last whole line.

        ``jobs`` (a recorder made with ``jobs=True``): what the tick's observation took from
        the job table, as plain dicts on ``clock``'s time: ``"ended"``, the jobs whose end the
        registry reported (pid, name, criticality, release_t, finish_t, deadline_s), and
        ``"snapshot"``, the registered jobs in the table's order (pid, name, criticality,
        release_t, deadline_s, profile, start_time, registrant_uid, adopter)."""
        reads, writes = self.sysfs.take()  # taken even when stopped: nothing piles up
        facts = self._procs.take() if self._procs is not None else {}
        # the check after the previous tick, where this tick's reads did not end on its value
        rechecked = {p: v for p, v in self._rechecked.items() if reads.get(p, v) != v}
        self._rechecked = {}
        if self.stopped is not None:
            return
        if self._unread is not None:  # the first sample: every header file has a value
            known = {_norm(p) for p in reads}
            for p in self._unread:
                if _norm(p) not in known:  # read from the board, not through self.sysfs
                    reads[p] = self.sysfs.inner.read_or(p)
            self._unread = None
        try:
            j = self._jobs(jobs, facts) if jobs is not None else None
            self._writer.write_sample(max(t - self._t0, 0.0), reads, writes, j, rechecked)
            if self.max_bytes is not None:  # a tell() a tick: each sample is flushed anyway
                size = self._writer.size()
                if size is None:  # a pipe: its reader keeps up or not, no file grows
                    self.max_bytes = None
                elif size >= self.max_bytes:
                    self._stop(f"reached its size limit ({size} of {self.max_bytes} bytes)")
        except OSError as err:
            self._stop(f"cannot write ({err.strerror or err})")

    def _trace_time(self, t: float) -> float:
        return round(float(t) - self._t0, 6)

    def _jobs(self, jobs: dict[str, list[dict[str, Any]]], facts) -> dict[str, Any] | None:
        """A sample's ``"j"``: the registrations the loop had not seen on the tick before
        (``new``), the registered jobs with what it read of their processes (``jobs``), the
        ends the registry reported (``ended``, with how the job exited when its launcher
        said), what it read of other processes (``procs``); times in trace seconds. None: no
        jobs."""
        new, rows = [], []
        seen: dict[int, dict[str, Any]] = {}
        for entry in jobs.get("snapshot", ()):
            row = dict(entry, release_t=self._trace_time(entry["release_t"]))
            pid = row["pid"]
            seen[pid] = row
            if self._seen.get(pid) != row:
                new.append(row)
            rows.append({"pid": pid, **facts.get(pid, {})})
        self._seen = seen
        # the other processes the loop read (a job's launcher, whose word on its end it waits for)
        procs = [{"pid": pid, **fact} for pid, fact in sorted(facts.items()) if pid not in seen]
        ended = [
            dict(
                out,
                release_t=self._trace_time(out["release_t"]),
                finish_t=self._trace_time(out["finish_t"]),
            )
            for out in jobs.get("ended", ())
        ]
        j = {"new": new, "jobs": rows, "ended": ended, "procs": procs}
        return {k: v for k, v in j.items() if v} or None

    def _stop(self, why: str, close: bool = True) -> None:
        self.stopped = why
        if close:
            try:
                self._writer.close()
            except OSError:
                pass  # the same full disk refusing the trailer: the file is closed all the same
        if self._on_stop is not None:
            self._on_stop(why)

    @property
    def count(self) -> int:
        return self._writer.count

    def close(self) -> None:
        """Stop recording: what the daemon does afterwards (its restore) is not a decision.
        Never raises for the file system: a failed close only sets :attr:`stopped`."""
        if self.stopped is None:  # else _stop closed it
            try:
                self._writer.close()
            except OSError as err:
                self._stop(f"cannot write ({err.strerror or err})", close=False)


class RecordingProcesses(ProcessControl):
    """``inner`` for the control loop of a recording daemon: everything is forwarded, and
    what was read of each process (alive, start time, affinity; the last answer per pid) is
    kept until :meth:`take`, as a sample's ``"j"`` facts. An affinity that could not be read
    is kept as None (the loop then knows none)."""

    def __init__(self, inner: ProcessControl):
        self.inner = inner
        self._facts: dict[int, dict[str, Any]] = {}
        self._lock = threading.Lock()

    def _note(self, pid: int, key: str, value: Any) -> None:
        with self._lock:
            self._facts.setdefault(pid, {})[key] = value

    def take(self) -> dict[int, dict[str, Any]]:
        """pid -> {"alive", "start", "cpus"} (those read) since the last call."""
        with self._lock:
            out, self._facts = self._facts, {}
        return out

    def alive(self, pid: int) -> bool:
        got = self.inner.alive(pid)
        self._note(pid, "alive", bool(got))
        return got

    def start_time(self, pid: int) -> float | None:
        got = self.inner.start_time(pid)
        self._note(pid, "start", got)
        return got

    def get_affinity(self, pid: int) -> tuple[int, ...]:
        try:
            got = self.inner.get_affinity(pid)
        except Exception:
            self._note(pid, "cpus", None)
            raise
        self._note(pid, "cpus", [int(c) for c in got])  # in its order: cpus[0] is its home
        return got

    # -- the rest is the inner backend's ----------------------------------------------------
    def set_affinity(self, pid, cpus):
        return self.inner.set_affinity(pid, cpus)

    def set_priority(self, pid, rt_priority=0, nice=0):
        return self.inner.set_priority(pid, rt_priority, nice)

    def cpu_time(self, pid):
        return self.inner.cpu_time(pid)

    def get_priority(self, pid):
        return self.inner.get_priority(pid)

    def set_own_affinity(self, pid, cpus):
        return self.inner.set_own_affinity(pid, cpus)

    def set_own_priority(self, pid, rt_priority=0, nice=0):
        return self.inner.set_own_priority(pid, rt_priority, nice)

    def parent(self, pid):
        return self.inner.parent(pid)

    def descendants(self, pid):
        return self.inner.descendants(pid)

    def rt_allowed(self, pid):
        return self.inner.rt_allowed(pid)

    def rt_limit(self, pid):
        return self.inner.rt_limit(pid)

    def identity(self, pid):
        return self.inner.identity(pid)

    def process_map(self, *, fresh_recheck: bool = False):
        return self.inner.process_map(fresh_recheck=fresh_recheck)

    def unmanageable(self, pid):
        return self.inner.unmanageable(pid)

    def machine_cpus(self):
        return self.inner.machine_cpus()

    def __getattr__(self, name: str):  # owner_uid and what else a backend adds
        return getattr(self.inner, name)


class RecordedProcesses(ProcessControl):
    """The processes of a recording's jobs, for its replay: on each tick (:meth:`feed`) a
    job's process is alive, started and placed as the recording daemon read it then. A pid
    the tick does not name is gone. What the replay's actuator sets (affinity, priority) is
    accepted and dropped: the recording says what the kernel did."""

    def __init__(self) -> None:
        self._facts: dict[int, dict[str, Any]] = {}

    def feed(self, j: dict[str, Any] | None) -> None:
        """The tick's sample's ``"j"`` (its ``"jobs"`` and ``"procs"`` rows)."""
        j = j or {}
        self._facts = {row["pid"]: row for key in ("procs", "jobs") for row in j.get(key, ())}

    def _fact(self, pid: int) -> dict[str, Any]:
        fact = self._facts.get(pid)
        if fact is None or not fact.get("alive", False):
            raise ProcessGone(pid)
        return fact

    def alive(self, pid: int) -> bool:
        return bool(self._facts.get(pid, {}).get("alive", False))

    def start_time(self, pid: int) -> float | None:
        return self._facts.get(pid, {}).get("start")

    def get_affinity(self, pid: int) -> tuple[int, ...]:
        cpus = self._fact(pid).get("cpus")
        if cpus is None:  # the daemon could not read it (or did not)
            raise ProcessGone(pid)
        return tuple(cpus)

    def set_affinity(self, pid, cpus):
        self._fact(pid)

    def set_priority(self, pid, rt_priority=0, nice=0):
        self._fact(pid)

    def cpu_time(self, pid):
        raise ProcessGone(pid)  # not recorded: nothing decides on it


_POLICY_RE = re.compile(r"policy\d+")
_CPU_RE = re.compile(r"cpu\d+")
_ZONE_RE = re.compile(r"thermal_zone\d+")
#: ina3221x channel folders (iio:deviceN, L4T 28's iio_device): the rule of power.is_iio_folder
_IIO_RE = power.IIO_FOLDER_RE
_HWMON_RE = re.compile(r"hwmon\d+")
_RAIL_PATTERNS = ("name", "*_label", "in*_input", "curr*_input", "in_power*", "rail_name_*")
IIO_DRIVER = "bus/i2c/drivers/ina3221x"
IIO_BUS = "bus/iio/devices"
HWMON_DRIVER = "bus/i2c/drivers/ina3221"
CLASS_HWMON = "class/hwmon"


def _rail_files(sysfs: SysfsBackend, folder: str) -> list[str]:
    return [
        f"{folder}/{n}"
        for n in sysfs.list(folder)
        if any(fnmatchcase(n, p) for p in _RAIL_PATTERNS)
    ]


def _matching(sysfs: SysfsBackend, folder: str, regex: re.Pattern[str]) -> list[str]:
    return [f"{folder}/{n}" for n in sysfs.list(folder) if regex.fullmatch(n)]


def relevant_files(sysfs: SysfsBackend, spec: BoardSpec | None = None) -> list[str]:
    """Every file the daemon reads on this board, found by listing (works on unknown boards).

    Policies, CPU online masks, thermal zones (type, temp, trips), INA3221 rails (IIO by driver
    folder and on the IIO bus, hwmon by driver folder and by ``class/hwmon`` name), ``proc/stat``
    and the device-tree identity. A spec adds its rails' device folders (boards that put them
    elsewhere).
    Only files that exist now are listed; a read that fails later is recorded as null.
    """
    out: set[str] = set()
    for pol in _matching(sysfs, paths.CPUFREQ, _POLICY_RE):
        present = set(sysfs.list(pol))
        out.update(f"{pol}/{n}" for n in paths.POLICY_FILES if n in present)
    for name in ("online", "present", "possible"):
        out.add(f"{paths.CPU}/{name}")
    for cpu in _matching(sysfs, paths.CPU, _CPU_RE):
        out.add(f"{cpu}/online")
    for zone in _matching(sysfs, paths.THERMAL, _ZONE_RE):
        out.update(
            f"{zone}/{n}"
            for n in sysfs.list(zone)
            if n in ("type", "temp") or n.startswith("trip_point_")
        )
    rail_dirs: list[str] = []
    for dev in sysfs.list(IIO_DRIVER):
        rail_dirs += _matching(sysfs, f"{IIO_DRIVER}/{dev}", _IIO_RE)
    for dev in _matching(sysfs, IIO_BUS, _IIO_RE):  # the same sensors as the IIO bus shows them
        if any(n.startswith("rail_name_") for n in sysfs.list(dev)):
            rail_dirs.append(dev)
    for dev in sysfs.list(HWMON_DRIVER):
        rail_dirs += _matching(sysfs, paths.hwmon_root(f"{HWMON_DRIVER}/{dev}"), _HWMON_RE)
    for hw in _matching(sysfs, CLASS_HWMON, _HWMON_RE):
        if sysfs.read_or(f"{hw}/name") == "ina3221":
            rail_dirs.append(hw)
    for rail in spec.rails if spec is not None else ():
        dev = _norm(rail.device)
        if rail.driver == "iio":
            rail_dirs.append(dev)
        else:
            rail_dirs += _matching(sysfs, paths.hwmon_root(dev), _HWMON_RE)
    for folder in rail_dirs:
        out.update(_rail_files(sysfs, folder))
    out.update(
        (
            paths.PROC_STAT,
            paths.DT_COMPATIBLE,
            paths.DT_MODEL,
            paths.DT_DTSFILENAME,
            paths.RT_RUNTIME,
            paths.RT_PERIOD,
        )
    )
    return sorted(p for p in out if sysfs.exists(p))


def record(
    sysfs: SysfsBackend,
    clock: Clock,
    out: str | os.PathLike[str],
    *,
    period_s: float,
    duration_s: float | None,
    board: str | None,
    files: list[str] | None = None,
    on_sample: Callable[[int, float], None] | None = None,
    spec: BoardSpec | None = None,
    started: str | None = None,
    stop: threading.Event | None = None,
    option: str = "--out",
) -> int:
    """Sample ``files`` (default: :func:`relevant_files`) every ``period_s`` into ``out``.

    Samples are taken on a fixed grid from the first one (t=0), so the period does not drift;
    a sample that overruns skips the grid points it missed instead of bursting. Reads that fail
    are stored as null. ``duration_s=None`` records until KeyboardInterrupt (the trace is kept).
    Setting ``stop`` (a signal handler does) ends the recording early, at once even in the
    middle of a long period, with the file closed as at the end (complete, gzip trailer
    written). ``on_sample(count, t)`` is called after each sample (progress). Returns the
    sample count. ``option`` names ``out`` in an error about the file (`trace record --out`).
    """
    if not period_s > 0:
        raise ValueError(f"period_s must be > 0 seconds, got {period_s!r}")
    if duration_s is not None and not duration_s > 0:
        raise ValueError(f"duration_s must be > 0 seconds or None, got {duration_s!r}")
    names = list(files) if files is not None else relevant_files(sysfs, spec)
    header = TraceHeader(board=board, period_s=float(period_s), files=names)
    if started is not None:
        header.started = started
    with TraceWriter(out, header, option=option) as writer:
        t0 = clock.now()
        k = 0
        try:
            while duration_s is None or k * period_s < duration_s - 1e-9:
                if stop is not None and stop.is_set():
                    break
                wait = t0 + k * period_s - clock.now()
                if wait > 0:
                    if stop is None:
                        clock.sleep(wait)
                    elif clock.wait(wait, stop):
                        break
                t = clock.now() - t0
                writer.write_sample(t, {p: sysfs.read_or(p) for p in names}, {})
                if on_sample is not None:
                    on_sample(writer.count, t)
                k = max(k + 1, int((clock.now() - t0) / period_s) + 1)
        except KeyboardInterrupt:
            if duration_s is not None:
                raise
        return writer.count


# --------------------------------------------------------------------------------------------
# Info


def _int_or_none(text: str | None) -> int | None:
    try:
        return int(text.split()[0]) if text is not None else None
    except (ValueError, IndexError):
        return None


def _range(values: list[int], scale: float = 1.0) -> dict[str, float | None]:
    if not values:
        return {"min": None, "max": None}
    return {"min": min(values) / scale, "max": max(values) / scale}


def _zone_specs(board: str | None) -> dict[str, ZoneSpec]:
    """The zones of the trace's board spec by type, when the header names a shipped board."""
    if not board:
        return {}
    try:
        return {z.type: z for z in load_board(board).zones}
    except HidvfsError:  # "unknown", or a board this install does not ship
        return {}


def trace_info(trace: Trace) -> dict[str, Any]:
    """Summary numbers of a trace (what ``hidvfs trace info --json`` prints).

    ``zones_c`` holds the temperature zones only: a zone that is not a temperature (PMIC-Die,
    stuck at 100; the PM7250B BCL zones, a battery current or level; what the board spec marks
    so) is in ``zones_skipped`` with the reason, and a reading no thermal zone can report
    (:func:`platforms.thermal.implausible_temp`) is left out and counted in
    ``implausible_temps`` (a zone with no other reading is skipped with that reason)."""
    zone_type: dict[str, str] = {}
    temps: dict[str, list[int]] = {}
    freqs: dict[str, list[int]] = {}
    unavailable = 0
    writes = 0
    for s in trace.samples:
        writes += len(s.w)
        for p, v in s.r.items():
            if v is None:
                unavailable += 1
            head, _, name = _norm(p).rpartition("/")
            folder = head.rpartition("/")[2]
            if name == "type" and _ZONE_RE.fullmatch(folder) and v is not None:
                zone_type.setdefault(head, v)
            elif name == "temp" and _ZONE_RE.fullmatch(folder):
                lst = temps.setdefault(head, [])
                if (x := _int_or_none(v)) is not None:
                    lst.append(x)
            elif name == "scaling_cur_freq" and _POLICY_RE.fullmatch(folder):
                lst = freqs.setdefault(folder, [])
                if (x := _int_or_none(v)) is not None:
                    lst.append(x)
    zones: dict[str, dict[str, float | None]] = {}
    skipped: dict[str, str] = {}
    implausible = 0
    specs = _zone_specs(trace.header.board)
    for zdir in sorted(temps, key=lambda z: int(z.rpartition("zone")[2])):
        ztype = zone_type.get(zdir)
        label = ztype or zdir.rpartition("/")[2]
        if label in zones or label in skipped:
            label = f"{label} ({zdir.rpartition('/')[2]})"
        reason = thermal.skip_reason(ztype, specs.get(ztype)) if ztype else None
        if reason is not None:
            skipped[label] = reason
            continue
        good: list[int] = []
        bad: list[str] = []
        for x in temps[zdir]:
            why = thermal.implausible_temp(x / 1000.0)
            if why is None:
                good.append(x)
            else:
                bad.append(why)
        implausible += len(bad)
        if bad and not good:
            skipped[label] = bad[0]
            continue
        zones[label] = _range(good, 1000.0)
    n = len(trace.samples)
    duration = trace.duration_s
    return {
        "file": trace.path,
        "board": trace.header.board,
        "version": trace.header.version,
        "started": trace.header.started,
        "period_s": trace.header.period_s,
        "samples": n,
        "duration_s": duration,
        "files": len(trace.paths()),
        "rate_hz": (n - 1) / duration if n > 1 and duration > 0 else None,
        "zones_c": zones,
        "zones_skipped": skipped,
        "implausible_temps": implausible,
        "policies_khz": {
            p: _range(freqs[p]) for p in sorted(freqs, key=lambda p: int(p[len("policy") :]))
        },
        "unavailable_reads": unavailable,
        "writes": writes,
        "truncated": trace.truncated,
    }


def _fmt_range(r: dict[str, float | None], unit: str, digits: int) -> str:
    if r["min"] is None:
        return "unavailable"
    return f"{r['min']:.{digits}f} .. {r['max']:.{digits}f} {unit}"


def format_info(info: dict[str, Any]) -> str:
    """Readable multi-line summary of :func:`trace_info` (``hidvfs trace info``)."""
    rate = f"{info['rate_hz']:.2f} Hz" if info["rate_hz"] is not None else "n/a"
    lines = [
        f"trace     {info['file']}",
        f"board     {info['board'] or 'unknown'}   (format v{info['version']}, started {info['started']})",
        f"samples   {info['samples']} over {info['duration_s']:.3f} s, mean rate {rate} "
        f"(period {info['period_s']} s)",
        f"files     {info['files']}   write entries {info['writes']}",
        f"unavailable reads {info['unavailable_reads']}"
        + (
            " (reads that found no value: a missing or empty file, EAGAIN, a permission or "
            "read error; a replay fails them the same way)"
            if info["unavailable_reads"]
            else ""
        ),
    ]
    if info.get("truncated"):
        lines.append(f"TRUNCATED {info['truncated']}")
    if info["zones_c"]:
        lines.append("thermal zones (°C):")
        width = max(len(z) for z in info["zones_c"])
        lines += [f"  {z:<{width}}  {_fmt_range(r, '°C', 1)}" for z, r in info["zones_c"].items()]
    if info.get("implausible_temps"):
        lines.append(f"  ({info['implausible_temps']} implausible readings left out of the ranges)")
    if info.get("zones_skipped"):
        lines.append("zones that are not temperatures (left out):")
        width = max(len(z) for z in info["zones_skipped"])
        lines += [f"  {z:<{width}}  {why}" for z, why in info["zones_skipped"].items()]
    if info["policies_khz"]:
        lines.append("cpufreq policies (scaling_cur_freq):")
        lines += [f"  {p:<8}  {_fmt_range(r, 'kHz', 0)}" for p, r in info["policies_khz"].items()]
    return "\n".join(lines)
