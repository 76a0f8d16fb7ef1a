"""Kubernetes scheduler-extender wire protocol: ``filter`` and ``prioritize`` over HTTP/JSON.

The scheduler POSTs ``ExtenderArgs`` ({Pod, Nodes | NodeNames}) to ``<urlPrefix>/<verb>``.
Current kube-scheduler sends Go field names (``Pod``, ``NodeNames``); v1.7-v1.14 sent lower
case (``pod``, ``nodenames``). Keys are therefore read case-insensitively and the reply uses
the casing of the request. Replies: ``ExtenderFilterResult`` for filter (a failure that
no eviction can fix, an :class:`Unresolvable` reason, goes to ``FailedAndUnresolvableNodes``,
any other to ``FailedNodes``), a ``HostPriorityList`` ([{Host, Score 0..10}]) for
prioritize. Anything but 200 is an error to the scheduler, so malformed requests get 400
with a message naming the key.
"""

from __future__ import annotations

import json
import logging
import math
import re
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from daemon.httpbounds import BoundedHandler, BoundedServer, HeadTooLarge

log = logging.getLogger("hidvfs.coordinator")

#: the largest request body read (a larger one is a 400). The scheduler sends the feasible
#: nodes it found: by default n * (50 - n/125) % of n nodes (500 of 5000; ~780 at most, near
#: n = 3100), all n with ``percentageOfNodesToScore: 100``. NodeNames take ~32 bytes a node
#: (5000 in 160 KB). A whole Node (``nodeCacheCapable: false``) takes 3 KB (no images) to
#: 12.5 KB (50 images), a few KB more with managedFields: 8 MiB holds 500-2700 of them, not
#: 780 fat ones nor a whole 5000-node list (15-60 MB): large clusters want NodeNames.
#: Parsed, a body takes ~4 times its size
MAX_BODY = 8 << 20
#: writing an answer may take this long, and a body gets this long plus its size at
#: :data:`BODY_MIN_RATE` to arrive whole (one deadline for the body, not one per recv)
HANDLER_TIMEOUT_S = 10.0
#: the lowest body rate waited for, bytes/s: an 8 MiB body has 10 + 8 = 18 s in all
BODY_MIN_RATE = 1 << 20
#: the whole request head (request line and headers) must arrive within this long; the
#: scheduler writes it at once, and 5 s is its httpTimeout in docs/k3s-extender.md
HEAD_TIMEOUT_S = 5.0
#: a larger request head is refused (414 in the request line, 431 in the headers)
MAX_HEAD_BYTES = 16 << 10
#: connections served at once (handler threads: at most twice this); when all are taken, the
#: oldest one still sending its request (head or body) from the peer holding the most is
#: dropped for the new one; only when all are being answered is the new one answered 503
MAX_CONNECTIONS = 64
#: connections from one address at once (its next one drops its own oldest unfinished one):
#: the scheduler asks one filter or prioritize at a time and the server closes each connection
#: after its answer, so it holds one or two; the margin covers several schedulers or probes
#: behind one address (loopback, NAT), and one address still gets half the slots at most
MAX_PER_PEER = 32
#: request bodies (declared Content-Length) held at once, from the read to the end of the
#: answer; a body that does not fit is answered 503 with Retry-After, its bytes discarded.
#: Four bodies of MAX_BODY (the scheduler sends one at a time), ~160 MB with their parse
BODY_BUDGET = 32 << 20
#: bodies up to this size are not counted against BODY_BUDGET (NodeNames requests: they are
#: never answered 503 by clients holding the budget with large slow bodies); at most
#: MAX_CONNECTIONS of them, 16 MiB
SMALL_BODY = 256 << 10
#: Retry-After of a 503, seconds
RETRY_AFTER_S = 1
#: refused and dropped connections are logged at most once in this long, counted
REFUSED_LOG_S = 5.0
#: pod annotations an upstream DAG coordinator sets (seconds on a speed-1 node)
ANN_WORK = "hidvfs.io/work-s"
ANN_RANK = "hidvfs.io/rank-s"
DEFAULT_WORK_S = 10.0
#: the largest work-s / rank-s annotation taken, in seconds
MAX_ANNOTATION_S = 1e9


