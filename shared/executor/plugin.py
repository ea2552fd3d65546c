"""What a backend declares about itself, in its own module: its name, what it runs, how to
build it and whether this host has it. `backends` gathers the declarations."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from edgefleet.shared.executor.base import Executor
from edgefleet.shared.executor.settings import ExecutionSettings


@dataclass(frozen=True)
class BackendTraits:
    """Static facts about a backend: what files it runs, in which precisions."""

    formats: frozenset[str]
    precisions: frozenset[str]
    gpu: bool


@dataclass(frozen=True)
class Backend:
    """One backend a model can run on.

    `build` makes its executor; `probe` says, without importing the runtime's heavy half,
    None when it is worth a proof here or the reason it is not; `rank` is its place in the
    shipped preference order (lower first)."""

    name: str
    traits: BackendTraits
    build: Callable[[ExecutionSettings], Executor]
    probe: Callable[[], str | None]
    rank: int
