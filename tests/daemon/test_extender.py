"""The scheduler extender over real HTTP on 127.0.0.1, with fake node daemons."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from daemon.coordinator import (
    Coordinator,
    TelemetryClient,
    build_server,
    parse_nodes_arg,
    parse_status,
    scale_scores,
)
from daemon.extender import parse_cpu, parse_mem_gb


class _Status(BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps(self.server.status).encode()
        self.server.auth.append(self.headers.get("Authorization"))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


@pytest.fixture
def node_daemon():
    """Start fake node daemons serving a status dict; yields a factory returning the URL."""
    servers = []

    def start(status):
        srv = ThreadingHTTPServer(("127.0.0.1", 0), _Status)
        srv.status, srv.auth = status, []
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        return f"http://127.0.0.1:{srv.server_address[1]}/status", srv

    yield start
    for s in servers:
        s.shutdown()
        s.server_close()


#: sockets bound and never listened on, held until the module's tests end
_HELD: list[socket.socket] = []


@pytest.fixture(autouse=True, scope="module")
def _release_dead_ports():
    yield
    while _HELD:
        _HELD.pop().close()


def _dead_url() -> str:
    """A status URL nobody answers: its port is bound here and never listened on, so a
    connection is refused at once and no other process on the machine can take the port
    while the tests run (a closed port could be reused)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    _HELD.append(s)
    return f"http://127.0.0.1:{s.getsockname()[1]}/status"


@pytest.fixture
def extender(node_daemon):
    cool, _ = node_daemon({"speed_factor": 1.0, "free_cpus": 8})
    hot, _ = node_daemon(
        {
            "clusters": [
                {
                    "cpus": [0, 1, 2, 3],
                    "online": [0, 1, 2, 3],
                    "cur_khz": 500000,
                    "max_khz": 2000000,
                    "limit_khz": 500000,  # capped to a quarter
                    "capacity": 1.0,
                    "util": [0.0, 0.0, 0.0, 0.0],
                }
            ]
        }
    )
    nodes = {
        "orin-a": {"board": "orin-nx", "url": cool},
        "orin-hot": {"board": "orin-nx", "url": hot},
        "tx2-dead": {"board": "tx2", "url": _dead_url()},
        "orin-dead": {"board": "orin-nx", "url": _dead_url()},
    }
    # default_url: whatever listens on the machine's 127.0.0.1:9130 must not matter
    srv = build_server("127.0.0.1", 0, "heft", nodes, timeout_s=0.3, default_url=_dead_url())
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()
    srv.coordinator.telemetry.close()


def _post(url, obj):
    req = urllib.request.Request(
        url,
        data=json.dumps(obj).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=5) as r:
        return r.status, json.loads(r.read())


POD = {
    "metadata": {"name": "t1", "namespace": "dag", "annotations": {"hidvfs.io/work-s": "60"}},
    "spec": {"containers": [{"resources": {"requests": {"cpu": "1", "memory": "512Mi"}}}]},
}


def test_prioritize_go_field_names(extender, caplog):
    caplog.set_level(logging.INFO, logger="hidvfs.coordinator")
    code, out = _post(
        extender + "/prioritize",
        {"Pod": POD, "NodeNames": ["orin-a", "orin-hot", "tx2-dead"], "Nodes": None},
    )
    assert code == 200
    scores = {e["Host"]: e["Score"] for e in out}
    assert scores["tx2-dead"] == 5  # unreachable: neutral
    assert (
        scores["orin-a"] == 10 and scores["orin-hot"] < scores["orin-a"]
    )  # throttled to 1/4 speed
    assert all(0 <= s <= 10 for s in scores.values())
    text = caplog.text
    assert (
        "tx2-dead" in text and "neutral" in text and "127.0.0.1" in text
    )  # the logged reason names the URL


def test_prioritize_lower_case_keys(extender):
    pod = {
        "metadata": POD["metadata"],
        "spec": {"containers": [{"resources": {"requests": {"cpu": "500m"}}}]},
    }
    code, out = _post(
        extender + "/scheduler/prioritize", {"pod": pod, "nodenames": ["orin-a", "orin-hot"]}
    )
    assert code == 200
    assert set(out[0]) == {"host", "score"}
    assert {e["host"] for e in out} == {"orin-a", "orin-hot"}


def test_filter_both_casings_and_node_lists(extender):
    big = {
        "metadata": {"name": "big"},
        "spec": {"containers": [{"resources": {"requests": {"cpu": "6"}}}]},
    }
    code, out = _post(
        extender + "/filter",
        {"Pod": big, "NodeNames": ["orin-a", "orin-hot", "tx2-dead", "orin-dead"]},
    )
    assert code == 200 and out["Error"] == ""
    # hot node has 4 cores free; a dead node fails open on telemetry, not on its board's size
    assert out["NodeNames"] == ["orin-a", "orin-dead"]
    assert set(out["FailedNodes"]) == {"orin-hot"} and "cores" in out["FailedNodes"]["orin-hot"]
    # larger than the node: no eviction helps
    assert set(out["FailedAndUnresolvableNodes"]) == {"tx2-dead"}
    assert "board tx2 4" in out["FailedAndUnresolvableNodes"]["tx2-dead"]
    items = [
        {
            "metadata": {"name": "orin-a", "labels": {"hidvfs.io/board": "orin-nx"}},
            "status": {"allocatable": {"cpu": "8", "memory": "16Gi"}},
        },
        {
            "metadata": {"name": "tx2-dead"},
            "status": {"allocatable": {"cpu": "4", "memory": "8Gi"}},
        },
    ]
    code, out = _post(extender + "/filter", {"pod": big, "nodes": {"items": items}})
    assert code == 200
    assert [i["metadata"]["name"] for i in out["nodes"]["items"]] == ["orin-a"]
    assert out["failednodes"] == {}
    assert "allocatable" in out["failedandunresolvablenodes"]["tx2-dead"]


def test_bad_requests_get_400_with_the_cause(extender):
    for body, needle in ((b"not json", "JSON"), (json.dumps({"Pod": POD}).encode(), "NodeNames")):
        req = urllib.request.Request(extender + "/prioritize", data=body, method="POST")
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(req, timeout=5)
        assert err.value.code == 400 and needle in json.loads(err.value.read())["Error"]
    with urllib.request.urlopen(extender + "/healthz", timeout=5) as r:
        assert json.loads(r.read())["policy"] == "heft"