class BadRequest(ValueError):
    pass


class Unresolvable(str):
    """A filter failure that no eviction can fix (the pod is larger than the node, the node
    can run no work): the reply puts it in ``FailedAndUnresolvableNodes``, which tells the
    scheduler that preempting pods there cannot help. Any other reason (a plain ``str``,
    such as too few cores free now) goes to ``FailedNodes``."""

    __slots__ = ()


def ci_get(d: object, key: str, default=None):
    """``d[key]`` with the key matched case-insensitively (Go's JSON decoding rule)."""
    if not isinstance(d, dict):
        return default
    if key in d:
        return d[key]
    low = key.lower()
    for k, v in d.items():
        if isinstance(k, str) and k.lower() == low:
            return v
    return default


_CPU_RE = re.compile(r"^([0-9.]+)(m?)$")
_MEM_RE = re.compile(r"^([0-9.]+(?:[eE][+-]?[0-9]+)?)([KMGTPE]i?|k|m)?$")
_MEM_UNIT = {
    None: 1.0,
    "k": 1e3,
    "K": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "E": 1e18,
    "m": 1e-3,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}


def _quantity(v: float, what: str, q: object) -> float:
    """A request quantity must be finite and >= 0 (a NaN or -1 would slip through every fit)."""
    if not math.isfinite(v) or v < 0:
        raise BadRequest(f"{what} quantity {q!r} is not a finite number >= 0")
    return v


def _quantity_text(q: object, what: str) -> str:
    if isinstance(q, bool) or not isinstance(q, (str, int, float)):
        raise BadRequest(f"{what} quantity {q!r:.60}: expected a string or a number")
    return str(q).strip()


def parse_cpu(q: object, what: str = "cpu") -> float:
    """Kubernetes CPU quantity (``"500m"``, ``"2"``, 1.5) in cores."""
    if isinstance(q, (int, float)) and not isinstance(q, bool):
        try:
            return _quantity(float(q), what, q)
        except OverflowError:
            raise BadRequest(f"{what} quantity is too large") from None
    m = _CPU_RE.match(_quantity_text(q, what))
    try:
        v = float(m.group(1)) if m else None
    except ValueError:
        v = None
    if v is None:
        raise BadRequest(f"{what} quantity {q!r:.60} is not understood")
    return _quantity(v / 1000.0 if m.group(2) else v, what, q)


def parse_mem_gb(q: object, what: str = "memory") -> float:
    """Kubernetes memory quantity (``"1Gi"``, ``"512M"``, bytes) in GB (10^9 bytes)."""
    if isinstance(q, (int, float)) and not isinstance(q, bool):
        try:
            return _quantity(float(q) / 1e9, what, q)
        except OverflowError:
            raise BadRequest(f"{what} quantity is too large") from None
    m = _MEM_RE.match(_quantity_text(q, what))
    try:
        v = float(m.group(1)) * _MEM_UNIT[m.group(2)] / 1e9 if m else None
    except ValueError:
        v = None
    if v is None:
        raise BadRequest(f"{what} quantity {q!r:.60} is not understood")
    return _quantity(v, what, q)


@dataclass(frozen=True)
class PodRequest:
    name: str
    cpu: float  # cores (sum of container requests; 0 when none)
    mem_gb: float
    work_s: float
    rank_s: float


@dataclass(frozen=True)
class NodeInfo:
    name: str
    cpu: float | None = None  # allocatable
    mem_gb: float | None = None
    labels: dict = field(default_factory=dict)


@dataclass(frozen=True)
class ExtenderArgs:
    pod: PodRequest
    nodes: list[NodeInfo]
    raw_nodes: list | None  # the NodeList items when the scheduler sent full nodes
    lower: bool  # the request used lower-case keys


