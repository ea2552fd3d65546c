"""A standalone fleet app: the fleet router behind operator API keys, with JSON errors.

The cloud includes `edgefleet.fleet.api.build_router` in its own app; this wrapper serves the same
routes on their own (`edgefleet fleet serve`, and the fleet's own tests).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from edgefleet.fleet.api import build_router
from edgefleet.fleet.models import ModelStore
from edgefleet.fleet.registry import DeviceRegistry
from edgefleet.fleet.rollout import RolloutController
from edgefleet.shared.errors import AuthError, EdgefleetError
from edgefleet.shared.logs import trace_id_from_traceparent, trace_id_var
from edgefleet.shared.messages import new_trace_id

log = logging.getLogger(__name__)


def operator_dependency(api_keys: list[str]) -> Callable[[Request], str]:
    """A FastAPI dependency accepting `Authorization: Bearer <one of api_keys>`."""
    digests = [hashlib.sha256(k.encode()).hexdigest() for k in api_keys]

    def require_operator(request: Request) -> str:
        scheme, _, token = (request.headers.get("authorization") or "").partition(" ")
        digest = hashlib.sha256(token.strip().encode()).hexdigest()
        if scheme.lower() == "bearer" and any(hmac.compare_digest(digest, d) for d in digests):
            return "operator"
        raise AuthError("this endpoint needs an operator API key")

    return require_operator


def create_app(
    registry: DeviceRegistry,
    rollouts: RolloutController,
    api_keys: list[str],
    *,
    model_store: ModelStore | None = None,
    recent_cases: Callable[[int], list[dict[str, Any]]] | None = None,
    events_interval_s: float = 1.0,
) -> FastAPI:
    app = FastAPI(title="edgefleet fleet", version="1")

    @app.middleware("http")
    async def trace(request: Request, call_next):
        trace_id = trace_id_from_traceparent(request.headers.get("traceparent")) or new_trace_id()
        token = trace_id_var.set(trace_id)
        try:
            return await call_next(request)
        finally:
            trace_id_var.reset(token)

    @app.exception_handler(EdgefleetError)
    async def edgefleet_error(request: Request, exc: EdgefleetError) -> JSONResponse:
        log.info("request refused: %s", exc, extra={"code": exc.code, "path": request.url.path})
        return _error(exc.http_status, exc.code, str(exc))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return _error(exc.status_code, code, str(exc.detail))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        where = ".".join(str(p) for p in first["loc"])
        return _error(422, "invalid_input", f"{where}: {first['msg']}")

    app.include_router(
        build_router(
            registry,
            rollouts,
            operator_dependency(api_keys),
            recent_cases=recent_cases,
            model_store=model_store,
            events_interval_s=events_interval_s,
        )
    )
    return app


def _error(status: int, code: str, message: str) -> JSONResponse:
    body = {"error": {"code": code, "message": message, "trace_id": trace_id_var.get()}}
    return JSONResponse(body, status_code=status)
