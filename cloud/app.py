"""The FastAPI app of the orchestrator, and the ONE place errors become HTTP answers.

Every error body is `{"error": {"code", "message", "trace_id"}}` (plus `hint` when the
error has one); 429 and 503 carry `Retry-After`. EdgefleetError subclasses map by their
own `http_status`; request validation is 422 (400 for JSON that does not parse); any
other exception is logged with its trace id and answered 500 by TraceMiddleware.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from edgefleet.cloud.api import escalations, feedback, health, infer
from edgefleet.cloud.auth import require_operator
from edgefleet.cloud.middleware import (
    BodyLimitMiddleware,
    JsonDepthMiddleware,
    TraceMiddleware,
    error_body,
    error_headers,
)
from edgefleet.cloud.services import CloudServices
from edgefleet.cloud.settings import CloudSettings
from edgefleet.fleet.service import build_router
from edgefleet.shared.errors import EdgefleetError

log = logging.getLogger(__name__)

_HTTP_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    409: "conflict",
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: "invalid_input",
    429: "overloaded",
    503: "unavailable",
}


def _json_error(
    status: int, code: str, message: str, hint: str = "", retry_after: float | None = None
) -> JSONResponse:
    headers = error_headers(status, retry_after)
    headers.pop("content-type", None)
    return JSONResponse(
        error_body(status, code, message, hint), status_code=status, headers=headers
    )


async def _edgefleet_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, EdgefleetError)
    level = logging.ERROR if exc.http_status >= 500 else logging.INFO
    log.log(
        level,
        "%s %s -> %s %s: %s",
        request.method,
        request.url.path,
        exc.http_status,
        exc.code,
        exc.message,
    )
    return _json_error(
        exc.http_status, exc.code, exc.message, exc.hint, getattr(exc, "retry_after_s", None)
    )


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    if any(e.get("type") == "json_invalid" for e in errors):
        return _json_error(400, "malformed_json", "the request body is not valid JSON")
    parts = []
    for err in errors[:5]:
        where = ".".join(str(p) for p in err.get("loc", ())) or "<request>"
        parts.append(f"{where}: {err.get('msg', 'invalid')}")
    return _json_error(422, "invalid_input", "; ".join(parts) or "invalid request")


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    code = _HTTP_CODES.get(exc.status_code, "http_error")
    detail = exc.detail if isinstance(exc.detail, str) else code.replace("_", " ")
    response = _json_error(exc.status_code, code, detail)
    for key, value in (exc.headers or {}).items():
        response.headers[key] = value
    return response


def create_app(settings: CloudSettings, *, services: CloudServices | None = None) -> FastAPI:
    """The app; it builds its services from `settings` unless given them (then it starts
    them but leaves closing to whoever built them)."""
    owned = services is None
    services = services or CloudServices.build(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        services.start()
        try:
            yield
        finally:
            if owned:
                services.close()

    app = FastAPI(
        title="edgefleet cloud orchestrator",
        version="1",
        lifespan=lifespan,
        description="Escalations, inference, feedback, export, fleet. Auth: "
        "`Authorization: Bearer <device token | operator API key>`.",
    )
    app.state.services = services
    app.state.settings = settings
    app.add_exception_handler(EdgefleetError, _edgefleet_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_middleware(JsonDepthMiddleware)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.http.max_upload_bytes)
    app.add_middleware(TraceMiddleware)  # added last = outermost
    app.include_router(escalations.router)
    app.include_router(infer.router)
    app.include_router(feedback.router)
    app.include_router(health.router)
    if services.fleet_registry is not None:
        _include_fleet(app, services)
    # FastAPI's documented way to customise the schema is to replace the method
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    return app


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's schema, with its default 422 body (`detail`) replaced by ours: every
    error here answers `{"error": {"code", "message", "trace_id"}}` (ErrorResponse, which
    the escalation routes already put in the components)."""
    if app.openapi_schema is None:
        schema = get_openapi(
            title=app.title, version=app.version, description=app.description, routes=app.routes
        )
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        ours = {"$ref": "#/components/schemas/ErrorResponse"}
        for path in schema.get("paths", {}).values():
            for operation in path.values():
                answer = operation.get("responses", {}).get("422")
                if answer is not None:
                    answer["description"] = "invalid input"
                    answer["content"] = {"application/json": {"schema": ours}}
        for name in ("HTTPValidationError", "ValidationError"):
            components.pop(name, None)
        app.openapi_schema = schema
    return app.openapi_schema


def _include_fleet(app: FastAPI, services: CloudServices) -> None:
    """The fleet's routes (/v1/devices*, /v1/deployments*, /v1/models*, the dashboard)."""
    app.include_router(
        build_router(
            services.fleet_registry,
            services.rollouts,
            require_operator,
            recent_cases=services.store.lookup.recent_cases,
            drift=services.drift.latest_json,
            model_store=services.model_store,
            events_interval_s=services.settings.http.events_interval_s,
            is_operator=services.auth.is_operator,
        )
    )