def _number_annotation(ann: dict, key: str, default: float | None) -> float | None:
    if key not in ann:
        return default
    v = ann[key]
    try:
        if isinstance(v, bool) or not isinstance(v, (str, int, float)):
            raise TypeError
        v = float(v)
    except (TypeError, ValueError, OverflowError):
        raise BadRequest(f"pod annotation {key}={ann[key]!r:.60} is not a number") from None
    if not math.isfinite(v) or v < 0:
        raise BadRequest(f"pod annotation {key}={ann[key]!r:.60} is not a finite number >= 0")
    if v > MAX_ANNOTATION_S:  # finish times past it overflow: every node would score 0
        raise BadRequest(
            f"pod annotation {key}={ann[key]!r:.60} is over {MAX_ANNOTATION_S:g} s (~30 years)"
        )
    return v


def _obj(d: object, key: str, where: str) -> dict:
    """``d[key]`` (case-insensitive) as an object: absent or null is empty, else a 400."""
    v = ci_get(d, key)
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise BadRequest(f"{where}: expected an object, got {type(v).__name__}")
    return v


def _str_or_none(d: dict, key: str, where: str) -> str | None:
    """``d[key]`` (case-insensitive) as a string: absent or null is None, else a 400."""
    v = ci_get(d, key)
    if v is not None and not isinstance(v, str):
        raise BadRequest(f"{where}: expected a string, got {type(v).__name__}")
    return v


def parse_pod(pod: object) -> PodRequest:
    if not isinstance(pod, dict):
        raise BadRequest("Pod: expected an object")
    meta = _obj(pod, "metadata", "Pod.metadata")
    # a wrong type is a 400 like the others (a number or a list was taken as a name, a
    # `containers` of 0, false, "" or {} as no containers)
    name = _str_or_none(meta, "name", "Pod.metadata.name") or ""
    ns = _str_or_none(meta, "namespace", "Pod.metadata.namespace")
    ann = _obj(meta, "annotations", "Pod.metadata.annotations")
    containers = ci_get(_obj(pod, "spec", "Pod.spec"), "containers")
    if containers is None:
        containers = []
    if not isinstance(containers, list):
        raise BadRequest(f"Pod.spec.containers: expected a list, got {type(containers).__name__}")
    cpu = mem = 0.0
    for i, c in enumerate(containers):
        where = f"Pod.spec.containers[{i}]"
        if not isinstance(c, dict):
            raise BadRequest(f"{where}: expected an object, got {type(c).__name__}")
        req = _obj(_obj(c, "resources", f"{where}.resources"), "requests", f"{where}.requests")
        if ci_get(req, "cpu") is not None:
            cpu += parse_cpu(ci_get(req, "cpu"), f"{where} cpu")
        if ci_get(req, "memory") is not None:
            mem += parse_mem_gb(ci_get(req, "memory"), f"{where} memory")
    work = _number_annotation(ann, ANN_WORK, DEFAULT_WORK_S)
    rank = _number_annotation(ann, ANN_RANK, work)
    return PodRequest(f"{ns}/{name}" if ns else name, cpu, mem, float(work), float(max(rank, work)))


def _node_info(item: object, i: int) -> NodeInfo:
    where = f"Nodes.items[{i}]"
    if not isinstance(item, dict):
        raise BadRequest(f"{where}: expected a Node object, got {type(item).__name__}")
    meta = _obj(item, "metadata", f"{where}.metadata")
    name = ci_get(meta, "name")
    if not isinstance(name, str) or not name:
        raise BadRequest(f"{where}.metadata.name: expected a node name")
    alloc = _obj(_obj(item, "status", f"{where}.status"), "allocatable", f"{where}.allocatable")
    labels = _obj(meta, "labels", f"{where}.metadata.labels")
    if not all(isinstance(v, str) for v in labels.values()):
        raise BadRequest(f"{where}.metadata.labels: expected string values")
    cpu = ci_get(alloc, "cpu")
    mem = ci_get(alloc, "memory")
    return NodeInfo(
        name,
        parse_cpu(cpu, f"{where} allocatable cpu") if cpu is not None else None,
        parse_mem_gb(mem, f"{where} allocatable memory") if mem is not None else None,
        dict(labels),
    )


