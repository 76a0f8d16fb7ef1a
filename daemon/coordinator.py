"""The coordinator: a Kubernetes scheduler extender that places pods with a placement policy
and each node's live telemetry.

Each node runs the hidvfs daemon, which serves its status as JSON over HTTP (default
``http://127.0.0.1:9130/status``, the single-board case). The coordinator fetches it per
node within one total budget per request (``timeout_s``, 0.5 s: connect, headers and body;
concurrently, cached for ``cache_s``), sending its bearer token, when set, to every node (a
daemon with a token asks for it on loopback too).
From it comes the node's speed factor (the rate its cores can run at now over their top
rate, capacity-weighted: offline cores and frequency caps lower it, an idle governor's low
``cur_khz`` does not) and its free cores. A node whose daemon cannot be reached in time, or
whose status cannot be read (wrong types, non-finite numbers), is never failed by
``filter`` for its telemetry and gets the neutral score in ``prioritize``; the reason is
logged (the extender fails open, like ``ignorable: true``).

The scheduler calls the extender only after its own filters, so every node it sends already
fits the pod by its allocatable. ``filter`` therefore fails a node only on what is known of
that node: its size when it is known (allocatable seen in a whole Node, a ``--nodes`` board,
a board label), its free cores and speed when they come from its own daemon. Telemetry is
read only from a node's own daemon: its ``--nodes`` URL, or the default URL when no node has
one (the single-board case); a node without a URL among nodes with one is not read (neutral
score). A failure no eviction can fix (the pod is larger than the node, speed factor 0) is
``Unresolvable`` (``FailedAndUnresolvableNodes``); too few cores free now is not.

Status keys read (case-insensitive; every one optional): ``speed_factor`` (0..1) or
``clusters: [{max_khz | freqs_khz, limit_khz, cur_khz, capacity, cpus, online, util}]``
(``limit_khz``: the current frequency ceiling; without it a ``throttled`` board is taken at
``cur_khz``, any other at ``max_khz``), ``free_cpus``, ``max_cpu_temp_c``, ``throttled``.
"""

from __future__ import annotations

import http.client
import io
import json
import logging
import math
import re
import threading
import time
import urllib.parse
import urllib.request
from collections import OrderedDict
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, replace

import numpy as np

from daemon.deadlineio import DeadlineReader
from daemon.extender import (
    ExtenderArgs,
    NodeInfo,
    PodRequest,
    Unresolvable,
    Verbs,
    ci_get,
    make_server,
)
from platforms.clock import Clock, MonotonicClock
from platforms.cluster.simcluster import ClusterView, NodeSpec, board_node, single_task_workload

log = logging.getLogger("hidvfs.coordinator")

DEFAULT_STATUS_URL = "http://127.0.0.1:9130/status"
NEUTRAL_SCORE = 5
MAX_SCORE = 10
DEFAULT_BOARD = "orin-nx"
BOARD_LABELS = ("hidvfs.io/board", "node.kubernetes.io/instance-type")
#: whole nodes remembered for NodeNames-only requests (least recently seen forgotten first);
#: Kubernetes supports clusters of up to 5000 nodes
MAX_REMEMBERED_NODES = 10_000


@dataclass(frozen=True)
class NodeTelemetry:
    node: str
    ok: bool
    reason: str = ""
    speed_factor: float | None = None  # current / maximum compute rate, 0..1
    free_cpus: float | None = None
    temp_c: float | None = None
    throttled: bool | None = None


class _BadStatus(ValueError):
    pass