def test_higfrl_policy_over_http(node_daemon):
    url, _ = node_daemon({"speed_factor": 1.0, "free_cpus": 4})
    srv = build_server(
        "127.0.0.1", 0, "higfrl", f"a=orin-nx@{url},b=tx2@{url}", default_url=_dead_url()
    )
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        code, out = _post(
            f"http://127.0.0.1:{srv.server_address[1]}/prioritize",
            {"Pod": POD, "NodeNames": ["a", "b"]},
        )
        assert code == 200 and {e["Host"] for e in out} == {"a", "b"}
    finally:
        srv.shutdown()
        srv.server_close()


def test_bearer_token_goes_to_every_node_loopback_included(node_daemon):
    """The daemon's telemetry endpoint requires its token on loopback too once one is set
    (README, systemd/config.yaml): a coordinator keeping it from loopback nodes could never
    score a token-protected local board (HTTP 401, neutral score)."""
    url, srv = node_daemon({"speed_factor": 0.5})
    client = TelemetryClient({"n": url}, token="s3cret")
    assert client.fetch("n").speed_factor == 0.5
    assert srv.auth == ["Bearer s3cret"]  # loopback: sent all the same
    local = TelemetryClient({"n": url.replace("127.0.0.1", "localhost")}, token="s3cret")
    local.fetch("n")
    assert srv.auth[-1] == "Bearer s3cret"
    remote = TelemetryClient({"board": "http://10.0.0.5:9130/status"}, token="s3cret")
    assert remote.request("board").get_header("Authorization") == "Bearer s3cret"
    assert (
        TelemetryClient(token="s3cret").request("x").get_header("Authorization") == "Bearer s3cret"
    )  # the default, localhost
    untokened = TelemetryClient({"n": url})
    untokened.fetch("n")
    assert srv.auth[-1] is None  # no token configured, none sent
    for c in (client, local, remote, untokened):
        c.close()


def test_a_token_protected_loopback_daemon_is_scored():
    """End to end with the daemon's own endpoint: a token on loopback scored neutral (401)."""
    from daemon.telemetry import TelemetryServer

    with TelemetryServer("127.0.0.1:0", lambda: {"speed_factor": 0.5}, token="s3cret") as srv:
        url = f"http://127.0.0.1:{srv.address[1]}/status"
        client = TelemetryClient({"n": url}, token="s3cret")
        try:
            tel = client.fetch("n")
            assert tel.ok and tel.speed_factor == 0.5, tel.reason
        finally:
            client.close()


def test_status_parsing_and_helpers():
    t = parse_status(
        "n",
        {
            "Clusters": [
                {
                    "cpus": [0, 1],
                    "online": [0],
                    "cur_khz": 1000,
                    "freqs_khz": [500, 2000],
                    "capacity": 2.0,
                    "util": [0.5, None],
                }
            ]
        },
    )
    assert (
        t.ok
        and t.speed_factor == pytest.approx(2 * 2000 * 1 / (2 * 2000 * 2))  # 1 of 2 online
        and t.free_cpus == pytest.approx(0.5)
    )
    assert not parse_status("n", [1, 2]).ok
    assert parse_cpu("250m") == 0.25 and parse_cpu(2) == 2.0
    assert parse_mem_gb("1Gi") == pytest.approx(1.073741824) and parse_mem_gb("500M") == 0.5
    # Kubernetes' decimal exponent is signed: 129e-3 (bytes) and 5e+8 are quantities too
    assert parse_mem_gb("129e-3") == pytest.approx(129e-12) and parse_mem_gb("5e+8") == 0.5
    assert parse_nodes_arg("a=tx2@http://x:1/s,b=orin-nx") == (
        {"a": "http://x:1/s"},
        {"a": "tx2", "b": "orin-nx"},
    )
    import numpy as np

    assert scale_scores(np.array([-np.inf, 1.0, 3.0])).tolist() == [0, 1, 10]
    assert isinstance(Coordinator("fifo", TelemetryClient(default_url=_dead_url())).status(), dict)


class _Raw(BaseHTTPRequestHandler):
    """Serves ``server.bodies[path]`` as is; ``/drip`` paths one byte per 0.1 s, counting in
    ``server.dripping[path]`` the bytes written until the client hung up (or all of them),
    and adding the path to ``server.dripped`` once its handler is done."""

    def do_GET(self):
        body = self.server.bodies.get(self.path, b"{}")
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.path.startswith("/drip"):
            self.server.dripping[self.path] = 0
            try:
                for i in range(len(body)):
                    try:
                        self.wfile.write(body[i : i + 1])
                        self.wfile.flush()
                    except OSError:
                        return
                    self.server.dripping[self.path] += 1
                    time.sleep(0.1)
            finally:
                self.server.dripped.add(self.path)
        else:
            self.wfile.write(body)

    def log_message(self, *a):
        pass


@pytest.fixture
def raw_daemon():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Raw)
    srv.daemon_threads = True
    srv.bodies = {}
    srv.dripping, srv.dripped = {}, set()
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv, f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def _serve(nodes, policy="heft", timeout_s=0.5, default_url=None):
    """An extender on an ephemeral port; a node without a URL in ``nodes`` reads
    ``default_url`` (default: a port nobody answers, never the machine's 127.0.0.1:9130)."""
    srv = build_server(
        "127.0.0.1", 0, policy, nodes, timeout_s=timeout_s, default_url=default_url or _dead_url()
    )
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}"


def _stop(srv):
    srv.shutdown()
    srv.server_close()
    srv.coordinator.telemetry.close()


def _orin_status(cur_khz, util):
    """What ``hidvfs daemon --sim orin-nx`` serves (max_khz is the top OPP)."""
    return {
        "clusters": [
            {
                "cpus": cpus,
                "online": cpus,
                "cur_khz": cur_khz,
                "max_khz": 1984000,
                "capacity": 1.0,
                "util": [util] * 4,
            }
            for cpus in ([0, 1, 2, 3], [4, 5, 6, 7])
        ],
        "max_cpu_temp_c": 38.8,
        "throttled": False,
    }


