"""The registry under a burst of clients, and requests nested past Python's recursion limit."""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import tempfile
import threading
import time

import pytest

from daemon.client import DaemonBusy, DaemonUnreachable, RegistryClient
from daemon.jobs import JobTable
from daemon.registry import JobRegistry, RequestError, parse_request
from daemon.registryserver import RegistryServer


@pytest.fixture
def sock_path():
    """A short path (AF_UNIX allows 107 bytes; pytest's folders can be longer), removed after."""
    d = tempfile.mkdtemp(prefix="hv31", dir="/tmp")
    yield os.path.join(d, "s.sock")
    shutil.rmtree(d, ignore_errors=True)


def _fill(path: str) -> list[socket.socket]:
    """Connect until the listener's accept queue is full (a non-blocking connect says EAGAIN)."""
    held = []
    while True:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.setblocking(False)
        try:
            s.connect(path)
        except BlockingIOError:
            s.close()
            return held
        held.append(s)
        assert len(held) < 100_000


def test_a_full_accept_queue_waits_instead_of_failing(sock_path):
    """A client with a timeout connected non-blocking: a full queue failed the request at
    once ("Resource temporarily unavailable") and `hidvfs run` killed its command."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(sock_path)
    listener.listen(0)
    held = _fill(sock_path)
    answered = []

    def serve_late():
        time.sleep(0.3)
        listener.settimeout(3.0)
        for _ in range(len(held) + 1):
            conn, _ = listener.accept()
            conn.settimeout(3.0)
            if conn.recv(1 << 16):  # the filler sockets send nothing: only the client does
                conn.sendall(b'{"ok": true, "status": {"board": "tx2"}, "jobs": []}\n')
                answered.append(conn)
            for s in held:
                s.close()
            held.clear()

    t = threading.Thread(target=serve_late)
    for s in held:
        s.shutdown(socket.SHUT_WR)  # their accept returns them with EOF ready
    t.start()
    try:
        assert RegistryClient(sock_path, timeout=3.0).status()["board"] == "tx2"
    finally:
        t.join(timeout=5.0)
        listener.close()
        for s in held + answered:
            s.close()


def test_a_queue_that_stays_full_is_busy_not_unreachable(sock_path):
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(sock_path)
    listener.listen(0)
    held = _fill(sock_path)
    try:
        t0 = time.monotonic()
        with pytest.raises(DaemonBusy) as err:
            RegistryClient(sock_path, timeout=0.3).status()
        assert time.monotonic() - t0 >= 0.29  # retried until the timeout
        assert isinstance(err.value, DaemonUnreachable)  # callers handle it as before
        msg = str(err.value)
        assert "busy" in msg and "Resource temporarily unavailable" not in msg
    finally:
        listener.close()
        for s in held:
            s.close()


def test_the_daemon_listens_with_the_systems_backlog(sock_path):
    """listen(32): the 33rd client of a burst got EAGAIN while the daemon was busy."""
    reg = JobRegistry(JobTable(), now=time.monotonic, alive=lambda pid: True)
    srv = RegistryServer(reg, sock_path, group=None)
    sock = srv._bind()  # listening, not accepting: every client waits in the queue
    held = []
    try:
        for _ in range(100):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.setblocking(False)
            s.connect(sock_path)  # EAGAIN past the backlog
            held.append(s)
    finally:
        for s in held:
            s.close()
        sock.close()


def test_deeply_nested_json_is_malformed_not_an_internal_error(caplog):
    with pytest.raises(RequestError, match="malformed JSON"):
        parse_request(b"[" * 60000)
    reg = JobRegistry(JobTable(), now=time.monotonic, alive=lambda pid: True)
    with caplog.at_level(logging.DEBUG, logger="hidvfs.registry"):
        answer = reg.handle_line(b'{"op": ' + b"[" * 60000 + b"\n")
    assert answer["ok"] is False
    assert answer["error"].startswith("malformed JSON") and "internal" not in answer["error"]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    json.dumps(answer)  # one plain line goes back
