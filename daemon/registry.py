"""The job registry: a Unix-socket server speaking newline-delimited JSON.

Requests (one JSON object per line)::

    {"op": "register", "pid": 1234, "deadline_s": 5.0, "criticality": "hi", "name": "fft"}
    {"op": "unregister", "pid": 1234}
    {"op": "status"}

``"adopter": true`` in a register says the job's parent is a child subreaper (``hidvfs run``):
what the job leaves behind (a helper that double-forks) stays below that parent, and the daemon
counts it as the job's when it gives the originals back. Taken only for a parent the client
may speak for, never init or the daemon.

Answers are one line each: ``{"ok": true, ...}`` or ``{"ok": false, "error": "..."}``. A
register answer may carry ``"warning": "..."``: the job is registered, but its reference
profile says no operating point of the board can meet its deadline (``deadline_check``). Every
malformed request (bad UTF-8 or JSON, unknown op or field, missing or mistyped field, a pid
that does not exist, a line over 64 KiB (skipped up to its newline), a client hanging up
mid-line) gets an error answer and never stops the server. Registered jobs land in the daemon's :class:`~daemon.jobs.JobTable`,
which the control loop reads every tick.

The server is one ``selectors`` thread: requests are tiny and handled inline, so a slow or
silent client costs a file descriptor, not a thread. The socket is mode 0660 and group
``hidvfs`` when that group exists (otherwise root-only); a client that is not root may only
register its own processes (checked with SO_PEERCRED when the daemon supplies ``pid_owner``).
"""

from __future__ import annotations

import contextlib
import difflib
import errno
import grp
import json
import logging
import math
import os
import selectors
import socket
import stat
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agents.deadlines import MAX_NAME  # the names profiles are stored under
from daemon.jobs import JobEntry, JobTable
from daemon.logs import log_event
from platforms.errors import HidvfsError
from platforms.observation import JobProfile

MAX_LINE = 64 * 1024
#: a client that never reads its answers is dropped once this much output is queued
MAX_OUTPUT = 1024 * 1024
#: slots root always has beyond ``max_clients`` (the administrator's `hidvfs status`)
ROOT_RESERVE = 8
#: refused connections waiting for their answer to be read; past it, new ones are closed
MAX_DRAINING = 16
#: a refused connection gets this long to read its answer and hang up
DRAIN_TIMEOUT_S = 2.0
#: after an accept fails (out of descriptors), the listen socket is left alone this long
ACCEPT_PAUSE_S = 1.0
OPS = ("register", "unregister", "status")
FIELDS = {
    "register": ("op", "pid", "deadline_s", "criticality", "name", "adopter"),
    "unregister": ("op", "pid"),
    "status": ("op",),
}

log = logging.getLogger("hidvfs.registry")


class RequestError(ValueError):
    """A request the registry refuses; the message is sent back to the client."""


class RegistryStartError(HidvfsError):
    """The socket could not be set up (names the path and the cause)."""


# --------------------------------------------------------------------------------------------
# Request validation (pure)


