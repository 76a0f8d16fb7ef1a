"""HTTP JSON status endpoint for the fleet coordinator.

``GET /status`` returns the same status dict the daemon writes to ``--status-file``;
``GET /healthz`` answers ``{"ok": true}``. It listens on localhost by default. Binding a
non-loopback address is refused without a bearer token, and once a token is set every request
must carry ``Authorization: Bearer <token>`` (compared in constant time); the rule lives in
:class:`daemon.metrics.LocalHttpServer`, shared with the metrics endpoint.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from daemon.metrics import LocalHttpServer

JSON = "application/json"


class TelemetryServer(LocalHttpServer):
    def __init__(
        self, listen: str, provider: Callable[[], Mapping[str, Any]], token: str | None = None
    ):
        self.provider = provider
        super().__init__(listen, self._handle, "telemetry", token)

    def unauthorized(self) -> tuple[int, str, bytes]:
        return 401, JSON, _dump({"ok": False, "error": "missing or wrong bearer token"})

    def _handle(self, path: str, headers: Mapping[str, str]) -> tuple[int, str, bytes]:
        route = path.split("?", 1)[0]
        if route == "/healthz":
            return 200, JSON, _dump({"ok": True})
        if route in ("/status", "/"):
            return 200, JSON, _dump(dict(self.provider()))
        return 404, JSON, _dump({"ok": False, "error": f"no such endpoint {route!r}; try /status"})


def _dump(obj: Any) -> bytes:
    return (json.dumps(obj, default=str, sort_keys=True) + "\n").encode()
