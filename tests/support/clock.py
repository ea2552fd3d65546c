"""A monotonic clock the test moves: what an object given `clock=` reads as now."""

from __future__ import annotations


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now