def _finite(v: object, what: str) -> float:
    """A JSON number that is finite; anything else makes the whole status unreadable."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise _BadStatus(f"{what}={v!r:.40} is not a number")
    try:
        f = float(v)
    except OverflowError:
        raise _BadStatus(f"{what} is too large") from None
    if not math.isfinite(f):
        raise _BadStatus(f"{what}={f!r} is not finite")
    return f


def _list(v: object, what: str) -> list:
    if v is None:
        return []
    if not isinstance(v, list):
        raise _BadStatus(f"{what}: expected a list, got {type(v).__name__}")
    return v


def _cluster_rates(c: object, i: int, throttled: bool) -> tuple[float, float, float | None]:
    """(reachable rate, top rate, idle cores) of one status cluster; idle cores None when the
    cluster reports no utilisation (0.0 is a busy cluster, not an unknown one).

    The rate a new pod can get is the cluster's frequency ceiling now, not ``cur_khz``: an
    idle board's governor lowers ``cur_khz`` (orin-nx idle: 115200 of 1984000 kHz), which
    would rank idle boards last. The ceiling is ``limit_khz`` (the current scaling_max_freq,
    thermal or policy cap) when the status has it; the daemon's status has only ``max_khz``
    (the top OPP), so a board that reports ``throttled`` without a limit is taken at
    ``cur_khz`` (which its cap bounds from above), and any other at its top frequency.
    """
    where = f"clusters[{i}]"
    if not isinstance(c, dict):
        raise _BadStatus(f"{where}: expected an object")
    cap = ci_get(c, "capacity")
    cap = 1.0 if cap is None else max(_finite(cap, f"{where}.capacity"), 0.0)
    cpus = _list(ci_get(c, "cpus"), f"{where}.cpus")
    online = _list(ci_get(c, "online", cpus), f"{where}.online")
    n_all = len(cpus) or len(online)
    n_on = len(online)
    table = _list(ci_get(c, "freqs_khz"), f"{where}.freqs_khz")
    table = [_finite(f, f"{where}.freqs_khz") for f in table]
    top = ci_get(c, "max_khz")
    top = _finite(top, f"{where}.max_khz") if top is not None else max(table, default=0.0)
    cur = ci_get(c, "cur_khz")
    cur = None if cur is None else _finite(cur, f"{where}.cur_khz")
    limit = ci_get(c, "limit_khz")
    if limit is not None:
        ceiling = _finite(limit, f"{where}.limit_khz")
    elif throttled and cur is not None:
        ceiling = cur
    else:
        ceiling = top
    ceiling = min(max(ceiling, 0.0), top)
    idle = None
    util = ci_get(c, "util")
    mean_util = ci_get(c, "mean_util")
    if isinstance(util, list) and util:
        vals = [_finite(u, f"{where}.util") for u in util if u is not None]
        if vals:
            idle = n_on * (1.0 - min(max(sum(vals) / len(vals), 0.0), 1.0))
    elif util is not None and not isinstance(util, list):
        raise _BadStatus(f"{where}.util: expected a list")
    elif mean_util is not None:
        idle = n_on * (1.0 - min(max(_finite(mean_util, f"{where}.mean_util"), 0.0), 1.0))
    if top <= 0:
        return 0.0, 0.0, idle
    return cap * ceiling * n_on, cap * top * n_all, idle


def parse_status(node: str, data: object) -> NodeTelemetry:
    """Telemetry from a node daemon's status JSON (see the module docstring for the keys).

    Never raises: a status that cannot be read (wrong types, non-finite numbers) is
    ``ok=False`` with the reason, so its node gets the neutral score instead of failing
    the whole request."""
    try:
        return _parse_status(node, data)
    except _BadStatus as err:
        return NodeTelemetry(node, False, f"status unreadable: {err}")
    except Exception as err:  # noqa: BLE001 - one node's odd status must not fail the pod
        return NodeTelemetry(node, False, f"status unreadable: {type(err).__name__}: {err}")


def _parse_status(node: str, data: object) -> NodeTelemetry:
    if not isinstance(data, dict):
        return NodeTelemetry(node, False, "status is not a JSON object")
    speed = ci_get(data, "speed_factor")
    free = ci_get(data, "free_cpus")
    temp = ci_get(data, "max_cpu_temp_c")
    thr = ci_get(data, "throttled")
    if thr is not None and not isinstance(thr, bool):
        raise _BadStatus(f"throttled={thr!r:.40} is not a boolean")
    speed = None if speed is None else min(max(_finite(speed, "speed_factor"), 0.0), 1.0)
    free = None if free is None else max(_finite(free, "free_cpus"), 0.0)
    temp = None if temp is None else _finite(temp, "max_cpu_temp_c")
    clusters = ci_get(data, "clusters")
    if clusters is not None:
        num = den = idle = 0.0
        known = False  # some cluster reported its utilisation
        for i, c in enumerate(_list(clusters, "clusters")):
            reach, top, free_i = _cluster_rates(c, i, bool(thr))
            num, den = num + reach, den + top
            if free_i is not None:
                known, idle = True, idle + free_i
        if speed is None and den > 0:
            speed = min(num / den, 1.0)
        if free is None and known:
            # 0 free cores is a saturated node (every core at util 1.0), not an unknown one:
            # taken as unknown, it was filtered in and scored as an idle node
            free = idle
    return NodeTelemetry(node, True, "", speed, free, temp, thr)


MAX_STATUS_BYTES = 1 << 20


class _DeadlineSocket:
    """The connection's socket as http.client sees it; the fetch closes the real one."""

    def __init__(self, sock, deadline: float):
        self._sock, self._deadline = sock, deadline

    def makefile(self, *_a, **_k):
        return io.BufferedReader(DeadlineReader(self._sock, self._deadline))

    def close(self) -> None:  # http.client closes early when the server will; reads go on
        pass

    def __getattr__(self, name):
        return getattr(self._sock, name)


