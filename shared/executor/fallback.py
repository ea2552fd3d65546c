"""Down the backend order: prove each candidate, open the model on it, or say why not.

A backend that is missing, fails its proof or fails to load the model is passed over for
the next one (logged, counted), so a host with a broken GPU stack runs on the CPU and
says why instead of crash-looping. The choices are kept per process for the health pages.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from edgefleet.shared.errors import EdgefleetError, MemoryBudgetExceeded
from edgefleet.shared.executor.base import runtime_message
from edgefleet.shared.executor.metrics import BACKEND_FALLBACKS
from edgefleet.shared.executor.proof import prove, proven
from edgefleet.shared.executor.selection import Screened, nothing_fits
from edgefleet.shared.executor.selftest import last_selftest
from edgefleet.shared.executor.settings import ExecutionSettings

log = logging.getLogger(__name__)

T = TypeVar("T")
Why = Literal["unavailable", "proof", "load"]


@dataclass(frozen=True)
class BackendChoice:
    """The backend a model runs on, its providers, and each backend passed over before it."""

    backend: str
    providers: tuple[str, ...]
    skipped: tuple[tuple[str, str], ...]

    def as_json(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "provider": self.providers[0] if self.providers else None,
            "providers": list(self.providers),
            "skipped": [{"backend": name, "reason": why} for name, why in self.skipped],
        }


_CHOSEN: dict[str, BackendChoice] = {}
_WARNED: set[tuple[str, str]] = set()
_LOCK = threading.Lock()


def open_first(
    screened: Sequence[Screened],
    settings: ExecutionSettings,
    open_on: Callable[[str], T],
    *,
    model: str,
    fmt: str,
) -> tuple[str, T, list[tuple[str, str]]]:
    """`open_on` the first screened backend that is proven here and loads the model.

    Returns (backend, what open_on returned, the backends passed over with reasons). When
    every proven backend fails to load the model, the last load error is raised (it is the
    model, not the host); a memory refusal is raised at once.
    """
    skipped: list[tuple[str, str]] = []
    failure: Exception | None = None
    for candidate in screened:
        if candidate.reason is not None:
            skipped.append((candidate.name, candidate.reason))
            if candidate.host:
                _passed_over(model, candidate.name, "unavailable", candidate.reason)
            continue
        why = prove(candidate.name, settings)
        if why is not None:
            skipped.append((candidate.name, f"failed its proof: {why}"))
            _passed_over(model, candidate.name, "proof", why)
            continue
        try:
            return candidate.name, open_on(candidate.name), skipped
        except MemoryBudgetExceeded:
            raise
        except Exception as exc:  # a backend's own error types: the next one may load it
            why = exc.message if isinstance(exc, EdgefleetError) else runtime_message(exc)
            skipped.append((candidate.name, f"did not load the model: {why}"))
            _passed_over(model, candidate.name, "load", why)
            failure = exc
    if failure is not None:
        raise failure
    raise nothing_fits(fmt, settings.precision, skipped)


def _passed_over(model: str, backend: str, reason: Why, detail: str) -> None:
    """Count every fallback; warn once per process for what the host lacks (the same for
    every model), and every time for a model that did not load."""
    BACKEND_FALLBACKS.labels(backend, reason).inc()
    with _LOCK:
        first = (backend, detail) not in _WARNED
        _WARNED.add((backend, detail))
    if first or reason == "load":
        # not installed is what a CPU host is: noted; installed and failing is a problem
        log.log(
            logging.INFO if reason == "unavailable" else logging.WARNING,
            "backend %s passed over: %s",
            backend,
            detail,
            extra={"model": model, "backend": backend, "reason": reason, "detail": detail},
        )


def record(component: str, choice: BackendChoice) -> None:
    """Keep what `component` (a model file of the manifest) was opened on."""
    with _LOCK:
        _CHOSEN[component] = choice


def report() -> dict[str, Any]:
    """What /readyz and the agent's health show: each model's backend, every proof, and
    the start-up self-test."""
    with _LOCK:
        chosen = {name: choice.as_json() for name, choice in _CHOSEN.items()}
    return {"models": chosen, "proofs": proven(), "selftest": last_selftest()}
