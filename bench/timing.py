"""The timing rule every micro-benchmark here shares, so their figures compare."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def timed(fn: Callable[[], object], repeat: int, rounds: int) -> float:
    """Seconds per call: the best over rounds of the median of `repeat` calls."""
    fn()
    best = float("inf")
    for _ in range(rounds):
        samples = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t0)
        best = min(best, statistics.median(samples))
    return best
