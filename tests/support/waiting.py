"""Waiting for an event in a test: poll a condition until it holds, never a fixed sleep."""

from __future__ import annotations

import time
from collections.abc import Callable


def eventually(
    predicate: Callable[[], object],
    timeout_s: float = 60.0,
    what: str = "",
    *,
    detail: Callable[[], object] | None = None,
    interval_s: float = 0.02,
) -> None:
    """Return as soon as `predicate()` is true; fail naming `what` after `timeout_s`, with
    `detail()` (logs, output) read at that moment. `interval_s` paces a predicate that costs
    something to ask (an HTTP request, a case posted)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            extra = f"\n{detail()}" if detail is not None else ""
            raise AssertionError(
                f"timed out after {timeout_s} s waiting for {what or predicate}{extra}"
            )
        time.sleep(interval_s)


def counter_value(name: str, **labels: str) -> float:
    """The current value of a Prometheus sample in this process (0 before it is first used)."""
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value(name, labels) or 0.0
