"""Which outbox rows the uplink publishes next: live first, an outage's backlog paced.

The state machine of the uplink's sender, apart from MQTT so it can be driven with an
injected clock:

- `connected()` starts a segment: rows stored until now (and not in flight) are backlog,
  rows stored from now on are live;
- `next_batch()` gives stale in-flight rows back (no PUBACK within `resend_after_s`), then
  every live row the in-flight window allows, then backlog rows as replay tokens allow
  (`replay_rate_per_s`, at most one second's worth saved up);
- `published()` records a row in flight under its MQTT message id; `acked()` settles
  PUBACKs: a good one removes the row from the outbox, a refused one sends it round again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from prometheus_client import Counter

from edgefleet.edge.outbox import Outbox, OutboxItem
from edgefleet.edge.outbox_tally import OutboxKind

log = logging.getLogger(__name__)

NACKED = Counter("ef_edge_uplink_nacked_total", "PUBACKs with a failure reason code", ["reason"])
RESENT = Counter("ef_edge_uplink_resent_total", "Messages published again after a timeout")

_BATCH = 64


@dataclass
class _InFlight:
    row_id: int
    kind: OutboxKind
    sent_at: float


class Delivery:
    """Owned by the uplink's sender thread (not thread-safe); the outbox is."""

    def __init__(
        self,
        outbox: Outbox,
        *,
        replay_rate_per_s: float,
        resend_after_s: float,
        max_inflight: int,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.outbox = outbox
        self.replay_rate_per_s = replay_rate_per_s
        self.resend_after_s = resend_after_s
        self.max_inflight = max_inflight
        self.sent: dict[OutboxKind, int] = {}
        self._clock = clock
        self._inflight: dict[int, _InFlight] = {}  # MQTT message id -> row
        self._inflight_rows: set[int] = set()
        self._live_after = outbox.max_id()  # rows above this are live
        self._backlog_cursor = 0  # rows in (cursor, live_after] are backlog still to send
        self._tokens = 0.0
        self._refilled_at = clock()

    @property
    def inflight(self) -> int:
        return len(self._inflight)

    def connected(self) -> None:
        """A (re)connect: what is stored but not in flight is backlog; paho resends what
        was in flight, so its resend clock starts again."""
        self._live_after = max(self._live_after, self.outbox.max_id())
        self._backlog_cursor = 0
        now = self._clock()
        for entry in self._inflight.values():
            entry.sent_at = now

    def next_batch(self) -> list[OutboxItem]:
        """The rows to publish now, live before backlog, within the in-flight window."""
        now = self._clock()
        self._refill(now)
        self._give_back_stale(now)
        window = self.max_inflight - len(self._inflight)
        if window <= 0:
            return []
        live = self.outbox.read(self._live_after, limit=min(_BATCH, window))
        if live:
            self._live_after = live[-1].id
            return live
        return self._backlog(window)

    def published(self, item: OutboxItem, mid: int, qos: int) -> None:
        """`item` was handed to the client; at QoS 0 it is done, at QoS 1 it awaits PUBACK."""
        if qos == 0:
            self.outbox.ack([item.id])
            self._count_sent(item.kind)
            return
        self._inflight[mid] = _InFlight(item.id, item.kind, self._clock())
        self._inflight_rows.add(item.id)

    def not_published(self, item: OutboxItem) -> None:
        """The client refused the publish: the row goes round again as backlog."""
        self._requeue(item.id)

    def acked(self, acks: Iterable[tuple[int, bool, str]]) -> None:
        """PUBACKs as (mid, ok, reason): good ones remove their rows (one transaction),
        refused ones go round again; unknown message ids are ignored."""
        done: list[int] = []
        for mid, ok, reason in acks:
            entry = self._inflight.pop(mid, None)
            if entry is None:
                continue
            self._inflight_rows.discard(entry.row_id)
            if ok:
                done.append(entry.row_id)
                self._count_sent(entry.kind)
            else:
                NACKED.labels(reason).inc()
                log.warning(
                    "broker refused %s %d: %s; will retry", entry.kind, entry.row_id, reason
                )
                self._requeue(entry.row_id)
        self.outbox.ack(done)

    # --- inside ------------------------------------------------------------------------

    def _refill(self, now: float) -> None:
        rate = self.replay_rate_per_s
        self._tokens = min(rate, self._tokens + (now - self._refilled_at) * rate)
        self._refilled_at = now

    def _backlog(self, window: int) -> list[OutboxItem]:
        batch: list[OutboxItem] = []
        while self._backlog_cursor < self._live_after and self._tokens >= 1 and window > 0:
            limit = max(1, min(_BATCH, window, int(self._tokens)))
            items = self.outbox.read(self._backlog_cursor, self._live_after, limit=limit)
            if not items:
                self._backlog_cursor = self._live_after
                break
            for item in items:
                self._backlog_cursor = item.id
                if item.id in self._inflight_rows:
                    continue
                self._tokens -= 1
                window -= 1
                batch.append(item)
        return batch

    def _give_back_stale(self, now: float) -> None:
        for mid, entry in list(self._inflight.items()):
            if now - entry.sent_at > self.resend_after_s:
                del self._inflight[mid]
                self._inflight_rows.discard(entry.row_id)
                RESENT.inc()
                self._requeue(entry.row_id)

    def _requeue(self, row_id: int) -> None:
        self._backlog_cursor = min(self._backlog_cursor, row_id - 1)

    def _count_sent(self, kind: OutboxKind) -> None:
        self.sent[kind] = self.sent.get(kind, 0) + 1
