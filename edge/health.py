"""Local HTTP: /healthz, /readyz, /metrics, and /verdicts for the local application.

`HealthReport` assembles what they answer from the agent's parts; `HealthServer` serves
it with the stdlib server in a thread: four read-only endpoints do not need a web
framework on a device where every megabyte counts.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from edgefleet.edge.cases import CaseWriter
from edgefleet.edge.clock import ClockWatch
from edgefleet.edge.outbox import Outbox
from edgefleet.edge.policy import EscalationPolicy
from edgefleet.edge.sources.capture import Capture
from edgefleet.edge.uplink import Uplink
from edgefleet.edge.verdicts import VerdictBook
from edgefleet.shared.errors import ConfigError
from edgefleet.shared.executor.fallback import report as backend_report

log = logging.getLogger(__name__)


class HealthReport:
    """What /healthz, /readyz and /verdicts answer, read from the running parts per call."""

    def __init__(
        self,
        device_id: str,
        *,
        uptime_s: Callable[[], float],
        captures: list[Capture],
        outbox: Outbox,
        uplink: Uplink,
        cases: CaseWriter,
        policy: EscalationPolicy,
        verdicts: VerdictBook,
        clock: ClockWatch,
    ):
        self.device_id = device_id
        self.clock = clock
        self.uptime_s = uptime_s
        self.captures = captures
        self.outbox = outbox
        self.uplink = uplink
        self.cases = cases
        self.policy = policy
        self.verdicts = verdicts

    def health(self) -> dict[str, Any]:
        budget = self.policy.budget
        return {
            "status": "ok",
            "device_id": self.device_id,
            "uptime_s": self.uptime_s(),
            "broker_connected": self.uplink.connected.is_set(),
            "streams": [
                {
                    "stream_id": c.stream_id,
                    "state": c.state,
                    "frames": c.frames,
                    "dropped": c.dropped,
                    "invalid": c.invalid,
                    "reconnects": c.reconnects,
                    "last_error": c.last_error,
                }
                for c in self.captures
            ],
            "outbox": {
                "depth": self.outbox.depth(),
                "bytes": self.outbox.size_bytes,
                "dropped": self.outbox.dropped,
                "recovered_from": str(self.outbox.recovered_from)
                if self.outbox.recovered_from
                else None,
            },
            "escalations_created": self.cases.created,
            "suppressed": dict(self.policy.suppressed),
            "agreement_rate": self.verdicts.agreement_rate,
            "agreement_by_score_bucket": budget.agreement(),
            "budget": {
                "spent": budget.spent,
                "skipped_agreeing_buckets": budget.skipped,
                "over_budget": budget.over,
            },
            "verdicts_for_unknown_tracks": self.verdicts.unknown_tracks,
            "execution": backend_report(),
            "clock": self.clock.latest.as_json(),
        }

    def ready(self) -> tuple[bool, list[str]]:
        """Ready when every stream is live, the outbox takes writes and the clock is not
        known to be off (the model is loaded before the agent exists)."""
        reasons = []
        if self.clock.latest.state == "off":
            reasons.append(self.clock.latest.detail)
        not_live = [c.stream_id for c in self.captures if c.state != "live"]
        if not_live:
            reasons.append(f"streams not live: {', '.join(not_live)}")
        if not self.outbox.writable():
            reasons.append("outbox not writable")
        return (not reasons, reasons)

    def recent_verdicts(self) -> list[dict[str, Any]]:
        return [
            {
                "verdict": m.verdict.model_dump(mode="json"),
                "stream_id": m.stream_id,
                "frame_index": m.frame_index,
                "edge_result": None
                if m.edge_result is None
                else [d.model_dump(mode="json") for d in m.edge_result],
                "agrees": m.agrees,
                "track_id": m.track_id,
                "track_result": m.track_result,
                "track_known": m.track_known,
            }
            for m in list(self.verdicts.recent)
        ]


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
        """Binds the port now, so a taken port fails before anything else is built."""
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                owner._handle(self)

            def log_message(self, format: str, *args: Any) -> None:
                log.debug("health http: " + format, *args)

        self._health, self._ready, self._verdicts = health, ready, verdicts
        try:
            self._server = ThreadingHTTPServer((host, port), Handler)
        except OSError as exc:  # the operator's question is "which port?"
            raise ConfigError(
                f"health.port: cannot listen on {host}:{port}: {exc.strerror}",
                hint="stop what holds that port, or set health.port (0 = any free port)",
            ) from None
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
