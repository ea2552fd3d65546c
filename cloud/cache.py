"""Verdict cache keyed by (image sha256, model version, route).

Only results that would come out the same again are kept: those of a deterministic model
level (primary or lighter, never rules or busy) whose every line is confident. The model
version is part of the key, and a new version also drops every entry of the old one, so a
model update can never serve a stale answer.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

from prometheus_client import Counter, Gauge

from edgefleet.shared.messages import Detection

CACHE_LOOKUPS = Counter("ef_cloud_cache_lookups_total", "Verdict cache lookups", ["result"])
CACHE_SIZE = Gauge("ef_cloud_cache_entries", "Verdicts in the cache")


@dataclass(frozen=True)
class CacheKey:
    image_sha256: str
    model: str  # name@version
    route: str


@dataclass(frozen=True)
class Cached:
    result: tuple[Detection, ...]
    model: str
    fallback_level: int


class VerdictCache:
    def __init__(self, size: int, min_score: float):
        self._size = size
        self._min_score = min_score
        self._items: OrderedDict[CacheKey, Cached] = OrderedDict()
        self._lock = threading.Lock()
        self._versions: dict[str, str] = {}  # model name -> version seen last

    def get(self, key: CacheKey) -> Cached | None:
        if self._size == 0:
            return None
        with self._lock:
            hit = self._items.get(key)
            if hit is not None:
                self._items.move_to_end(key)
        CACHE_LOOKUPS.labels("hit" if hit else "miss").inc()
        return hit

    def cacheable(self, result: list[Detection], fallback_level: int) -> bool:
        return fallback_level <= 1 and all(d.score >= self._min_score for d in result)

    def put(self, key: CacheKey, value: Cached) -> bool:
        """Store if cacheable; True if stored."""
        if self._size == 0 or not self.cacheable(list(value.result), value.fallback_level):
            return False
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self._size:
                self._items.popitem(last=False)
            CACHE_SIZE.set(len(self._items))
        return True

    def model_version(self, name: str, version: str) -> None:
        """Tell the cache which version of `name` is loaded; a change drops older entries."""
        with self._lock:
            previous = self._versions.get(name)
            self._versions[name] = version
            if previous is None or previous == version:
                return
            stale = f"{name}@{previous}"
            for key in [k for k in self._items if k.model == stale]:
                del self._items[key]
            CACHE_SIZE.set(len(self._items))

    def __len__(self) -> int:
        return len(self._items)
