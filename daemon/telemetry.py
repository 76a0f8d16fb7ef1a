"""HTTP JSON status endpoint for the fleet coordinator.

``GET /status`` returns the same status dict the daemon writes to ``--status-file``;
``GET /healthz`` answers ``{"ok": true}``. It listens on localhost by default. Binding a
non-loopback address is refused without a bearer token, and once a token is set every request
must carry ``Authorization: Bearer <token>`` (compared in constant time).
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Callable, Mapping
from typing import Any

from daemon.config import is_loopback, parse_listen
from daemon.metrics import LocalHttpServer

JSON = "application/json"


class TelemetryServer(LocalHttpServer):
    def __init__(
        self, listen: str, provider: Callable[[], Mapping[str, Any]], token: str | None = None
    ):
        host, _ = parse_listen(listen)
        if not token and not is_loopback(host):
            raise ValueError(
                f"telemetry: refusing to serve {listen} without a token: {host} is not a loopback "
                "address (set telemetry.token or telemetry.token_file)"
            )
        self.provider = provider
        self.token = token or None
        super().__init__(listen, self._handle, "telemetry")

    def _authorized(self, headers: Mapping[str, str]) -> bool:
        if self.token is None:
            return True
        got = headers.get("Authorization") or ""
        scheme, _, value = got.partition(" ")
        if scheme.lower() != "bearer":
            return False
        return hmac.compare_digest(value.strip().encode(), self.token.encode())

    def _handle(self, path: str, headers: Mapping[str, str]) -> tuple[int, str, bytes]:
        if not self._authorized(headers):
            return 401, JSON, _dump({"ok": False, "error": "missing or wrong bearer token"})
        route = path.split("?", 1)[0]
        if route == "/healthz":
            return 200, JSON, _dump({"ok": True})
        if route in ("/status", "/"):
            return 200, JSON, _dump(dict(self.provider()))
        return 404, JSON, _dump({"ok": False, "error": f"no such endpoint {route!r}; try /status"})


def _dump(obj: Any) -> bytes:
    return (json.dumps(obj, default=str, sort_keys=True) + "\n").encode()
