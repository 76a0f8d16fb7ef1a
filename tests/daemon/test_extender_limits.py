"""The extender's HTTP server against slow, idle and greedy clients: the bounds it shares with
the metrics endpoint (daemon.httpbounds) and its own on request bodies."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest

import daemon.extender as ext
from daemon.extender import Verbs, make_server

POD = {"metadata": {"name": "p"}, "spec": {"containers": []}}


class _Gate:
    """A filter verb that holds its callers until released (their slots are being answered)."""

    def __init__(self):
        self.release = threading.Event()
        self.entered = threading.Semaphore(0)

    def __call__(self, args):
        self.entered.release()
        self.release.wait(10)
        return {}


@pytest.fixture
def serve():
    """Start the extender with trivial verbs (``filter=`` overrides); yields a factory."""
    started = []

    def start(filter=lambda args: {}):  # noqa: A002 - the verb's name
        verbs = Verbs(filter=filter, prioritize=lambda args: {n.name: 5 for n in args.nodes})
        srv = make_server("127.0.0.1", 0, verbs)
        threading.Thread(
            target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()
        started.append(srv)
        return srv

    yield start
    for srv in started:
        srv.shutdown()
        srv.server_close()


def _connect(srv, data: bytes = b"", source: str = "127.0.0.1") -> socket.socket:
    s = socket.create_connection(srv.server_address[:2], timeout=5, source_address=(source, 0))
    if data:
        s.sendall(data)
    return s


def _request(path: str, body: bytes, extra: bytes = b"") -> bytes:
    return (
        b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n%s\r\n" % (path.encode(), len(body), extra)
    ) + body


def _answer(s: socket.socket) -> tuple[int, dict[str, str], object]:
    """Read to the server's close: (status, headers with lower-case names, JSON body)."""
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
    return int(lines[0].split()[1]), headers, json.loads(body)


def _exchange(srv, data: bytes, source: str = "127.0.0.1"):
    with _connect(srv, source=source) as s:
        s.sendall(data)
        return _answer(s)


def _filter(srv, names=("a", "b"), source: str = "127.0.0.1", pad: int = 0):
    body = json.dumps({"Pod": POD, "NodeNames": list(names)}).encode() + b" " * pad
    return _exchange(srv, _request("/filter", body), source)


def _is_open(s: socket.socket) -> bool:
    """True while the server has not closed ``s`` (nothing is ever sent to these)."""
    s.setblocking(False)
    try:
        return s.recv(1) != b""
    except BlockingIOError:
        return True
    except OSError:  # reset
        return False
    finally:
        s.settimeout(5)


def _wait_until(cond, what: str, limit: float = 4.0) -> None:
    end = time.monotonic() + limit
    while not cond():
        if time.monotonic() > end:
            pytest.fail(f"still not {what} after {limit} s")
        time.sleep(0.02)


def _handler_threads() -> int:
    return sum("process_request_thread" in t.name for t in threading.enumerate())


@pytest.mark.parametrize("flood_from", ["127.0.0.1", "others"])
def test_idle_and_slow_clients_past_the_caps_do_not_keep_a_filter_out(
    serve, monkeypatch, flood_from
):
    """Hundreds of idle sockets and clients stuck in their head or body held a thread each
    for as long as they liked. Past the caps the oldest unfinished one is dropped for a new
    connection, so a real filter is answered (the long head deadline here shows that the drop,
    not the deadline, lets it in), and the server's threads stay bounded. ``127.0.0.1``: the
    flood comes from the scheduler's own address (the loopback setup of the docs)."""
    monkeypatch.setattr(ext, "HEAD_TIMEOUT_S", 60.0)
    monkeypatch.setattr(ext, "HANDLER_TIMEOUT_S", 60.0)
    srv = serve()

    def source(i):
        return "127.0.0.1" if flood_from == "127.0.0.1" else f"127.0.0.{2 + i % 5}"

    stuck_body = _request("/filter", b"x" * 1000)[:-900]  # head whole, body a tenth
    flood = [_connect(srv, stuck_body, source(i)) for i in range(10)]
    flood += [_connect(srv, b"POST /filter HTTP/1.1\r\n", source(i)) for i in range(10)]
    flood += [_connect(srv, b"", source(i)) for i in range(ext.MAX_CONNECTIONS + 20)]
    try:
        for _ in range(3):
            code, _, out = _filter(srv)
            assert code == 200 and out["NodeNames"] == ["a", "b"]
        cap = ext.MAX_PER_PEER if flood_from == "127.0.0.1" else ext.MAX_CONNECTIONS
        _wait_until(lambda: sum(map(_is_open, flood)) <= cap, f"down to {cap} flooding sockets")
        assert _handler_threads() <= 2 * ext.MAX_CONNECTIONS
    finally:
        for s in flood:
            s.close()


def test_a_trickled_head_is_cut_at_the_head_deadline(serve, monkeypatch):
    """A head sent a byte every 0.1 s (a timeout per recv never fires) is closed unanswered
    once the deadline for the whole head has passed."""
    monkeypatch.setattr(ext, "HEAD_TIMEOUT_S", 0.5)
    srv = serve()
    s = _connect(srv, b"POST /filter HTTP/1.1\r\n")
    stop = threading.Event()

    def drip():
        while not stop.wait(0.1):
            try:
                s.sendall(b"X")
            except OSError:
                return

    t = threading.Thread(target=drip, daemon=True)
    t.start()
    try:
        s.settimeout(5)
        try:
            assert s.recv(4096) == b""  # closed, no answer
        except ConnectionResetError:
            pass
        except TimeoutError:
            pytest.fail("the trickled head was still held after 5 s")
    finally:
        stop.set()
        t.join(2)
        s.close()
    assert _filter(srv)[0] == 200


