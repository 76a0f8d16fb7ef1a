"""journald-friendly logging: one line per event, ``event=...`` first, then ``key=value`` pairs.

Under systemd, stdout/stderr go to the journal, which stamps the time itself and reads the
priority from a ``<N>`` prefix (``SyslogLevelPrefix=yes``, the default), so in that case the
line carries neither a timestamp nor a level word. Elsewhere it gets ``ts=`` and ``level=``.
``logging.format: json`` follows the same rule (under the journal: the prefix, no ``ts``).
Values with spaces, quotes, ``=`` or control characters are double-quoted with escapes, so every
line stays machine-splittable; tracebacks are folded into one ``exc=`` field.

Use :func:`log_event` for structured events; plain ``logger.info("...")`` calls still work
(a message that already reads ``event=...`` is kept as is, any other becomes ``msg="..."``).
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, TextIO

from platforms import paths, power

if TYPE_CHECKING:
    from platforms.spec import ZoneSpec

_FIELDS = "hidvfs_fields"
_EVENT = "hidvfs_event"
#: syslog priorities for the <N> prefix (sd-daemon(3))
_PRIORITY = {
    logging.CRITICAL: 2,
    logging.ERROR: 3,
    logging.WARNING: 4,
    logging.INFO: 6,
    logging.DEBUG: 7,
}
_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.:/,+@%[]()")


def format_value(v: Any) -> str:
    """One value as it appears after ``key=`` (quoted only when needed)."""
    if v is None:
        text = "null"
    elif isinstance(v, bool):
        text = "true" if v else "false"
    elif isinstance(v, float):
        text = repr(v) if math.isfinite(v) else str(v)
        if math.isfinite(v) and ("e" in text or len(text) > 12):
            text = f"{v:.6g}"
    elif isinstance(v, (int, str)):
        text = str(v)
    elif isinstance(v, (list, tuple, set, frozenset)):
        items = sorted(v, key=str) if isinstance(v, (set, frozenset)) else v
        text = ",".join(format_value(x) for x in items)
    elif isinstance(v, Mapping):
        text = json.dumps(v, default=str, separators=(",", ":"), sort_keys=True)
    else:
        text = str(v)
    if text and all(ch in _SAFE for ch in text):
        return text
    escaped = (
        text.replace("\\", "\\\\")
        .replace('"', '\\"')
        .replace("\n", "\\n")
        .replace("\r", "\\r")
        .replace("\t", "\\t")
    )
    escaped = "".join(ch if ch.isprintable() else _escape_char(ch) for ch in escaped)
    return f'"{escaped}"'


def _escape_char(ch: str) -> str:
    n = ord(ch)
    if n < 0x100:
        return f"\\x{n:02x}"
    return f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"


def format_pairs(event: str, fields: Mapping[str, Any]) -> str:
    parts = [f"event={format_value(event)}"]
    for k, v in fields.items():
        parts.append(f"{_key(k)}={format_value(v)}")
    return " ".join(parts)


def _key(k: str) -> str:
    return "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in str(k)) or "_"


def log_event(logger: logging.Logger, event: str, level: int = logging.INFO, **fields: Any) -> None:
    """Log one structured event: ``log_event(log, "tick", policy="hidvfs", freq_khz=1420800)``."""
    if logger.isEnabledFor(level):
        logger.log(
            level,
            "%s",
            format_pairs(event, fields),
            extra={_EVENT: event, _FIELDS: fields},
            stacklevel=2,
        )


class KeyValueFormatter(logging.Formatter):
    """``[<N>]event=... k=v ...``; ``journal=True`` drops the time and level words."""

    def __init__(self, journal: bool = False):
        super().__init__()
        self.journal = journal

    def format(self, record: logging.LogRecord) -> str:
        if hasattr(record, _EVENT):
            line = format_pairs(getattr(record, _EVENT), getattr(record, _FIELDS))
        else:
            msg = record.getMessage()
            line = (
                msg
                if msg.startswith("event=") and "\n" not in msg
                else f"event=log msg={format_value(msg)}"
            )
        extra = []
        if not self.journal:
            extra.append(f"level={record.levelname.lower()}")
            extra.append(
                f"ts={datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec='milliseconds')}"
            )
        if record.name and record.name != "root":
            extra.append(f"logger={format_value(record.name)}")
        if record.exc_info:
            extra.append(f"exc={format_value(self.formatException(record.exc_info))}")
        # event= stays first: insert the extras after it
        head, _, tail = line.partition(" ")
        line = " ".join(x for x in (head, *extra, tail) if x)
        if self.journal:
            line = f"<{_priority(record.levelno)}>{line}"
        return line


class JsonFormatter(logging.Formatter):
    """``[<N>]{"event": ...}``: one JSON object per line, ``event`` first; ``journal=True``
    prefixes the priority and drops ``ts`` (the journal stamps the time). ``level`` stays: the
    journal strips the prefix, and a reader of the bare objects still wants it."""

    def __init__(self, journal: bool = False):
        super().__init__()
        self.journal = journal

    def format(self, record: logging.LogRecord) -> str:
        if hasattr(record, _EVENT):
            obj: dict[str, Any] = {"event": getattr(record, _EVENT), **getattr(record, _FIELDS)}
        else:
            obj = {"event": "log", "msg": record.getMessage()}
        obj["level"] = record.levelname.lower()
        if not self.journal:
            obj["ts"] = datetime.fromtimestamp(record.created, timezone.utc).isoformat(
                timespec="milliseconds"
            )
        obj["logger"] = record.name
        if record.exc_info:
            obj["exc"] = self.formatException(record.exc_info)
        line = json.dumps(obj, default=str)
        return f"<{_priority(record.levelno)}>{line}" if self.journal else line


def _priority(levelno: int) -> int:
    for lvl in sorted(_PRIORITY, reverse=True):
        if levelno >= lvl:
            return _PRIORITY[lvl]
    return 7


def under_journal() -> bool:
    """True when stderr is connected to the journal (systemd sets ``$JOURNAL_STREAM``)."""
    stream = os.environ.get("JOURNAL_STREAM")
    if not stream:
        return False
    try:
        dev, ino = (int(x) for x in stream.split(":"))
        st = os.fstat(sys.stderr.fileno())
    except (ValueError, OSError, AttributeError):
        return False
    return (st.st_dev, st.st_ino) == (dev, ino)


def setup_logging(
    level: str | int = "info",
    fmt: str = "keyvalue",
    stream: TextIO | None = None,
    journal: bool | None = None,
    logger_name: str = "hidvfs",
) -> logging.Logger:
    """Configure the ``hidvfs`` logger tree (idempotent: replaces our previous handler)."""
    logger = logging.getLogger(logger_name)
    lvl = level if isinstance(level, int) else logging.getLevelName(str(level).upper())
    if not isinstance(lvl, int):
        raise ValueError(
            f"unknown log level {level!r}; expected debug, info, warning, error or critical"
        )
    logger.setLevel(lvl)
    if journal is None:
        journal = under_journal() if stream is None else False
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    if fmt == "keyvalue":
        handler.setFormatter(KeyValueFormatter(journal=journal))
    elif fmt == "json":
        handler.setFormatter(JsonFormatter(journal=journal))
    else:
        raise ValueError(f"unknown log format {fmt!r}; expected keyvalue or json")
    handler._hidvfs = True  # type: ignore[attr-defined]
    for h in list(logger.handlers):
        if getattr(h, "_hidvfs", False):
            logger.removeHandler(h)
    logger.addHandler(handler)
    logger.propagate = False
    return logger


def _optional_sensor(file: str) -> bool:
    """A thermal zone or a power rail: some are normally unreadable at start (gated, probing
    late); a cpufreq file, ``/proc/stat`` or the CPU list never are."""
    return (
        file.startswith("class/thermal")
        or any(mark in file for mark in ("hwmon", "channel labelled"))
        or any(power.is_iio_folder(part) for part in file.split("/"))
    )


class SensorErrorLog:
    """Log a sensor file when its reads start failing and when they recover, once each: the
    status keeps only the latest errors, and a file failing every tick must not flood.

    Zones and rails that fail on the very first observation are often normal (Jetson Orin's
    ``cv*`` zones read EAGAIN while the DLA/PVA are power-gated; a power monitor may probe
    after the daemon starts): one INFO line lists them all. They are still read (a zone or
    rail not found is looked for again every second) and their recovery is logged. Anything
    else failing at start, a sensor that fails after the start (or again after it came back),
    and having no CPU temperature at all (the thermal guard cannot act) are WARNINGs.
    """

    def __init__(self, logger: logging.Logger, zones: Iterable[ZoneSpec] | None = None):
        """``zones``: the board spec's, named in the warning when none of them is a CPU zone."""
        self.log = logger
        self.failing: dict[str, str] = {}  # file -> the error that started it
        self.started = False
        self.cpu_temp: bool | None = None  # a CPU temperature was read at the last tick
        self.zones = None if zones is None else tuple(zones)

    def _no_cpu_temperature(self, errors) -> str:
        """Why no CPU temperature was read. A CPU zone either reads or fails under
        ``class/thermal``, so no such failure means that no zone is a CPU zone at all (on a
        board without a spec: no type reads as a CPU sensor), which no retry cures."""
        if self.zones is not None:
            unclassified = not any(z.role == "cpu" for z in self.zones)
        else:
            unclassified = not any(str(e).startswith(paths.THERMAL) for e in errors)
        if not unclassified:
            return "no CPU thermal zone can be read: the thermal guard cannot act until one can"
        if self.zones is None:
            seen = "`hidvfs probe` lists the zones and their roles"
        elif self.zones:
            seen = "zones: " + ", ".join(f"{z.type} ({z.role})" for z in self.zones)
        else:
            seen = "the board has no thermal zone"
        return (
            f"no thermal zone is classified as a CPU zone ({seen}): the thermal guard cannot "
            "act; a board spec (config board:) giving the CPU zone role cpu and the clusters "
            "it watches turns it on"
        )

    @staticmethod
    def _file(error: str) -> str:
        """The failing file; a sensor not found at all is keyed by its whole message (they
        share a folder: every missing zone reports the thermal class folder)."""
        head, _, rest = error.partition(": ")
        return error if rest.startswith("no ") else head

    def update(self, errors, *, cpu_temp: bool | None = None) -> None:
        """``errors`` of one observation; ``cpu_temp``: whether it had a CPU temperature."""
        now = {self._file(e): e for e in errors}
        if not self.started:
            self.started = True
            quiet = {f: e for f, e in now.items() if _optional_sensor(f)}
            if quiet:
                log_event(
                    self.log,
                    "sensors_unavailable_at_start",
                    count=len(quiet),
                    sensors=sorted(quiet),
                    detail="; ".join(quiet[f] for f in sorted(quiet)),
                    note="retried; each is logged when it comes back",
                )
            for f in sorted(now.keys() - quiet.keys()):
                self.log.warning("event=sensor_unavailable detail=%r", now[f])
        else:
            for f, e in now.items():
                if f not in self.failing:
                    self.log.warning("event=sensor_unavailable detail=%r", e)
        for f in self.failing.keys() - now.keys():
            self.log.info("event=sensor_recovered file=%s", f)
        self.failing = now
        if cpu_temp is False and self.cpu_temp is not False:
            self.log.warning(
                "event=no_cpu_temperature detail=%r", self._no_cpu_temperature(now.values())
            )
        elif cpu_temp and self.cpu_temp is False:
            self.log.info("event=cpu_temperature_back")
        if cpu_temp is not None:
            self.cpu_temp = cpu_temp