def test_an_idle_board_is_scored_at_its_frequency_ceiling(node_daemon):
    idle = parse_status("n", _orin_status(115200, 0.0))  # the governor parks an idle board
    busy = parse_status("n", _orin_status(1984000, 0.5))
    assert idle.speed_factor == busy.speed_factor == 1.0
    capped = _orin_status(115200, 0.0)
    for c in capped["clusters"]:
        c["limit_khz"] = 992000  # a thermal cap: the ceiling now
    assert parse_status("n", capped).speed_factor == pytest.approx(0.5)
    throttled = dict(_orin_status(992000, 1.0), throttled=True)  # no limit: cur bounds it
    assert parse_status("n", throttled).speed_factor == pytest.approx(0.5)
    idle_url, _ = node_daemon(_orin_status(115200, 0.0))
    busy_url, _ = node_daemon(_orin_status(1984000, 0.5))
    srv, base = _serve(f"idle=orin-nx@{idle_url},busy=orin-nx@{busy_url}")
    try:
        _, out = _post(base + "/prioritize", {"Pod": POD, "NodeNames": ["idle", "busy"]})
        scores = {e["Host"]: e["Score"] for e in out}
        assert scores["idle"] == 10 and scores["idle"] >= scores["busy"]
    finally:
        _stop(srv)


MALFORMED = {
    "/str-cur": b'{"clusters": [{"cur_khz": "x", "max_khz": 1000, "cpus": [0]}]}',
    "/str-util": b'{"clusters": [{"cpus": [0, 1], "util": ["a"]}]}',
    "/str-freqs": b'{"clusters": [{"cur_khz": 1, "freqs_khz": ["a", "b"], "cpus": [0]}]}',
    "/str-cap": b'{"clusters": [{"capacity": "big", "cur_khz": 1, "max_khz": 2, "cpus": [0]}]}',
    "/str-temp": b'{"speed_factor": 0.9, "max_cpu_temp_c": "hot"}',
    "/str-clusters": b'{"clusters": "abc"}',
    "/nan": b'{"speed_factor": NaN, "free_cpus": 4}',
    "/inf-free": b'{"free_cpus": Infinity}',
    "/nan-util": b'{"clusters": [{"cpus": [0], "max_khz": 1, "util": [NaN]}]}',
    "/deep": b"[" * 200000,
    "/huge-int": b'{"speed_factor": 1' + b"0" * 400 + b"}",
}


def test_malformed_telemetry_degrades_its_node_only(raw_daemon, node_daemon, caplog):
    caplog.set_level(logging.INFO, logger="hidvfs.coordinator")
    srv_raw, base_raw = raw_daemon
    srv_raw.bodies.update(MALFORMED)
    good, _ = node_daemon({"speed_factor": 1.0, "free_cpus": 8})
    nodes = {p.strip("/"): {"board": "orin-nx", "url": base_raw + p} for p in MALFORMED}
    nodes["badurl"] = {"board": "orin-nx", "url": "notaurl"}
    nodes["good"] = {"board": "orin-nx", "url": good}
    srv, base = _serve(nodes, timeout_s=2.0)  # the point is the content, not the timing
    try:
        names = list(nodes)
        code, out = _post(base + "/prioritize", {"Pod": POD, "NodeNames": names})
        assert code == 200
        scores = {e["Host"]: e["Score"] for e in out}
        assert scores == {n: 10 if n == "good" else 5 for n in names}
        code, out = _post(base + "/filter", {"Pod": POD, "NodeNames": names})
        assert code == 200 and out["Error"] == "" and out["NodeNames"] == names
        for n in names[:-1]:  # once per node, with its reason (not once per pod)
            line = f"node {n}: telemetry unavailable ("
            assert caplog.text.count(line) == 1 and "neutral score" in caplog.text
        assert "notaurl" in caplog.text and "nested too deeply" in caplog.text
    finally:
        _stop(srv)


def test_speed_factor_zero_is_slow_and_nan_is_neutral(node_daemon):
    assert parse_status("n", {"speed_factor": 0.0}).speed_factor == 0.0
    assert parse_status("n", {"speed_factor": -3}).speed_factor == 0.0
    assert not parse_status("n", {"speed_factor": float("nan")}).ok
    stopped, _ = node_daemon({"speed_factor": 0.0, "free_cpus": 8})
    full, _ = node_daemon({"speed_factor": 1.0, "free_cpus": 8})
    srv, base = _serve(f"stopped=orin-nx@{stopped},full=orin-nx@{full}")
    try:
        _, out = _post(base + "/prioritize", {"Pod": POD, "NodeNames": ["stopped", "full"]})
        scores = {e["Host"]: e["Score"] for e in out}
        assert scores["full"] == 10 and scores["stopped"] < scores["full"]
    finally:
        _stop(srv)


def test_a_dripping_status_is_cut_at_the_budget(raw_daemon, node_daemon):
    srv_raw, base_raw = raw_daemon
    good, _ = node_daemon({"speed_factor": 1.0, "free_cpus": 8})
    urls = {"good": good}
    for i in range(12):  # more than the old 8-worker pool; each would drip for 3 s
        srv_raw.bodies[f"/drip{i}"] = b" " * 30
        urls[f"drip{i}"] = f"{base_raw}/drip{i}"
    client = TelemetryClient(urls, timeout_s=0.4)
    try:
        t0 = time.monotonic()
        tel = client.fetch_many(list(urls))
        elapsed = time.monotonic() - t0
        # the budget is 0.4 s; waiting for the drips took 3 s (6 s on the old 8-worker pool)
        assert elapsed < 2.0
        assert tel["good"].ok
        for i in range(12):
            assert not tel[f"drip{i}"].ok and "within 0.4 s" in tel[f"drip{i}"].reason
        # every drip asked was hung up on, not read to its end by a worker left behind (the
        # wait is for the handlers to finish: cut they end at once, read whole after 3 s)
        give_up = time.monotonic() + 10.0
        while set(srv_raw.dripping) - srv_raw.dripped and time.monotonic() < give_up:
            time.sleep(0.05)
        assert srv_raw.dripping and srv_raw.dripped == set(srv_raw.dripping)
        assert max(srv_raw.dripping.values()) < 30, srv_raw.dripping
    finally:
        client.close()


def test_filter_and_prioritize_share_one_fit_test(extender):
    huge = {
        "metadata": {"name": "huge"},
        "spec": {"containers": [{"resources": {"requests": {"cpu": "1", "memory": "100Gi"}}}]},
    }
    names = ["orin-a", "orin-hot", "tx2-dead"]
    _, out = _post(extender + "/filter", {"Pod": huge, "NodeNames": names})
    assert out["NodeNames"] == [] and out["FailedNodes"] == {}
    failed = out["FailedAndUnresolvableNodes"]
    assert set(failed) == set(names) and all("memory" in r for r in failed.values())
    _, out = _post(extender + "/prioritize", {"Pod": huge, "NodeNames": names})
    assert [e["Score"] for e in out] == [0, 0, 0]