def test_a_trickled_body_gets_400_at_the_body_deadline(serve, monkeypatch):
    """The body has one deadline in all (HANDLER_TIMEOUT_S + size / BODY_MIN_RATE), not one
    per recv: dripped, it is answered 400 naming the cause."""
    monkeypatch.setattr(ext, "HANDLER_TIMEOUT_S", 0.4)
    srv = serve()
    body = json.dumps({"Pod": POD, "NodeNames": ["a"]}).encode()
    s = _connect(srv, _request("/filter", body)[: -len(body)])
    stop = threading.Event()

    def drip():
        for b in body:
            if stop.wait(0.1):
                return
            try:
                s.sendall(bytes([b]))
            except OSError:
                return

    t = threading.Thread(target=drip, daemon=True)
    t.start()
    try:
        code, _, out = _answer(s)
        assert code == 400 and "shorter than Content-Length" in out["Error"]
    finally:
        stop.set()
        t.join(2)
        s.close()


def test_an_oversized_head_gets_431_or_414_as_json(serve, monkeypatch):
    monkeypatch.setattr(ext, "MAX_HEAD_BYTES", 1024)
    srv = serve()
    start = b"POST /filter HTTP/1.1\r\nX-Pad: "
    code, _, out = _exchange(srv, start + b"a" * (1024 - len(start)))
    assert code == 431 and "Error" in out
    code, _, out = _exchange(srv, b"POST /" + b"a" * 1019)
    assert code == 414 and "Error" in out
    code, _, out = _exchange(srv, b"PUT /filter HTTP/1.1\r\nContent-Length: 0\r\n\r\n")
    assert code == 501 and "PUT" in out["Error"]  # http.server's own errors are JSON too
    fits = _request("/filter", json.dumps({"Pod": POD, "NodeNames": ["a"]}).encode())
    assert len(fits) < 1024
    assert _exchange(srv, fits)[0] == 200


def test_a_body_past_max_body_is_answered_not_reset(serve, monkeypatch):
    """Answered before its body is read: the body is discarded before the close (closing on
    unread bytes resets the connection, and the client may never read its 400)."""
    monkeypatch.setattr(ext, "MAX_BODY", 64 << 10)
    srv = serve()
    body = b" " * (16 << 20)  # more than the socket buffers take: the server must read it
    code, _, out = _exchange(srv, _request("/filter", body))
    assert code == 400 and "expected 0..65536" in out["Error"]
    code, _, out = _exchange(srv, _request("/bind", body))
    assert code == 404 and "unknown verb" in out["Error"]


def test_bodies_past_the_budget_get_503_json_with_retry_after(serve, monkeypatch):
    """Clients holding large bodies half sent took memory without bound (40 of 8 MiB: 340 MB).
    A body that would take the bodies held at once past BODY_BUDGET is answered 503 with
    Retry-After and JSON, never a dropped socket; a small body (NodeNames) is not counted, so
    it is still served; once the budget is free again, a large one is too."""
    monkeypatch.setattr(ext, "BODY_BUDGET", 2 << 20)
    monkeypatch.setattr(ext, "SMALL_BODY", 16 << 10)
    srv = serve()
    big = 1 << 20
    holders = [_connect(srv, _request("/filter", b" " * big)[: -big // 2]) for _ in range(2)]
    try:
        _wait_until(lambda: srv.body_bytes == 2 * big, "holding the whole budget")
        code, headers, out = _filter(srv, pad=big)
        assert code == 503 and "busy" in out["Error"]
        assert headers["content-type"] == "application/json"
        assert int(headers["retry-after"]) >= 1
        code, _, out = _filter(srv)  # small: not counted
        assert code == 200 and out["NodeNames"] == ["a", "b"]
    finally:
        for s in holders:
            s.close()
    _wait_until(lambda: srv.body_bytes == 0, "budget released")
    code, _, out = _filter(srv, pad=big)
    assert code == 200 and out["NodeNames"] == ["a", "b"]


def test_a_connection_past_the_cap_while_every_slot_is_answering_gets_503(serve, monkeypatch):
    """With every slot answering (none to drop), a new connection gets a JSON 503, not a bare
    close; the requests in progress are answered."""
    monkeypatch.setattr(ext, "MAX_CONNECTIONS", 2)
    gate = _Gate()
    srv = serve(filter=gate)
    body = json.dumps({"Pod": POD, "NodeNames": ["a"]}).encode()
    busy = [_connect(srv, _request("/filter", body)) for _ in range(2)]
    try:
        for _ in busy:
            assert gate.entered.acquire(timeout=5), "a filter never reached the verb"
        with _connect(srv) as extra:
            code, headers, out = _answer(extra)
        assert code == 503 and "busy" in out["Error"] and "retry-after" in headers
        gate.release.set()
        for s in busy:
            code, _, out = _answer(s)
            assert code == 200 and out["NodeNames"] == ["a"]
    finally:
        gate.release.set()
        for s in busy:
            s.close()
    # a handler gives its slot back when its thread ends, a moment after its answer
    end = time.monotonic() + 5
    while (code := _filter(srv)[0]) == 503 and time.monotonic() < end:
        time.sleep(0.05)
    assert code == 200