def _connection(url: str, deadline: float) -> tuple[http.client.HTTPConnection, str]:
    """A connection to ``url``'s host whose every read stops at ``deadline``, and the path."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("not an http(s) URL")
    base = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection

    class Conn(base):
        raw_sock = None

        def connect(self):
            super().connect()
            self.raw_sock = self.sock
            self.sock = _DeadlineSocket(self.sock, deadline)

    left = max(deadline - time.monotonic(), 1e-3)
    conn = Conn(parts.hostname, parts.port, timeout=left)
    path = parts.path or "/"
    return conn, path + ("?" + parts.query if parts.query else "")


def _reason_kind(reason: str) -> str:
    """A failure's kind without the numbers that change every time (a timing, an address)."""
    return re.sub(r"[0-9.]+", "#", reason)


#: node names the telemetry client keeps answers and states for: a cluster's nodes many
#: times over; past it (a client sending made-up names) the memory is dropped, not grown
MAX_TRACKED = 16384


class TelemetryClient:
    """Fetches node status JSON over HTTP; caches each answer for ``cache_s``.

    ``timeout_s`` is the whole budget of one fetch (connect, headers and body) counted from
    the request that asked for it; a node that has not answered by then is unreachable for
    that request (neutral score) and a later answer is dropped.
    """

    def __init__(
        self,
        urls: Mapping[str, str] | None = None,
        token: str | None = None,
        timeout_s: float = 0.5,
        cache_s: float = 1.0,
        default_url: str = DEFAULT_STATUS_URL,
        clock: Clock | None = None,
        max_workers: int = 64,
    ):
        self.urls = dict(urls or {})
        self.token = token
        self.timeout_s = timeout_s
        self.cache_s = cache_s
        self.default_url = default_url
        self.clock = clock or MonotonicClock()
        self._cache: dict[str, tuple[float, NodeTelemetry]] = {}
        self._down: dict[str, str] = {}  # node -> the kind of failure last logged
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="telemetry")

    def url(self, node: str) -> str:
        return self.urls.get(node, self.default_url)

    def fetch(self, node: str, deadline: float | None = None) -> NodeTelemetry:
        """``node``'s telemetry, answered by ``deadline`` (time.monotonic; default: the
        budget from now)."""
        deadline = time.monotonic() + self.timeout_s if deadline is None else deadline
        now = self.clock.now()
        hit = self._cached(node, now)
        if hit is not None:
            return hit
        if time.monotonic() >= deadline:
            # queued behind other fetches until the budget ran out: the node was never asked,
            # so it is neither cached nor logged as down (a later request asks it)
            return self._unasked(node)
        try:
            tel = self._fetch(node, deadline)
        except Exception as err:  # noqa: BLE001 - a bad URL or status must not fail the pod
            tel = NodeTelemetry(node, False, f"{self.url(node)}: {type(err).__name__}: {err}")
        if time.monotonic() > deadline + 0.05:
            tel = self._late(node)
        self._note(node, tel)
        with self._lock:
            if len(self._cache) >= MAX_TRACKED:  # names a client made up: drop the stale
                self._cache = {k: v for k, v in self._cache.items() if now - v[0] < self.cache_s}
                if len(self._cache) >= MAX_TRACKED:
                    self._cache.clear()
            self._cache[node] = (now, tel)
        return tel

    def _note(self, node: str, tel: NodeTelemetry) -> None:
        """Log a node's telemetry when it becomes unavailable (or fails anew) and when it
        comes back, not on every cache miss of a node that stays down."""
        with self._lock:
            before = self._down.get(node)
            if tel.ok:
                self._down.pop(node, None)
            else:
                if len(self._down) >= MAX_TRACKED and node not in self._down:
                    self._down.clear()  # at worst a node's going down is logged again
                self._down[node] = _reason_kind(tel.reason)
        if not tel.ok and before != _reason_kind(tel.reason):
            log.warning("node %s: telemetry unavailable (%s); neutral score", node, tel.reason)
        elif tel.ok and before is not None:
            log.info("node %s: telemetry back", node)

    def _cached(self, node: str, now: float) -> NodeTelemetry | None:
        with self._lock:
            hit = self._cache.get(node)
        return hit[1] if hit is not None and now - hit[0] < self.cache_s else None

    def _unasked(self, node: str) -> NodeTelemetry:
        return NodeTelemetry(
            node,
            False,
            f"{self.url(node)}: not asked within {self.timeout_s:g} s (every telemetry worker "
            "was waiting on slower nodes)",
        )

    def _late(self, node: str) -> NodeTelemetry:
        return NodeTelemetry(
            node, False, f"{self.url(node)}: no answer within {self.timeout_s:g} s"
        )

    def request(self, node: str) -> urllib.request.Request:
        """The status request for ``node``, with the bearer token whenever one is set: the
        daemon's endpoint requires it on loopback too once it has one."""
        url = self.url(node)
        req = urllib.request.Request(url, headers={"Accept": "application/json"})
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        return req

    def _fetch(self, node: str, deadline: float) -> NodeTelemetry:
        url = self.url(node)
        if time.monotonic() >= deadline:
            return self._late(node)
        try:
            req = self.request(node)
            conn, path = _connection(req.full_url, deadline)
        except ValueError as err:
            return NodeTelemetry(node, False, f"{url!r}: bad status URL ({err})")
        try:
            conn.request("GET", path, headers=dict(req.header_items()))
            resp = conn.getresponse()
            if resp.status != 200:
                return NodeTelemetry(node, False, f"{url}: HTTP {resp.status}")
            body = resp.read(MAX_STATUS_BYTES + 1)
        except TimeoutError:
            return self._late(node)
        except (OSError, http.client.HTTPException) as err:
            return NodeTelemetry(node, False, f"{url}: {type(err).__name__}: {err}")
        finally:
            conn.close()
            if conn.raw_sock is not None:
                conn.raw_sock.close()
        if len(body) > MAX_STATUS_BYTES:
            return NodeTelemetry(node, False, f"{url}: status larger than {MAX_STATUS_BYTES} bytes")
        try:
            data = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            return NodeTelemetry(node, False, f"{url}: status is not JSON ({err})")
        except RecursionError:
            return NodeTelemetry(node, False, f"{url}: status JSON is nested too deeply")
        return parse_status(node, data)

    def fetch_many(self, nodes: list[str]) -> dict[str, NodeTelemetry]:
        """Every node's telemetry within the one budget, fetched concurrently."""
        deadline = time.monotonic() + self.timeout_s
        now = self.clock.now()
        out: dict[str, NodeTelemetry] = {}
        futs = {}
        for n in dict.fromkeys(nodes):
            hit = self._cached(n, now)  # answered here: never queued behind slow nodes
            if hit is not None:
                out[n] = hit
            else:
                futs[n] = self._pool.submit(self.fetch, n, deadline)
        wait(futs.values(), timeout=self.timeout_s + 0.1)
        for n, f in futs.items():
            # a worker that never started in time: the node was not asked (see fetch)
            out[n] = f.result() if f.done() else self._unasked(n)
        return {n: out[n] for n in dict.fromkeys(nodes)}

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


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


