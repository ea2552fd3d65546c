"""Small helpers the routers share."""

from __future__ import annotations

import json
from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel, Field, ValidationError

from edgefleet.cloud.services import CloudServices
from edgefleet.shared.errors import InvalidInput, UnsupportedMediaType
from edgefleet.shared.jsondepth import MAX_DEPTH, too_deep

M = TypeVar("M", bound=BaseModel)


class ErrorDetail(BaseModel):
    code: str = Field(description="stable machine-readable reason, e.g. duplicate_case")
    message: str
    trace_id: str | None = Field(description="W3C trace id of the request (also in the logs)")
    hint: str | None = Field(None, description="what to do about it, when there is advice")


class ErrorResponse(BaseModel):
    """The body of every 4xx/5xx answer."""

    error: ErrorDetail


def error_responses(**descriptions: str) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` for the given statuses (`e409="..."`), all with ErrorResponse."""
    return {
        int(status.removeprefix("e")): {"model": ErrorResponse, "description": text}
        for status, text in descriptions.items()
    }


def services(request: Request) -> CloudServices:
    found: CloudServices = request.app.state.services
    return found


def media_type(request: Request) -> str:
    return request.headers.get("content-type", "").split(";", 1)[0].strip().lower()


def require_media_type(request: Request, *allowed: str) -> str:
    kind = media_type(request)
    if kind not in allowed:
        raise UnsupportedMediaType(
            f"content type {kind or '(none)'!r} is not accepted here; send {' or '.join(allowed)}",
            hint=f"set Content-Type: {allowed[0]}",
        )
    return kind


class MalformedJson(InvalidInput):
    """A body or field that should be JSON and does not parse."""

    code = "malformed_json"
    http_status = 400


def parse_json_object(raw: str | bytes, what: str) -> dict[str, Any]:
    if too_deep(raw):
        raise InvalidInput(f"{what} nests deeper than {MAX_DEPTH} levels")
    try:
        value = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise MalformedJson(f"{what} is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise InvalidInput(f"{what} must be a JSON object")
    return value


def validate_model(model: type[M], data: dict[str, Any], what: str) -> M:
    """Strict validation in JSON mode (ISO timestamps as strings), errors as 422."""
    try:
        return model.model_validate_json(json.dumps(data))
    except ValidationError as exc:
        parts = []
        for err in exc.errors()[:5]:
            where = ".".join(str(p) for p in err["loc"]) or "<root>"
            parts.append(f"{what}.{where}: {err['msg']}")
        raise InvalidInput("; ".join(parts)) from None
