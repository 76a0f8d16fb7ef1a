"""The coordinator: a Kubernetes scheduler extender that places pods with a placement policy
and each node's live telemetry.

Each node runs the hidvfs daemon, which serves its status as JSON over HTTP (default
``http://127.0.0.1:9130/status``, the single-board case). The coordinator fetches it per
node with a timeout (concurrently, cached for ``cache_s``), sending a bearer token only to
non-loopback hosts. From it comes the node's speed factor (current over maximum frequency,
capacity-weighted, so thermal capping shows) and its free cores. A node whose daemon cannot
be reached, or whose status cannot be read, is never failed by ``filter`` and gets the
neutral score in ``prioritize``; the reason is logged (the extender fails open, like
``ignorable: true``).

Status keys read (case-insensitive; every one optional): ``speed_factor`` (0..1) or
``clusters: [{cur_khz, max_khz | freqs_khz, capacity, cpus, online, util}]``,
``free_cpus``, ``max_cpu_temp_c``, ``throttled``.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from daemon.extender import ExtenderArgs, Verbs, ci_get, make_server
from platforms.clock import Clock, MonotonicClock
from platforms.cluster.simcluster import ClusterView, NodeSpec, board_node, single_task_workload

log = logging.getLogger("hidvfs.coordinator")

DEFAULT_STATUS_URL = "http://127.0.0.1:9130/status"
NEUTRAL_SCORE = 5
MAX_SCORE = 10
DEFAULT_BOARD = "orin-nx"
BOARD_LABELS = ("hidvfs.io/board", "node.kubernetes.io/instance-type")


@dataclass(frozen=True)
class NodeTelemetry:
    node: str
    ok: bool
    reason: str = ""
    speed_factor: float | None = None  # current / maximum compute rate, 0..1
    free_cpus: float | None = None
    temp_c: float | None = None
    throttled: bool | None = None


def parse_status(node: str, data: object) -> NodeTelemetry:
    """Telemetry from a node daemon's status JSON (see the module docstring for the keys)."""
    if not isinstance(data, dict):
        return NodeTelemetry(node, False, "status is not a JSON object")
    speed = ci_get(data, "speed_factor")
    free = ci_get(data, "free_cpus")
    clusters = ci_get(data, "clusters")
    if isinstance(clusters, list) and clusters:
        num = den = idle = 0.0
        for c in clusters:
            cap = float(ci_get(c, "capacity", 1.0) or 1.0)
            cpus = ci_get(c, "cpus") or []
            online = ci_get(c, "online", cpus) or []
            cur = ci_get(c, "cur_khz")
            top = ci_get(c, "max_khz")
            table = ci_get(c, "freqs_khz") or []
            if top is None and table:
                top = max(table)
            n_all = (
                len(cpus)
                if isinstance(cpus, list) and cpus
                else len(online)
                if isinstance(online, list)
                else 0
            )
            n_on = len(online) if isinstance(online, list) else n_all
            if cur is not None and top:
                num += cap * float(cur) * n_on
                den += cap * float(top) * n_all
            util = ci_get(c, "util")
            if isinstance(util, list) and util:
                vals = [float(u) for u in util if u is not None]
                if vals:
                    idle += n_on * (1.0 - min(max(sum(vals) / len(vals), 0.0), 1.0))
            elif ci_get(c, "mean_util") is not None:
                idle += n_on * (1.0 - min(max(float(ci_get(c, "mean_util")), 0.0), 1.0))
        if speed is None and den > 0:
            speed = num / den
        if free is None and idle > 0:
            free = idle
    try:
        speed = None if speed is None else min(max(float(speed), 0.0), 1.0)
        free = None if free is None else max(float(free), 0.0)
    except (TypeError, ValueError):
        return NodeTelemetry(
            node, False, f"status has a non-numeric speed_factor or free_cpus ({speed!r}, {free!r})"
        )
    temp = ci_get(data, "max_cpu_temp_c")
    thr = ci_get(data, "throttled")
    return NodeTelemetry(
        node,
        True,
        "",
        speed,
        free,
        None if temp is None else float(temp),
        None if thr is None else bool(thr),
    )