def scale_scores(scores: np.ndarray, kind: str = "spread") -> np.ndarray:
    """Policy scores (higher is better, -inf = cannot take the pod) to integers 1..10, 0 for
    -inf: 10 x each node's share of the best on the policy's own scale (``kind``, a placer's
    ``score_kind``): "cost" (minus a positive cost, e.g. a finish time): best / cost;
    "ratio" (a positive score): score / best; "logit": exp(score - best), the odds of the
    choice against the best. A node 5 % slower than the best scores 10 or 9, not 1, so the
    neutral 5 of a node without telemetry ranks below the reachable ones up to about twice
    as slow. "spread" (or scores the kind does not fit: a cost or ratio not positive) spans
    1..10 between the worst and the best, which amplifies small differences."""
    out = np.zeros(scores.shape, dtype=np.int64)
    fin = np.isfinite(scores)
    if not fin.any():
        return out
    x = scores[fin]
    best = float(x.max())
    if kind == "cost" and best < 0:
        share = best / x  # both negative: best cost / cost
    elif kind == "ratio" and float(x.min()) > 0:
        share = x / best
    elif kind == "logit":
        share = np.exp(x - best)
    else:
        lo = float(x.min())
        share = np.ones_like(x) if best - lo < 1e-12 else 0.1 + 0.9 * (x - lo) / (best - lo)
    out[fin] = np.clip(np.rint(MAX_SCORE * share), 1, MAX_SCORE).astype(np.int64)
    return out


