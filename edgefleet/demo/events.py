"""The demo's incidents on the dashboard: each closed one is posted to the fleet's event
log (`POST /v1/fleet/events`), which the dashboard's live feed shows."""

from __future__ import annotations

import logging
from typing import Any

from edgefleet.demo.supervisor import Incident

log = logging.getLogger(__name__)


def post_incident(http: Any, incident: Incident) -> None:
    """Post the event line; a cloud that cannot take it now costs the line, not the demo."""
    import httpx

    body = {
        "source": "demo",
        "component": incident.component,
        "message": incident.line(),
        "healthy_after_s": incident.healthy_after_s,
    }
    try:
        http.post("/v1/fleet/events", json=body).raise_for_status()
    except httpx.HTTPError as exc:
        log.warning("the dashboard did not take the event %r: %s", incident.line(), exc)