def parse_args(body: bytes) -> ExtenderArgs:
    try:
        data = json.loads(body or b"null")
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise BadRequest(f"body is not JSON ({err})") from None
    except RecursionError:
        raise BadRequest("body is JSON nested too deeply") from None
    if not isinstance(data, dict):
        raise BadRequest("ExtenderArgs: expected a JSON object")
    lower = "pod" in data and "Pod" not in data
    pod = parse_pod(ci_get(data, "pod"))
    node_list = ci_get(data, "nodes")
    names = ci_get(data, "nodenames")
    if node_list is not None:
        if not isinstance(node_list, dict):
            raise BadRequest('Nodes: expected a NodeList object ({"items": [...]})')
        items = ci_get(node_list, "items", []) or []
        if not isinstance(items, list):
            raise BadRequest("Nodes.items: expected a list")
        return ExtenderArgs(pod, [_node_info(it, i) for i, it in enumerate(items)], items, lower)
    if names is not None:
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise BadRequest("NodeNames: expected a list of strings")
        return ExtenderArgs(pod, [NodeInfo(n) for n in names], None, lower)
    raise BadRequest("ExtenderArgs: neither Nodes nor NodeNames is set")


def _key(name: str, lower: bool) -> str:
    return name.lower() if lower else name


def filter_reply(args: ExtenderArgs, failed: dict[str, str], error: str = "") -> dict:
    """The ExtenderFilterResult: the nodes of ``args`` not in ``failed`` kept; each failed
    node in ``FailedAndUnresolvableNodes`` when its reason is :class:`Unresolvable`, else in
    ``FailedNodes`` (never in both); keys in the request's casing."""
    keep = [n.name for n in args.nodes if n.name not in failed]
    out = {
        _key("Nodes", args.lower): None,
        _key("NodeNames", args.lower): None,
        _key("FailedNodes", args.lower): {
            n: str(r) for n, r in failed.items() if not isinstance(r, Unresolvable)
        },
        _key("FailedAndUnresolvableNodes", args.lower): {
            n: str(r) for n, r in failed.items() if isinstance(r, Unresolvable)
        },
        _key("Error", args.lower): error,
    }
    if args.raw_nodes is not None:
        keep_set = set(keep)
        items = [
            i for i in args.raw_nodes if ci_get(ci_get(i, "metadata", {}) or {}, "name") in keep_set
        ]
        out[_key("Nodes", args.lower)] = {"items": items}
    else:
        out[_key("NodeNames", args.lower)] = keep
    return out


def prioritize_reply(args: ExtenderArgs, scores: dict[str, int]) -> list[dict]:
    return [
        {_key("Host", args.lower): n.name, _key("Score", args.lower): int(scores.get(n.name, 0))}
        for n in args.nodes
    ]


@dataclass
class Verbs:
    """What the server calls: ``filter(args) -> {node: reason}`` for the nodes that fail
    (an :class:`Unresolvable` reason when preemption cannot help),
    ``prioritize(args) -> {node: score 0..10}``."""

    filter: Callable[[ExtenderArgs], dict[str, str]]
    prioritize: Callable[[ExtenderArgs], dict[str, int]]
    status: Callable[[], dict] = lambda: {"ok": True}


def _body_deadline(n: int) -> float:
    """When a body of ``n`` bytes (or a discarded one) must have arrived, from now."""
    return time.monotonic() + HANDLER_TIMEOUT_S + min(n, MAX_BODY) / BODY_MIN_RATE


