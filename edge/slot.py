"""The running model behind reference-counted leases, so a swap never closes a model in use.

Every call to the model holds a lease for its duration. A swap installs the new model at
once (the next lease gets it); the old one is closed when its last lease is released, or
at the swap itself when nothing holds it. No timer guesses how long a call may take.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from edgefleet.edge.model import Predictor
from edgefleet.shared.messages import ModelInfo, ModelRef

log = logging.getLogger(__name__)


@dataclass
class _Held:
    """One model and the leases on it; `retired` once replaced or closed, `closed` once shut."""

    model: Predictor
    ref: ModelRef | None
    leases: int = 0
    retired: bool = False
    closed: bool = False

    def release(self) -> bool:
        """Whether the caller must close the model now (under the slot's lock: exactly once)."""
        if self.retired and self.leases == 0 and not self.closed:
            self.closed = True
            return True
        return False


class ModelSlot:
    """Thread-safe: inference workers lease, the updater swaps, the agent closes."""

    def __init__(self, model: Predictor, ref: ModelRef | None = None):
        self._lock = threading.Lock()
        self._held = _Held(model, ref)

    @contextmanager
    def lease(self) -> Iterator[Predictor]:
        """The current model, kept open until the `with` block ends."""
        with self._lock:
            held = self._held
            held.leases += 1
        try:
            yield held.model
        finally:
            with self._lock:
                held.leases -= 1
                last = held.release()
            if last:
                _close(held.model)

    @property
    def info(self) -> ModelInfo:
        """What the current model reports (for telemetry and cases)."""
        with self.lease() as model:
            return model.info

    @property
    def ref(self) -> ModelRef | None:
        """The deployed model reference it was swapped in by; None for the configured model."""
        return self._held.ref

    def swap(self, model: Predictor, ref: ModelRef) -> None:
        """Install `model` (already loaded and warmed); the old one closes when last released."""
        with self._lock:
            old, self._held = self._held, _Held(model, ref)
            old.retired = True
            idle = old.release()
        if idle:
            _close(old.model)

    def close(self) -> None:
        """Close the current model once no call holds it (idempotent)."""
        with self._lock:
            held = self._held
            held.retired = True
            idle = held.release()
        if idle:
            _close(held.model)


def _close(model: Predictor) -> None:
    try:
        model.close()
    except Exception:  # a model that fails to close must not break the caller's call
        log.exception("closing model %s failed", model.info.name)