def _is_loopback(url: str) -> bool:
    host = urllib.parse.urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class TelemetryClient:
    """Fetches node status JSON over HTTP with a timeout; caches each answer for ``cache_s``."""

    def __init__(
        self,
        urls: Mapping[str, str] | None = None,
        token: str | None = None,
        timeout_s: float = 0.5,
        cache_s: float = 1.0,
        default_url: str = DEFAULT_STATUS_URL,
        clock: Clock | None = None,
    ):
        self.urls = dict(urls or {})
        self.token = token
        self.timeout_s = timeout_s
        self.cache_s = cache_s
        self.default_url = default_url
        self.clock = clock or MonotonicClock()
        self._cache: dict[str, tuple[float, NodeTelemetry]] = {}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="telemetry")

    def url(self, node: str) -> str:
        return self.urls.get(node, self.default_url)

    def fetch(self, node: str) -> NodeTelemetry:
        now = self.clock.now()
        with self._lock:
            hit = self._cache.get(node)
        if hit is not None and now - hit[0] < self.cache_s:
            return hit[1]
        tel = self._fetch(node)
        if not tel.ok:
            log.warning("node %s: telemetry unavailable (%s); neutral score", node, tel.reason)
        with self._lock:
            self._cache[node] = (now, tel)
        return tel

    def request(self, node: str) -> urllib.request.Request:
        """The status request for ``node``: a bearer token goes to remote hosts only."""
        url = self.url(node)
        req = urllib.request.Request(url, headers={"Accept": "application/json"})
        if self.token and not _is_loopback(url):
            req.add_header("Authorization", f"Bearer {self.token}")
        return req

    def _fetch(self, node: str) -> NodeTelemetry:
        req = self.request(node)
        url = req.full_url
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                body = resp.read(1 << 20)
        except urllib.error.HTTPError as err:
            return NodeTelemetry(node, False, f"{url}: HTTP {err.code}")
        except (urllib.error.URLError, OSError) as err:
            reason = getattr(err, "reason", err)
            return NodeTelemetry(node, False, f"{url}: {reason}")
        try:
            return parse_status(node, json.loads(body))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            return NodeTelemetry(node, False, f"{url}: status is not JSON ({err})")

    def fetch_many(self, nodes: list[str]) -> dict[str, NodeTelemetry]:
        return dict(zip(nodes, self._pool.map(self.fetch, nodes)))

    def close(self) -> None:
        self._pool.shutdown(wait=False)


def _make_placer(policy: str, model_path=None):
    from agents.placement.heuristics import HEURISTICS, make_heuristic
    from agents.placement.higfrl import HigfrlPlacer

    if policy == "higfrl":
        return HigfrlPlacer(model_path=model_path)
    if policy not in HEURISTICS:
        raise ValueError(
            f"unknown placement policy {policy!r}; known: higfrl, {', '.join(sorted(HEURISTICS))}"
        )
    return make_heuristic(policy)


def scale_scores(scores: np.ndarray) -> np.ndarray:
    """Policy scores (higher is better, -inf = cannot take the pod) to integers 0..10."""
    out = np.zeros(scores.shape, dtype=np.int64)
    fin = np.isfinite(scores)
    if fin.any():
        lo, hi = float(scores[fin].min()), float(scores[fin].max())
        out[fin] = (
            MAX_SCORE
            if hi - lo < 1e-12
            else np.rint(1 + (MAX_SCORE - 1) * (scores[fin] - lo) / (hi - lo)).astype(np.int64)
        )
    return out


