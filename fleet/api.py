"""The fleet's REST routes, live event stream, model downloads and the dashboard page.

`build_router` is included by the cloud app (which maps EdgefleetError to JSON errors in
its one handler).

Live updates: one SSE stream per dashboard (`GET /v1/events`). Every `interval_s` it
sends one `devices` event with all devices changed since the last one (a batch, not a
message per telemetry sample) and a `deployments` event when rollout progress changed.
The change feed is read from the database (`updated_at`), so it works with several
orchestrator replicas writing to one store; so are the fleet event log's lines (`events`,
edgefleet.fleet.events).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import re
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from anyio import to_thread
from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response, StreamingResponse
from pydantic import ValidationError
from sse_starlette.sse import EventSourceResponse

from edgefleet.fleet.deployment import parse_request
from edgefleet.fleet.events import EventLog, FleetEventIn
from edgefleet.fleet.models import ModelStore, capability, not_found
from edgefleet.fleet.registry import DeviceRegistry
from edgefleet.fleet.rollout import RolloutController
from edgefleet.shared.errors import AuthError, InvalidInput, NotFound
from edgefleet.shared.hashing import same_hex
from edgefleet.shared.jsondepth import MAX_DEPTH, too_deep

log = logging.getLogger(__name__)

DASHBOARD_DIR = Path(__file__).parent / "dashboard"
ASSETS = {"dashboard.js": "text/javascript", "dashboard.css": "text/css"}
_RANGE_RE = re.compile(r"^bytes=(\d*)-(\d*)$")
_FULL_REFRESH_TICKS = 30  # rebuild the rollout views at least this often on a live stream


def build_router(
    registry: DeviceRegistry,
    rollouts: RolloutController,
    require_operator: Callable[..., Any],
    *,
    recent_cases: Callable[[int], list[dict[str, Any]]] | None = None,
    drift: Callable[[str], list[dict[str, Any]]] | None = None,
    model_store: ModelStore | None = None,
    events_interval_s: float = 1.0,
    is_operator: Callable[[str], bool] = lambda token: False,
) -> APIRouter:
    """Routes of the fleet: devices, deployments, models, events and the dashboard.
    `is_operator` tells an operator's bearer token, which may download any model."""
    router = APIRouter()
    operator = [Depends(require_operator)]
    event_log = EventLog(registry.db)

    @router.get("/", include_in_schema=False)
    def dashboard() -> HTMLResponse:
        return HTMLResponse((DASHBOARD_DIR / "index.html").read_text())

    @router.get("/fleet/assets/{name}", include_in_schema=False)
    def asset(name: str) -> FileResponse:
        if name not in ASSETS:
            raise NotFound(f"no dashboard asset {name!r}")
        return FileResponse(DASHBOARD_DIR / name, media_type=ASSETS[name])

    @router.get("/v1/devices", dependencies=operator, tags=["fleet"])
    def devices(group: str | None = None) -> dict[str, Any]:
        found = registry.list_devices(group)
        return {"count": len(found), "devices": [d.model_dump(mode="json") for d in found]}

    @router.get("/v1/devices/{device_id}", dependencies=operator, tags=["fleet"])
    def device(device_id: str) -> dict[str, Any]:
        view = registry.get_device(device_id).model_dump(mode="json")
        # edge score drift (KS, this week vs the reference window) per model, from the cloud
        view["drift"] = drift(device_id) if drift else []
        return view

    @router.get("/v1/devices/{device_id}/history", dependencies=operator, tags=["fleet"])
    def history(device_id: str, hours: float = Query(6.0, gt=0, le=168)) -> dict[str, Any]:
        points = registry.telemetry.history(device_id, hours=hours)
        return {"device_id": device_id, "points": [p.model_dump(mode="json") for p in points]}

    @router.get("/v1/groups", dependencies=operator, tags=["fleet"])
    def groups() -> dict[str, Any]:
        return {"groups": registry.groups()}

    @router.post("/v1/deployments", dependencies=operator, status_code=201, tags=["fleet"])
    async def create_deployment(request: Request) -> JSONResponse:
        raw = await request.body()
        if too_deep(raw):  # whatever its content type said
            raise InvalidInput(f"the body nests deeper than {MAX_DEPTH} levels")
        try:
            body = json.loads(raw or b"null")
        except ValueError:
            raise InvalidInput("the body is not JSON") from None
        req = parse_request(body)
        view = await to_thread.run_sync(rollouts.create, req)
        return JSONResponse(view.model_dump(mode="json"), status_code=201)

    @router.get("/v1/deployments", dependencies=operator, tags=["fleet"])
    def deployments(limit: int = Query(20, ge=1, le=200)) -> dict[str, Any]:
        return {"deployments": [d.model_dump(mode="json") for d in rollouts.list(limit)]}

    @router.get("/v1/deployments/{deployment_id}", dependencies=operator, tags=["fleet"])
    def deployment(deployment_id: str) -> dict[str, Any]:
        return rollouts.get(deployment_id).model_dump(mode="json")

    @router.delete("/v1/deployments/{deployment_id}", dependencies=operator, tags=["fleet"])
    async def cancel_deployment(deployment_id: str) -> dict[str, Any]:
        """Roll an active deployment back (409 once it has ended)."""
        view = await to_thread.run_sync(rollouts.cancel, deployment_id)
        return view.model_dump(mode="json")

    @router.post("/v1/fleet/events", dependencies=operator, status_code=201, tags=["fleet"])
    async def post_event(request: Request) -> dict[str, Any]:
        """Add a line to the fleet's event log (e.g. a fault `edgefleet demo --chaos` saw)."""
        try:
            event = FleetEventIn.model_validate_json(await request.body())
        except ValidationError as exc:
            raise InvalidInput(f"not a fleet event: {exc.errors()[0]['msg']}") from None
        await to_thread.run_sync(event_log.add, event)
        return {"status": "stored"}

    @router.get("/v1/fleet/events", dependencies=operator, tags=["fleet"])
    def list_events(limit: int = Query(50, ge=1, le=500)) -> dict[str, Any]:
        return {"events": [e.model_dump(mode="json") for e in event_log.recent(limit)]}

    @router.get("/v1/fleet/cases", dependencies=operator, tags=["fleet"])
    def cases(limit: int = Query(20, ge=1, le=200)) -> dict[str, Any]:
        return {"cases": recent_cases(limit) if recent_cases else []}

    @router.get("/v1/models/{name}/{version}", tags=["fleet"])
    def model_file(
        name: str,
        version: str,
        request: Request,
        device: str | None = None,
        sig: str | None = None,
    ) -> Response:
        device_id = _authorize_download(registry, request, name, version, device, sig, is_operator)
        if model_store is None:
            raise NotFound("this server has no model store")
        stored = model_store.get(name, version)
        # a device downloads only its own deployments' models; one it may not have looks
        # exactly like one that does not exist, so names cannot be probed
        if device_id is not None and not rollouts.book.deployed_to(device_id, name, version):
            raise not_found(name, version)
        return _ranged_file(stored.path, stored.size, request.headers.get("range"))

    @router.get("/v1/events", dependencies=operator, tags=["fleet"])
    async def events(request: Request) -> EventSourceResponse:
        return EventSourceResponse(
            _event_stream(request, registry, rollouts, event_log, events_interval_s), ping=15
        )

    return router