def _field_hint(name: str, allowed: tuple[str, ...]) -> str:
    close = difflib.get_close_matches(name, allowed, n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def parse_request(line: bytes) -> dict[str, Any]:
    """Decode and validate one request line; RequestError names what is wrong."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        raise RequestError("request is not valid UTF-8") from None
    try:
        req = json.loads(text)
    except json.JSONDecodeError as err:
        raise RequestError(f"malformed JSON: {err.msg} at column {err.colno}") from None
    except RecursionError:  # '[' * 60000: no request nests; not an internal error either
        raise RequestError("malformed JSON: nested too deeply") from None
    if not isinstance(req, dict):
        raise RequestError(f"a request must be a JSON object, got {type(req).__name__}")
    if "op" not in req:
        raise RequestError(f"missing field 'op' (one of {', '.join(OPS)})")
    op = req["op"]
    if not isinstance(op, str) or op not in OPS:
        raise RequestError(
            f"unknown op {op!r}{_field_hint(str(op), OPS)}; known ops: {', '.join(OPS)}"
        )
    allowed = FIELDS[op]
    for key in req:
        if key not in allowed:
            raise RequestError(
                f"unknown field {key!r} for op '{op}'{_field_hint(key, allowed)}; allowed: {', '.join(allowed)}"
            )
    out: dict[str, Any] = {"op": op}
    if op in ("register", "unregister"):
        if "pid" not in req:
            raise RequestError(f"missing field 'pid' (a positive integer) for op '{op}'")
        pid = req["pid"]
        if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
            raise RequestError(f"field 'pid' must be a positive integer, got {pid!r}")
        out["pid"] = pid
    if op == "register":
        deadline = req.get("deadline_s")
        if deadline is not None:
            if isinstance(deadline, bool) or not isinstance(deadline, (int, float)):
                raise RequestError(
                    f"field 'deadline_s' must be a number of seconds > 0 or null, got {deadline!r}"
                )
            if not math.isfinite(deadline) or deadline <= 0:
                raise RequestError(
                    f"field 'deadline_s' must be a number of seconds > 0 or null, got {deadline!r}"
                )
            deadline = float(deadline)
        crit = req.get("criticality", "lo")
        if crit not in ("hi", "lo"):
            raise RequestError(f"field 'criticality' must be 'hi' or 'lo', got {crit!r}")
        name = req.get("name", "")
        if (
            not isinstance(name, str)
            or len(name) > MAX_NAME
            or not name.isprintable()
            or name.strip() != name  # " fib" would never find the profile "fib"
        ):
            raise RequestError(
                f"field 'name' must be a printable string of at most {MAX_NAME} characters, "
                f"without leading or trailing spaces, got {name!r:.60}"
            )
        adopter = req.get("adopter", False)
        if not isinstance(adopter, bool):
            raise RequestError(f"field 'adopter' must be true or false, got {adopter!r:.60}")
        out.update(
            deadline_s=deadline, criticality=crit, name=name or f"pid{out['pid']}", adopter=adopter
        )
    return out


def job_to_json(entry: JobEntry, now: float | None = None) -> dict[str, Any]:
    d = {
        "pid": entry.pid,
        "name": entry.name,
        "criticality": entry.criticality,
        "deadline_s": entry.deadline_s,
        "release_t": entry.release_t,
        # the reference profile the gate and the shield plan with (None: no profile)
        "profile_version": entry.profile.version if entry.profile else None,
    }
    if now is not None:
        d["elapsed_s"] = round(now - entry.release_t, 6)
    return d


# --------------------------------------------------------------------------------------------
# The registry (transport-free)


class JobRegistry:
    """Validates and records jobs into the daemon's JobTable; thread-safe.

    Collaborators are injected: ``now`` (the platform clock), ``alive(pid)`` (process control),
    ``status_provider()`` (the daemon's status dict), ``pid_owner(pid) -> uid`` (to stop a
    non-root client from registering someone else's process), ``profile_for(name)`` (a job
    profile lookup) and ``deadline_check(profile, deadline_s)`` (why no operating point of the
    board can meet the deadline, None when one may: :class:`daemon.profiles.DeadlineCheck`;
    the job is registered all the same, with the reason as its warning).
    """

    def __init__(
        self,
        table: JobTable | None = None,
        *,
        now: Callable[[], float],
        alive: Callable[[int], bool],
        status_provider: Callable[[], dict] | None = None,
        pid_owner: Callable[[int], int | None] | None = None,
        profile_for: Callable[[str], JobProfile | None] | None = None,
        max_jobs: int = 1024,
        unmanageable: Callable[[int], str | None] | None = None,
        start_time: Callable[[int], float | None] | None = None,
        parent_of: Callable[[int], int | None] | None = None,
        deadline_check: Callable[[JobProfile, float], str | None] | None = None,
    ):
        self.table = table if table is not None else JobTable()
        self.now = now
        self.alive = alive
        self.status_provider = status_provider
        self.pid_owner = pid_owner
        self.profile_for = profile_for
        self.max_jobs = max_jobs
        self.unmanageable = unmanageable
        self.start_time = start_time
        self.parent_of = parent_of
        self.deadline_check = deadline_check
        self._lock = threading.Lock()  # makes check-then-insert atomic

    def register(
        self,
        pid: int,
        deadline_s: float | None = None,
        criticality: str = "lo",
        name: str = "",
        *,
        peer_uid: int | None = None,
        adopter: bool = False,
    ) -> JobEntry:
        why = self.unmanageable(pid) if self.unmanageable is not None else None
        if why is not None:
            raise RequestError(f"pid {pid} cannot be a job: {why}")
        if not self.alive(pid):
            raise RequestError(f"pid {pid} does not exist")
        if peer_uid not in (None, 0) and self.pid_owner is not None:
            owner = self.pid_owner(pid)
            if owner is not None and owner != peer_uid:
                raise RequestError(
                    f"pid {pid} belongs to uid {owner}; a client with uid {peer_uid} may only register its own processes"
                )
        name = name or f"pid{pid}"
        # (not `if self.profile_for`: an empty store is falsy, and profiles added to it later
        # must still be found)
        profile = self.profile_for(name) if self.profile_for is not None else None
        warning = self._check_deadline(profile, deadline_s)
        with self._lock:
            if self.table.get(pid) is not None:
                raise RequestError(f"pid {pid} is already registered (unregister it first)")
            if len(self.table) >= self.max_jobs:
                raise RequestError(f"too many registered jobs (limit {self.max_jobs})")
            entry = JobEntry(
                pid=pid,
                name=name,
                release_t=self.now(),
                deadline_s=deadline_s,
                criticality=criticality,
                profile=profile,
                registrant_uid=peer_uid,
                start_time=self.start_time(pid) if self.start_time is not None else None,
                adopter=self._adopter(pid, peer_uid) if adopter else None,
                warning=warning,
            )
            try:
                self.table.register(entry)
            except ValueError as err:
                raise RequestError(str(err)) from None
        log.info(
            "event=job_registered pid=%d name=%s criticality=%s deadline_s=%s profile=%s",
            pid,
            name,
            criticality,
            deadline_s,
            f"v{profile.version}" if profile else "none",
        )
        if warning is not None:
            log_event(
                log,
                "job_deadline_infeasible",
                level=logging.WARNING,
                pid=pid,
                name=name,
                criticality=criticality,
                deadline_s=deadline_s,
                detail=warning,
            )
        return entry

    def _check_deadline(self, profile: JobProfile | None, deadline_s: float | None) -> str | None:
        """Why the gate can plan no operating point for the deadline (None: one may, or nothing to tell
        without a profile or a deadline). A failing check costs the warning, not the job."""
        if self.deadline_check is None or profile is None or deadline_s is None:
            return None
        try:
            return self.deadline_check(profile, deadline_s)
        except Exception:  # noqa: BLE001 - a warning must never refuse a job
            log.exception("event=deadline_check_failed name=%s", profile.name)
            return None

    def unregister(self, pid: int, *, peer_uid: int | None = None) -> JobEntry:
        """Drop a job. A non-root client may only drop a job it registered or a process it
        owns: another user's job would lose its deadline and its reservation."""
        with self._lock:
            entry = self.table.get(pid)
            if entry is None:
                raise RequestError(f"pid {pid} is not registered")
            if peer_uid not in (None, 0) and entry.registrant_uid != peer_uid:
                owner = self.pid_owner(pid) if self.pid_owner is not None else None
                if owner != peer_uid:
                    raise RequestError(
                        f"pid {pid} was registered by uid {entry.registrant_uid}; a client "
                        f"with uid {peer_uid} may only unregister its own jobs"
                    )
            ended = not self.alive(pid)
        if ended:  # `hidvfs run` tells us as soon as its command exits: that is its end
            out = self.table.finish(pid, self.now())
            if out is None:
                raise RequestError(f"pid {pid} is not registered")
            log.info("event=job_unregistered pid=%d name=%s ended=true", pid, entry.name)
            return entry
        entry = self.table.unregister(pid)
        if entry is None:
            raise RequestError(f"pid {pid} is not registered")
        log.info("event=job_unregistered pid=%d name=%s", pid, entry.name)
        return entry

    def list(self) -> list[JobEntry]:
        return sorted(self.table.snapshot(), key=lambda e: (e.release_t, e.pid))

    def status(self) -> dict[str, Any]:
        return dict(self.status_provider()) if self.status_provider else {}

    def _adopter(self, pid: int, peer_uid: int | None) -> tuple[int, float | None] | None:
        """The job's parent, when it says it adopts what the job leaves behind: only a parent
        the client may speak for (its own process, or any for root), never init or the
        daemon (their other descendants are not the job's)."""
        parent = self.parent_of(pid) if self.parent_of is not None else None
        if parent is None or parent <= 1:
            return None
        if self.unmanageable is not None and self.unmanageable(parent) is not None:
            return None
        if peer_uid not in (None, 0) and self.pid_owner is not None:
            if self.pid_owner(parent) != peer_uid:
                return None
        start = self.start_time(parent) if self.start_time is not None else None
        return parent, start

    def handle(self, req: dict[str, Any], peer_uid: int | None = None) -> dict[str, Any]:
        """Answer one validated request."""
        op = req["op"]
        if op == "register":
            e = self.register(
                req["pid"],
                req["deadline_s"],
                req["criticality"],
                req["name"],
                peer_uid=peer_uid,
                adopter=req.get("adopter", False),
            )
            answer = {"ok": True, "job": job_to_json(e)}
            if e.warning is not None:
                answer["warning"] = e.warning
            return answer
        if op == "unregister":
            entry = self.unregister(req["pid"], peer_uid=peer_uid)
            return {"ok": True, "job": job_to_json(entry)}
        now = self.now()
        try:
            status = self.status()
        except Exception as err:  # noqa: BLE001 - a broken provider must not kill the server
            log.exception("event=status_provider_failed")
            raise RequestError(f"status unavailable: {type(err).__name__}: {err}") from None
        return {"ok": True, "status": status, "jobs": [job_to_json(e, now) for e in self.list()]}

    def handle_line(self, line: bytes, peer_uid: int | None = None) -> dict[str, Any]:
        """Answer one raw request line; never raises."""
        try:
            return self.handle(parse_request(line), peer_uid)
        except RequestError as err:
            return {"ok": False, "error": str(err)}
        except Exception as err:  # noqa: BLE001 - the server must keep serving
            log.exception("event=registry_internal_error")
            return {"ok": False, "error": f"internal error: {type(err).__name__}: {err}"}


def encode(answer: dict[str, Any]) -> bytes:
    return (json.dumps(answer, default=str, separators=(",", ":")) + "\n").encode()


# --------------------------------------------------------------------------------------------
# The socket server


@dataclass
class _Conn:
    sock: socket.socket
    peer_uid: int | None
    inbuf: bytearray = field(default_factory=bytearray)
    outbuf: bytearray = field(default_factory=bytearray)
    closing: bool = False  # close once outbuf is flushed
    discarding: bool = False  # skipping the rest of an oversized line
    #: refused connection: after the answer, half-close and swallow input until EOF, so the
    #: kernel does not reset the connection (and lose the answer) over unread data
    draining: bool = False
    last_active: float = field(default_factory=time.monotonic)


def peer_uid(sock: socket.socket) -> int | None:
    """The connecting process's uid (SO_PEERCRED), None where unsupported."""
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except (AttributeError, OSError):
        return None
    _pid, uid, _gid = struct.unpack("3i", raw)
    return uid


def _remove_stale_socket(path: str) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise RegistryStartError(f"{path} exists and is not a socket; refusing to remove it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(0.5)
    try:
        probe.connect(path)
    except ConnectionRefusedError:
        os.unlink(path)  # nobody listens: a leftover of a crashed run
        log.info("event=socket_stale_removed path=%s", path)
        return
    except OSError as err:
        # a timeout or a full accept queue is a daemon that is alive but slow: its socket
        # must stay (removing it would cut the running daemon off from every client)
        raise RegistryStartError(
            f"{path} did not answer ({err.strerror or err}) and is not refused either: another "
            "process may be serving it (is a second hidvfs daemon running?)"
        ) from None
    finally:
        probe.close()
    raise RegistryStartError(
        f"another process is already serving {path} (is a second hidvfs daemon running?)"
    )


class RegistryServer:
    """Serves a :class:`JobRegistry` on a Unix socket from one background thread."""

    def __init__(
        self,
        registry: JobRegistry,
        path: str,
        *,
        group: str | None = "hidvfs",
        mode: int = 0o660,
        max_clients: int = 64,
        idle_timeout_s: float = 60.0,
    ):
        self.registry = registry
        self.path = path
        self.group = group
        self.mode = mode
        self.max_clients = max_clients
        self.idle_timeout_s = idle_timeout_s
        self._sock: socket.socket | None = None
        self._sel: selectors.BaseSelector | None = None
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None
        self._conns: dict[int, _Conn] = {}
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._inode: tuple[int, int] | None = None
        #: requests answered so far (status/metrics)
        self.served = 0
        #: the listen socket is unwatched until then after an accept failed (EMFILE)
        self._accept_paused_until: float | None = None

    # -- setup -------------------------------------------------------------------------------
    def _bind(self) -> socket.socket:
        if len(os.fsencode(self.path)) >= 108:
            raise RegistryStartError(
                f"{self.path}: socket path longer than the 107 bytes AF_UNIX allows"
            )
        parent = os.path.dirname(os.path.abspath(self.path))
        try:
            os.makedirs(parent, mode=0o755, exist_ok=True)
        except OSError as err:
            raise RegistryStartError(
                f"cannot create {parent} for the socket: {err.strerror}"
            ) from None
        _remove_stale_socket(self.path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)  # born 0600: no window in which others can connect
        try:
            sock.bind(self.path)
        except OSError as err:
            sock.close()
            raise RegistryStartError(f"cannot bind {self.path}: {err.strerror}") from None
        finally:
            os.umask(old_umask)
        self._apply_permissions()
        st = os.stat(self.path)
        self._inode = (st.st_dev, st.st_ino)
        sock.listen(socket.SOMAXCONN)  # a burst of `hidvfs run`s waits, not fails
        sock.setblocking(False)
        return sock

    def _apply_permissions(self) -> None:
        if self.group is None:
            os.chmod(self.path, 0o600)
            log.info("event=socket_root_only path=%s reason=%r", self.path, "socket.group is null")
            return
        try:
            gid = grp.getgrnam(self.group).gr_gid
        except KeyError:
            os.chmod(self.path, 0o600)
            log.warning(
                "event=socket_root_only path=%s reason=%r",
                self.path,
                f"group {self.group!r} does not exist (create it: groupadd --system {self.group})",
            )
            return
        try:
            os.chown(self.path, -1, gid)
        except OSError as err:
            os.chmod(self.path, 0o600)
            log.warning(
                "event=socket_root_only path=%s reason=%r",
                self.path,
                f"chown to group {self.group!r} failed: {err.strerror}",
            )
            return
        os.chmod(self.path, self.mode)
        log.info(
            "event=socket_ready path=%s group=%s mode=%s", self.path, self.group, oct(self.mode)
        )

    def start(self) -> RegistryServer:
        if self._thread is not None:
            raise RuntimeError("registry server already started")
        self._sock = self._bind()
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._sel.register(self._sock, selectors.EVENT_READ, "listen")
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._stop.clear()
        self._thread = threading.Thread(target=self._serve, name="hidvfs-registry", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop serving, close every connection and remove our socket file. Idempotent."""
        if self._thread is None:
            return
        self._stop.set()
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        self._thread.join(timeout)
        self._thread = None
        for conn in list(self._conns.values()):
            self._close(conn)
        for s in (self._sock, self._wake_r, self._wake_w):
            if s is not None:
                s.close()
        if self._sel is not None:
            self._sel.close()
        try:
            st = os.stat(self.path)
            if (st.st_dev, st.st_ino) == self._inode:
                os.unlink(self.path)
        except OSError:
            pass

    def __enter__(self) -> RegistryServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # -- the loop ----------------------------------------------------------------------------
    def _serve(self) -> None:
        assert self._sel is not None
        while not self._stop.is_set():
            try:
                events = self._sel.select(timeout=1.0)
            except OSError as err:  # pragma: no cover - EINTR is retried by Python
                log.error("event=registry_select_failed error=%r", str(err))
                continue
            for key, mask in events:
                try:
                    if key.data == "listen":
                        self._accept()
                    elif key.data == "wake":
                        with contextlib.suppress(OSError):
                            self._wake_r.recv(64)
                    else:
                        self._service(key.data, mask)
                except Exception:  # noqa: BLE001 - one connection must never take the server down
                    log.exception("event=registry_connection_error")
                    if isinstance(key.data, _Conn):
                        self._close(key.data)
            self._reap_idle()

    def _accept(self) -> None:
        try:
            sock, _ = self._sock.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as err:  # EMFILE and friends: keep serving the others
            # the listen socket stays readable: stop watching it for a moment, or this spins
            log.warning(
                "event=registry_accept_failed error=%r pause_s=%g", err.strerror, ACCEPT_PAUSE_S
            )
            with contextlib.suppress(KeyError, ValueError):
                self._sel.unregister(self._sock)
            self._accept_paused_until = time.monotonic() + ACCEPT_PAUSE_S
            return
        sock.setblocking(False)
        conn = _Conn(sock, peer_uid(sock))
        refusal = self._refusal(conn.peer_uid)
        if refusal is not None:
            if sum(1 for c in self._conns.values() if c.draining) >= MAX_DRAINING:
                sock.close()  # refusals pile up: no answer rather than one more descriptor
                return
            conn.outbuf += encode({"ok": False, "error": refusal})
            conn.draining = True
        self._conns[sock.fileno()] = conn
        self._sel.register(sock, self._events(conn), conn)

    def _refusal(self, uid: int | None) -> str | None:
        """Why a new client is refused, None when it is served. One uid gets a quarter of
        the slots and root always has room, so one user cannot lock the others (or the
        administrator) out."""
        live = [c for c in self._conns.values() if not c.draining]
        if uid == 0:
            if len(live) >= self.max_clients + ROOT_RESERVE:
                return f"too many clients (limit {self.max_clients}); retry later"
            return None
        if len(live) >= self.max_clients:
            return f"too many clients (limit {self.max_clients}); retry later"
        per_uid = max(1, self.max_clients // 4)
        if sum(1 for c in live if c.peer_uid == uid) >= per_uid:
            return f"too many connections from uid {uid} (limit {per_uid}); close some first"
        return None

    @staticmethod
    def _events(conn: _Conn) -> int:
        ev = 0 if conn.closing else selectors.EVENT_READ
        if conn.outbuf:
            ev |= selectors.EVENT_WRITE
        return ev or selectors.EVENT_WRITE

    def _service(self, conn: _Conn, mask: int) -> None:
        if conn.draining:
            self._drain(conn, mask)
            return
        if mask & selectors.EVENT_READ and not conn.closing:
            self._read(conn)
        if conn.sock.fileno() < 0:
            return
        if conn.outbuf:
            self._flush(conn)
        elif conn.closing:
            self._close(conn)
            return
        if conn.sock.fileno() >= 0 and conn.sock.fileno() in self._conns:
            self._sel.modify(conn.sock, self._events(conn), conn)

    def _drain(self, conn: _Conn, mask: int) -> None:
        if conn.outbuf:
            self._flush(conn)
            if conn.sock.fileno() < 0:
                return
            if not conn.outbuf:
                with contextlib.suppress(OSError):
                    conn.sock.shutdown(socket.SHUT_WR)
        elif mask & selectors.EVENT_READ:
            try:
                data = conn.sock.recv(65536)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data = b""
            if not data:
                self._close(conn)
                return
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if conn.outbuf else 0)
        self._sel.modify(conn.sock, events, conn)

    def _read(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(conn)
            return
        if not data:  # the client hung up (or shut down its write side)
            if conn.inbuf.strip() and not conn.discarding:
                self._answer(
                    conn,
                    {
                        "ok": False,
                        "error": "incomplete request: the connection closed before the end of the line",
                    },
                )
            conn.inbuf.clear()
            conn.closing = True
            return
        conn.inbuf += data
        while True:
            nl = conn.inbuf.find(b"\n")
            if nl < 0:
                break
            line = bytes(conn.inbuf[:nl]).rstrip(b"\r")
            del conn.inbuf[: nl + 1]
            if conn.discarding:  # the tail of an oversized line: the next line is a new request
                conn.discarding = False
                continue
            if len(line) > MAX_LINE:  # a whole line: what follows it is the next request
                self._answer(
                    conn, {"ok": False, "error": f"request line longer than {MAX_LINE} bytes"}
                )
                continue
            if line.strip():
                # only a whole request keeps a connection alive: a byte now and then does not
                conn.last_active = time.monotonic()
                self._answer(conn, self.registry.handle_line(line, conn.peer_uid))
        if conn.discarding:
            conn.inbuf.clear()
        elif len(conn.inbuf) > MAX_LINE:
            self._too_long(conn)

    def _too_long(self, conn: _Conn) -> None:
        # Answer now and skip to the next newline: JSON lines hold no raw newline, so that is
        # a reliable request boundary (closing with unread input would reset the connection
        # and lose the answer).
        self._answer(conn, {"ok": False, "error": f"request line longer than {MAX_LINE} bytes"})
        conn.inbuf.clear()
        conn.discarding = True

    def _answer(self, conn: _Conn, answer: dict[str, Any]) -> None:
        self.served += 1
        conn.outbuf += encode(answer)
        if len(conn.outbuf) > MAX_OUTPUT:
            log.warning("event=registry_client_dropped reason=%r", "it does not read its answers")
            conn.outbuf.clear()
            conn.closing = True

    def _flush(self, conn: _Conn) -> None:
        try:
            sent = conn.sock.send(conn.outbuf)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as err:
            if err.errno not in (errno.EPIPE, errno.ECONNRESET):
                log.debug("event=registry_send_failed error=%r", err.strerror)
            self._close(conn)
            return
        del conn.outbuf[:sent]
        if not conn.outbuf and conn.closing and not conn.draining:
            self._close(conn)

    def _close(self, conn: _Conn) -> None:
        fd = conn.sock.fileno()
        if fd >= 0:
            self._conns.pop(fd, None)
            with contextlib.suppress(KeyError, ValueError, OSError):
                self._sel.unregister(conn.sock)
        conn.sock.close()

    def _reap_idle(self) -> None:
        now = time.monotonic()
        for conn in list(self._conns.values()):
            timeout = DRAIN_TIMEOUT_S if conn.draining else self.idle_timeout_s
            if conn.last_active < now - timeout:
                self._close(conn)
        if self._accept_paused_until is not None and now >= self._accept_paused_until:
            self._accept_paused_until = None
            with contextlib.suppress(KeyError, ValueError):
                self._sel.register(self._sock, selectors.EVENT_READ, "listen")
