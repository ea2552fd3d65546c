"""ASGI middleware: trace ids + request metrics + last-resort 500s, and the body limit.

Both are plain ASGI (not BaseHTTPMiddleware) so streaming bodies stay streams.
"""

from __future__ import annotations

import json
import logging
import math
import time
from typing import Any

from prometheus_client import Counter, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from edgefleet.shared.errors import EdgefleetError, InvalidInput, PayloadTooLarge
from edgefleet.shared.jsondepth import MAX_DEPTH, too_deep
from edgefleet.shared.logs import trace_id_from_traceparent, trace_id_var
from edgefleet.shared.messages import new_trace_id

log = logging.getLogger(__name__)

REQUESTS = Counter("ef_cloud_http_requests_total", "HTTP requests", ["method", "route", "status"])
REQUEST_SECONDS = Histogram(
    "ef_cloud_http_request_seconds",
    "HTTP request time",
    ["method", "route"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)


def error_body(status: int, code: str, message: str, hint: str = "") -> dict[str, Any]:
    error = {"code": code, "message": message, "trace_id": trace_id_var.get()}
    if hint:
        error["hint"] = hint
    return {"error": error}


def error_headers(status: int, retry_after_s: float | None = None) -> dict[str, str]:
    headers = {"content-type": "application/json"}  # x-trace-id: TraceMiddleware adds it
    if status in (429, 503):
        headers["retry-after"] = str(max(1, math.ceil(retry_after_s or 1)))
    return headers


async def send_error(send: Send, exc: EdgefleetError) -> None:
    body = json.dumps(error_body(exc.http_status, exc.code, exc.message, exc.hint)).encode()
    headers = error_headers(exc.http_status, getattr(exc, "retry_after_s", None))
    await send(
        {
            "type": "http.response.start",
            "status": exc.http_status,
            "headers": [(k.encode(), v.encode()) for k, v in headers.items()],
        }
    )
    await send({"type": "http.response.body", "body": body})


class TraceMiddleware:
    """Trace id from `traceparent` (or new) for logs, error bodies and the response."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        trace_id = (
            trace_id_from_traceparent(headers.get(b"traceparent", b"").decode("latin-1"))
            or new_trace_id()
        )
        token = trace_id_var.set(trace_id)
        scope.setdefault("state", {})["trace_id"] = trace_id
        started = time.perf_counter()
        status = {"code": 500, "sent": False}

        async def traced_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
                status["sent"] = True
                message["headers"] = [
                    *(h for h in message.get("headers", []) if h[0].lower() != b"x-trace-id"),
                    (b"x-trace-id", trace_id.encode()),
                    (b"traceparent", f"00-{trace_id}-{new_trace_id()[:16]}-01".encode()),
                ]
            await send(message)

        try:
            await self.app(scope, receive, traced_send)
        except Exception:  # the one place an unknown error becomes a logged 500
            log.exception("unhandled error on %s %s", scope.get("method"), scope.get("path"))
            if not status["sent"]:
                await send_error(
                    traced_send, EdgefleetError("internal error; the trace id is in the logs")
                )
        finally:
            route = scope.get("route")
            path = getattr(route, "path", None) or "unmatched"
            REQUESTS.labels(scope.get("method", ""), path, str(status["code"])).inc()
            REQUEST_SECONDS.labels(scope.get("method", ""), path).observe(
                time.perf_counter() - started
            )
            trace_id_var.reset(token)


class _BodyTooLarge(Exception):
    pass


class BodyLimitMiddleware:
    """Refuse bodies over `max_bytes`: by Content-Length up front, and by counting the
    stream as it arrives (chunked uploads), so an oversize body is never held whole."""

    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    def _too_large(self, size: str) -> PayloadTooLarge:
        return PayloadTooLarge(
            f"request body of {size} bytes is over the limit of {self.max_bytes} bytes"
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        if length is not None:
            try:
                declared = int(length)
            except ValueError:
                declared = -1
            if declared > self.max_bytes:
                await send_error(send, self._too_large(str(declared)))
                return
        state = {"received": 0, "exceeded": False, "started": False}

        async def counting_receive() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                state["received"] += len(message.get("body", b""))
                if state["received"] > self.max_bytes:
                    state["exceeded"] = True
                    raise _BodyTooLarge()
            return message

        async def guarded_send(message: Message) -> None:
            if state["exceeded"]:
                return  # the app's own answer to the aborted body is replaced by our 413
            if message["type"] == "http.response.start":
                state["started"] = True
            await send(message)

        try:
            await self.app(scope, counting_receive, guarded_send)
        except _BodyTooLarge:
            pass
        except Exception:
            if not state["exceeded"]:
                raise
        if state["exceeded"] and not state["started"]:
            await send_error(send, self._too_large(f"more than {self.max_bytes}"))


class JsonDepthMiddleware:
    """Refuse a JSON body nested deeper than MAX_DEPTH with a typed 400, before any parser
    recurses into it. The body is held whole here, as the JSON parser would hold it
    anyway; BodyLimitMiddleware, outside this one, bounds it."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = dict(scope.get("headers") or []) if scope["type"] == "http" else {}
        kind = headers.get(b"content-type", b"").split(b";", 1)[0].strip().lower()
        if kind != b"application/json" and not kind.endswith(b"+json"):
            await self.app(scope, receive, send)
            return
        messages: list[Message] = []
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request" or not message.get("more_body"):
                break
        body = b"".join(m.get("body", b"") for m in messages if m["type"] == "http.request")
        if too_deep(body):
            error = InvalidInput(f"the JSON body nests deeper than {MAX_DEPTH} levels")
            await send_error(send, error)
            return

        async def replay() -> Message:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)