def _authorize_download(
    registry: DeviceRegistry,
    request: Request,
    name: str,
    version: str,
    device: str | None,
    sig: str | None,
    is_operator: Callable[[str], bool],
) -> str | None:
    """A device proves itself by its URL capability or its REST bearer token; the device,
    or None for an operator."""
    if device and sig:
        key = registry.device_key(device)
        if key is not None and same_hex(sig, capability(key, name, version)):
            return device
        raise AuthError("the download link is not valid for this device", code="bad_capability")
    scheme, _, token = (request.headers.get("authorization") or "").partition(" ")
    token = token.strip() if scheme.lower() == "bearer" else ""
    if token and is_operator(token):
        return None
    device_id = registry.authenticate_token(token) if token else None
    if device_id is None:
        raise AuthError("model downloads need the device's link or bearer token")
    return device_id


def _ranged_file(path: Path, size: int, range_header: str | None) -> Response:
    """The file, or one byte range of it (RFC 9110) so interrupted downloads resume."""
    headers = {
        "Accept-Ranges": "bytes",
        "Content-Disposition": f'attachment; filename="{path.name}"',
    }
    start, end = 0, size - 1
    status = 200
    if range_header:
        match = _RANGE_RE.match(range_header.strip())
        if not match or (match.group(1) == "" and match.group(2) == ""):
            raise InvalidInput(f"unsupported Range {range_header!r}; send bytes=START-[END]")
        if match.group(1) == "":  # suffix: the last N bytes
            start = max(0, size - int(match.group(2)))
        else:
            start = int(match.group(1))
            if match.group(2):
                end = min(end, int(match.group(2)))
        if start >= size or start > end:
            return Response(
                status_code=416, headers={**headers, "Content-Range": f"bytes */{size}"}
            )
        status = 206
        headers["Content-Range"] = f"bytes {start}-{end}/{size}"
    headers["Content-Length"] = str(end - start + 1)

    def chunks() -> Iterator[bytes]:
        with open(path, "rb") as fh:
            fh.seek(start)
            left = end - start + 1
            while left > 0:
                block = fh.read(min(1 << 16, left))
                if not block:
                    return
                left -= len(block)
                yield block

    return StreamingResponse(
        chunks(), status_code=status, headers=headers, media_type="application/octet-stream"
    )


