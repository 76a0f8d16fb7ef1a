"""Kubernetes scheduler-extender wire protocol: ``filter`` and ``prioritize`` over HTTP/JSON.

The scheduler POSTs ``ExtenderArgs`` ({Pod, Nodes | NodeNames}) to ``<urlPrefix>/<verb>``.
Current kube-scheduler sends Go field names (``Pod``, ``NodeNames``); v1.7-v1.14 sent lower
case (``pod``, ``nodenames``). Keys are therefore read case-insensitively and the reply uses
the casing of the request. Replies: ``ExtenderFilterResult`` for filter, a
``HostPriorityList`` ([{Host, Score 0..10}]) for prioritize. Anything but 200 is an error to
the scheduler, so malformed requests get 400 with a message naming the key.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

log = logging.getLogger("hidvfs.coordinator")

MAX_BODY = 8 << 20
#: pod annotations an upstream DAG coordinator sets (seconds on a speed-1 node)
ANN_WORK = "hidvfs.io/work-s"
ANN_RANK = "hidvfs.io/rank-s"
DEFAULT_WORK_S = 10.0


class BadRequest(ValueError):
    pass


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
_MEM_RE = re.compile(r"^([0-9.]+(?:[eE][0-9]+)?)([KMGTPE]i?|k|m)?$")
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


def parse_cpu(q: object) -> float:
    """Kubernetes CPU quantity (``"500m"``, ``"2"``, 1.5) in cores."""
    if isinstance(q, (int, float)) and not isinstance(q, bool):
        return float(q)
    m = _CPU_RE.match(str(q).strip())
    if not m:
        raise BadRequest(f"cpu quantity {q!r} is not understood")
    v = float(m.group(1))
    return v / 1000.0 if m.group(2) else v


def parse_mem_gb(q: object) -> float:
    """Kubernetes memory quantity (``"1Gi"``, ``"512M"``, bytes) in GB (10^9 bytes)."""
    if isinstance(q, (int, float)) and not isinstance(q, bool):
        return float(q) / 1e9
    m = _MEM_RE.match(str(q).strip())
    if not m:
        raise BadRequest(f"memory quantity {q!r} is not understood")
    return float(m.group(1)) * _MEM_UNIT[m.group(2)] / 1e9


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
    try:
        v = float(ann[key])
    except (TypeError, ValueError):
        raise BadRequest(f"pod annotation {key}={ann[key]!r} is not a number") from None
    if v < 0:
        raise BadRequest(f"pod annotation {key}={v!r} is negative")
    return v


def parse_pod(pod: object) -> PodRequest:
    if not isinstance(pod, dict):
        raise BadRequest("Pod: expected an object")
    meta = ci_get(pod, "metadata", {}) or {}
    name = str(ci_get(meta, "name", "") or "")
    ns = ci_get(meta, "namespace")
    ann = ci_get(meta, "annotations", {}) or {}
    cpu = mem = 0.0
    for c in ci_get(ci_get(pod, "spec", {}) or {}, "containers", []) or []:
        req = ci_get(ci_get(c, "resources", {}) or {}, "requests", {}) or {}
        if ci_get(req, "cpu") is not None:
            cpu += parse_cpu(ci_get(req, "cpu"))
        if ci_get(req, "memory") is not None:
            mem += parse_mem_gb(ci_get(req, "memory"))
    work = _number_annotation(ann, ANN_WORK, DEFAULT_WORK_S)
    rank = _number_annotation(ann, ANN_RANK, work)
    return PodRequest(f"{ns}/{name}" if ns else name, cpu, mem, float(work), float(max(rank, work)))


def _node_info(item: dict) -> NodeInfo:
    meta = ci_get(item, "metadata", {}) or {}
    name = ci_get(meta, "name")
    if not isinstance(name, str) or not name:
        raise BadRequest("Nodes.items[].metadata.name: expected a node name")
    alloc = ci_get(ci_get(item, "status", {}) or {}, "allocatable", {}) or {}
    cpu = ci_get(alloc, "cpu")
    mem = ci_get(alloc, "memory")
    return NodeInfo(
        name,
        parse_cpu(cpu) if cpu is not None else None,
        parse_mem_gb(mem) if mem is not None else None,
        dict(ci_get(meta, "labels", {}) or {}),
    )


def parse_args(body: bytes) -> ExtenderArgs:
    try:
        data = json.loads(body or b"null")
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise BadRequest(f"body is not JSON ({err})") from None
    if not isinstance(data, dict):
        raise BadRequest("ExtenderArgs: expected a JSON object")
    lower = "pod" in data and "Pod" not in data
    pod = parse_pod(ci_get(data, "pod"))
    node_list = ci_get(data, "nodes")
    names = ci_get(data, "nodenames")
    if node_list is not None:
        items = ci_get(node_list, "items", []) or []
        if not isinstance(items, list):
            raise BadRequest("Nodes.items: expected a list")
        return ExtenderArgs(pod, [_node_info(i) for i in items], items, lower)
    if names is not None:
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise BadRequest("NodeNames: expected a list of strings")
        return ExtenderArgs(pod, [NodeInfo(n) for n in names], None, lower)
    raise BadRequest("ExtenderArgs: neither Nodes nor NodeNames is set")


def _key(name: str, lower: bool) -> str:
    return name.lower() if lower else name


def filter_reply(args: ExtenderArgs, failed: dict[str, str], error: str = "") -> dict:
    keep = [n.name for n in args.nodes if n.name not in failed]
    out = {
        _key("Nodes", args.lower): None,
        _key("NodeNames", args.lower): None,
        _key("FailedNodes", args.lower): failed,
        _key("FailedAndUnresolvableNodes", args.lower): {},
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
    """What the server calls: ``filter(args) -> {node: reason}`` for the nodes that fail,
    ``prioritize(args) -> {node: score 0..10}``."""

    filter: Callable[[ExtenderArgs], dict[str, str]]
    prioritize: Callable[[ExtenderArgs], dict[str, int]]
    status: Callable[[], dict] = lambda: {"ok": True}


def make_handler(verbs: Verbs) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "hidvfs-coordinator/1"

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
            try:
                n = int(self.headers.get("Content-Length") or 0)
                if n < 0 or n > MAX_BODY:
                    raise BadRequest(f"Content-Length {n} outside 0..{MAX_BODY}")
                args = parse_args(self.rfile.read(n))
            except (BadRequest, ValueError) as err:
                log.warning("%s: bad request: %s", verb, err)
                self._send(400, {"Error": str(err)})
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


def make_server(host: str, port: int, verbs: Verbs) -> ThreadingHTTPServer:
    """A threading HTTP server (port 0 = ephemeral; read ``server.server_address``)."""
    srv = ThreadingHTTPServer((host, port), make_handler(verbs))
    srv.daemon_threads = True
    return srv
