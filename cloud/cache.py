"""Verdict cache keyed by (image sha256, model version, route).

Only results that would come out the same again are kept: those of a deterministic model
level (primary or lighter, never rules or busy) whose every line is confident. The model
version is part of the key, and a new version also drops every entry of the old one, so a
model update can never serve a stale answer. Bounded by count and bytes (least recently
used out first), reported as `ef_bounded_*{name="verdict_cache"}`.
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass

from prometheus_client import Counter

from edgefleet.shared.bounded import ENTRY_OVERHEAD, BoundedMap
from edgefleet.shared.messages import Detection, Sha256

CACHE_LOOKUPS = Counter("ef_cloud_cache_lookups_total", "Verdict cache lookups", ["result"])


@dataclass(frozen=True)
class CacheKey:
    image_sha256: Sha256
    model: str  # name@version
    route: str


@dataclass(frozen=True)
class Cached:
    result: tuple[Detection, ...]
    model: str
    fallback_level: int
    lines_unread: int = 0


def _entry_bytes(key: CacheKey, value: Cached) -> int:
    """Estimated memory of one entry: the key's strings and each line's objects."""
    lines = sum(
        _DETECTION_BYTES + sys.getsizeof(d.text or "") + _POINT_BYTES * len(d.polygon or ())
        for d in value.result
    )
    return (
        ENTRY_OVERHEAD
        + sys.getsizeof(key.image_sha256)
        + sys.getsizeof(key.model) * 2  # the key's and the value's
        + sys.getsizeof(key.route)
        + lines
    )


# One Detection with a box (1,096 bytes) and each polygon point (~112 bytes), measured with
# tracemalloc over 20,000 of them on CPython 3.11.
_DETECTION_BYTES = 1100
_POINT_BYTES = 112


class VerdictCache:
    def __init__(self, size: int, min_score: float, max_bytes: int = 64 * 2**20):
        self._min_score = min_score
        self._items: BoundedMap[CacheKey, Cached] = BoundedMap(
            "verdict_cache",
            max_entries=size,
            max_bytes=max_bytes,
            size_of=_entry_bytes,
            touch=True,
        )
        self._lock = threading.Lock()
        self._versions: dict[str, str] = {}  # model name -> version seen last

    def get(self, key: CacheKey) -> Cached | None:
        if self._items.max_entries == 0:
            return None
        hit = self._items.get(key)
        CACHE_LOOKUPS.labels("hit" if hit else "miss").inc()
        return hit

    def cacheable(self, result: list[Detection], fallback_level: int) -> bool:
        return fallback_level <= 1 and all(d.score >= self._min_score for d in result)

    def put(self, key: CacheKey, value: Cached) -> bool:
        """Store if cacheable; True if stored."""
        if not self.cacheable(list(value.result), value.fallback_level):
            return False
        return self._items.put(key, value)

    def model_version(self, name: str, version: str) -> None:
        """Tell the cache which version of `name` is loaded; a change drops older entries."""
        with self._lock:
            previous = self._versions.get(name)
            self._versions[name] = version
        if previous is None or previous == version:
            return
        stale = f"{name}@{previous}"
        self._items.drop_where(lambda key, _: key.model == stale)

    @property
    def bytes(self) -> int:
        return self._items.bytes

    def __len__(self) -> int:
        return len(self._items)