@dataclass(frozen=True)
class _Sized:
    """A node as the fit test and the policy see it: ``spec`` (a guessed size when unknown)
    and which of its size is known rather than guessed."""

    spec: NodeSpec
    cpu_known: bool
    mem_known: bool


class Coordinator:
    """Scores and filters nodes for one pod with a placement policy and live telemetry.

    ``boards`` maps node names to board types (else the node's ``hidvfs.io/board`` label,
    seen in this request or remembered from an earlier one that sent whole nodes); the board
    gives the speed, and the cores and memory unless the node's allocatable says otherwise.
    A node of no known board (no ``boards`` entry, no label naming a shipped board) is
    scored as ``default_board`` (warned once per node), its size at least the pod's request
    (the scheduler's own filters found it fits), and never failed on that guess: ``filter``
    fails a node on its size only when the size is known (allocatable, board).

    Telemetry is read from a node's own daemon only: its URL in ``telemetry.urls``, or the
    default URL when no node has a URL (the single-board case). A node without a URL among
    nodes with one is not read (the default URL is the coordinator host's daemon, not its):
    it is never failed on telemetry and gets the neutral score, warned once per node.

    A scheduler with ``nodeCacheCapable: true`` sends node names only; a node named so is
    taken as the last whole Node seen for that name (its labels and allocatable cores and
    memory), for the ``max_remembered`` nodes seen most recently.
    """

    def __init__(
        self,
        policy: str,
        telemetry: TelemetryClient,
        boards: Mapping[str, str] | None = None,
        default_board: str = DEFAULT_BOARD,
        model_path=None,
    ):
        for node, board in (boards or {}).items():
            try:
                board_node(board)
            except Exception as err:
                raise ValueError(f"nodes: node {node!r}: {err}") from None
        self.policy = policy
        self.telemetry = telemetry
        self.boards = dict(boards or {})
        self.default_board = default_board
        self.placer = _make_placer(policy, model_path)
        load = getattr(self.placer, "_model", None)
        if load is not None:
            # the learned placer's model loads (and is checked) now: a broken file refused at
            # start, not answered as an error to every /prioritize request
            load()
        self._lock = threading.Lock()  # placers keep per-call state
        # the last whole Node seen per name (NodeNames-only requests lack labels, allocatable)
        self._seen: OrderedDict[str, NodeInfo] = OrderedDict()
        self._seen_lock = threading.Lock()
        self.max_remembered = MAX_REMEMBERED_NODES
        self._warned: set[tuple[str, str]] = set()
        self._default_url_nodes: set[str] = set()
        self._board_specs: dict[str, NodeSpec] = {}  # shipped boards read (a few)

    def _board_spec(self, board: str) -> NodeSpec:
        """The nominal node of a shipped board (raises for any other name)."""
        spec = self._board_specs.get(board)
        if spec is None:
            spec = self._board_specs[board] = board_node(board)
        return spec

    def _warn_once(self, node: str, what: str, msg: str, *a) -> None:
        if (node, what) not in self._warned:
            if len(self._warned) >= 4 * MAX_REMEMBERED_NODES:  # names a client made up
                self._warned.clear()
            self._warned.add((node, what))
            log.warning(msg, *a)

    def _board(self, node) -> str | None:
        """``node``'s board type: its ``boards`` entry, else its board label when that names
        a shipped board; None (warned once) when unknown."""
        if node.name in self.boards:
            return self.boards[node.name]
        labels = node.labels
        for key in BOARD_LABELS:
            if labels.get(key):
                board = str(labels[key])
                try:
                    self._board_spec(board)
                except Exception as err:  # a label naming no shipped board
                    self._warn_once(
                        node.name,
                        "label",
                        "node %s: label %s: %s; board unknown: scored as %s, "
                        "failed on size only by its allocatable",
                        node.name,
                        key,
                        err,
                        self.default_board,
                    )
                    return None
                return board
        self._warn_once(
            node.name,
            "board",
            "node %s: board unknown (no --nodes board, no %s label seen); scored as %s, "
            "failed on size only by its allocatable",
            node.name,
            BOARD_LABELS[0],
            self.default_board,
        )
        return None

    def _size(self, n: NodeInfo, pod: PodRequest) -> _Sized:
        board = self._board(n)
        base = self._board_spec(board or self.default_board)
        cpu_known = n.cpu is not None or board is not None
        mem_known = n.mem_gb is not None or board is not None
        cpus = n.cpu if n.cpu is not None else base.cpus
        mem = n.mem_gb if n.mem_gb is not None else base.mem
        # a guessed size holds the pod at least: the scheduler's own filters found it fits
        cpus = cpus if cpu_known else max(cpus, pod.cpu)
        mem = mem if mem_known else max(mem, pod.mem_gb)
        spec = NodeSpec(n.name, base.board, max(cpus, 1e-3), max(mem, 1e-3), base.speed)
        return _Sized(spec, cpu_known, mem_known)

    def own_telemetry(self, node: str) -> bool:
        """Whether ``node``'s own daemon can be read: its URL is configured, or no node's is
        (the default URL then is the one board's daemon)."""
        return node in self.telemetry.urls or not self.telemetry.urls

    def _telemetry(self, names: list[str]) -> dict[str, NodeTelemetry]:
        """Each node's telemetry from its own daemon; a node with none is not read."""
        own = [n for n in names if self.own_telemetry(n)]
        tel = self.telemetry.fetch_many(own) if own else {}
        return {
            n: tel[n] if n in tel else NodeTelemetry(n, False, "no --nodes URL; not read")
            for n in names
        }

    def _remember(self, args: ExtenderArgs) -> ExtenderArgs:
        """Remember the whole nodes of ``args``, or fill a NodeNames-only request in from
        them; returns the args to size the nodes by."""
        with self._seen_lock:
            if args.raw_nodes is not None:
                for n in args.nodes:
                    self._seen[n.name] = n
                    self._seen.move_to_end(n.name)
                while len(self._seen) > max(self.max_remembered, 0):
                    self._seen.popitem(last=False)
            else:
                args = replace(args, nodes=[self._seen.get(n.name, n) for n in args.nodes])
        self._warn_urls(args)
        return args

    def _warn_urls(self, args: ExtenderArgs) -> None:
        urls = self.telemetry.urls
        for n in args.nodes:
            if n.name in urls:
                continue
            if urls:  # others have URLs: the default one is not this node's daemon
                self._warn_once(
                    n.name,
                    "url",
                    "node %s has no --nodes URL (other nodes have one): its telemetry is not "
                    "read (neutral score, never failed on it); give --nodes %s=board@url "
                    "(%s for this host's own board)",
                    n.name,
                    n.name,
                    self.telemetry.default_url,
                )
            elif n.name not in self._default_url_nodes and len(self._default_url_nodes) < 2:
                self._default_url_nodes.add(n.name)  # all the warning below needs
                if len(self._default_url_nodes) == 2:
                    log.warning(
                        "nodes %s have no --nodes URL and all read %s (one board's daemon): "
                        "its free cores and speed filter and score each of them; "
                        "give --nodes name=board@url for each node",
                        ", ".join(sorted(self._default_url_nodes)),
                        self.telemetry.default_url,
                    )

    def _nodes(
        self, args: ExtenderArgs, tel: dict[str, NodeTelemetry]
    ) -> tuple[list[_Sized], np.ndarray, np.ndarray]:
        sized, free_cpu, speed = [], [], []
        for n in args.nodes:
            s = self._size(n, args.pod)
            t = tel[n.name]
            sized.append(s)
            free_cpu.append(
                min(t.free_cpus, s.spec.cpus) if t.ok and t.free_cpus is not None else s.spec.cpus
            )
            factor = t.speed_factor if t.ok and t.speed_factor is not None else 1.0
            speed.append(s.spec.speed * max(factor, 1e-3))
        return sized, np.array(free_cpu), np.array(speed)

    def _unfit(
        self,
        args: ExtenderArgs,
        sized: list[_Sized],
        free_cpu: np.ndarray,
        tel: dict[str, NodeTelemetry],
    ) -> dict[str, str]:
        """Why each node that cannot take the pod cannot: the one test filter and
        prioritize share. Size (allocatable or board) only when known, free cores and speed
        only from the node's own telemetry (``tel`` has no other); a failure no eviction can
        fix (larger than the node, speed 0) is :class:`Unresolvable` and reported before one
        that can."""
        p, out = args.pod, {}
        for n, s, free in zip(args.nodes, sized, free_cpu.tolist()):
            spec = s.spec
            t = tel[n.name]
            if t.ok and t.speed_factor is not None and t.speed_factor <= 0:
                out[n.name] = Unresolvable("telemetry shows speed factor 0 (no core can run work)")
            elif s.cpu_known and p.cpu > spec.cpus + 1e-9:
                src = "allocatable" if n.cpu is not None else f"board {spec.board}"
                out[n.name] = Unresolvable(
                    f"pod requests {p.cpu:g} cores, node {src} {spec.cpus:g}"
                )
            elif s.mem_known and p.mem_gb > spec.mem + 1e-9:
                src = "allocatable" if n.mem_gb is not None else f"board {spec.board}"
                out[n.name] = Unresolvable(
                    f"pod requests {p.mem_gb:g} GB memory, node {src} {spec.mem:g} GB"
                )
            elif t.ok and p.cpu > free + 1e-9:
                out[n.name] = f"pod requests {p.cpu:g} cores, telemetry shows {free:.2f} free"
        return out

    def _view(self, args: ExtenderArgs, specs: list[NodeSpec], free_cpu, speed) -> ClusterView:
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
        if not args.nodes:  # nothing to fail (an empty list is a valid request)
            return {}
        args = self._remember(args)
        tel = self._telemetry([n.name for n in args.nodes])
        sized, free_cpu, _ = self._nodes(args, tel)
        return self._unfit(args, sized, free_cpu, tel)

    def prioritize(self, args: ExtenderArgs) -> dict[str, int]:
        if not args.nodes:  # nothing to score; the placers are not built for no nodes
            return {}
        args = self._remember(args)
        names = [n.name for n in args.nodes]
        tel = self._telemetry(names)
        sized, free_cpu, speed = self._nodes(args, tel)
        unfit = self._unfit(args, sized, free_cpu, tel)
        with self._lock:  # the placer keeps the workload of the current pod
            view = self._view(args, [s.spec for s in sized], free_cpu, speed)
            raw = np.asarray(self.placer.node_scores(view, 0), dtype=float)
        fits = np.array([n not in unfit for n in names], dtype=bool)
        reachable = np.array([tel[n].ok for n in names], dtype=bool) & fits
        scores = np.where(fits, NEUTRAL_SCORE, 0).astype(np.int64)
        if reachable.any():
            kind = getattr(self.placer, "score_kind", "spread")
            scores[reachable] = scale_scores(raw[reachable], kind)
        for n in names:  # debug: the node's going down is logged once, when it happens
            if not tel[n].ok and n not in unfit:
                log.debug("pod %s: node %s scored neutral (%s)", args.pod.name, n, tel[n].reason)
        return dict(zip(names, scores.tolist()))

    def status(self) -> dict:
        return {"ok": True, "policy": self.policy}

    def verbs(self) -> Verbs:
        return Verbs(filter=self.filter, prioritize=self.prioritize, status=self.status)


