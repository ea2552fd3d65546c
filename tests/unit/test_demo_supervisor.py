"""The demo's supervisor against real child processes (and a real broker), mostly on an
injected clock."""

from __future__ import annotations

import shutil
import signal
import sys
import threading
from pathlib import Path

import pytest
from rich.console import Console

from edgefleet.bench.mosquitto import MosquittoBroker
from edgefleet.demo.chaos import broker_answers
from edgefleet.demo.stack import Stack
from edgefleet.demo.supervisor import GaveUp, Incident, Supervised, Supervisor


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]
CRASHER = [sys.executable, "-c", "import sys; print('bad config'); sys.exit(3)"]


@pytest.fixture
def stack(tmp_path: Path):
    stack = Stack(tmp_path, Console(quiet=True))
    yield stack
    stack.stop_all()


def _supervised(stack: Stack, supervisor: Supervisor, argv: list[str], healthy=lambda: True):
    child = stack.start("worker", argv)
    component = Supervised(
        "worker",
        child,
        lambda: stack.restart(supervisor.components["worker"].child),
        healthy,
    )
    supervisor.add(component)
    return component


def test_a_dead_component_is_restarted_after_a_growing_backoff(stack: Stack) -> None:
    clock = Clock()
    supervisor = Supervisor(clock=clock, base_s=0.5, cap_s=4.0, stable_s=30.0)
    component = _supervised(stack, supervisor, SLEEPER)
    first = component.child
    delays = []
    for _ in range(5):
        # when it is killed, then the supervisor notes it and waits its backoff
        component.child.process.kill()
        component.child.process.wait()
        supervisor.tick()
        assert component.restart_at is not None
        delays.append(component.restart_at - clock.now)
        clock.now = component.restart_at - 0.01
        supervisor.tick()
        assert not component.child.alive()  # not before the backoff is over
        clock.now = component.restart_at
        supervisor.tick()
        assert component.child.alive()  # restarted the same way, in the same place
        assert component.child.argv == first.argv
        assert stack.children == [component.child]
        clock.now += 1.0
    assert delays == [0.5, 1.0, 2.0, 4.0, 4.0]  # doubling, capped
    incident = supervisor.incidents[0]
    assert incident.component == "worker" and "exited unasked" in incident.what
    supervisor.tick()  # healthy: the incident closes with how long it took
    assert incident.closed and incident.restarts == 5
    assert "healthy again after" in incident.line()


def test_the_backoff_starts_over_once_a_restart_stayed_up(stack: Stack) -> None:
    clock = Clock()
    supervisor = Supervisor(clock=clock, base_s=0.5, stable_s=30.0)
    component = _supervised(stack, supervisor, SLEEPER)
    for _ in range(3):
        component.child.process.kill()
        component.child.process.wait()
        supervisor.tick()
        clock.now = component.restart_at
        supervisor.tick()
    assert component.deaths == 3
    clock.now += 31.0  # it stayed up past `stable_s`
    component.child.process.kill()
    component.child.process.wait()
    supervisor.tick()
    assert component.deaths == 1 and component.restart_at == clock.now + 0.5


def test_an_incident_stays_open_until_its_own_criterion_holds(stack: Stack) -> None:
    clock = Clock()
    supervisor = Supervisor(clock=clock)
    _supervised(stack, supervisor, SLEEPER)
    recovered = False
    incident = supervisor.open_incident("worker", "uplink cut 6 s", lambda: recovered)
    clock.now += 3.0
    supervisor.tick()
    assert not incident.closed and "not healthy yet" in incident.line()
    recovered = True
    clock.now += 2.5
    supervisor.tick()
    assert incident.healthy_after_s == pytest.approx(5.5)


def test_stop_hands_on_the_incidents_that_never_healed(stack: Stack) -> None:
    notified: list[str] = []
    supervisor = Supervisor(clock=Clock(), notify=lambda i: notified.append(i.line()))
    _supervised(stack, supervisor, SLEEPER)
    supervisor.open_incident("worker", "uplink cut 6 s", lambda: False)
    supervisor.tick()
    assert notified == []
    supervisor.stop()
    assert notified == ["t=0.0 s worker: uplink cut 6 s; not healthy yet"]


def test_a_component_that_keeps_crashing_is_given_up_with_its_log(stack: Stack) -> None:
    clock = Clock()
    supervisor = Supervisor(clock=clock, give_up_after=2)
    component = _supervised(stack, supervisor, CRASHER)
    with pytest.raises(GaveUp, match="bad config"):
        for _ in range(10):
            component.child.process.wait(timeout=30)  # it exits by itself
            supervisor.tick()
            if component.restart_at is not None:
                clock.now = component.restart_at
                supervisor.tick()


@pytest.mark.skipif(
    not (shutil.which("mosquitto") or Path("/usr/sbin/mosquitto").exists()),
    reason="mosquitto is not installed",
)
def test_a_broker_killed_unasked_is_restarted_on_its_port_and_answers_again(
    stack: Stack, tmp_path: Path
) -> None:
    # given a real Mosquitto under the supervisor's thread, as the demo runs it
    broker = MosquittoBroker(tmp_path / "broker")
    broker.write_config()
    child = stack.start("mosquitto", [broker.binary, "-c", str(broker.config_path)])
    healed = threading.Event()

    def notify(incident: Incident) -> None:
        healed.set()

    supervisor = Supervisor(notify=notify)
    supervisor.add(
        Supervised(
            "broker",
            child,
            lambda: stack.restart(supervisor.components["broker"].child),
            lambda: broker_answers(broker.port),
        )
    )
    assert _eventually_answers(broker.port)
    supervisor.start(every_s=0.1)
    try:
        # when it is killed without being asked to stop
        child.process.send_signal(signal.SIGKILL)
        # then it is restarted, answers MQTT again, and the incident says so
        assert healed.wait(60), [i.line() for i in supervisor.incidents]
    finally:
        supervisor.stop()
    incident = supervisor.incidents[0]
    assert incident.restarts == 1 and incident.closed
    assert "exited unasked (code -9)" in incident.line()
    assert supervisor.components["broker"].child is not child
    assert broker_answers(broker.port)


def _eventually_answers(port: int) -> bool:
    done = threading.Event()
    for _ in range(200):
        if broker_answers(port):
            return True
        done.wait(0.05)
    return False