def test_an_unknown_board_in_nodes_is_refused_at_start():
    with pytest.raises(ValueError, match="'orin_nx'"):
        build_server("127.0.0.1", 0, "fifo", "a=orin_nx@http://127.0.0.1:1/status")


def test_labels_from_whole_nodes_are_remembered_for_node_names(caplog):
    caplog.set_level(logging.WARNING, logger="hidvfs.coordinator")
    srv, base = _serve(None, "fifo", timeout_s=0.2)
    six = {
        "metadata": {"name": "six"},
        "spec": {"containers": [{"resources": {"requests": {"cpu": "6"}}}]},
    }
    try:
        items = [{"metadata": {"name": "t", "labels": {"hidvfs.io/board": "tx2"}}}]
        _, out = _post(base + "/filter", {"Pod": POD, "Nodes": {"items": items}})
        assert [i["metadata"]["name"] for i in out["Nodes"]["items"]] == ["t"]
        for _ in range(2):  # nodeCacheCapable: names only from now on
            _, out = _post(base + "/filter", {"Pod": six, "NodeNames": ["t", "u"]})
            assert "board tx2" in out["FailedAndUnresolvableNodes"]["t"]
            assert out["NodeNames"] == ["u"] and out["FailedNodes"] == {}
        assert caplog.text.count("node u: board unknown") == 1
        assert "node t: board unknown" not in caplog.text
        assert "have no --nodes URL" in caplog.text
    finally:
        _stop(srv)


def _node(name, cpu=None, memory=None, board="tx2"):
    alloc = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v is not None}
    return {
        "metadata": {"name": name, "labels": {"hidvfs.io/board": board}},
        "status": {"allocatable": alloc},
    }


def test_allocatable_from_whole_nodes_is_remembered_for_node_names():
    """nodeCacheCapable: a NodeNames-only request is sized by the allocatable of the last
    whole Node seen (the board's nominal 4 cores and 8 GB were used instead)."""
    srv, base = _serve(None, "fifo", timeout_s=0.2)
    three = _pod({"cpu": "3"})
    big = _pod({"cpu": "1", "memory": "2Gi"})
    try:
        items = [_node("t", cpu="2", memory="1Gi"), _node("u")]  # u: no allocatable
        _, out = _post(base + "/filter", {"Pod": three, "Nodes": {"items": items}})
        assert set(out["FailedAndUnresolvableNodes"]) == {"t"} and out["FailedNodes"] == {}
        for _ in range(2):  # names only from now on
            _, out = _post(base + "/filter", {"Pod": three, "NodeNames": ["t", "u"]})
            assert out["NodeNames"] == ["u"] and out["FailedNodes"] == {}
            assert out["FailedAndUnresolvableNodes"] == {
                "t": "pod requests 3 cores, node allocatable 2"
            }
            _, out = _post(base + "/filter", {"Pod": big, "NodeNames": ["t", "u"]})
            assert out["NodeNames"] == ["u"]
            assert "allocatable 1.07374 GB" in out["FailedAndUnresolvableNodes"]["t"]
            _, out = _post(base + "/prioritize", {"Pod": three, "NodeNames": ["t", "u"]})
            assert [(e["Host"], e["Score"] > 0) for e in out] == [("t", False), ("u", True)]
        # the last whole node wins: t now reports 4 cores, and a NodeNames request follows it
        _post(base + "/filter", {"Pod": three, "Nodes": {"items": [_node("t", cpu="4")]}})
        _, out = _post(base + "/filter", {"Pod": three, "NodeNames": ["t"]})
        assert out["NodeNames"] == ["t"] and out["FailedNodes"] == {}
        assert out["FailedAndUnresolvableNodes"] == {}
    finally:
        _stop(srv)


def test_remembered_nodes_are_bounded(caplog):
    caplog.set_level(logging.WARNING, logger="hidvfs.coordinator")
    srv, base = _serve(None, "fifo", timeout_s=0.2)
    srv.coordinator.max_remembered = 2
    three = _pod({"cpu": "3"})
    try:
        items = [_node(n, cpu="2", board="orin-nx") for n in ("a", "b", "c")]
        _post(base + "/filter", {"Pod": three, "Nodes": {"items": items}})
        assert len(srv.coordinator._seen) == 2
        _, out = _post(base + "/filter", {"Pod": three, "NodeNames": ["a", "b", "c"]})
        # a, the oldest, is forgotten with its label and allocatable: its size is unknown,
        # so it is kept (the scheduler's own filters checked it)
        assert out["NodeNames"] == ["a"] and set(out["FailedAndUnresolvableNodes"]) == {"b", "c"}
        assert "node a: board unknown" in caplog.text
    finally:
        _stop(srv)


def _raw_post(base, path, head: bytes, body: bytes = b"", timeout=5.0) -> tuple[int, dict]:
    """POST with hand-written headers over a plain socket: (status, JSON reply)."""
    host, port = base.rsplit("/", 1)[-1].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\n" + head + b"\r\n" + body)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
            if b"\r\n\r\n" in data:
                top, _, rest = data.partition(b"\r\n\r\n")
                n = int(
                    next(
                        h for h in top.split(b"\r\n") if h.lower().startswith(b"content-length")
                    ).split(b":")[1]
                )
                if len(rest) >= n:
                    return int(top.split()[1]), json.loads(rest[:n])
    raise AssertionError(f"connection closed without a reply: {data!r}")


def _post_error(url, obj_or_bytes) -> tuple[int, str]:
    data = obj_or_bytes if isinstance(obj_or_bytes, bytes) else json.dumps(obj_or_bytes).encode()
    req = urllib.request.Request(url, data=data, method="POST")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=5)
    return err.value.code, json.loads(err.value.read())["Error"]


def _pod(requests=None, annotations=None):
    return {
        "metadata": {"name": "p", "annotations": annotations or {}},
        "spec": {"containers": [{"resources": {"requests": requests or {}}}]},
    }