def make_handler(verbs: Verbs) -> type[BaseHTTPRequestHandler]:
    class Handler(BoundedHandler):
        server: _Server
        server_version = "hidvfs-coordinator/1"
        timeout = HANDLER_TIMEOUT_S  # writing the answer; reads have their own deadlines

        def head_limits(self) -> tuple[float, int]:
            return HEAD_TIMEOUT_S, MAX_HEAD_BYTES

        def head_complete(self) -> bool:
            """A POST has arrived only with its body: it keeps its slot from then on."""
            return True if self.command == "POST" else self.claim_slot()

        def log_message(self, fmt, *a):  # route access logs through logging, not stderr
            log.debug("%s %s", self.address_string(), fmt % a)

        def _send(self, code: int, obj, headers: dict[str, str] | None = None) -> None:
            body = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def send_error(self, code, message=None, explain=None) -> None:
            """http.server's own errors (400 on a bad request line, 414, 431, 501) as JSON
            ``{"Error": ...}`` like every other answer, not an HTML page."""
            short, long = self.responses.get(code, ("error", ""))
            self.log_error("code %d, message %s", code, message or short)
            self.close_connection = True
            text = f"{message or short}: {explain or long}" if (explain or long) else short
            self._send(code, {"Error": text}, {"Connection": "close"})

        def _linger(self, n: int | None) -> None:
            """After an answer sent before the body was read: end the answer (FIN), then
            discard up to ``n`` bytes (until EOF when unknown) by the body deadline. A socket
            closed with unread bytes is reset, and the reset can destroy the answer before
            the client has read it: a 400, 411 or 503 would look like a dropped connection."""
            self.close_connection = True
            try:
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_WR)
                left = MAX_BODY if n is None else n
                self.reader.rearm(_body_deadline(left if n is not None else 0), left)
                while left > 0 and (chunk := self.rfile.read1(min(left, 1 << 16))):
                    left -= len(chunk)
            except (OSError, ValueError, HeadTooLarge):
                pass  # timed out, reset, or more than declared: close as it is

        def do_GET(self):
            if self.path.rstrip("/").rsplit("/", 1)[-1] in ("healthz", "status"):
                self._send(200, verbs.status())
            else:
                self._send(404, {"Error": f"no such path {self.path!r}; POST filter or prioritize"})

        def do_POST(self):
            verb = self.path.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
            length = self.headers.get("Content-Length")
            chunked = "chunked" in (self.headers.get("Transfer-Encoding") or "")
            valid = length is not None and length.strip().isascii() and length.strip().isdigit()
            n = int(length) if valid and not chunked else -1
            if verb not in ("filter", "prioritize"):
                self._send(404, {"Error": f"unknown verb {verb!r}; expected filter or prioritize"})
                self._linger(n if n >= 0 else None)
                return
            if length is None or chunked:
                self._send(411, {"Error": "Content-Length required (chunked bodies are not read)"})
                self._linger(None)  # the body, if any, is still on the socket
                return
            if n < 0 or n > MAX_BODY:
                err = f"Content-Length {length!r:.40}: expected 0..{MAX_BODY}"
                log.warning("%s: bad request: %s", verb, err)
                self._send(400, {"Error": err})
                self._linger(n if n >= 0 else None)
                return
            counted = n if n > SMALL_BODY else 0
            if not self.server.reserve(counted):
                self.server.count_refused(
                    self.client_address[0], f"request bodies over {BODY_BUDGET} bytes at once"
                )
                self._send(
                    503,
                    {"Error": f"busy: too many request bodies at once; retry in {RETRY_AFTER_S} s"},
                    {"Retry-After": str(RETRY_AFTER_S)},
                )
                self._linger(n)
                return
            try:
                self._post(verb, n)
            finally:
                self.server.release(counted)

        def _post(self, verb: str, n: int) -> None:
            try:
                self.reader.rearm(_body_deadline(n), n)
                try:
                    body = self.rfile.read(n)
                except (OSError, HeadTooLarge):
                    body = None
                if body is None or len(body) < n:
                    self.close_connection = True
                    if not self.server.holds(self.connection):
                        return  # dropped for another connection: nobody to answer
                    if body is None:
                        raise BadRequest(
                            f"body shorter than Content-Length {n} (not all within "
                            f"{HANDLER_TIMEOUT_S + n / BODY_MIN_RATE:.3g} s)"
                        )
                    raise BadRequest(f"body ended after {len(body)} of {n} bytes")
                if not self.claim_slot():  # dropped for another connection: no answer
                    return
                args = parse_args(body)
                del body
            except BadRequest as err:
                log.warning("%s: bad request: %s", verb, err)
                self._send(400, {"Error": str(err)})
                return
            except Exception as err:  # a malformed request is a 400, never a dropped socket
                log.warning("%s: bad request: %s: %s", verb, type(err).__name__, err)
                self._send(400, {"Error": f"malformed request ({type(err).__name__}: {err})"})
                return
            try:
                if verb == "filter":
                    self._send(200, filter_reply(args, verbs.filter(args)))
                else:
                    self._send(200, prioritize_reply(args, verbs.prioritize(args)))
            except Exception as err:  # the scheduler must get an answer, never a dropped socket
                log.exception("%s failed", verb)
                if verb == "filter":
                    self._send(200, filter_reply(args, {}, error=f"{type(err).__name__}: {err}"))
                else:
                    self._send(500, {"Error": f"{type(err).__name__}: {err}"})

    return Handler


