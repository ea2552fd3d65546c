"""The demo's start-up orchestrator, driven with fake steps: concurrency, order, failure.

Synchronisation is by events only: a step that must be slow waits for the test to release
it, so "the others did not wait for it" is shown, not timed.
"""

from __future__ import annotations

import io
import sys
import threading
from pathlib import Path

import psutil
import pytest
from rich.console import Console

from edgefleet.demo.stack import Interrupted, Stack
from edgefleet.demo.startup import Step, StepContext, StepFailed, check_graph, run_steps
from edgefleet.shared.errors import ConfigError

WAIT_S = 60  # a safety net for a broken orchestrator, never reached when it works


def _console() -> Console:
    return Console(file=io.StringIO(), width=120)


def _run_in_thread(steps: list[Step], stop: threading.Event) -> tuple[threading.Thread, dict]:
    outcome: dict = {}

    def target() -> None:
        try:
            outcome["report"] = run_steps(steps, _console(), stop)
        except BaseException as exc:  # the test inspects whatever ended the run
            outcome["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, outcome


def test_a_slow_step_does_not_hold_up_the_steps_that_do_not_need_it() -> None:
    # given a slow step (it runs until the test releases it) and two quick ones,
    # the second of which needs the first
    release, quick_done = threading.Event(), threading.Event()
    seen: dict[str, object] = {}

    def slow(ctx: StepContext) -> str:
        assert release.wait(WAIT_S), "never released"
        return "rendered"

    def enroll(ctx: StepContext) -> str:
        return "bundles"

    def broker(ctx: StepContext) -> str:
        seen["broker saw"] = dict(ctx.results)
        quick_done.set()
        return "broker up"

    def agents(ctx: StepContext) -> str:
        seen["agents saw"] = dict(ctx.results)
        return "agents up"

    steps = [
        Step("videos", "scenes", slow),
        Step("enroll", "enroll", enroll),
        Step("broker", "broker", broker, after=("enroll",)),
        Step("agents", "agents", agents, after=("videos", "broker")),
    ]
    thread, outcome = _run_in_thread(steps, threading.Event())
    # when the quick chain has run
    assert quick_done.wait(WAIT_S), "the quick steps waited for the slow one"
    # then it ran while the slow step was still running, and the step needing both has not
    assert "agents saw" not in seen
    assert seen["broker saw"] == {"enroll": "bundles"}
    release.set()
    thread.join(WAIT_S)
    # and once the slow step is done, the step after both sees both results
    assert "error" not in outcome, outcome
    report = outcome["report"]
    assert seen["agents saw"] == {"videos": "rendered", "enroll": "bundles", "broker": "broker up"}
    assert report.results["agents"] == "agents up"
    assert report.started_s["broker"] <= report.ended_s["broker"] <= report.ended_s["videos"]
    assert report.started_s["agents"] >= max(report.ended_s["videos"], report.ended_s["broker"])


def test_a_failing_step_stops_the_others_and_is_what_is_raised() -> None:
    # given a step that waits (as a wait for a port or /readyz does) until told to stop,
    # a step that fails, and a step that would run after the failed one
    waiting = threading.Event()
    ran_after = threading.Event()

    def waits(ctx: StepContext) -> None:
        waiting.set()
        if ctx.stop.wait(WAIT_S):
            raise Interrupted("the cloud")  # what wait_until raises: an echo of the failure

    def fails(ctx: StepContext) -> None:
        assert waiting.wait(WAIT_S)
        raise ConfigError("--video gone.mp4: no such file")

    steps = [
        Step("cloud", "cloud", waits),
        Step("videos", "scenes", fails),
        Step("agents", "agents", lambda ctx: ran_after.set(), after=("videos",)),
    ]
    stop = threading.Event()
    # when it runs, then the failure itself is raised, not the waiting step's Interrupted
    with pytest.raises(ConfigError, match=r"gone\.mp4: no such file"):
        run_steps(steps, _console(), stop)
    assert stop.is_set()
    assert not ran_after.is_set()


def test_a_foreign_error_is_raised_as_step_failed_naming_the_step() -> None:
    def broken(ctx: StepContext) -> None:
        raise OSError("disk full")

    with pytest.raises(StepFailed, match="enroll: disk full") as caught:
        run_steps([Step("enroll", "enroll", broken)], _console(), threading.Event())
    assert caught.value.step == "enroll"
    assert isinstance(caught.value.__cause__, OSError)


def test_ctrl_c_while_steps_wait_raises_interrupted() -> None:
    # given a step that waits for the stop event, and the user presses Ctrl-C
    started = threading.Event()

    def waits(ctx: StepContext) -> None:
        started.set()
        ctx.stop.wait(WAIT_S)  # a step that simply returns when stopped

    stop = threading.Event()
    steps = [
        Step("cloud", "cloud", waits),
        Step("agents", "agents", lambda ctx: None, after=("cloud",)),
    ]
    thread, outcome = _run_in_thread(steps, stop)
    assert started.wait(WAIT_S)
    stop.set()
    thread.join(WAIT_S)
    # then the start-up ends as Interrupted: the agents never started
    assert isinstance(outcome.get("error"), Interrupted), outcome


def test_processes_started_before_a_failure_are_left_to_the_stack_which_stops_them(
    tmp_path: Path,
) -> None:
    # given a step that starts a process (as the broker step does) and a step that fails
    stack = Stack(tmp_path, _console())

    def broker(ctx: StepContext) -> int:
        child = stack.start("sleeper", [sys.executable, "-c", "import time; time.sleep(600)"])
        return child.process.pid

    def fails(ctx: StepContext) -> None:
        raise ConfigError("bad bundle")

    steps = [Step("broker", "broker", broker), Step("enroll", "enroll", fails, after=("broker",))]
    try:
        with pytest.raises(ConfigError, match="bad bundle"):
            run_steps(steps, _console(), threading.Event())
        [child] = stack.children
        assert child.alive()
    finally:
        # when the demo cleans up, as it does whatever happened
        stack.stop_all()
    # then nothing it started is left
    assert not child.alive()
    assert not psutil.pid_exists(child.process.pid)  # stopped and reaped


def test_the_progress_lines_name_each_step_and_its_time() -> None:
    console = _console()
    steps = [
        Step("a", "rendering scenes", lambda ctx: ctx.note("2 of 3")),
        Step("b", "broker", lambda ctx: None),
    ]
    run_steps(steps, console, threading.Event())
    output = console.file.getvalue()  # type: ignore[attr-defined]
    assert "rendering scenes" in output and "broker" in output
    assert output.count(" s") >= 2  # each finished line says how long it took


@pytest.mark.parametrize(
    ("steps", "message"),
    [
        ([Step("a", "a", print), Step("a", "a", print)], "same name"),
        ([Step("a", "a", print, after=("ghost",))], "unknown steps"),
        (
            [Step("a", "a", print, after=("b",)), Step("b", "b", print, after=("a",))],
            "wait for each other",
        ),
    ],
)
def test_a_bad_step_graph_is_refused_before_anything_runs(steps: list[Step], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_graph(steps)