MALFORMED_REQUESTS = [
    ({"Pod": {"spec": {"containers": 5}}, "NodeNames": ["a"]}, "containers"),
    ({"Pod": {"spec": {"containers": True}}, "NodeNames": ["a"]}, "containers"),
    ({"Pod": {"spec": {"containers": [5]}}, "NodeNames": ["a"]}, "containers[0]"),
    # falsy wrong types were taken as no containers (200), other wrong names as names
    ({"Pod": {"spec": {"containers": 0}}, "NodeNames": ["a"]}, "containers: expected a list"),
    ({"Pod": {"spec": {"containers": False}}, "NodeNames": ["a"]}, "containers: expected a"),
    ({"Pod": {"spec": {"containers": ""}}, "NodeNames": ["a"]}, "containers: expected a list"),
    ({"Pod": {"spec": {"containers": {}}}, "NodeNames": ["a"]}, "containers: expected a list"),
    ({"Pod": {"metadata": {"name": 7}}, "NodeNames": ["a"]}, "metadata.name: expected a string"),
    ({"Pod": {"metadata": {"name": ["p"]}}, "NodeNames": ["a"]}, "metadata.name: expected a"),
    ({"Pod": {"metadata": {"namespace": 1}}, "NodeNames": ["a"]}, "namespace: expected a"),
    ({"Pod": {"metadata": []}, "NodeNames": ["a"]}, "metadata"),
    ({"Pod": _pod({"cpu": {"x": 1}}), "NodeNames": ["a"]}, "cpu"),
    (
        {"Pod": POD, "Nodes": {"items": [{"metadata": {"name": "a", "labels": ["x"]}}]}},
        "labels",
    ),
    ({"Pod": POD, "Nodes": {"items": [5]}}, "items[0]"),
    ({"Pod": POD, "Nodes": [{"metadata": {"name": "a"}}]}, "NodeList object"),
    (b"[" * 100000, "nested too deeply"),
    ({"Pod": _pod(annotations={"hidvfs.io/work-s": "nan"}), "NodeNames": ["a"]}, "work-s"),
    ({"Pod": _pod(annotations={"hidvfs.io/work-s": "inf"}), "NodeNames": ["a"]}, "work-s"),
    ({"Pod": _pod(annotations={"hidvfs.io/rank-s": "1e309"}), "NodeNames": ["a"]}, "rank-s"),
    ({"Pod": _pod(annotations={"hidvfs.io/work-s": [1]}), "NodeNames": ["a"]}, "work-s"),
    ({"Pod": _pod(annotations={"hidvfs.io/work-s": "1e308"}), "NodeNames": ["a"]}, "work-s"),
    ({"Pod": _pod(annotations={"hidvfs.io/rank-s": 2e9}), "NodeNames": ["a"]}, "rank-s"),
    ({"Pod": _pod({"cpu": -1}), "NodeNames": ["a"]}, "cpu"),
    ({"Pod": _pod({"memory": "1e309"}), "NodeNames": ["a"]}, "memory"),
    ({"Pod": _pod({"cpu": "1.2.3"}), "NodeNames": ["a"]}, "cpu"),
    (
        {
            "Pod": POD,
            "Nodes": {
                "items": [{"metadata": {"name": "a"}, "status": {"allocatable": {"cpu": -4}}}]
            },
        },
        "allocatable cpu",
    ),
]


def test_malformed_requests_get_400_naming_the_field(extender):
    for body, needle in MALFORMED_REQUESTS:
        for verb in ("filter", "prioritize"):
            code, error = _post_error(f"{extender}/{verb}", body)
            assert code == 400 and needle in error, (body, error)


def test_a_nan_cpu_is_refused():
    # JSON NaN reaches parse_cpu as a float
    with pytest.raises(ValueError, match="finite"):
        parse_cpu(float("nan"))
    with pytest.raises(ValueError, match="finite"):
        parse_mem_gb(-1)


def test_content_length_is_required_and_checked(extender):
    body = json.dumps({"Pod": POD, "NodeNames": ["orin-a"]}).encode()
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    code, out = _raw_post(extender, "/filter", b"Transfer-Encoding: chunked\r\n", chunked)
    assert code == 411 and "Content-Length required" in out["Error"]
    code, out = _raw_post(extender, "/filter", b"")
    assert code == 411
    code, out = _raw_post(extender, "/filter", b"Content-Length: abc\r\n", body)
    assert code == 400 and "Content-Length 'abc'" in out["Error"]
    code, out = _raw_post(extender, "/filter", b"Content-Length: %d\r\n" % len(body), body)
    assert code == 200 and out["NodeNames"] == ["orin-a"]


def test_a_short_body_is_answered_after_the_handler_timeout(monkeypatch):
    import daemon.extender as ext

    monkeypatch.setattr(ext, "HANDLER_TIMEOUT_S", 0.5)
    srv, base = _serve(None, "fifo", timeout_s=0.1)
    try:
        assert srv.request_queue_size >= 128
        t0 = time.monotonic()
        code, out = _raw_post(base, "/filter", b"Content-Length: 100\r\n", b'{"Pod"')
        assert code == 400 and "shorter than Content-Length" in out["Error"]
        assert time.monotonic() - t0 < 3
    finally:
        _stop(srv)


def test_serves_on_ipv6_loopback():
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError as err:
        pytest.skip(f"no IPv6 loopback ({err})")
    srv = build_server("::1", 0, "fifo", None, timeout_s=0.1, default_url=_dead_url())
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        with urllib.request.urlopen(
            f"http://[::1]:{srv.server_address[1]}/healthz", timeout=5
        ) as r:
            assert json.loads(r.read())["ok"] is True
    finally:
        _stop(srv)


def test_a_node_that_stays_down_is_logged_once_and_again_when_back(caplog):
    """Every cache miss of a down node logged a warning (about once a second per node)."""
    import logging

    from daemon.coordinator import NodeTelemetry, TelemetryClient

    client = TelemetryClient({"n": _dead_url()}, cache_s=0.0)
    try:
        with caplog.at_level(logging.INFO, logger="hidvfs.coordinator"):
            for _ in range(4):
                assert not client.fetch_many(["n"])["n"].ok
            client._note("n", NodeTelemetry("n", True, ""))
    finally:
        client.close()
    msgs = [r.getMessage() for r in caplog.records]
    assert sum("telemetry unavailable" in m for m in msgs) == 1, msgs
    assert any("telemetry back" in m for m in msgs)


EMPTY_NODE_LISTS = [
    {"Pod": POD, "NodeNames": []},
    {"pod": POD, "nodenames": []},
    {"Pod": POD, "Nodes": {"items": []}},
    {"Pod": POD, "Nodes": {"items": None}},
    {"pod": POD, "nodes": {"items": []}},
]