_BUSY = json.dumps({"Error": "busy: every connection is being answered; retry"}).encode()
#: the answer of a connection refused for want of a slot, written from the accepting thread
_REFUSED = (
    b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    b"Retry-After: %d\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s"
)


class _Server(BoundedServer):
    """The bounds of :mod:`daemon.httpbounds` (head deadline and size, connection caps with
    the oldest unfinished request dropped for a new one) with the constants above, and
    :data:`BODY_BUDGET` on the bodies held at once."""

    request_queue_size = 128  # the default 5 reset connections at 32-64 concurrent clients
    endpoint = "extender"
    logger = log

    def __init__(self, *args, **kwargs):
        self._budget_lock = threading.Lock()
        self.body_bytes = 0  # counted bodies being read or answered
        super().__init__(*args, **kwargs)

    def max_connections(self) -> int:
        return MAX_CONNECTIONS

    def max_per_peer(self) -> int:
        return MAX_PER_PEER

    def refused_log_s(self) -> float:
        return REFUSED_LOG_S

    def reserve(self, n: int) -> bool:
        """Room for a body of ``n`` bytes under :data:`BODY_BUDGET` (``release`` it after)."""
        with self._budget_lock:
            if n and self.body_bytes + n > BODY_BUDGET:
                return False
            self.body_bytes += n
            return True

    def release(self, n: int) -> None:
        with self._budget_lock:
            self.body_bytes -= n

    def refuse(self, request, reason: str) -> None:
        """No slot (every one is being answered): a 503 rather than a silent close, written
        without blocking from the accepting thread. What the client has sent is read first
        (a close with unread bytes resets the connection, which can destroy the answer); a
        request still on its way can make it a reset all the same: best effort."""
        try:
            request.setblocking(False)
            try:
                for _ in range(16):
                    if not request.recv(1 << 16):
                        break
            except OSError:  # nothing more yet (BlockingIOError) or reset
                pass
            request.send(_REFUSED % (RETRY_AFTER_S, len(_BUSY), _BUSY))
        except OSError:
            pass
        self.shutdown_request(request)


class _Server6(_Server):
    address_family = socket.AF_INET6


def make_server(host: str, port: int, verbs: Verbs) -> ThreadingHTTPServer:
    """A threading HTTP server (port 0 = ephemeral; read ``server.server_address``); an IPv6
    host (``::1``) gets an IPv6 socket. Slow and idle clients are bounded as in
    :mod:`daemon.httpbounds`: see the constants above."""
    cls = _Server6 if ":" in host else _Server
    return cls((host, port), make_handler(verbs))
