"""The trace file format: header, samples, writer and a strict reader.

A trace is ``.jsonl`` or ``.jsonl.gz``. Line 1 is the header
``{"format": "hidvfs-trace", "version": 1, "board": ..., "period_s": ..., "started": ISO-8601,
"files": [...]}``; each later line is one sample ``{"t": s, "r": {path: text|null}, "w": {path:
text}}``: what was read (null: the read failed) and what the daemon wrote on that tick. A
sample of a daemon recording whose header says ``"records_jobs": true`` may also carry ``"j"``:
the registered jobs the control loop saw on that tick (see :func:`_check_jobs`), and, with
``"records_rechecks": true``, ``"c"``: what the daemon's check of its writes after the previous
tick read where ``r`` ends on another value (path -> text|null). A reader that ignores them
still reads the file (the keys are additive, the version stays 1).

The reader refuses anything it cannot trust (unknown version, corrupt or truncated line,
time going backwards) with a :class:`TraceError` naming the file, the line and the cause, so a
CI replay never silently runs on half a trace. ``allow_truncated=True`` salvages the complete
part of a recording that was cut short (a crash, a full disk): the writer flushes every sample,
so such a file loses at most its last line.
"""

from __future__ import annotations

import datetime as _dt
import gzip
import json
import math
import os
import zlib
from dataclasses import dataclass, field
from typing import IO, Any

from platforms.errors import TraceError
from platforms.outputs import open_output
from platforms.streams import sniff_gzip

FORMAT = "hidvfs-trace"
VERSION = 1
#: the shortest period `trace record` samples at; a header below it is not a recording
MIN_PERIOD_S = 0.001
#: the latest sample time a trace may hold (about 31 years): past it float time stops advancing
#: by a period, and a replay would never end
MAX_T_S = 1e9


def now_iso() -> str:
    """The current wall time as ISO-8601 with its UTC offset (the header's ``started``)."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


@dataclass
class TraceHeader:
    """Line 1 of a trace. ``extra`` keeps header keys this version does not know, verbatim."""

    board: str | None
    period_s: float
    files: list[str] = field(default_factory=list)
    started: str = field(default_factory=now_iso)
    version: int = VERSION
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out = {
            "format": FORMAT,
            "version": self.version,
            "board": self.board,
            "period_s": self.period_s,
            "started": self.started,
            "files": list(self.files),
        }
        out.update({k: v for k, v in self.extra.items() if k not in out})
        return out


@dataclass(slots=True)
class Sample:
    """One tick: ``r`` maps path -> text read (None: unavailable), ``w`` path -> text written;
    ``j`` the jobs the daemon's control loop saw on the tick (None: none, or not recorded);
    ``c`` see below."""

    t: float
    r: dict[str, str | None]
    w: dict[str, str]
    j: dict[str, Any] | None = None
    #: what the daemon's check of its writes after the previous tick read, where ``r`` ends
    #: on another value for the file (a header's ``records_rechecks``); None: nothing such
    c: dict[str, str | None] | None = None


@dataclass
class Trace:
    header: TraceHeader
    samples: list[Sample]
    path: str = "<trace>"
    #: why the tail was dropped when read with ``allow_truncated=True``; None when complete
    truncated: str | None = None

    @property
    def times(self) -> list[float]:
        return [s.t for s in self.samples]

    @property
    def duration_s(self) -> float:
        return self.samples[-1].t - self.samples[0].t if self.samples else 0.0

    def paths(self) -> set[str]:
        """Every path the trace knows: the header's files and all read or written paths."""
        out = set(self.header.files)
        for s in self.samples:
            out.update(s.r)
            out.update(s.w)
        return out


# --------------------------------------------------------------------------------------------
# Writing


