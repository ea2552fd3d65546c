"""POST /v1/escalations (multipart: image + metadata JSON), GET /v1/escalations/{id} and
GET /v1/escalations/{id}/image (the stored crop, for the dashboard's recent cases)."""

from __future__ import annotations

import asyncio
import functools
from concurrent.futures import Future
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, File, Form, Path, Query, Request, UploadFile
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse, JSONResponse
from pydantic import BaseModel, ValidationError

from edgefleet.cloud.api.deps import (
    error_responses,
    parse_json_object,
    require_media_type,
    services,
    validate_model,
)
from edgefleet.cloud.auth import Principal, require_device_or_operator, require_device_scope
from edgefleet.cloud.services import CloudServices
from edgefleet.shared.errors import EdgefleetError, NotFound, UnsupportedMediaType
from edgefleet.shared.imaging import sniff_format
from edgefleet.shared.messages import CaseId, CloudVerdict, EscalationCase

router = APIRouter(prefix="/v1/escalations", tags=["escalations"])

_IMAGE_TYPES = {"image/jpeg": "jpeg", "image/png": "png"}


class EscalationAccepted(BaseModel):
    case_id: CaseId
    status: Literal["queued", "processing"]
    trace_id: str


def multipart_only(request: Request) -> None:
    require_media_type(request, "multipart/form-data")


def read_case(
    metadata: str, *, trace_id: str, content_type: str, device_id: str | None
) -> tuple[EscalationCase, bytes | None]:
    """The case of a metadata part, and its JSON as received when that is what to store.

    A complete case is parsed once and stored as sent. One that leaves fields to the
    request (its device, the image part's content type, the request's trace id) gets them
    filled in, and is serialised once more when it is stored; bad metadata takes that
    path too, for its typed 400/422.
    """
    try:
        case = EscalationCase.model_validate_json(metadata)
    except ValidationError:
        pass
    else:
        if "trace_id" in case.model_fields_set:
            return case, metadata.encode()
        return case.model_copy(update={"trace_id": trace_id}), None
    meta = parse_json_object(metadata, "metadata")
    meta.setdefault("trace_id", trace_id)
    meta.setdefault("content_type", content_type)
    if device_id is not None:
        meta.setdefault("device_id", device_id)
    return validate_model(EscalationCase, meta, "metadata"), None


@router.post(
    "",
    status_code=202,
    summary="send a hard case; 202 with its case_id, or 200 with the verdict given ?wait=",
    description="Idempotent by `case_id`, like the MQTT ingest: a case is stored and run "
    "once. Over MQTT a redelivered case is answered again on the results topic; over REST "
    "the caller is there to be told, so a `case_id` already received is a 409 "
    "`duplicate_case` whose hint names `GET /v1/escalations/{case_id}` (the verdict). With "
    "`?wait=S` (capped by `http.max_wait_s`) the answer is 200 with the verdict, or 202 "
    "`processing` when S runs out first; the case still gets its verdict.",
    response_model=EscalationAccepted,
    responses={
        202: {"description": "queued (no ?wait=), or still processing when ?wait= ran out"},
        200: {"model": CloudVerdict, "description": "the verdict (with ?wait=)"},
        **error_responses(
            e400="malformed metadata JSON, or an image that will not decode",
            e401="missing or unknown bearer token",
            e403="a device sending for another device",
            e409="a case with this case_id was already received; GET it for the verdict",
            e413="upload too large, or an image that would take too many bytes to decode",
            e415="not multipart, or the image part is not the JPEG/PNG it claims",
            e422="metadata missing fields or with wrong types",
            e429="queue full; retry after Retry-After",
            e503="store unavailable or the decode budget full; retry after Retry-After",
        ),
    },
)
async def post_escalation(
    request: Request,
    _mp: Annotated[None, Depends(multipart_only)],
    principal: Annotated[Principal, Depends(require_device_or_operator)],
    image: Annotated[UploadFile, File(description="the crop or frame, JPEG or PNG")],
    metadata: Annotated[
        str, Form(description="EscalationCase JSON (ef.escalation/2 or /1), without the image")
    ],
    wait: Annotated[
        float | None, Query(ge=0, le=300, description="seconds to wait for the verdict")
    ] = None,
) -> Any:
    svc = services(request)
    # what the caller had refused this minute is charged to it: refusals are not free
    svc.refusals.check(principal.label)
    try:
        case, future = await _admit(svc, request, principal, image, metadata)
    except EdgefleetError:
        svc.refusals.charge(principal.label)
        raise
    accepted = EscalationAccepted(case_id=case.case_id, status="queued", trace_id=case.trace_id)
    if not wait:
        return accepted
    max_wait = min(wait, svc.settings.http.max_wait_s)
    loop = asyncio.get_running_loop()
    started = loop.time()
    try:
        verdict = await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(future)), max_wait)
    except (asyncio.TimeoutError, TimeoutError):
        verdict = None
    if verdict is None:
        left = max(0.0, max_wait - (loop.time() - started))
        verdict = await run_in_threadpool(
            functools.partial(svc.processor.wait_verdict, device_id=case.device_id),
            case.case_id,
            left,
        )
    if verdict is None:
        return JSONResponse(
            accepted.model_copy(update={"status": "processing"}).model_dump(), status_code=202
        )
    return JSONResponse(verdict.model_dump(mode="json"), status_code=200)