@pytest.mark.parametrize("policy", ["higfrl", "tetris", "heft", "fifo"])
def test_an_empty_node_list_gets_an_empty_answer(policy):
    """prioritize with no nodes was HTTP 500 under higfrl (max() of an empty sequence) and
    tetris (a zero-size reduction)."""
    srv, base = _serve(None, policy, timeout_s=0.1)
    try:
        for body in EMPTY_NODE_LISTS:
            assert _post(base + "/prioritize", body) == (200, []), body
            lower = "pod" in body
            code, out = _post(base + "/filter", body)
            key = {k.lower(): k for k in out}
            assert code == 200 and out[key["error"]] == "" and out[key["failednodes"]] == {}
            nodes, names = out[key["nodes"]], out[key["nodenames"]]
            assert (nodes, names) in (({"items": []}, None), (None, [])), body
            assert all(k.islower() == lower for k in out)
    finally:
        _stop(srv)


@pytest.mark.parametrize(
    "nodes, needle",
    [
        ("a=tx2@ftp://127.0.0.1:9130/status", "'a=tx2@ftp://127.0.0.1:9130/status': URL"),
        ("a=tx2@http://127.0.0.1:99999/status", "Port out of range"),
        ("a=tx2@notaurl", "'a=tx2@notaurl': URL 'notaurl' is not http"),
        ("a=tx2@http://[::1/status", "Invalid IPv6 URL"),
        ("a=tx2@http:///status", "has no host"),
        ("=tx2", "'=tx2': no node name"),
        ("n1=", "'n1=': no board"),
        ("n1=tx2@", "'n1=tx2@': no URL"),
        ("n1=tx2,n1=orin-nx", "'n1=orin-nx': node 'n1' is given twice"),
    ],
)
def test_a_malformed_nodes_entry_is_refused_at_start(nodes, needle):
    """These were accepted (a duplicate name silently last-wins) and only logged later."""
    with pytest.raises(ValueError) as err:
        parse_nodes_arg(nodes)
    assert needle in str(err.value)
    with pytest.raises(ValueError, match="nodes entry"):
        build_server("127.0.0.1", 0, "fifo", nodes)


def test_a_nodes_entry_may_give_only_a_url_or_only_a_board():
    urls, boards = parse_nodes_arg(" a = tx2 @ http://127.0.0.1:9130/status , b=@https://h/s,c=tx2")
    assert urls == {"a": "http://127.0.0.1:9130/status", "b": "https://h/s"}
    assert boards == {"a": "tx2", "c": "tx2"}


def test_nodes_queued_behind_slow_ones_are_not_called_down_nor_cached(monkeypatch, caplog):
    """With every telemetry worker held by hanging nodes, a fast node is not asked in time:
    its neutral score says so, nothing is logged against it, and the next request asks it
    (it used to get the cached "no answer" for the cache's life)."""
    import time

    from daemon.coordinator import NodeTelemetry, TelemetryClient

    asked = []

    def fake_fetch(self, node, deadline):
        asked.append(node)
        if node.startswith("slow"):
            time.sleep(max(0.0, deadline - time.monotonic()) + 0.05)
            return self._late(node)
        return NodeTelemetry(node, True, speed_factor=1.0, free_cpus=4.0)

    monkeypatch.setattr(TelemetryClient, "_fetch", fake_fetch)
    client = TelemetryClient(timeout_s=0.2, cache_s=60.0, max_workers=2, default_url=_dead_url())
    try:
        caplog.set_level("INFO", logger="hidvfs")
        first = client.fetch_many(["slow1", "slow2", "fast"])
        assert not first["fast"].ok and "not asked within" in first["fast"].reason
        assert not any("node fast" in r.getMessage() for r in caplog.records)
        time.sleep(0.3)  # the slow workers are free again
        second = client.fetch_many(["fast"])
        assert second["fast"].ok
        third = client.fetch_many(["slow1", "slow2", "fast"])  # a cached answer waits for none
        assert third["fast"].ok
    finally:
        client.close()


def test_made_up_node_names_do_not_grow_the_telemetry_memory(monkeypatch):
    import daemon.coordinator as co

    monkeypatch.setattr(co, "MAX_TRACKED", 10)
    monkeypatch.setattr(
        co.TelemetryClient,
        "_fetch",
        lambda self, node, deadline: co.NodeTelemetry(node, False, "x"),
    )
    client = co.TelemetryClient(timeout_s=0.2, cache_s=60.0, default_url=_dead_url())
    try:
        for i in range(50):
            client.fetch(f"made-up-{i}")
        assert len(client._cache) <= 10 and len(client._down) <= 10
    finally:
        client.close()


def test_a_busy_port_is_refused_naming_the_address():
    import socket

    from daemon.coordinator import build_server

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(OSError, match=f"cannot listen on 127.0.0.1:{port}"):
            build_server("127.0.0.1", port, "fifo")


def test_a_node_at_speed_zero_is_filtered_out_and_scores_zero(node_daemon):
    """A node whose daemon reports no core able to run (speed factor 0) cannot finish the
    pod: filter names it, prioritize gives it 0, not a score among the live ones."""
    live, _ = node_daemon({"speed_factor": 1.0, "free_cpus": 4})
    stalled, _ = node_daemon({"speed_factor": 0.0, "free_cpus": 4})
    srv = build_server(
        "127.0.0.1", 0, "heft", f"a=orin-nx@{live},z=orin-nx@{stalled}", default_url=_dead_url()
    )
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{srv.server_address[1]}"
    try:
        code, out = _post(base + "/filter", {"Pod": POD, "NodeNames": ["a", "z"]})
        assert code == 200 and out["NodeNames"] == ["a"] and out["FailedNodes"] == {}
        assert "speed factor 0" in out["FailedAndUnresolvableNodes"]["z"]
        code, out = _post(base + "/prioritize", {"Pod": POD, "NodeNames": ["a", "z"]})
        assert {e["Host"]: e["Score"] for e in out} == {"a": 10, "z": 0}
    finally:
        srv.shutdown()
        srv.server_close()
        srv.coordinator.telemetry.close()


#: what a busy, stalled coordinator host's daemon serves on the default URL
STALLED_HOST = {"speed_factor": 0.0, "free_cpus": 0}


def _filter_split(out: dict) -> tuple[list, dict, dict]:
    """(kept names, FailedNodes, FailedAndUnresolvableNodes) of a filter reply in either
    casing, checking every key has the request's casing."""
    key = {k.lower(): k for k in out}
    kept = out[key["nodenames"]]
    if kept is None:
        kept = [i["metadata"]["name"] for i in out[key["nodes"]]["items"]]
    return kept, out[key["failednodes"]], out[key["failedandunresolvablenodes"]]


