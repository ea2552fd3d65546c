"""POST /v1/infer/{model}: synchronous inference on one image, for direct clients.

There is no fallback here (the caller asked for this model): a timeout is a 504.
"""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel

from edgefleet.cloud.api.deps import error_responses, require_media_type, services
from edgefleet.cloud.auth import Principal, require_device_or_operator
from edgefleet.shared.errors import ImageRejected, ModelNotFound
from edgefleet.shared.imaging.headers import MEDIA_TYPES
from edgefleet.shared.messages import Detection, Sha256

router = APIRouter(prefix="/v1/infer", tags=["inference"])


class InferResult(BaseModel):
    model: str
    sha256: Sha256 | None
    backend: str | None
    result: list[Detection]
    latency_ms: float
    trace_id: str


@router.post(
    "/{model}",
    summary="run one served model on one image (raw JPEG, PNG, BMP, WebP or TIFF body)",
    response_model=InferResult,
    responses=error_responses(
        e400="an image that will not decode",
        e401="missing or unknown bearer token",
        e404="model not served",
        e413="image too large, or one that would take too many bytes to decode",
        e415="not an image body the decoder reads (JPEG, PNG, BMP, WebP, TIFF)",
        e429="model queue full; retry after Retry-After",
        e503="decode budget full, model closed or store unavailable; retry after Retry-After",
        e504="inference timed out (this endpoint has no fallback)",
    ),
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                kind: {"schema": {"type": "string", "format": "binary"}} for kind in MEDIA_TYPES
            },
        }
    },
)
async def infer(
    request: Request,
    model: Annotated[str, Path(max_length=128)],
    principal: Annotated[Principal, Depends(require_device_or_operator)],
    timeout_s: Annotated[float | None, Query(gt=0, le=300)] = None,
) -> InferResult:
    svc = services(request)
    if model not in svc.pool.names:
        raise ModelNotFound(f"model {model!r} is not served; served: {', '.join(svc.pool.names)}")
    require_media_type(request, *MEDIA_TYPES)
    body = await request.body()
    if not body:
        raise ImageRejected("empty body: send the image bytes")
    rgb = await run_in_threadpool(svc.decode, body)
    started = time.perf_counter()
    result = await svc.pool.call_async(
        model,
        rgb,
        timeout_s or svc.settings.models.timeout_s,
        priority=svc.settings.models.infer_priority,
        # a device's calls share its turn and its share of the queue with its escalations
        tenant=principal.id if principal.kind == "device" else principal.label,
    )
    info = svc.pool.get(model).info
    return InferResult(
        model=f"{info.name}@{info.version}",
        sha256=info.sha256,
        backend=info.backend,
        result=result,
        latency_ms=round((time.perf_counter() - started) * 1000, 3),
        trace_id=request.state.trace_id,
    )