class Coordinator:
    """Scores and filters nodes for one pod with a placement policy and live telemetry.

    ``boards`` maps node names to board types (else the node's ``hidvfs.io/board`` label,
    else ``default_board``); the board gives the nominal cores, memory and speed.
    """

    def __init__(
        self,
        policy: str,
        telemetry: TelemetryClient,
        boards: Mapping[str, str] | None = None,
        default_board: str = DEFAULT_BOARD,
        model_path=None,
    ):
        self.policy = policy
        self.telemetry = telemetry
        self.boards = dict(boards or {})
        self.default_board = default_board
        self.placer = _make_placer(policy, model_path)
        self._lock = threading.Lock()  # placers keep per-call state

    def _board(self, node) -> str:
        if node.name in self.boards:
            return self.boards[node.name]
        for key in BOARD_LABELS:
            if node.labels.get(key):
                return str(node.labels[key])
        return self.default_board

    def _nodes(
        self, args: ExtenderArgs, tel: dict[str, NodeTelemetry]
    ) -> tuple[list[NodeSpec], np.ndarray, np.ndarray]:
        specs, free_cpu, speed = [], [], []
        for n in args.nodes:
            try:
                base = board_node(self._board(n), n.name)
            except Exception:  # unknown board label: size from the node object alone
                base = NodeSpec(n.name, self._board(n), n.cpu or 1.0, n.mem_gb or 1.0, 1.0)
            cpus = n.cpu if n.cpu is not None else base.cpus
            mem = n.mem_gb if n.mem_gb is not None else base.mem
            spec = NodeSpec(n.name, base.board, max(cpus, 1e-3), max(mem, 1e-3), base.speed)
            t = tel[n.name]
            specs.append(spec)
            free_cpu.append(
                min(t.free_cpus, spec.cpus) if t.ok and t.free_cpus is not None else spec.cpus
            )
            factor = t.speed_factor if t.ok and t.speed_factor else 1.0
            speed.append(spec.speed * max(factor, 1e-3))
        return specs, np.array(free_cpu), np.array(speed)

    def _view(self, args: ExtenderArgs, tel: dict[str, NodeTelemetry]) -> ClusterView:
        specs, free_cpu, speed = self._nodes(args, tel)
        p = args.pod
        w = single_task_workload(p.name, p.work_s, p.cpu, p.mem_gb, p.rank_s)
        self.placer.reset(w, specs, 0)
        return ClusterView(
            t=0.0,
            workload=w,
            nodes=tuple(specs),
            ready=np.array([0]),
            ready_t=np.zeros(1),
            free_cpu=free_cpu,
            free_mem=np.array([s.mem for s in specs]),
            speed=speed,
        )

    def filter(self, args: ExtenderArgs) -> dict[str, str]:
        tel = self.telemetry.fetch_many([n.name for n in args.nodes])
        failed = {}
        for n in args.nodes:
            t = tel[n.name]
            if n.cpu is not None and args.pod.cpu > n.cpu + 1e-9:
                failed[n.name] = f"pod requests {args.pod.cpu:g} cores, node allocatable {n.cpu:g}"
            elif t.ok and t.free_cpus is not None and args.pod.cpu > t.free_cpus + 1e-9:
                failed[n.name] = (
                    f"pod requests {args.pod.cpu:g} cores, telemetry shows {t.free_cpus:.2f} free"
                )
        return failed

    def prioritize(self, args: ExtenderArgs) -> dict[str, int]:
        names = [n.name for n in args.nodes]
        tel = self.telemetry.fetch_many(names)
        with self._lock:  # the placer keeps the workload of the current pod
            view = self._view(args, tel)
            raw = np.asarray(self.placer.node_scores(view, 0), dtype=float)
        reachable = np.array([tel[n].ok for n in names])
        scores = np.full(len(names), NEUTRAL_SCORE, dtype=np.int64)
        if reachable.any():
            scores[reachable] = scale_scores(raw[reachable])
        for n in names:
            if not tel[n].ok:
                log.info("pod %s: node %s scored neutral (%s)", args.pod.name, n, tel[n].reason)
        return dict(zip(names, scores.tolist()))

    def status(self) -> dict:
        return {"ok": True, "policy": self.policy}

    def verbs(self) -> Verbs:
        return Verbs(filter=self.filter, prioritize=self.prioritize, status=self.status)


def parse_nodes_arg(nodes: str | Mapping | None) -> tuple[dict[str, str], dict[str, str]]:
    """``"name=board@url,name2=board2"`` (or a mapping name -> {"board", "url"}) into
    (urls, boards)."""
    urls: dict[str, str] = {}
    boards: dict[str, str] = {}
    if not nodes:
        return urls, boards
    if isinstance(nodes, Mapping):
        for name, v in nodes.items():
            v = v if isinstance(v, Mapping) else {"url": v}
            if v.get("url"):
                urls[name] = str(v["url"])
            if v.get("board"):
                boards[name] = str(v["board"])
        return urls, boards
    for item in (s.strip() for s in nodes.split(",")):
        if not item:
            continue
        if "=" not in item:
            raise ValueError(f"nodes entry {item!r}: expected name=board[@url]")
        name, rest = item.split("=", 1)
        board, _, url = rest.partition("@")
        if board:
            boards[name] = board
        if url:
            urls[name] = url
    return urls, boards


def build_server(
    host: str,
    port: int,
    policy: str,
    nodes=None,
    token: str | None = None,
    timeout_s: float = 0.5,
    model_path=None,
):
    """The extender HTTP server, ready for ``serve_forever()`` (port 0 = ephemeral)."""
    urls, boards = parse_nodes_arg(nodes)
    coord = Coordinator(
        policy,
        TelemetryClient(urls, token=token, timeout_s=timeout_s),
        boards,
        model_path=model_path,
    )
    srv = make_server(host, port, coord.verbs())
    srv.coordinator = coord
    return srv