class TraceWriter:
    """Append samples to a trace file; gzip when the name ends in ``.gz``.

    Every sample is flushed to the OS (gzip with a sync flush), so a crashed process loses at
    most the line it was writing. Times must not go backwards and values must be text (reads may
    be None), so the writer never produces a file the reader refuses. The file is opened by
    :func:`platforms.outputs.open_output` (no write through another user's symlink, into a
    block device or a file with other hard links; ``/dev/stdout`` and a FIFO as streams), a
    refusal naming ``option``.
    """

    def __init__(
        self, path: str | os.PathLike[str], header: TraceHeader, *, option: str = "the trace"
    ):
        self.path = os.fspath(path)
        self.header = header
        #: the command option naming the file, for an error about it (``--record``)
        self.option = option
        self.count = 0
        self._f: IO[bytes] | None = None
        self._raw: IO[bytes] | None = None  # the file under a GzipFile
        self._last_t: float | None = None

    def open(self) -> TraceWriter:
        p = self.header.period_s
        if not MIN_PERIOD_S <= p <= MAX_T_S:
            raise ValueError(
                f"{self.path}: period_s must be {MIN_PERIOD_S} to {MAX_T_S:g} s, got {p}"
            )
        if self._f is None:
            # never through another user's symlink, never into a block device or a file
            # hard-linked elsewhere (a root daemon's --record in a folder a user can write)
            raw = open_output(self.path, self.option)
            if self.path.endswith(".gz"):
                # level 6 (gzip's own default): 4x cheaper than 9 for ~5% more bytes, which
                # matters when the recorder shares the board with the workload it measures;
                # the name in the gzip header is the path's, as gzip.open(path) wrote it
                try:
                    self._f = gzip.GzipFile(self.path, "wb", compresslevel=6, fileobj=raw)
                except BaseException:
                    raw.close()
                    raise
                self._raw = raw  # GzipFile leaves a file it was given open: close() does it
            else:
                self._f = raw  # closed in close()
            self._line(self.header.to_json())
        return self

    def __enter__(self) -> TraceWriter:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the file; a close that fails (a full disk refusing gzip's trailer) still
        releases it and raises once, never again."""
        f, self._f = self._f, None
        raw, self._raw = self._raw, None
        try:
            if f is not None:
                f.close()
        finally:
            if raw is not None:
                raw.close()

    def size(self) -> int | None:
        """Bytes written to the file so far (compressed, for gzip: each sample is flushed);
        None where that cannot be told (a pipe or a FIFO cannot seek, and nothing fills up)."""
        if self._f is None:
            return os.path.getsize(self.path) if os.path.exists(self.path) else 0
        raw = getattr(self._f, "fileobj", None) or self._f
        try:
            return raw.tell()
        except OSError:  # ESPIPE
            return None

    def write_sample(
        self,
        t: float,
        reads: dict[str, str | None],
        writes: dict[str, str] | None = None,
        jobs: dict[str, Any] | None = None,
        rechecked: dict[str, str | None] | None = None,
    ) -> None:
        if self._f is None:
            raise RuntimeError(f"{self.path}: write_sample on a closed TraceWriter")
        t = float(t)
        if not 0.0 <= t <= MAX_T_S:
            raise ValueError(f"{self.path}: sample time must be 0 to {MAX_T_S:g} s, got {t}")
        if self._last_t is not None and t < self._last_t:
            raise ValueError(
                f"{self.path}: sample time {t} is earlier than the previous {self._last_t}"
            )
        writes = writes or {}
        for path, v in (*reads.items(), *(rechecked or {}).items()):
            if v is not None and not isinstance(v, str):
                raise TypeError(f"read of {path}: expected text or None, got {v!r}")
        for path, v in writes.items():
            if not isinstance(v, str):
                raise TypeError(f"write to {path}: expected text, got {v!r}")
        line: dict[str, Any] = {"t": round(t, 6), "r": reads, "w": writes}
        if jobs:
            _check_jobs(jobs, lambda reason: ValueError(f"{self.path}: jobs: {reason}"))
            line["j"] = jobs
        if rechecked:
            line["c"] = rechecked
        self._line(line)
        self._last_t = t
        self.count += 1

    def _line(self, obj: dict[str, Any]) -> None:
        assert self._f is not None
        self._f.write(json.dumps(obj, separators=(",", ":")).encode() + b"\n")
        self._f.flush()


# --------------------------------------------------------------------------------------------
# Reading


def read_trace(path: str | os.PathLike[str], *, allow_truncated: bool = False) -> Trace:
    """Read and validate a whole trace (gzip is detected by its magic bytes, not the name).

    The file is opened once and its first bytes sniffed from that open file, so a pipe or a
    FIFO (``trace replay <(zcat d.jsonl.gz)``) reads as well as a file."""
    path = os.fspath(path)
    try:
        f = open(path, "rb")
    except OSError as err:
        raise TraceError(path, 0, f"cannot open: {err.strerror}") from None
    with f:
        try:
            stream, gz = sniff_gzip(f)
        except OSError as err:
            raise TraceError(path, 0, f"cannot read: {err.strerror}") from None
        with gzip.GzipFile(fileobj=stream, mode="rb") if gz else stream as lines:
            return _read_lines(lines, path, allow_truncated)


def _read_lines(f: IO[bytes], path: str, allow_truncated: bool) -> Trace:
    header: TraceHeader | None = None
    samples: list[Sample] = []
    truncated: str | None = None
    lineno = 0
    last_t = -math.inf
    lines = iter(f)
    while True:
        try:
            raw = next(lines)
        except StopIteration:
            break
        except EOFError:
            reason = "truncated: the gzip stream is cut short (the recording was interrupted)"
            if not allow_truncated or header is None:
                raise TraceError(path, lineno + 1, reason) from None
            truncated = f"line {lineno + 1}: {reason}"
            break
        except (gzip.BadGzipFile, zlib.error) as err:
            raise TraceError(path, lineno + 1, f"corrupt gzip data ({err})") from None
        lineno += 1
        if not raw.strip():
            continue  # a blank line carries nothing
        try:
            obj = json.loads(raw)
        except RecursionError:
            raise TraceError(path, lineno, "corrupt line: JSON nested too deeply") from None
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            if not raw.endswith(b"\n"):
                reason = "truncated last line (no newline at the end and not valid JSON)"
                if allow_truncated and header is not None:
                    truncated = f"line {lineno}: {reason}"
                    break
                raise TraceError(path, lineno, reason) from None
            what = "header" if header is None else "corrupt line"
            raise TraceError(path, lineno, f"{what}: not JSON ({_json_reason(err)})") from None
        if header is None:
            header = _parse_header(obj, path, lineno)
            continue
        sample = _parse_sample(obj, path, lineno)
        if sample.t < last_t:
            raise TraceError(path, lineno, f"time goes backwards: t={sample.t} after t={last_t}")
        last_t = sample.t
        samples.append(sample)
    if header is None:
        raise TraceError(path, 1, "empty file (no header line)")
    return Trace(header=header, samples=samples, path=path, truncated=truncated)


def _json_reason(err: Exception) -> str:
    if isinstance(err, json.JSONDecodeError):
        return f"{err.msg} at column {err.colno}"
    return f"not UTF-8: {err}"


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _parse_header(obj: Any, path: str, line: int) -> TraceHeader:
    def fail(reason: str) -> TraceError:
        return TraceError(path, line, reason)

    if not isinstance(obj, dict):
        raise fail(f"header: expected a JSON object, got {type(obj).__name__}")
    fmt = obj.get("format")
    if fmt != FORMAT:
        raise fail(f"not a hidvfs trace: header 'format' is {fmt!r}, expected {FORMAT!r}")
    version = obj.get("version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise fail(f"header 'version' must be an integer, got {version!r}")
    if version > VERSION:
        raise fail(
            f"trace version {version} is newer than this hidvfs understands ({VERSION}); "
            "upgrade hidvfs"
        )
    if version != VERSION:
        raise fail(f"trace version {version} is unknown (this hidvfs reads version {VERSION})")
    board = obj.get("board")
    if board is not None and not isinstance(board, str):
        raise fail(f"header 'board' must be a string or null, got {board!r}")
    period = obj.get("period_s")
    if not _is_number(period) or not MIN_PERIOD_S <= period <= MAX_T_S:
        raise fail(
            f"header 'period_s' must be a number of seconds from {MIN_PERIOD_S} "
            f"(what `trace record` can sample) to {MAX_T_S:g}, got {period!r}"
        )
    started = obj.get("started")
    if not isinstance(started, str) or not _is_iso(started):
        raise fail(f"header 'started' must be an ISO-8601 time, got {started!r}")
    files = obj.get("files", [])
    if not isinstance(files, list) or not all(isinstance(x, str) for x in files):
        raise fail("header 'files' must be a list of paths")
    known = {"format", "version", "board", "period_s", "started", "files"}
    return TraceHeader(
        board=board,
        period_s=float(period),
        files=files,
        started=started,
        version=version,
        extra={k: v for k, v in obj.items() if k not in known},
    )


def _is_iso(text: str) -> bool:
    try:
        _dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return False
    return True


def _parse_sample(obj: Any, path: str, line: int) -> Sample:
    def fail(reason: str) -> TraceError:
        return TraceError(path, line, f"corrupt line: {reason}")

    if not isinstance(obj, dict):
        raise fail(f"a sample must be a JSON object, got {type(obj).__name__}")
    if "t" not in obj:
        raise fail("sample has no 't' (time in seconds)")
    t = obj["t"]
    if not _is_number(t) or not 0 <= t <= MAX_T_S:
        raise fail(f"'t' must be a number of seconds from 0 to {MAX_T_S:g}, got {t!r}")
    r = obj.get("r", {})
    w = obj.get("w", {})
    if not isinstance(r, dict):
        raise fail(f"'r' must be an object of path -> text, got {type(r).__name__}")
    if not isinstance(w, dict):
        raise fail(f"'w' must be an object of path -> text, got {type(w).__name__}")
    for k, v in r.items():
        if v is not None and not isinstance(v, str):
            raise fail(f"'r' value of {k!r} must be text or null, got {v!r}")
    for k, v in w.items():
        if not isinstance(v, str):
            raise fail(f"'w' value of {k!r} must be text, got {v!r}")
    j = obj.get("j")
    if j is not None:
        _check_jobs(j, lambda reason: fail(f"'j': {reason}"))
    c = obj.get("c")
    if c is not None:
        if not isinstance(c, dict):
            raise fail(f"'c' must be an object of path -> text, got {type(c).__name__}")
        for k, v in c.items():
            if v is not None and not isinstance(v, str):
                raise fail(f"'c' value of {k!r} must be text or null, got {v!r}")
    return Sample(t=float(t), r=r, w=w, j=j or None, c=c or None)


# --------------------------------------------------------------------------------------------
# The jobs of a daemon recording's tick (a sample's "j")

#: a registration the loop saw for the first time on the tick (its times in trace seconds)
JOB_KEYS = {
    "pid": "pid",
    "name": "text",
    "criticality": "crit",
    "release_t": "number",
    "deadline_s": "number?",
    "profile": "object?",
    "start_time": "number?",
    "registrant_uid": "int?",
    "adopter": "adopter?",
}
#: a job whose end the registry reported (``hidvfs run`` unregistering its command)
ENDED_KEYS = {
    "pid": "pid",
    "name": "text",
    "criticality": "crit",
    "release_t": "number",
    "finish_t": "number",
    "deadline_s": "number?",
    "exit": "object?",
}
#: a registered job on the tick, in the table's order, with what the loop read of its process
FACT_KEYS = {"pid": "pid", "alive": "bool", "start": "number?", "cpus": "cpus?"}


def _check_jobs(j: Any, fail) -> None:
    """Check a sample's ``"j"``: ``{"new": [registration], "jobs": [fact], "ended": [end],
    "procs": [fact]}`` (``procs``: other processes the loop read), each list optional (see :data:`JOB_KEYS`, :data:`FACT_KEYS`, :data:`ENDED_KEYS`); raise
    ``fail(reason)`` for the first thing wrong. Other keys are left for a later hidvfs."""
    if not isinstance(j, dict):
        raise fail(f"must be an object, got {type(j).__name__}")
    for key, spec in (
        ("new", JOB_KEYS),
        ("jobs", FACT_KEYS),
        ("ended", ENDED_KEYS),
        ("procs", FACT_KEYS),
    ):
        rows = j.get(key, [])
        if not isinstance(rows, list):
            raise fail(f"{key!r} must be a list, got {type(rows).__name__}")
        for row in rows:
            if not isinstance(row, dict):
                raise fail(f"{key!r} rows must be objects, got {row!r}")
            for name, kind in spec.items():
                if name not in row:
                    if kind.endswith("?") or (key in ("jobs", "procs") and name != "pid"):
                        continue  # (a fact the loop did not read is left out)
                    raise fail(f"{key!r} row has no {name!r}: {row!r}")
                if not _fits(row[name], kind):
                    raise fail(f"{key!r} row: {name!r} is {row[name]!r}, expected {kind}")
        if key in ("jobs", "procs") and len({row["pid"] for row in rows}) != len(rows):
            raise fail(f"{key!r} names a pid twice")


def _fits(v: Any, kind: str) -> bool:
    if kind.endswith("?"):
        if v is None:
            return True
        kind = kind[:-1]
    if kind == "pid":
        return isinstance(v, int) and not isinstance(v, bool) and v > 0
    if kind == "int":
        return isinstance(v, int) and not isinstance(v, bool)
    if kind == "text":
        return isinstance(v, str)
    if kind == "crit":
        return v in ("hi", "lo")
    if kind == "number":
        return _is_number(v)
    if kind == "bool":
        return isinstance(v, bool)
    if kind == "object":
        return isinstance(v, dict)
    if kind == "cpus":
        return isinstance(v, list) and all(_fits(c, "int") and c >= 0 for c in v)
    if kind == "adopter":
        return isinstance(v, list) and len(v) == 2 and _fits(v[0], "pid") and _fits(v[1], "number?")
    raise AssertionError(kind)