def test_a_node_the_coordinator_knows_nothing_about_is_not_failed(node_daemon, caplog):
    """cluster.md 5.1: the scheduler calls the extender after its own filters, so a node it
    sends already fits the pod by its allocatable. A node the coordinator knows nothing of
    (no --nodes entry, no whole Node seen, or a label naming no shipped board) was failed on
    guesses: sized as an orin-nx (8 cores) and read from the default URL, the coordinator
    host's own daemon (here stalled: speed 0, no core free)."""
    caplog.set_level(logging.WARNING, logger="hidvfs.coordinator")
    own, _ = node_daemon({"speed_factor": 1.0, "free_cpus": 8})
    host, _ = node_daemon(STALLED_HOST)
    srv, base = _serve(f"a=orin-nx@{own}", default_url=host)
    twelve = _pod({"cpu": "12", "memory": "20Gi"})  # over an orin-nx's 8 cores and 16 GB
    try:
        for pod in (POD, twelve):
            _, out = _post(base + "/filter", {"Pod": pod, "NodeNames": ["new", "a"]})
            kept, failed, never = _filter_split(out)
            assert "new" in kept and "new" not in failed and "new" not in never, out
        assert never == {"a": "pod requests 12 cores, node board orin-nx 8"}
        # a label naming no shipped board (a cloud instance type) says nothing of the size
        odd = [{"metadata": {"name": "m5", "labels": {"node.kubernetes.io/instance-type": "m5"}}}]
        _, out = _post(base + "/filter", {"pod": twelve, "nodes": {"items": odd}})
        assert _filter_split(out) == (["m5"], {}, {}), out
        # prioritize does not zero what filter kept: the host's daemon is not new's, so new
        # is scored as a node without telemetry (neutral)
        _, out = _post(base + "/prioritize", {"Pod": twelve, "NodeNames": ["new", "a"]})
        assert {e["Host"]: e["Score"] for e in out} == {"new": 5, "a": 0}
        _, out = _post(base + "/prioritize", {"Pod": POD, "NodeNames": ["new", "a"]})
        assert {e["Host"]: e["Score"] for e in out} == {"new": 5, "a": 10}
        assert "node new: board unknown" in caplog.text
        assert "node new has no --nodes URL" in caplog.text
        assert "label node.kubernetes.io/instance-type" in caplog.text
    finally:
        _stop(srv)


def test_a_size_seen_in_a_whole_node_still_fails_it_without_a_board(node_daemon):
    """Known size without a known board: the allocatable of a whole Node is the node's."""
    host, _ = node_daemon(STALLED_HOST)
    # a: a board, no URL; b's URL makes the default one the host's daemon, not a's
    srv, base = _serve(f"a=orin-nx,b=tx2@{_dead_url()}", default_url=host)
    try:
        items = [_node("bare", cpu="2", memory="1Gi", board="")]  # no board label
        _, out = _post(base + "/filter", {"Pod": _pod({"cpu": "3"}), "Nodes": {"items": items}})
        assert _filter_split(out) == ([], {}, {"bare": "pod requests 3 cores, node allocatable 2"})
        _, out = _post(base + "/filter", {"Pod": _pod({"memory": "2Gi"}), "NodeNames": ["bare"]})
        kept, failed, never = _filter_split(out)
        assert kept == [] and failed == {} and "allocatable 1.07374 GB" in never["bare"]
        # a --nodes board without a URL: sized by the board, the host's telemetry not its own
        _, out = _post(base + "/filter", {"Pod": _pod({"cpu": "9"}), "NodeNames": ["a"]})
        assert _filter_split(out) == ([], {}, {"a": "pod requests 9 cores, node board orin-nx 8"})
        _, out = _post(base + "/filter", {"Pod": POD, "NodeNames": ["a"]})
        assert _filter_split(out) == (["a"], {}, {})
    finally:
        _stop(srv)


def test_the_single_board_case_filters_on_the_default_url(node_daemon):
    """No --nodes URL at all: the default URL is the one board's own daemon, read for its
    free cores and speed (and the URL the coordinator was given is the one read)."""
    busy, _ = node_daemon({"speed_factor": 1.0, "free_cpus": 0.5})
    srv, base = _serve(None, default_url=busy)
    try:
        _, out = _post(base + "/filter", {"Pod": POD, "NodeNames": ["only"]})
        assert _filter_split(out) == (
            [],
            {"only": "pod requests 1 cores, telemetry shows 0.50 free"},
            {},
        )
    finally:
        _stop(srv)
    stalled, _ = node_daemon(STALLED_HOST)
    srv, base = _serve("only=tx2", default_url=stalled)  # a board, still no URL anywhere
    try:
        _, out = _post(base + "/filter", {"pod": POD, "nodenames": ["only"]})
        kept, failed, never = _filter_split(out)
        assert kept == [] and failed == {} and "speed factor 0" in never["only"]
    finally:
        _stop(srv)


@pytest.mark.parametrize("lower", [False, True])
@pytest.mark.parametrize("whole", [False, True])
def test_failures_no_eviction_can_fix_are_unresolvable(node_daemon, lower, whole):
    """cluster.md 5.2: FailedAndUnresolvableNodes ("preemption cannot help; takes
    precedence") was always {}: a pod larger than the node in cores or memory, or a node
    at speed 0, went to FailedNodes, where the scheduler may evict pods for nothing. Too
    few cores free now stays in FailedNodes. Both casings; neither map's nodes are kept."""
    free8, _ = node_daemon({"speed_factor": 1.0, "free_cpus": 8})
    free1, _ = node_daemon({"speed_factor": 1.0, "free_cpus": 1})
    stalled, _ = node_daemon({"speed_factor": 0.0, "free_cpus": 8})
    srv, base = _serve(
        f"ok=orin-nx@{free8},busy=orin-nx@{free1},stalled=orin-nx@{stalled},small=tx2@{free1}",
        default_url=_dead_url(),
    )
    names = ["ok", "busy", "stalled", "small"]
    pods = {  # pod -> nodes failed (resolvable, unresolvable)
        "cpu": (_pod({"cpu": "6"}), {"busy"}, {"stalled", "small"}),
        "mem": (_pod({"cpu": "2", "memory": "12Gi"}), {"busy"}, {"stalled", "small"}),
    }
    try:
        for what, (pod, resolvable, unresolvable) in pods.items():
            if whole:
                body = {"Pod": pod, "Nodes": {"items": [_node(n, board="") for n in names]}}
            else:
                body = {"Pod": pod, "NodeNames": names}
            if lower:
                body = {k.lower(): v for k, v in body.items()}
            _, out = _post(base + "/filter", body)
            assert all(k.islower() == lower for k in out), out
            kept, failed, never = _filter_split(out)
            assert set(failed) == resolvable and set(never) == unresolvable, (what, out)
            assert kept == [n for n in names if n not in resolvable | unresolvable]
            assert out["error" if lower else "Error"] == ""
        # small has too little memory and too few cores free: the failure no eviction fixes
        # is the one given
        assert never["small"] == "pod requests 12.8849 GB memory, node board tx2 8 GB"
        assert "speed factor 0" in never["stalled"]
    finally:
        _stop(srv)


