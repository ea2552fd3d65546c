"""Pure backend choice: a chain of filters that names the winner and why each other lost.

Logged at start, so "why is it on CPU?" answers itself. No imports of any runtime here:
availability is probed elsewhere (`backends.probe_backends`) and passed in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from edgefleet.shared.errors import EdgefleetError
from edgefleet.shared.executor.backends import traits
from edgefleet.shared.messages import Precision


class NeedsBackend(Protocol):
    """What selection needs to know about a model (a `ModelSpec` satisfies it)."""

    @property
    def format(self) -> str: ...


class NoBackendAvailable(EdgefleetError):
    code = "no_backend"
    http_status = 503
    hint = "install a backend that runs this model format, or change `backends` in the settings"


@dataclass(frozen=True)
class Screened:
    """One backend of the preference order: None when it is worth trying, else why not.

    `host` says the host lacks it (not installed, not probed), as opposed to a backend
    that is here but does not fit the model (format, precision).
    """

    name: str
    reason: str | None
    host: bool = False


def screen(
    available: Mapping[str, str | None],
    preference: Sequence[str],
    model_spec: NeedsBackend,
    precision: Precision = "fp32",
) -> list[Screened]:
    """Every backend in `preference`, in order, with the reason it cannot run this model."""
    fmt = model_spec.format
    out: list[Screened] = []
    for name in preference:
        facts = traits(name)
        if facts is None:
            out.append(Screened(name, "unknown backend"))
        elif name not in available:
            out.append(Screened(name, "not probed on this host", host=True))
        elif available[name] is not None:
            out.append(Screened(name, str(available[name]), host=True))
        elif fmt not in facts.formats:
            out.append(Screened(name, f"does not run {fmt} models"))
        elif precision not in facts.precisions:
            out.append(Screened(name, f"does not support {precision}"))
        else:
            out.append(Screened(name, None))
    return out


def select_backend(
    available: Mapping[str, str | None],
    preference: Sequence[str],
    model_spec: NeedsBackend,
    precision: Precision = "fp32",
) -> tuple[str, list[tuple[str, str]]]:
    """Pick the first backend in `preference` that is available and fits the model.

    `available` maps a backend name to None (usable here) or the reason it is not.
    Returns (chosen, rejected) where rejected lists (name, reason) for every other
    candidate in preference order. Raises NoBackendAvailable with all reasons if none fits.
    """
    rejected: list[tuple[str, str]] = []
    chosen: str | None = None
    for s in screen(available, preference, model_spec, precision):
        if chosen is not None:
            rejected.append((s.name, f"lower preference than {chosen}"))
        elif s.reason is not None:
            rejected.append((s.name, s.reason))
        else:
            chosen = s.name
    if chosen is None:
        raise nothing_fits(model_spec.format, precision, rejected)
    return chosen, rejected


def nothing_fits(
    fmt: str, precision: str, rejected: Sequence[tuple[str, str]]
) -> NoBackendAvailable:
    """The error when every backend was ruled out, with each one's reason."""
    reasons = "; ".join(f"{n}: {r}" for n, r in rejected) or "no backend in preference"
    return NoBackendAvailable(f"no backend can run this {fmt} model at {precision}: {reasons}")


def explain(chosen: str, rejected: Sequence[tuple[str, str]]) -> str:
    """One log line: the winner and each loser with its reason."""
    others = ", ".join(f"{n} ({r})" for n, r in rejected)
    return f"backend {chosen}" + (f"; not chosen: {others}" if others else "")
