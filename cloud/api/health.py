"""Liveness, readiness, metrics and drift."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from edgefleet.cloud.api.deps import services
from edgefleet.cloud.auth import Principal, require_operator

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="liveness: the process answers")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get(
    "/readyz",
    summary="readiness: models warmed, broker connected, store writable (503 with reasons)",
    responses={503: {"description": "not ready; `reasons` says why"}},
)
def readyz(request: Request) -> JSONResponse:
    ready, body = services(request).readiness()
    headers = {} if ready else {"Retry-After": "5"}
    return JSONResponse(body, status_code=200 if ready else 503, headers=headers)


@router.get("/metrics", summary="Prometheus metrics", response_class=Response)
def metrics() -> Response:
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)


@router.get("/v1/drift", summary="edge score drift (KS) per device and model")
def drift(
    request: Request, device_id: str | None = None, _: Principal = Depends(require_operator)
) -> list[dict[str, Any]]:
    return services(request).drift.latest_json(device_id)