def _check_url(url: str, where: str) -> str:
    """``url`` if it is an http(s) URL with a host and a valid port: a bad one used to be
    logged only at each request, its node scored neutral for good."""
    try:
        parts = urllib.parse.urlsplit(url)
        _ = parts.port  # raises for a port that is not a number in 0-65535
    except ValueError as err:
        raise ValueError(f"{where}: bad URL {url!r} ({err})") from None
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"{where}: URL {url!r} is not http:// or https://")
    if not parts.hostname:
        raise ValueError(f"{where}: URL {url!r} has no host")
    return url


def parse_nodes_arg(nodes: str | Mapping | None) -> tuple[dict[str, str], dict[str, str]]:
    """``"name=board@url,name2=board2"`` (or a mapping name -> {"board", "url"}) into
    (urls, boards). In the string (``serve --nodes``) a malformed entry (no name, neither
    board nor URL, a URL that is not http(s)://host[:port], a name given twice) is refused,
    naming it, before serving; a mapping is taken as given (a bad URL is logged per request)."""
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
        name, rest = (s.strip() for s in item.split("=", 1))
        board, at, url = (s.strip() for s in rest.partition("@"))
        if not name:
            raise ValueError(f"nodes entry {item!r}: no node name before '='")
        if not board and not url:
            raise ValueError(f"nodes entry {item!r}: no board after '='; expected name=board[@url]")
        if at and not url:
            raise ValueError(f"nodes entry {item!r}: no URL after '@'")
        if name in boards or name in urls:
            raise ValueError(f"nodes entry {item!r}: node {name!r} is given twice")
        if board:
            boards[name] = board
        if url:
            urls[name] = _check_url(url, f"nodes entry {item!r}")
    return urls, boards


def build_server(
    host: str,
    port: int,
    policy: str,
    nodes=None,
    token: str | None = None,
    timeout_s: float = 0.5,
    model_path=None,
    default_url: str = DEFAULT_STATUS_URL,
):
    """The extender HTTP server, ready for ``serve_forever()`` (port 0 = ephemeral).
    ``default_url``: the status URL of a node without one in ``nodes`` (the local daemon)."""
    urls, boards = parse_nodes_arg(nodes)
    coord = Coordinator(
        policy,
        TelemetryClient(urls, token=token, timeout_s=timeout_s, default_url=default_url),
        boards,
        model_path=model_path,
    )
    try:
        srv = make_server(host, port, coord.verbs())
    except OSError as err:
        coord.telemetry.close()
        where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        raise OSError(err.errno, f"cannot listen on {where}: {err.strerror or err}") from None
    srv.coordinator = coord
    return srv