async def _admit(
    svc: CloudServices, request: Request, principal: Principal, image: UploadFile, metadata: str
) -> tuple[EscalationCase, Future[CloudVerdict | None]]:
    """Check the parts, then decode and claim the case in the processor's one admission
    step: typed 400/413/415 on a bad image, 409 for a case_id already received, 429 when
    the queue is full."""
    declared = (image.content_type or "").split(";", 1)[0].strip().lower()
    if declared not in _IMAGE_TYPES:
        raise UnsupportedMediaType(f"image part has content type {declared or '(none)'!r}")
    data = await image.read()
    case, as_received = read_case(
        metadata,
        trace_id=request.state.trace_id,
        content_type=declared,
        device_id=principal.id if principal.kind == "device" else None,
    )
    require_device_scope(principal, case.device_id)
    if case.content_type != declared:
        raise UnsupportedMediaType(
            f"metadata says {case.content_type} but the image part is {declared}"
        )
    if sniff_format(data) != _IMAGE_TYPES[declared]:
        raise UnsupportedMediaType(f"the image bytes are not a {declared} file")
    future = await run_in_threadpool(
        svc.processor.accept, case, data, source="rest", meta=as_received
    )
    return case, future


DeviceQuery = Annotated[
    str | None,
    Query(
        pattern=r"^[a-z0-9][a-z0-9-]{0,62}$",
        description="the device that sent the case (case ids are per device); an operator "
        "names it when several devices sent the same id; a device sees only its own",
    ),
]


def _scope(principal: Principal, device: str | None) -> str | None:
    """The device whose case a caller may read: a device's own, whatever it names (another
    device's id is the same 404 as an unknown one), or the one an operator names."""
    return principal.id if principal.kind == "device" else device


@router.get(
    "/{case_id}",
    summary="the case, its edge result, verdict and feedback",
    responses=error_responses(
        e404="no such case (for a device: none of its own)",
        e409="an operator's case id sent by several devices; name one with ?device=",
    ),
)
def get_escalation(
    request: Request,
    case_id: Annotated[str, Path(pattern=r"^[A-Za-z0-9_-]{8,64}$")],
    principal: Annotated[Principal, Depends(require_device_or_operator)],
    device: DeviceQuery = None,
) -> dict[str, Any]:
    return services(request).store.lookup.case(case_id, device_id=_scope(principal, device))


@router.get(
    "/{case_id}/image",
    summary="the case's stored image (JPEG or PNG, as it was sent)",
    response_class=FileResponse,
    responses={200: {"content": {"image/jpeg": {}, "image/png": {}}}},
)
def get_escalation_image(
    request: Request,
    case_id: Annotated[str, Path(pattern=r"^[A-Za-z0-9_-]{8,64}$")],
    principal: Annotated[Principal, Depends(require_device_or_operator)],
    device: DeviceQuery = None,
) -> FileResponse:
    _, path, content_type = services(request).store.lookup.case_image(
        case_id, device_id=_scope(principal, device)
    )
    if not path.is_file():
        raise NotFound(
            f"the image of case {case_id} is missing from the store",
            hint="restore data_dir/images from the backup",
        )
    return FileResponse(path, media_type=content_type)
