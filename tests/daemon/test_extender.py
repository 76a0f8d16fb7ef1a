"""The scheduler extender over real HTTP on 127.0.0.1, with fake node daemons."""

from __future__ import annotations

import json
import logging
import socket
import threading
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


def _dead_url() -> str:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/status"


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
    }
    srv = build_server("127.0.0.1", 0, "heft", nodes, timeout_s=0.3)
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
        extender + "/filter", {"Pod": big, "NodeNames": ["orin-a", "orin-hot", "tx2-dead"]}
    )
    assert code == 200 and out["Error"] == ""
    assert out["NodeNames"] == [
        "orin-a",
        "tx2-dead",
    ]  # hot node has 4 cores free; dead node fails open
    assert "orin-hot" in out["FailedNodes"] and "cores" in out["FailedNodes"]["orin-hot"]
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
    assert "allocatable" in out["failednodes"]["tx2-dead"]


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
    srv = build_server("127.0.0.1", 0, "higfrl", f"a=orin-nx@{url},b=tx2@{url}")
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


def test_bearer_token_only_for_remote_hosts(node_daemon):
    url, srv = node_daemon({"speed_factor": 0.5})
    client = TelemetryClient({"n": url}, token="s3cret")
    assert client.fetch("n").speed_factor == 0.5
    assert srv.auth == [None]  # loopback: no token sent
    local = TelemetryClient({"n": url.replace("127.0.0.1", "localhost")}, token="s3cret")
    local.fetch("n")
    assert srv.auth[-1] is None
    remote = TelemetryClient({"board": "http://10.0.0.5:9130/status"}, token="s3cret")
    assert remote.request("board").get_header("Authorization") == "Bearer s3cret"
    assert (
        TelemetryClient(token="s3cret").request("x").get_header("Authorization") is None
    )  # default is localhost
    for c in (client, local, remote):
        c.close()


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
        and t.speed_factor == pytest.approx(2 * 1000 * 1 / (2 * 2000 * 2))
        and t.free_cpus == pytest.approx(0.5)
    )
    assert not parse_status("n", [1, 2]).ok
    assert parse_cpu("250m") == 0.25 and parse_cpu(2) == 2.0
    assert parse_mem_gb("1Gi") == pytest.approx(1.073741824) and parse_mem_gb("500M") == 0.5
    assert parse_nodes_arg("a=tx2@http://x:1/s,b=orin-nx") == (
        {"a": "http://x:1/s"},
        {"a": "tx2", "b": "orin-nx"},
    )
    import numpy as np

    assert scale_scores(np.array([-np.inf, 1.0, 3.0])).tolist() == [0, 1, 10]
    assert isinstance(Coordinator("fifo", TelemetryClient()).status(), dict)
