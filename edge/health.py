"""Local HTTP: /healthz, /readyz, /metrics, and /verdicts for the local application.

The stdlib server in a thread: four read-only endpoints do not need a web framework on a
device where every megabyte counts.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

log = logging.getLogger(__name__)


class HealthServer:
    """Serves the agent's health; `health()` / `ready()` are called per request."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        health: Callable[[], dict[str, Any]],
        ready: Callable[[], tuple[bool, list[str]]],
        verdicts: Callable[[], list[dict[str, Any]]],
    ):
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                owner._handle(self)

            def log_message(self, format: str, *args: Any) -> None:
                log.debug("health http: " + format, *args)

        self._health, self._ready, self._verdicts = health, ready, verdicts
        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="health-http", daemon=True
        )

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> HealthServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and free the port (also when serving never started)."""
        if self._thread.is_alive():
            self._server.shutdown()
        self._server.server_close()

    def _handle(self, request: BaseHTTPRequestHandler) -> None:
        path = request.path.split("?", 1)[0]
        try:
            if path == "/healthz":
                self._json(request, 200, self._health())
            elif path == "/readyz":
                ok, reasons = self._ready()
                self._json(request, 200 if ok else 503, {"ready": ok, "reasons": reasons})
            elif path == "/metrics":
                self._send(request, 200, generate_latest(), CONTENT_TYPE_LATEST)
            elif path == "/verdicts":
                self._json(request, 200, {"verdicts": self._verdicts()})
            else:
                self._json(request, 404, {"error": {"code": "not_found", "message": path}})
        except Exception as exc:  # never let a probe take the agent down
            log.exception("health endpoint %s failed", path)
            self._json(request, 500, {"error": {"code": "internal", "message": str(exc)}})

    @staticmethod
    def _json(request: BaseHTTPRequestHandler, status: int, body: Any) -> None:
        HealthServer._send(request, status, json.dumps(body).encode(), "application/json")

    @staticmethod
    def _send(request: BaseHTTPRequestHandler, status: int, body: bytes, ctype: str) -> None:
        request.send_response(status)
        request.send_header("Content-Type", ctype)
        request.send_header("Content-Length", str(len(body)))
        request.end_headers()
        request.wfile.write(body)
