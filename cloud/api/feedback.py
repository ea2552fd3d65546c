"""POST /v1/feedback (signed) and GET /v1/export?format=jsonl (streamed training set)."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from edgefleet.cloud.api.deps import parse_json_object, require_media_type, services, validate_model
from edgefleet.cloud.auth import (
    SIGNATURE_HEADER,
    Principal,
    require_device_or_operator,
    require_operator,
)
from edgefleet.shared.errors import NotFound
from edgefleet.shared.messages import CaseId, DeviceId, Feedback, TraceId

router = APIRouter(tags=["feedback"])


class FeedbackIn(BaseModel):
    """The body of POST /v1/feedback; sign its exact bytes (see edgefleet.cloud.auth)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    case_id: CaseId
    label: str = Field(max_length=4096, description="the right answer (e.g. the text)")
    correct: bool = Field(description="whether the cloud verdict was right")
    author: str | None = Field(None, max_length=128)
    trace_id: TraceId | None = None
    device_id: DeviceId | None = Field(
        None,
        description="the device that sent the case (case ids are per device): an operator "
        "names it when several devices sent the same id; a device's feedback is on its own",
    )


class FeedbackStored(BaseModel):
    case_id: CaseId
    status: Literal["stored"]


@router.post(
    "/v1/feedback",
    status_code=201,
    response_model=FeedbackStored,
    summary="label or correct a case; body signed with X-EF-Signature: sha256=<hmac hex>",
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": FeedbackIn.model_json_schema()}},
        },
        "parameters": [
            {
                "name": SIGNATURE_HEADER,
                "in": "header",
                "required": True,
                "schema": {"type": "string"},
                "description": "sha256=<hex HMAC-SHA256 of the body>",
            }
        ],
    },
)
async def post_feedback(
    request: Request, principal: Annotated[Principal, Depends(require_device_or_operator)]
) -> FeedbackStored:
    svc = services(request)
    require_media_type(request, "application/json")
    body = await request.body()
    signature = svc.auth.verify_body(principal, body, request.headers.get(SIGNATURE_HEADER))
    data = validate_model(FeedbackIn, parse_json_object(body, "body"), "body")
    # a device gives feedback on its own cases only: another's id is the same 404 as none
    scope = principal.id if principal.kind == "device" else data.device_id
    device_id = await run_in_threadpool(
        functools.partial(svc.store.lookup.case_device, device_id=scope), data.case_id
    )
    if device_id is None:
        raise NotFound(f"no case {data.case_id!r}")
    feedback = Feedback(
        device_id=device_id,
        case_id=data.case_id,
        label=data.label,
        correct=data.correct,
        author=data.author or principal.label,
        trace_id=data.trace_id or request.state.trace_id,
    )
    await run_in_threadpool(
        svc.store.feedback.add, feedback, principal=principal.label, signature=signature
    )
    return FeedbackStored(case_id=data.case_id, status="stored")


@router.get(
    "/v1/export",
    summary="the feedback store as a training set (JSON lines, streamed)",
    response_class=StreamingResponse,
    responses={200: {"content": {"application/x-ndjson": {}}}},
)
def export(
    request: Request,
    _: Annotated[Principal, Depends(require_operator)],
    format: Annotated[Literal["jsonl"], Query(description="only jsonl")] = "jsonl",
) -> StreamingResponse:
    store = services(request).store

    def lines() -> Iterator[bytes]:
        for record in store.feedback.export():
            yield (record.to_json() + "\n").encode()

    return StreamingResponse(lines(), media_type="application/x-ndjson")
