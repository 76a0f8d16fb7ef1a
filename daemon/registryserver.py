"""The Unix-socket server of the job registry: it accepts clients, reads their request lines
and writes back what :class:`daemon.registry.JobRegistry` answers.

Why a module of its own: the registry (:mod:`daemon.registry`) checks and records jobs and
knows nothing of sockets, so it is driven and tested without one; this module is the
transport (descriptors, peer credentials, the socket file and its folder). It imports the
registry, never the other way round.

The server is one ``selectors`` thread: requests are tiny and handled inline, so a slow or
silent client costs a file descriptor, not a thread. The socket is mode 0660 and group
``hidvfs`` when that group exists (otherwise root-only), born with that mode and checked to
be the socket bound before it is served; as root, a socket folder another user can write is
refused. Each client's uid (SO_PEERCRED) goes with its requests to the registry, which
decides what that client may register.
"""

from __future__ import annotations

import contextlib
import errno
import grp
import logging
import os
import selectors
import socket
import stat
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from daemon.registry import JobRegistry, encode
from platforms.errors import HidvfsError

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

#: the registry's logger: what the socket logs is the registry's too (``hidvfs.registry``)
log = logging.getLogger("hidvfs.registry")


class RegistryStartError(HidvfsError):
    """The socket could not be set up (names the path and the cause)."""


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


def _check_socket_dir(folder: str) -> None:
    """Refuse (root only) a socket folder another user can write: one not owned by root, or
    group- or other-writable without the sticky bit. Whoever can write there can replace
    the socket and answer the clients in the daemon's place, or swap it for a link while
    the daemon sets it up."""
    try:
        st = os.stat(folder)
    except OSError as err:
        raise RegistryStartError(f"cannot inspect {folder}: {err.strerror}") from None
    why = None
    if st.st_uid != 0:
        why = f"it belongs to uid {st.st_uid}, not root"
    elif st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        who = "its group" if st.st_mode & 0o020 else "every user"
        if st.st_mode & 0o022 == 0o022:
            who = "its group and every user"
        why = f"{who} can write it (mode {stat.S_IMODE(st.st_mode):04o}, no sticky bit)"
    if why is not None:
        raise RegistryStartError(
            f"refusing the socket folder {folder}: {why}; another user could replace the "
            "socket and answer clients in the daemon's place (use a folder only root can "
            "write, such as the default /run/hidvfs)"
        )


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
        if os.geteuid() == 0:
            _check_socket_dir(parent)
        _remove_stale_socket(self.path)
        gid, mode = self._permissions()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        # born with its final mode (no chmod by path afterwards, which would follow a
        # symlink put in its place); until the chown below its group is the daemon's own
        old_umask = os.umask(0o777 & ~mode)
        try:
            sock.bind(self.path)
        except OSError as err:
            sock.close()
            raise RegistryStartError(f"cannot bind {self.path}: {err.strerror}") from None
        finally:
            os.umask(old_umask)
        try:
            st = self._verify_ours(os.lstat(self.path))
            if gid is not None:
                # never through a symlink: at worst the link itself changes group
                os.chown(self.path, -1, gid, follow_symlinks=False)
                after = self._verify_ours(os.lstat(self.path))
                if (after.st_dev, after.st_ino) != (st.st_dev, st.st_ino) or after.st_gid != gid:
                    raise RegistryStartError(
                        f"{self.path} was replaced while its group was set: another process "
                        "writes the socket's folder; refusing to serve there"
                    )
                st = after
        except OSError as err:
            sock.close()
            raise RegistryStartError(
                f"cannot set up {self.path}: {err.strerror or err}; refusing to serve there"
            ) from None
        except RegistryStartError:
            sock.close()
            raise
        self._inode = (st.st_dev, st.st_ino)
        if gid is not None:
            log.info(
                "event=socket_ready path=%s group=%s mode=%s", self.path, self.group, oct(mode)
            )
        sock.listen(socket.SOMAXCONN)  # a burst of `hidvfs run`s waits, not fails
        sock.setblocking(False)
        return sock

    def _verify_ours(self, st: os.stat_result) -> os.stat_result:
        """``st`` (an lstat of the path) is the socket this daemon just bound: a socket, of
        this user, with one link (a hard link to someone else's socket has two), else
        RegistryStartError: something replaced it."""
        if not stat.S_ISSOCK(st.st_mode) or st.st_uid != os.geteuid() or st.st_nlink != 1:
            what = (
                "a symlink"
                if stat.S_ISLNK(st.st_mode)
                else f"a socket of uid {st.st_uid}"
                if stat.S_ISSOCK(st.st_mode)
                else "not a socket"
            )
            raise RegistryStartError(
                f"{self.path} is not the socket just bound ({what}, {st.st_nlink} link(s)): "
                "another process replaced it; refusing to serve there"
            )
        return st

    def _permissions(self) -> tuple[int | None, int]:
        """(group id to give the socket, None to keep it root-only; its mode)."""
        if self.group is None:
            log.info("event=socket_root_only path=%s reason=%r", self.path, "socket.group is null")
            return None, 0o600
        try:
            gid = grp.getgrnam(self.group).gr_gid
        except KeyError:
            log.warning(
                "event=socket_root_only path=%s reason=%r",
                self.path,
                f"group {self.group!r} does not exist (create it: groupadd --system {self.group})",
            )
            return None, 0o600
        if os.geteuid() != 0 and gid not in (os.getegid(), *os.getgroups()):
            log.warning(
                "event=socket_root_only path=%s reason=%r",
                self.path,
                f"chown to group {self.group!r} is not allowed to uid {os.geteuid()}",
            )
            return None, 0o600
        if self.mode & 0o002:  # the mode is the operator's; what it opens is said once
            log.warning(
                "event=socket_world_writable path=%s mode=%04o reason=%r",
                self.path,
                self.mode & 0o777,
                "every local user may register jobs, high-criticality ones included (each "
                f"only its own processes); to limit it, put the users in group {self.group!r} "
                "and use mode 0660",
            )
        return gid, self.mode & 0o777

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
            st = os.lstat(self.path)
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
