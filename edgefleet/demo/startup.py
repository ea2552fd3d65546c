"""The demo's start-up: steps that run at once wherever their dependencies allow.

Each step is a function in its own thread that starts as soon as the steps it names in
`after` are done, with one progress line (rich) that says what it waits for, what it is
doing and how long it took, so the wait is never silent. A failing step sets the shared
`stop` event: the running steps wind down (their waits check it), the ones not started
yet never start, and `run_steps` raises the failure, not the echoes it caused. Ctrl-C
sets the same event from outside. Processes a step started belong to the caller's
`Stack`, which stops them whatever happened here.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn

from edgefleet.demo.stack import Interrupted
from edgefleet.shared.errors import EdgefleetError


@dataclass(frozen=True)
class Step:
    """One start-up step: `run` gets a StepContext and returns what its dependants need."""

    name: str
    label: str
    run: Callable[[StepContext], Any]
    after: tuple[str, ...] = ()


@dataclass
class StepContext:
    """What a running step sees: its dependencies' results and the shared stop event."""

    results: dict[str, Any]
    stop: threading.Event
    note: Callable[[str], None]  # replaces the detail shown on the step's progress line


@dataclass
class StartupReport:
    """What the steps returned and when each started and ended (seconds from the start)."""

    results: dict[str, Any] = field(default_factory=dict)
    started_s: dict[str, float] = field(default_factory=dict)
    ended_s: dict[str, float] = field(default_factory=dict)


class StepFailed(EdgefleetError):
    """A step of the start-up failed with an error that is not one of ours."""

    def __init__(self, step: str, cause: BaseException):
        super().__init__(f"{step}: {cause}", code="demo_failed")
        self.step = step


def check_graph(steps: Sequence[Step]) -> None:
    """Unique names, known dependencies, no cycle (ValueError otherwise)."""
    names = [s.name for s in steps]
    if len(set(names)) != len(names):
        raise ValueError(f"start-up steps with the same name: {names}")
    for step in steps:
        unknown = set(step.after) - set(names)
        if unknown:
            raise ValueError(f"step {step.name!r} waits for unknown steps {sorted(unknown)}")
    done: set[str] = set()
    pending = list(steps)
    while pending:
        ready = [s for s in pending if set(s.after) <= done]
        if not ready:
            raise ValueError(f"start-up steps wait for each other: {[s.name for s in pending]}")
        done.update(s.name for s in ready)
        pending = [s for s in pending if s not in ready]


def run_steps(steps: Sequence[Step], console: Console, stop: threading.Event) -> StartupReport:
    """Run the steps, each as soon as its dependencies are done; raise on the first failure.

    An error raised by a step after `stop` was set by another step's failure is an echo:
    the failure that set it is what is raised (as it is if it is an EdgefleetError, else
    as StepFailed naming the step); Interrupted if `stop` was set from outside.
    """
    check_graph(steps)
    report = StartupReport()
    changed = threading.Condition()
    failures: list[tuple[str, BaseException]] = []
    begin = time.monotonic()
    columns = (SpinnerColumn(finished_text="[green]✓[/]"), TextColumn("{task.description}"))
    with Progress(*columns, console=console, transient=False) as progress:
        tasks = {
            s.name: progress.add_task(_line(s.label, _waiting(s, report)), total=1) for s in steps
        }

        def run_one(step: Step) -> None:
            task = tasks[step.name]
            with changed:
                # A timed wait, so that a Ctrl-C (stop set from outside) is seen too.
                while not (stop.is_set() or set(step.after) <= set(report.ended_s)):
                    changed.wait(0.25)
                if stop.is_set():
                    progress.update(task, description=_line(step.label, "[dim]not started[/]"))
                    return
                report.started_s[step.name] = time.monotonic() - begin
            progress.update(task, description=_line(step.label, "…"))

            def note(detail: str) -> None:
                progress.update(task, description=_line(step.label, detail))

            try:
                result = step.run(StepContext(dict(report.results), stop, note))
            except BaseException as exc:  # every failure ends the start-up; it is re-raised
                with changed:
                    failures.append((step.name, exc))
                    stop.set()
                    changed.notify_all()
                progress.update(task, description=_line(step.label, f"[red]failed[/]: {exc}"))
                return
            with changed:
                report.results[step.name] = result
                report.ended_s[step.name] = time.monotonic() - begin
                changed.notify_all()
            took = report.ended_s[step.name] - report.started_s[step.name]
            progress.update(
                task, completed=1, description=_line(step.label, f"[green]{took:.1f} s[/]")
            )

        threads = [
            threading.Thread(target=run_one, args=(s,), name=f"startup-{s.name}", daemon=True)
            for s in steps
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    if failures:
        name, first = failures[0]
        if isinstance(first, EdgefleetError):
            raise first  # ours say what failed (Interrupted: what it was waiting for)
        raise StepFailed(name, first) from first
    if len(report.ended_s) < len(steps):
        raise Interrupted("the start-up steps")
    return report


def _waiting(step: Step, report: StartupReport) -> str:
    pending = [name for name in step.after if name not in report.ended_s]
    return f"[dim]after {', '.join(pending)}[/]" if pending else "[dim]queued[/]"


def _line(label: str, detail: str) -> str:
    return f"{label:<34} {detail}"
