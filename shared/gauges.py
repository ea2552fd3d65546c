"""Gauges read from the live objects they describe, when scraped.

`Gauge.set_function` binds a gauge to one function: given by each new instance of a class,
the gauge reports only the newest one, and its closure keeps every instance it was given
alive. `observe` instead keeps the objects weakly and reports their readings combined
(summed: what a process holds in all its queues; or the largest: several views of one
store), so an object's reading leaves the gauge with the object.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from prometheus_client import Gauge

T = TypeVar("T")

# gauge -> its live owners and how each is read (a gauge that goes takes its entry along)
_SOURCES: weakref.WeakKeyDictionary[Gauge, weakref.WeakKeyDictionary[Any, Callable[[Any], float]]]
_SOURCES = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def observe(
    gauge: Gauge,
    owner: T,
    read: Callable[[T], float],
    *,
    combine: Callable[[Iterable[float]], float] = sum,
) -> None:
    """Report `read(owner)` on `gauge` while `owner` lives, combined with the readings of
    the other live owners of the same gauge. `read` must not hold `owner` itself."""
    with _LOCK:
        sources = _SOURCES.get(gauge)
        if sources is None:
            sources = weakref.WeakKeyDictionary()
            _SOURCES[gauge] = sources
            live = sources

            def value() -> float:
                with _LOCK:
                    readers = list(live.items())
                return float(combine([reader(obj) for obj, reader in readers] or [0.0]))

            gauge.set_function(value)
        sources[owner] = read