async def _event_stream(
    request: Request,
    registry: DeviceRegistry,
    rollouts: RolloutController,
    event_log: EventLog,
    interval_s: float,
) -> AsyncIterator[dict[str, str]]:
    """Batched changes: devices updated since the last batch, rollout progress when it moves,
    event-log lines as they are added."""
    cursor = datetime.now(timezone.utc) - timedelta(seconds=1)
    sent: dict[str, datetime] = {}
    last_deployments = ""
    last_marker: tuple[Any, ...] | None = None
    ticks = 0
    # the log's position before `hello`: a line added once the client has `hello` is sent
    latest = await to_thread.run_sync(event_log.recent, 1)
    last_event = latest[-1].id if latest else 0
    yield {"event": "hello", "data": json.dumps({"interval_s": interval_s})}
    while not await request.is_disconnected():
        lines = await to_thread.run_sync(functools.partial(event_log.recent, 100, last_event))
        if lines:
            last_event = lines[-1].id
            yield {
                "event": "events",
                "data": json.dumps([e.model_dump(mode="json") for e in lines]),
            }
        # a small overlap catches rows committed just after the previous read;
        # `sent` drops the repeats
        since = cursor - timedelta(seconds=2)
        changed = await to_thread.run_sync(
            functools.partial(registry.list_devices, None, updated_since=since)
        )
        fresh = [d for d in changed if sent.get(d.device_id) != d.updated_at]
        # only rows inside the overlap can come back: the rest are forgotten, so what one
        # dashboard connection remembers is bounded by one interval's changes, not the fleet
        sent = {k: at for k, at in sent.items() if at >= since}
        if fresh:
            for d in fresh:
                sent[d.device_id] = d.updated_at
            cursor = max(cursor, *(d.updated_at for d in fresh))
            payload = [d.model_dump(mode="json") for d in fresh]
            yield {"event": "devices", "data": json.dumps(payload)}
        # the views of big rollouts cost tens of ms to build: only when the marker moves
        # (and now and then regardless, should replica clocks disagree)
        marker = await to_thread.run_sync(rollouts.book.progress_marker, 10)
        ticks += 1
        if marker != last_marker or ticks >= _FULL_REFRESH_TICKS:
            last_marker, ticks = marker, 0
            deps = await to_thread.run_sync(lambda: rollouts.list(10))
            deps_json = json.dumps([d.model_dump(mode="json") for d in deps])
            if deps_json != last_deployments:
                last_deployments = deps_json
                yield {"event": "deployments", "data": deps_json}
        await asyncio.sleep(interval_s)
