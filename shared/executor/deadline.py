"""The deadline of the batch a scheduler is running, for backends that can pass it on.

The dynamic batcher sets it around each batch (the latest deadline of its requests: the
batch answers all of them); a remote backend (Triton) sends what is left of it with the call,
so a server that is slow costs a case no more than its deadline. Outside a batch: None.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass


@dataclass(frozen=True)
class Deadline:
    at: float
    clock: Callable[[], float] = time.monotonic

    def remaining_s(self) -> float:
        return self.at - self.clock()


_CURRENT: ContextVar[Deadline | None] = ContextVar("edgefleet_batch_deadline", default=None)


@contextmanager
def batch_deadline(at: float, clock: Callable[[], float] = time.monotonic) -> Iterator[None]:
    token = _CURRENT.set(Deadline(at, clock))
    try:
        yield
    finally:
        _CURRENT.reset(token)


def current_deadline() -> Deadline | None:
    """The running batch's deadline, or None outside a scheduler's batch."""
    return _CURRENT.get()
