"""The start-up self-test: which backend and provider an ONNX model gets on this host.

Run at the start of the agent and the cloud (and by `edgefleet edge|cloud selftest`), so a
container's first log lines say what its GPU stack really does. It goes down the backend
order as a model load does, proving each candidate with the tiny model (`proof.prove`,
whose verdicts the model loads then reuse): a host where no GPU backend loads reports the
CPU backend and why each other was passed over, and one where nothing loads says so,
without raising, so the process goes on and its model load gives the error.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import threading
from dataclasses import dataclass
from typing import Any

from edgefleet.shared.executor.backends import preference, probe_backends
from edgefleet.shared.executor.proof import prove, providers
from edgefleet.shared.executor.selection import screen
from edgefleet.shared.executor.settings import ExecutionSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OnnxModel:
    """What `screen` needs of a model: the self-test stands for the ONNX models."""

    format: str = "onnx"


@dataclass(frozen=True)
class SelfTest:
    """The backend the tiny model ran on (None: none did), its providers, the others' reasons."""

    backend: str | None
    providers: tuple[str, ...]
    skipped: tuple[tuple[str, str], ...]

    def as_json(self) -> dict[str, Any]:
        return {
            "ok": self.backend is not None,
            "backend": self.backend,
            "provider": self.providers[0] if self.providers else None,
            "providers": list(self.providers),
            "skipped": [{"backend": name, "reason": why} for name, why in self.skipped],
        }

    def summary(self) -> str:
        """One line for the log and the terminal."""
        others = "; ".join(f"{name}: {why}" for name, why in self.skipped)
        got = (
            f"backend {self.backend} (provider {self.providers[0] if self.providers else '-'})"
            if self.backend is not None
            else "no backend ran the tiny model"
        )
        return f"selftest: {got}" + (f"; passed over: {others}" if others else "")


_LAST: SelfTest | None = None
_LOCK = threading.Lock()


def run_selftest(settings: ExecutionSettings) -> SelfTest:
    """Prove the backends `settings` prefers, in order, until one runs; log and keep it."""
    skipped: list[tuple[str, str]] = []
    result = None
    for candidate in screen(
        probe_backends(), preference(settings), OnnxModel(), settings.precision
    ):
        if candidate.reason is not None:
            skipped.append((candidate.name, candidate.reason))
            continue
        why = prove(candidate.name, settings)
        if why is not None:
            skipped.append((candidate.name, f"failed its proof: {why}"))
            continue
        result = SelfTest(candidate.name, providers(candidate.name, settings), tuple(skipped))
        break
    if result is None:
        result = SelfTest(None, (), tuple(skipped))
    global _LAST
    with _LOCK:
        _LAST = result
    log.log(
        logging.INFO if result.backend is not None else logging.ERROR,
        result.summary(),
        extra={"selftest": result.as_json()},
    )
    return result


def last_selftest() -> dict[str, Any] | None:
    """What the health pages show: the start-up self-test's result (None before it ran)."""
    with _LOCK:
        return _LAST.as_json() if _LAST is not None else None


def selftest_output(settings: ExecutionSettings, as_json: bool) -> tuple[str, int]:
    """`edgefleet edge|cloud selftest`: the self-test run on `settings`, as the text to print
    and the exit status (0 when a backend ran the tiny model, 1 when none did). ONNX Runtime
    prints its provider errors to stdout: they go to stderr, keeping stdout for the result."""
    with contextlib.redirect_stdout(sys.stderr):
        result = run_selftest(settings)
    text = json.dumps(result.as_json(), indent=2) if as_json else result.summary()
    return text, 0 if result.backend is not None else 1