def test_filter_reply_splits_unresolvable_reasons():
    from daemon.extender import Unresolvable, filter_reply, parse_args

    for lower in (False, True):
        body = {"Pod": POD, "NodeNames": ["a", "b", "c"]}
        if lower:
            body = {k.lower(): v for k, v in body.items()}
        args = parse_args(json.dumps(body).encode())
        out = filter_reply(args, {"a": "busy", "b": Unresolvable("too small")})
        assert _filter_split(out) == (["c"], {"a": "busy"}, {"b": "too small"})
        assert json.loads(json.dumps(out)) == out


def test_a_saturated_node_has_no_free_cores_and_is_not_an_idle_one(node_daemon):
    """Every online core at util 1.0 (what `daemon --sim orin-nx --load 3` serves while jobs
    run) is 0 free cores; 0 was read as "unknown", so the node was kept by filter and scored
    10 by prioritize, as an idle one. A status without util still means unknown."""
    assert parse_status("n", _orin_status(1984000, 1.0)).free_cpus == 0.0
    assert parse_status("n", _orin_status(1984000, 0.5)).free_cpus == pytest.approx(4.0)
    no_util = _orin_status(1984000, 0.0)
    for c in no_util["clusters"]:
        del c["util"]
    assert parse_status("n", no_util).free_cpus is None
    busy, _ = node_daemon(_orin_status(1984000, 1.0))
    idle, _ = node_daemon(_orin_status(115200, 0.0))
    srv, base = _serve(f"busy=orin-nx@{busy},idle=orin-nx@{idle}")
    try:
        code, out = _post(base + "/filter", {"Pod": POD, "NodeNames": ["busy", "idle"]})
        assert code == 200 and out["NodeNames"] == ["idle"] and "busy" in out["FailedNodes"]
        _, out = _post(base + "/prioritize", {"Pod": POD, "NodeNames": ["busy", "idle"]})
        scores = {e["Host"]: e["Score"] for e in out}
        assert scores["idle"] == 10 and scores["busy"] < scores["idle"]
    finally:
        _stop(srv)


def test_drain_waits_for_the_requests_being_answered():
    """A stop waits (bounded) for a pod being scored instead of closing its connection: the
    scheduler got RemoteDisconnected for a prioritize that waited on a slow node."""
    from http.server import BaseHTTPRequestHandler

    asked, release = threading.Event(), threading.Event()

    class SlowNode(BaseHTTPRequestHandler):
        def do_GET(self):
            asked.set()
            release.wait(10)
            body = json.dumps({"speed_factor": 1.0, "free_cpus": 8}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    node = ThreadingHTTPServer(("127.0.0.1", 0), SlowNode)
    threading.Thread(target=node.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{node.server_address[1]}/status"
    srv, base = _serve(f"a=orin-nx@{url}", timeout_s=5.0)
    answer = {}
    asker = threading.Thread(
        target=lambda: answer.update(
            zip(("code", "body"), _post(base + "/prioritize", {"Pod": POD, "NodeNames": ["a"]}))
        )
    )
    try:
        asker.start()
        assert asked.wait(10)
        srv.shutdown()  # no new connection from here
        assert srv.drain(0.1) == 1  # still waiting on the node: not answered yet
        threading.Timer(0.2, release.set).start()
        assert srv.drain(5.0) == 0
        asker.join(5)
        assert answer["code"] == 200 and [e["Host"] for e in answer["body"]] == ["a"]
    finally:
        release.set()
        srv.server_close()
        srv.coordinator.telemetry.close()
        node.shutdown()
        node.server_close()


def test_scores_keep_the_policy_s_scale_across_nodes():
    """The 1..10 map spanned the worst and the best node however close they were: a node
    1 % slower scored 1, below the neutral 5 of a node whose daemon is down."""
    import numpy as np

    inf = np.inf
    # heft: minus the finish time; a node at 1.1x the best finish is 9, at 2.5x is 4
    assert scale_scores(np.array([-100.0, -110.0, -250.0, -inf]), "cost").tolist() == [
        10, 9, 4, 0,
    ]  # fmt: skip
    assert scale_scores(np.array([2.0, 1.8, 0.6]), "ratio").tolist() == [10, 9, 3]
    assert scale_scores(np.array([0.0, -np.log(2.0), -10.0]), "logit").tolist() == [10, 5, 1]
    # scores the kind does not fit (a "ratio" that is not positive): worst 1, best 10
    assert scale_scores(np.array([1.0, -1.0]), "ratio").tolist() == [10, 1]
    assert scale_scores(np.array([-3.0, -3.0]), "spread").tolist() == [10, 10]


@pytest.mark.parametrize("policy", ["heft", "fifo", "sjf", "cp", "tetris", "random", "higfrl"])
def test_every_policy_names_a_scale_its_scores_fit(policy):
    from daemon.coordinator import _make_placer

    kind = _make_placer(policy).score_kind
    assert kind in ("cost", "ratio", "logit")


def test_a_node_a_little_slower_ranks_above_one_without_telemetry(node_daemon):
    fast, _ = node_daemon({"speed_factor": 1.0, "free_cpus": 8})
    near, _ = node_daemon({"speed_factor": 0.9, "free_cpus": 8})
    slow, _ = node_daemon({"speed_factor": 0.4, "free_cpus": 8})
    spec = f"fast=orin-nx@{fast},near=orin-nx@{near},slow=orin-nx@{slow},down=orin-nx@{_dead_url()}"
    srv, base = _serve(spec)
    try:
        _, out = _post(
            base + "/prioritize", {"Pod": POD, "NodeNames": ["fast", "near", "slow", "down"]}
        )
        scores = {e["Host"]: e["Score"] for e in out}
        assert scores == {"fast": 10, "near": 9, "slow": 4, "down": 5}
    finally:
        _stop(srv)
