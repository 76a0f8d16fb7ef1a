"""Telemetry JSON endpoint: status over loopback, bearer token, refusal to bind remote openly."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from daemon.telemetry import TelemetryServer

STATUS = {
    "board": "orin-nx",
    "policy": "hidvfs",
    "freq_khz": {"a78ae_0": 1984000},
    "jobs_running": 1,
}


def get(srv, path="/status", token=None):
    host, port = srv.address
    req = urllib.request.Request(f"http://{host}:{port}{path}")
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(req, timeout=5) as r:
        return r.status, r.headers.get("Content-Type"), json.loads(r.read())


def test_status_on_loopback_without_token():
    with TelemetryServer("127.0.0.1:0", lambda: STATUS) as srv:
        status, ctype, body = get(srv)
        assert status == 200 and ctype == "application/json" and body == STATUS
        assert get(srv, "/healthz")[2] == {"ok": True}
        with pytest.raises(urllib.error.HTTPError) as exc:
            get(srv, "/other")
        assert exc.value.code == 404


def test_token_is_required_once_set():
    with TelemetryServer("127.0.0.1:0", lambda: STATUS, token="s3cret") as srv:
        for bad in (None, "wrong", ""):
            with pytest.raises(urllib.error.HTTPError) as exc:
                get(srv, token=bad)
            assert exc.value.code == 401
            assert exc.value.headers.get("WWW-Authenticate", "").startswith("Bearer")
        assert get(srv, token="s3cret")[2] == STATUS


@pytest.mark.parametrize("listen", ["0.0.0.0:0", "10.0.0.5:9467", "board.local:9467", "[::]:0"])
def test_non_loopback_without_token_is_refused(listen):
    with pytest.raises(ValueError, match="without a token"):
        TelemetryServer(listen, lambda: STATUS)


def test_non_loopback_with_token_serves():
    with TelemetryServer("0.0.0.0:0", lambda: STATUS, token="t") as srv:
        _, port = srv.address
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/status", headers={"Authorization": "Bearer t"}
        )
        with urllib.request.urlopen(req, timeout=5) as r:
            assert json.loads(r.read()) == STATUS


def test_status_is_fresh_on_every_request():
    counter = {"n": 0}

    def provider():
        counter["n"] += 1
        return {"ticks": counter["n"]}

    with TelemetryServer("127.0.0.1:0", provider) as srv:
        assert get(srv)[2] == {"ticks": 1}
        assert get(srv)[2] == {"ticks": 2}


def test_idle_connections_cannot_keep_the_coordinator_out(monkeypatch):
    """40 connections that never send a byte took every slot before the token check, and the
    coordinator's status fetch was closed unanswered; the oldest of them now gives way."""
    import socket

    from daemon import metrics

    monkeypatch.setattr(metrics, "HTTP_HEAD_TIMEOUT_S", 60.0)  # the drop lets it in, not this
    with TelemetryServer("127.0.0.1:0", lambda: STATUS, token="s3cret") as srv:
        idle = [socket.create_connection(srv.address, timeout=5) for _ in range(40)]
        try:
            assert get(srv, token="s3cret")[2] == STATUS
            with pytest.raises(urllib.error.HTTPError) as exc:
                get(srv)
            assert exc.value.code == 401
        finally:
            for s in idle:
                s.close()
