"""Client of the daemon's job-registry socket (used by ``hidvfs run`` and ``hidvfs status``).

One connection per request, one JSON line each way. When the daemon cannot be reached the
error says where it looked, why it failed and what to check, instead of a bare errno.
"""

from __future__ import annotations

import json
import socket
from typing import Any

from daemon.config import DEFAULT_SOCKET
from platforms.errors import HidvfsError

#: status answers list every job, so allow more than a request line
MAX_ANSWER = 16 * 1024 * 1024


class DaemonUnreachable(HidvfsError):
    """The registry socket is missing, refuses connections, or does not answer."""

    def __init__(self, path: str, reason: str):
        self.path = path
        self.reason = reason
        super().__init__(
            f"cannot reach the hidvfs daemon at {path}: {reason}; is it running? (systemctl status hidvfs)"
        )


class RegistryError(HidvfsError):
    """The daemon answered ``{"ok": false, "error": ...}``."""

    def __init__(self, op: str, error: str):
        self.op = op
        self.error = error
        super().__init__(f"hidvfs daemon refused {op}: {error}")


class RegistryClient:
    def __init__(self, path: str = DEFAULT_SOCKET, timeout: float = 5.0):
        self.path = path
        self.timeout = timeout

    def __repr__(self) -> str:
        return f"RegistryClient({self.path!r})"

    def request(self, req: dict[str, Any]) -> dict[str, Any]:
        """Send one request; return the answer when ``ok``, raise RegistryError otherwise."""
        answer = self._roundtrip((json.dumps(req) + "\n").encode())
        if not isinstance(answer, dict) or "ok" not in answer:
            raise DaemonUnreachable(self.path, f"unexpected answer {answer!r:.200}")
        if not answer["ok"]:
            raise RegistryError(str(req.get("op")), str(answer.get("error", "no reason given")))
        return answer

    def _roundtrip(self, line: bytes) -> Any:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            try:
                sock.connect(self.path)
            except FileNotFoundError:
                raise DaemonUnreachable(self.path, "no such socket") from None
            except ConnectionRefusedError:
                raise DaemonUnreachable(
                    self.path, "connection refused (a stale socket of a stopped daemon?)"
                ) from None
            except PermissionError:
                raise DaemonUnreachable(
                    self.path,
                    "permission denied (join the 'hidvfs' group: sudo usermod -aG hidvfs $USER, then log in again)",
                ) from None
            except TimeoutError:
                raise DaemonUnreachable(self.path, f"no answer within {self.timeout:g} s") from None
            except OSError as err:
                raise DaemonUnreachable(self.path, err.strerror or str(err)) from None
            try:
                sock.sendall(line)
                buf = bytearray()
                while b"\n" not in buf:
                    chunk = sock.recv(65536)
                    if not chunk:
                        break
                    buf += chunk
                    if len(buf) > MAX_ANSWER:
                        raise DaemonUnreachable(self.path, f"answer longer than {MAX_ANSWER} bytes")
            except TimeoutError:
                raise DaemonUnreachable(self.path, f"no answer within {self.timeout:g} s") from None
            except OSError as err:
                raise DaemonUnreachable(
                    self.path, f"connection lost ({err.strerror or err})"
                ) from None
        finally:
            sock.close()
        if b"\n" not in buf:
            raise DaemonUnreachable(self.path, "the daemon closed the connection without answering")
        try:
            return json.loads(bytes(buf).split(b"\n", 1)[0])
        except ValueError:
            raise DaemonUnreachable(
                self.path, "the answer is not JSON (is this a hidvfs socket?)"
            ) from None

    def register(
        self, pid: int, deadline_s: float | None = None, criticality: str = "lo", name: str = ""
    ) -> dict[str, Any]:
        """Register ``pid``; returns the job as the daemon recorded it."""
        req = {
            "op": "register",
            "pid": pid,
            "deadline_s": deadline_s,
            "criticality": criticality,
            "name": name,
        }
        return self.request(req)["job"]

    def unregister(self, pid: int) -> dict[str, Any]:
        return self.request({"op": "unregister", "pid": pid})["job"]

    def status(self) -> dict[str, Any]:
        """``{"status": {...daemon status...}, "jobs": [...]}``."""
        answer = self.request({"op": "status"})
        return {"status": answer.get("status", {}), "jobs": answer.get("jobs", [])}
