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
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

log = logging.getLogger("hidvfs.coordinator")

MAX_BODY = 8 << 20
#: a connection that sends nothing for this long is closed (idle keep-alive, short bodies)
HANDLER_TIMEOUT_S = 10.0
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


def parse_pod(pod: object) -> PodRequest:
    if not isinstance(pod, dict):
        raise BadRequest("Pod: expected an object")
    meta = _obj(pod, "metadata", "Pod.metadata")
    name = str(ci_get(meta, "name", "") or "")
    ns = ci_get(meta, "namespace")
    ann = _obj(meta, "annotations", "Pod.metadata.annotations")
    containers = ci_get(_obj(pod, "spec", "Pod.spec"), "containers") or []
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


def make_handler(verbs: Verbs) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "hidvfs-coordinator/1"
        timeout = HANDLER_TIMEOUT_S  # an idle or half-sent request must not hold a thread

        def log_message(self, fmt, *a):  # route access logs through logging, not stderr
            log.debug("%s %s", self.address_string(), fmt % a)

        def _send(self, code: int, obj) -> None:
            body = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path.rstrip("/").rsplit("/", 1)[-1] in ("healthz", "status"):
                self._send(200, verbs.status())
            else:
                self._send(404, {"Error": f"no such path {self.path!r}; POST filter or prioritize"})

        def do_POST(self):
            verb = self.path.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
            if verb not in ("filter", "prioritize"):
                self._send(404, {"Error": f"unknown verb {verb!r}; expected filter or prioritize"})
                return
            length = self.headers.get("Content-Length")
            if length is None or "chunked" in (self.headers.get("Transfer-Encoding") or ""):
                self.close_connection = True  # the body, if any, is still on the socket
                self._send(411, {"Error": "Content-Length required (chunked bodies are not read)"})
                return
            try:
                n = int(length) if length.strip().isascii() and length.strip().isdigit() else -1
                if n < 0 or n > MAX_BODY:
                    self.close_connection = True
                    raise BadRequest(f"Content-Length {length!r:.40}: expected 0..{MAX_BODY}")
                try:
                    body = self.rfile.read(n)
                except TimeoutError:
                    self.close_connection = True
                    raise BadRequest(
                        f"body shorter than Content-Length {n} (none for {self.timeout:g} s)"
                    ) from None
                if len(body) < n:
                    raise BadRequest(f"body ended after {len(body)} of {n} bytes")
                args = parse_args(body)
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


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # the default 5 reset connections at 32-64 concurrent clients


class _Server6(_Server):
    address_family = socket.AF_INET6


def make_server(host: str, port: int, verbs: Verbs) -> ThreadingHTTPServer:
    """A threading HTTP server (port 0 = ephemeral; read ``server.server_address``); an IPv6
    host (``::1``) gets an IPv6 socket."""
    cls = _Server6 if ":" in host else _Server
    return cls((host, port), make_handler(verbs))
