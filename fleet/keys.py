"""Device HMAC keys, unsealed from the registry's rows and cached.

A revoke or re-enroll made by another process (the `fleet` CLI, another replica) must bite
in every running replica within `cache_s`: cached keys are kept until their device's key
changes, found by one indexed query every `cache_s` (a per-key expiry that short would send
every message of a device reporting every 5 s to the store). The backstop expiry only
limits a change missed through a clock far off.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta

from edgefleet.fleet.credentials import KeySealer
from edgefleet.shared.bounded import ENTRY_OVERHEAD, BoundedMap
from edgefleet.shared.db import Database
from edgefleet.shared.messages import utcnow

# A change is looked for with this much lookback (another host's clock, a commit still
# open), and a key is read again after the backstop at the latest.
KEY_CHANGE_MARGIN_S = 120.0
KEY_BACKSTOP_S = 600.0
# A cached key: the device id (~60 bytes as a str) and the 32-byte key (65 as bytes).
_KEY_ENTRY_BYTES = ENTRY_OVERHEAD + 180


class DeviceKeys:
    def __init__(
        self,
        db: Database,
        sealer: KeySealer,
        *,
        cache_s: float = 5.0,
        max_entries: int = 100_000,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.db = db
        self.sealer = sealer
        self.cache_s = cache_s
        self._clock = clock
        self._checked = clock()
        self._since = utcnow()
        self._checking = threading.Lock()
        # device id -> (key, key_changed_at of the row it was read from)
        self._cache: BoundedMap[str, tuple[bytes, datetime | None]] = BoundedMap(
            "device_keys",
            max_entries=max_entries,
            max_bytes=max_entries * _KEY_ENTRY_BYTES,
            size_of=lambda device_id, key: _KEY_ENTRY_BYTES,
            ttl_s=KEY_BACKSTOP_S,
            clock=clock,
        )

    def get(self, device_id: str) -> bytes | None:
        """The HMAC key of an enrolled, unrevoked device; None otherwise (cached until it
        changes)."""
        self._forget_changed()
        cached = self._cache.get(device_id)
        if cached is not None:
            return cached[0]
        row = self.db.query_one(
            "SELECT key_sealed, key_changed_at FROM fleet_devices "
            "WHERE device_id = ? AND revoked_at IS NULL",
            (device_id,),
        )
        if row is None or not row["key_sealed"]:
            return None
        key = self.sealer.unseal(row["key_sealed"])
        self._cache.put(device_id, (key, row["key_changed_at"]))
        return key

    def load(self) -> int:
        """Fill the cache with every active device's key (as many as it holds) in one
        query: a replica starting under a fleet's traffic would otherwise read each device's
        key alone. Returns how many it holds."""
        self._checked, self._since = self._clock(), utcnow()
        rows = self.db.query(
            "SELECT device_id, key_sealed, key_changed_at FROM fleet_devices "
            "WHERE revoked_at IS NULL AND key_sealed IS NOT NULL ORDER BY device_id LIMIT ?",
            (self._cache.max_entries,),
        )
        for row in rows:
            key = self.sealer.unseal(row["key_sealed"])
            self._cache.put(row["device_id"], (key, row["key_changed_at"]))
        return len(rows)

    def remember(self, device_id: str, key: bytes, changed_at: datetime) -> None:
        """A key this process just wrote (an enrollment)."""
        self._cache.put(device_id, (key, changed_at))

    def forget(self, device_id: str) -> None:
        """A key this process just dropped (a revoke)."""
        self._cache.pop(device_id)

    def _forget_changed(self) -> None:
        """Every `cache_s`, drop the cached keys of devices enrolled or revoked since
        they were read. It looks back a margin before the last look (another host's clock,
        a commit still open); a change already read is recognised by its time."""
        if self._clock() - self._checked < self.cache_s:
            return
        if not self._checking.acquire(blocking=False):
            return  # another thread is looking; this lookup uses the cache as it is
        try:
            checked, now = self._clock(), utcnow()
            rows = self.db.query(
                "SELECT device_id, key_changed_at FROM fleet_devices WHERE key_changed_at > ?",
                (self._since - timedelta(seconds=KEY_CHANGE_MARGIN_S),),
            )
            for row in rows:
                cached = self._cache.get(row["device_id"])
                if cached is not None and cached[1] != row["key_changed_at"]:
                    self._cache.pop(row["device_id"])
            self._checked, self._since = checked, now
        finally:
            self._checking.release()
