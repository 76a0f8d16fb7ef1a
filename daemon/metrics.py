"""Optional Prometheus endpoint (text exposition format 0.0.4) on localhost.

The daemon supplies a callback returning :class:`Metric` families (or its status dict, turned
into the standard families by :func:`metrics_from_status`); each scrape calls it, so the numbers
are as fresh as the last tick. Units are Prometheus base units (hertz, celsius, watts, joules);
an unavailable reading is left out of the scrape rather than reported as 0. Stdlib only:
``http.server`` on a background thread, shared with the telemetry endpoint, and the same access
rule as it: a non-loopback address is refused without a bearer token, and once a token is set
every request must carry ``Authorization: Bearer <token>`` (compared in constant time).
"""

from __future__ import annotations

import hmac
import logging
import math
import re
import socket
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from daemon.config import is_loopback, parse_listen
from daemon.httpbounds import BoundedHandler, BoundedServer, host_port

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")

log = logging.getLogger("hidvfs.metrics")


@dataclass
class Metric:
    """One metric family: a name, its type, a help text and labelled samples."""

    name: str
    kind: str  # "gauge" | "counter"
    help: str
    samples: list[tuple[dict[str, str], float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(f"invalid metric name {self.name!r}")
        if self.kind not in ("gauge", "counter"):
            raise ValueError(
                f"metric {self.name}: kind must be gauge or counter, got {self.kind!r}"
            )

    def add(self, value: float | None, **labels: str) -> Metric:
        """Add a sample; ``None`` (unavailable) is skipped."""
        if value is None:
            return self
        for k in labels:
            if not _LABEL.match(k) or k.startswith("__"):
                raise ValueError(f"metric {self.name}: invalid label name {k!r}")
        self.samples.append(({k: str(v) for k, v in labels.items()}, float(value)))
        return self


def escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def format_number(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if v == int(v) and abs(v) < 1e15:
        return str(int(v))
    return repr(v)


def render(metrics: Iterable[Metric]) -> str:
    """The text exposition of ``metrics`` (``# HELP``, ``# TYPE``, one line per sample)."""
    lines: list[str] = []
    seen: set[str] = set()
    for m in metrics:
        if m.name in seen:
            raise ValueError(f"metric family {m.name!r} appears twice")
        seen.add(m.name)
        lines.append(f"# HELP {m.name} {escape_help(m.help)}")
        lines.append(f"# TYPE {m.name} {m.kind}")
        for labels, value in m.samples:
            if labels:
                body = ",".join(f'{k}="{escape_label(v)}"' for k, v in labels.items())
                lines.append(f"{m.name}{{{body}}} {format_number(value)}")
            else:
                lines.append(f"{m.name} {format_number(value)}")
    return "\n".join(lines) + "\n" if lines else ""


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v)


def _by_criticality(name: str, kind: str, help_text: str, counts: Any) -> Metric:
    """A family with one sample per criticality of the status's ``{criticality: n}`` map."""
    m = Metric(name, kind, help_text)
    for crit, n in sorted(dict(counts or {}).items()):
        m.add(_num(n), criticality=crit)
    return m


def metrics_from_status(status: Mapping[str, Any]) -> list[Metric]:
    """The standard hidvfs families from the daemon's status dict.

    Reads ``freq_khz`` {cluster: kHz}, ``temp_c`` {zone: °C}, ``power_w`` {rail: W} (and
    ``rails_w`` when present), ``energy_j``, ``jobs_running``, ``deadline_misses``
    {criticality: n}, ``jobs_failed`` {criticality: n}, ``jobs_overdue`` {criticality: n},
    ``ticks`` (decisions) and ``interventions`` (an int, or {kind: n} such
    as gate/shield/guard). Missing keys and ``None`` values are left out.
    """
    freq = Metric(
        "hidvfs_cluster_frequency_hertz", "gauge", "Current CPU frequency of each cpufreq cluster."
    )
    for name, khz in sorted(dict(status.get("freq_khz") or {}).items()):
        v = _num(khz)
        freq.add(None if v is None else v * 1000.0, cluster=name)
    temp = Metric("hidvfs_zone_temperature_celsius", "gauge", "Temperature of each thermal zone.")
    for name, c in sorted(dict(status.get("temp_c") or {}).items()):
        temp.add(_num(c), zone=name)
    power = Metric("hidvfs_rail_power_watts", "gauge", "Power drawn on each monitored rail.")
    rails = dict(status.get("power_w") or {})
    rails.update(dict(status.get("rails_w") or {}))
    for name, w in sorted(rails.items()):
        power.add(_num(w), rail=name)
    energy = Metric(
        "hidvfs_energy_joules_total",
        "counter",
        "Energy on the board's total input rail since the daemon started.",
    )
    energy.add(_num(status.get("energy_j")))
    jobs = Metric("hidvfs_jobs_running", "gauge", "Registered jobs still running.")
    jobs.add(_num(status.get("jobs_running")))
    done = Metric(
        "hidvfs_jobs_completed_total",
        "counter",
        "Registered jobs that finished, failed ones included.",
    )
    done.add(_num(status.get("jobs_done")))
    misses = _by_criticality(
        "hidvfs_deadline_misses_total",
        "counter",
        "Jobs that finished after their deadline, by criticality (failed jobs are not "
        "scored; a running job past its deadline is in hidvfs_jobs_overdue).",
        status.get("deadline_misses"),
    )
    failed = _by_criticality(
        "hidvfs_jobs_failed_total",
        "counter",
        "Jobs that ended with a non-zero exit status, were killed by a signal or were stopped "
        "by hidvfs run, as hidvfs run reported, by criticality; neither met nor missed.",
        status.get("jobs_failed"),
    )
    overdue = _by_criticality(
        "hidvfs_jobs_overdue",
        "gauge",
        "Registered jobs still running past their deadline, by criticality.",
        status.get("jobs_overdue"),
    )
    decisions = Metric("hidvfs_decisions_total", "counter", "Control-loop decisions taken.")
    decisions.add(_num(status.get("ticks", status.get("decisions"))))
    inter = Metric(
        "hidvfs_interventions_total",
        "counter",
        "Decisions changed by the schedulability gate, the conformal shield or the thermal guard.",
    )
    raw = status.get("interventions")
    if isinstance(raw, Mapping):
        for kind, n in sorted(raw.items()):
            inter.add(_num(n), kind=kind)
    else:
        inter.add(_num(raw), kind="all")
    return [freq, temp, power, energy, jobs, done, misses, failed, overdue, decisions, inter]


# --------------------------------------------------------------------------------------------
# A small HTTP server on a thread (shared with daemon.telemetry); the bounds against slow and
# idle clients live in daemon.httpbounds (shared with the coordinator's extender)


#: a connection must send its whole request head (request line and headers) within this long
#: in all, not per recv (a client dripping a byte a second held its slot for as long as it liked)
HTTP_HEAD_TIMEOUT_S = 3.0
#: writing the answer gets its own time
HTTP_TIMEOUT_S = 10.0
#: a request head larger than this is refused (414 in the request line, 431 in the headers)
HTTP_MAX_HEAD_BYTES = 16 * 1024
#: connections served at once (a slowloris held 1500 threads and 13 GB of address space);
#: when they are all taken, the oldest connection that has not sent its whole request head is
#: dropped for the new one, and only when every one is being answered is the new one closed
HTTP_MAX_CONNECTIONS = 32
#: connections from one peer address at once: its next one drops its own oldest unfinished one
HTTP_MAX_PER_PEER = 8
#: refused and dropped connections are logged at most once in this long per endpoint, counted
HTTP_REFUSED_LOG_S = 5.0


class _Server(BoundedServer):
    """The bounds of :mod:`daemon.httpbounds` with the ``HTTP_*`` constants above."""

    allow_reuse_address = True
    request_queue_size = 64

    endpoint = "http"
    logger = log

    def max_connections(self) -> int:
        return HTTP_MAX_CONNECTIONS

    def max_per_peer(self) -> int:
        return HTTP_MAX_PER_PEER

    def refused_log_s(self) -> float:
        return HTTP_REFUSED_LOG_S

    def server_bind(self) -> None:
        """Bind even before the address exists (IP_FREEBIND): at boot a board's network may
        come up after the daemon, and a refused bind would fail the start."""
        try:  # IP_FREEBIND (SOL_IP) covers IPv6 sockets too on Linux
            self.socket.setsockopt(socket.IPPROTO_IP, getattr(socket, "IP_FREEBIND", 15), 1)
        except OSError:
            pass  # not Linux: bind as usual
        super().server_bind()


class LocalHttpServer:
    """Serves ``handler(path, headers) -> (status, content_type, body)`` on a thread.

    ``token`` guards every request (``Authorization: Bearer <token>``, compared in constant
    time; anything else is answered by :meth:`unauthorized`, a 401). Without a token only a
    loopback address is served: a remote one is refused here, naming the config keys
    ``<name>.token`` / ``<name>.token_file``."""

    def __init__(
        self,
        listen: str,
        handler: Callable[[str, Mapping[str, str]], tuple[int, str, bytes]],
        name: str,
        token: str | None = None,
    ):
        self.listen = listen
        self.host, self.port = parse_listen(listen)
        if not token and not is_loopback(self.host):
            raise ValueError(
                f"{name}: refusing to serve {listen} without a token: {self.host} is not a "
                f"loopback address (set {name}.token or {name}.token_file)"
            )
        self.handler = handler
        self.name = name
        self.token = token or None
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None

    def authorized(self, headers: Mapping[str, str]) -> bool:
        if self.token is None:
            return True
        got = headers.get("Authorization") or ""
        scheme, _, value = got.partition(" ")
        if scheme.lower() != "bearer":
            return False
        return hmac.compare_digest(value.strip().encode(), self.token.encode())

    def unauthorized(self) -> tuple[int, str, bytes]:
        """The answer to a request without the right token (endpoints override the body)."""
        return 401, "text/plain; charset=utf-8", b"missing or wrong bearer token\n"

    def respond(self, path: str, headers: Mapping[str, str]) -> tuple[int, str, bytes]:
        """The token check, then the handler."""
        if not self.authorized(headers):
            return self.unauthorized()
        return self.handler(path, headers)

    @property
    def address(self) -> tuple[str, int]:
        """The bound (host, port); the port is the real one when 0 was asked for."""
        if self._httpd is None:
            return self.host, self.port
        addr = self._httpd.server_address
        return str(addr[0]), int(addr[1])

    def start(self) -> LocalHttpServer:
        outer = self

        class Handler(BoundedHandler):
            server_version = "hidvfs"
            sys_version = ""
            timeout = HTTP_TIMEOUT_S

            def version_string(self) -> str:
                return self.server_version  # not "hidvfs " with the empty sys_version

            def head_limits(self) -> tuple[float, int]:
                return HTTP_HEAD_TIMEOUT_S, HTTP_MAX_HEAD_BYTES

            def do_GET(self) -> None:  # noqa: N802 - http.server naming
                try:
                    status, ctype, body = outer.respond(self.path, self.headers)
                except Exception:  # noqa: BLE001 - a scrape must never kill the daemon
                    log.exception(
                        "event=http_handler_failed endpoint=%s path=%s", outer.name, self.path
                    )
                    status, ctype, body = 500, "text/plain; charset=utf-8", b"internal error\n"
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                if status == 401:
                    self.send_header("WWW-Authenticate", 'Bearer realm="hidvfs"')
                self.end_headers()
                self.wfile.write(body)

            def _not_allowed(self) -> None:
                """Another method than GET: 405 with ``Allow: GET`` (http.server said 501,
                "not implemented", which reads as a broken server)."""
                body = b"only GET is served here\n"
                self.send_response(405)
                self.send_header("Allow", "GET")
                self.send_header("Content-Type", "text/plain; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Connection", "close")  # a request body is left unread
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)
                self.close_connection = True

            do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = _not_allowed

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
                log.debug("event=http_request endpoint=%s detail=%r", outer.name, format % args)

        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        server_cls = type(
            "_BoundServer", (_Server,), {"address_family": family, "endpoint": self.name}
        )
        try:
            self._httpd = server_cls((self.host, self.port), Handler)
        except OSError as err:
            raise OSError(
                err.errno, f"{self.name}: cannot listen on {self.listen}: {err.strerror}"
            ) from None
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.2},
            name=f"hidvfs-{self.name}",
            daemon=True,
        )
        self._thread.start()
        log.info("event=http_listening endpoint=%s address=%s", self.name, host_port(*self.address))
        return self

    def stop(self) -> None:
        if self._httpd is None:
            return
        self._httpd.shutdown()
        self._httpd.log_refused()  # the count since the last line
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(5)
        self._httpd = None
        self._thread = None

    def __enter__(self) -> LocalHttpServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


MetricsProvider = Callable[[], "Iterable[Metric] | Mapping[str, Any]"]


class MetricsServer(LocalHttpServer):
    """``GET /metrics`` -> the exposition of ``provider()`` (Metric families or a status dict);
    ``token`` as for :class:`LocalHttpServer` (config ``metrics.token`` / ``metrics.token_file``;
    Prometheus sends it with ``authorization`` or ``bearer_token_file`` in its scrape config)."""

    def __init__(self, listen: str, provider: MetricsProvider, token: str | None = None):
        self.provider = provider
        super().__init__(listen, self._handle, "metrics", token)

    def _handle(self, path: str, headers: Mapping[str, str]) -> tuple[int, str, bytes]:
        route = path.split("?", 1)[0]
        if route not in ("/metrics", "/"):
            return 404, "text/plain; charset=utf-8", b"not found; try /metrics\n"
        got = self.provider()
        families = metrics_from_status(got) if isinstance(got, Mapping) else list(got)
        return 200, CONTENT_TYPE, render(families).encode()
