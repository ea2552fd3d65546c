"""One byte budget for every decode in the process, reserved before a decoder allocates.

A few hundred bytes of JPEG or PNG can declare an image that takes hundreds of megabytes
to decode, so a per-image limit alone lets a handful of parallel requests exhaust memory.
Each decode reserves what its headers say it will allocate; a reservation larger than
the whole budget is refused at once (`PayloadTooLarge`, it can never fit), one that does
not fit now waits at most `wait_s` for others to be released, then is refused as
retryable (`DecodeBudgetBusy`, 503 + Retry-After).

The decoded array's own bytes stay reserved for as long as the array lives (`hold`): the
budget then bounds the pixels waiting in queues and models too, and a reference that keeps
pixels alive shows as budget that never comes back (`ef_decode_budget_bytes`).
"""

from __future__ import annotations

import threading
import weakref
from types import TracebackType

import numpy as np
from prometheus_client import Counter, Gauge

from edgefleet.shared.errors import Overloaded, PayloadTooLarge

BUDGET_BYTES = Gauge(
    "ef_decode_budget_bytes", "Bytes of the decode budget, by state", ["state"]
)
BUDGET_REFUSED = Counter(
    "ef_decode_budget_refused_total",
    "Decodes refused by the process's byte budget, by reason",
    ["reason"],
)
BUDGET_WAITING = Gauge("ef_decode_budget_waiting", "Decodes waiting for the budget")
_MIB = 1 << 20


class DecodeBudgetBusy(Overloaded):
    """Other decodes hold the budget; retryable."""

    code = "decode_budget_busy"
    http_status = 503
    hint = "too many large images are being decoded; retry after Retry-After"


class DecodeBudget:
    """A counting semaphore over bytes, shared by every thread that decodes images."""

    def __init__(self, total_bytes: int, *, wait_s: float = 2.0, retry_after_s: float = 1.0):
        if total_bytes <= 0:
            raise ValueError(f"the decode budget must be positive, got {total_bytes}")
        self.total_bytes = total_bytes
        self.wait_s = wait_s
        self.retry_after_s = retry_after_s
        self._reserved = 0
        self._waiting = 0
        self._free = threading.Condition()
        BUDGET_BYTES.labels("total").set(total_bytes)
        BUDGET_BYTES.labels("reserved").set(0)

    @property
    def reserved(self) -> int:
        with self._free:
            return self._reserved

    @property
    def waiting(self) -> int:
        with self._free:
            return self._waiting

    def reserve(self, nbytes: int) -> Reservation:
        """Take `nbytes`, waiting at most `wait_s`; refuses what can never fit at once."""
        if nbytes > self.total_bytes:
            BUDGET_REFUSED.labels("never_fits").inc()
            raise PayloadTooLarge(
                f"decoding this image takes {_mib(nbytes)}, more than the process's whole "
                f"decode budget of {_mib(self.total_bytes)}"
            )
        with self._free:
            if not self._wait_for(nbytes):
                BUDGET_REFUSED.labels("busy").inc()
                raise DecodeBudgetBusy(
                    f"decoding this image takes {_mib(nbytes)}; other decodes hold "
                    f"{_mib(self._reserved)} of {_mib(self.total_bytes)} and not enough was "
                    f"released within {self.wait_s:g} s",
                    retry_after_s=self.retry_after_s,
                )
            self._reserved += nbytes
            BUDGET_BYTES.labels("reserved").set(self._reserved)
        return Reservation(self, nbytes)

    def _wait_for(self, nbytes: int) -> bool:
        """Whether `nbytes` fit within `wait_s` (called holding the condition)."""
        if self._reserved + nbytes <= self.total_bytes:
            return True
        self._waiting += 1
        BUDGET_WAITING.inc()
        try:
            return self._free.wait_for(
                lambda: self._reserved + nbytes <= self.total_bytes, self.wait_s
            )
        finally:
            self._waiting -= 1
            BUDGET_WAITING.dec()

    def _release(self, nbytes: int) -> None:
        with self._free:
            self._reserved -= nbytes
            BUDGET_BYTES.labels("reserved").set(self._reserved)
            self._free.notify_all()


class Reservation:
    """Bytes taken from a `DecodeBudget`; released on exit, except what `hold` keeps."""

    def __init__(self, budget: DecodeBudget, nbytes: int):
        self._budget = budget
        self._lock = threading.Lock()
        self.nbytes = nbytes

    def hold(self, array: np.ndarray, nbytes: int) -> np.ndarray:
        """Keep `nbytes` of this reservation until `array` (and every view of it) is freed;
        `array` must own its buffer, as views keep their owner alive, not each other."""
        if array.base is not None:
            raise ValueError("hold the array that owns its pixels, not a view of it")
        with self._lock:
            kept = min(nbytes, self.nbytes)
            self.nbytes -= kept
        weakref.finalize(array, self._budget._release, kept)
        return array

    def release(self) -> None:
        with self._lock:
            nbytes, self.nbytes = self.nbytes, 0
        if nbytes:
            self._budget._release(nbytes)

    def __enter__(self) -> Reservation:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


def _mib(nbytes: int) -> str:
    return f"{nbytes / _MIB:.1f} MiB"
