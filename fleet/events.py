"""The fleet's event log: operator-visible lines the dashboard's live feed shows.

Anything that acts on the fleet from outside the devices' own messages posts a line here
(`POST /v1/fleet/events`): `edgefleet demo` posts one per fault it saw (what, when, how
long until healthy again). Lines live in the store, so every replica's dashboard shows
the same feed; the SSE stream sends the new ones (`events` event) as they arrive.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from edgefleet.shared.db import Database
from edgefleet.shared.messages import utcnow

_SCHEMA = [
    """CREATE TABLE fleet_events (
        id {autoid},
        source TEXT NOT NULL,
        component TEXT NOT NULL,
        message TEXT NOT NULL,
        healthy_after_s {double},
        created_at {ts} NOT NULL
    )""",
]


class FleetEventIn(BaseModel):
    """An event line as posted by an operator tool."""

    model_config = ConfigDict(extra="forbid", strict=True)

    source: str = Field(min_length=1, max_length=32, description="who posts it, e.g. demo")
    component: str = Field(min_length=1, max_length=64, description="what it is about")
    message: str = Field(min_length=1, max_length=500, description="the line to show")
    healthy_after_s: float | None = Field(
        None, ge=0, description="seconds until the component was healthy again, if known"
    )


class FleetEvent(FleetEventIn):
    id: int
    created_at: datetime


class EventLog:
    """The newest `keep` lines (a history bounded by count: a script posting in a loop
    cannot fill the database)."""

    def __init__(self, db: Database, keep: int = 10_000):
        self.db = db
        self.keep = keep
        t = db.types
        db.migrate(
            "fleet_events_v1",
            [s.format(autoid=t.autoid, double=t.double, ts=t.timestamp) for s in _SCHEMA],
        )

    def add(self, event: FleetEventIn) -> None:
        self.db.execute(
            """INSERT INTO fleet_events (source, component, message, healthy_after_s, created_at)
               VALUES (?, ?, ?, ?, ?)""",
            (event.source, event.component, event.message, event.healthy_after_s, utcnow()),
        )
        self.db.execute(
            "DELETE FROM fleet_events WHERE id <= (SELECT max(id) FROM fleet_events) - ?",
            (self.keep,),
        )

    def recent(self, limit: int = 50, after_id: int = 0) -> list[FleetEvent]:
        """The newest `limit` lines with an id above `after_id`, oldest first."""
        rows = self.db.query(
            """SELECT id, source, component, message, healthy_after_s, created_at
               FROM fleet_events WHERE id > ? ORDER BY id DESC LIMIT ?""",
            (after_id, limit),
        )
        return [FleetEvent.model_validate(row, strict=False) for row in reversed(rows)]
