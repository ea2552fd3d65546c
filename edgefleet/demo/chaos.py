"""`edgefleet demo --chaos`: a seeded schedule of faults against the demo's real processes.

Five faults, each once, in an order and at times drawn from the seed (the same seed gives
the same schedule, printed at the start):

- `broker_kill`: Mosquitto `kill -9`'d; the supervisor restarts it on its persistence.
- `broker_freeze`: Mosquitto SIGSTOPped for longer than the clients' keepalive (a network
  partition: connections stay open but nothing answers), then SIGCONTed.
- `cloud_kill`: the second cloud replica `kill -9`'d while it holds a case (mid-ingest);
  the first keeps serving the share group, the supervisor restarts the second.
- `agent_kill`: one agent `kill -9`'d; restarted from its state folder and outbox.
- `uplink_cut`: one agent's link to the broker (a relay, edgefleet.demo.proxy) cut for a
  while: its outbox grows, then drains once the link is back.

Each fault opens an incident (edgefleet.demo.supervisor) with its own recovery criterion,
so the event line says how long until the system was whole again, not only the process.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import signal
import socket
import sqlite3
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from edgefleet.demo.proxy import UplinkRelay
from edgefleet.demo.supervisor import Incident, Supervisor

log = logging.getLogger(__name__)

FaultKind = Literal["broker_kill", "broker_freeze", "cloud_kill", "agent_kill", "uplink_cut"]
FAULTS: tuple[FaultKind, ...] = (
    "broker_kill",
    "broker_freeze",
    "cloud_kill",
    "agent_kill",
    "uplink_cut",
)
# The clients' MQTT keepalive under --chaos: short, so that a partition is noticed (and
# a freeze longer than it fits) within a demo of a minute or two.
CHAOS_KEEPALIVE_S = 5
# An acknowledged case still unanswered after this is sent again (a broker killed between
# its PUBACK and the delivery lost it): short enough to heal within the demo's drain.
CHAOS_RESEND_UNANSWERED_S = 30.0
SECOND_CLOUD = "cloud-b"
# Where the faults may start: after the first escalations, early enough to heal and drain.
WINDOW = (0.08, 0.62)


@dataclass(frozen=True)
class Fault:
    kind: FaultKind
    at_s: float  # seconds into the live run
    lasts_s: float  # how long a freeze or a cut lasts (0 for a kill)
    target: str  # the component: broker, cloud-b or an agent's device id

    def describe(self) -> str:
        what = {
            "broker_kill": "kill -9, restart on its persistence",
            "broker_freeze": f"SIGSTOP for {self.lasts_s:.1f} s (keepalive {CHAOS_KEEPALIVE_S} s)",
            "cloud_kill": "kill -9 mid-ingest (the first replica keeps serving), restart",
            "agent_kill": "kill -9, restart from its state folder",
            "uplink_cut": f"uplink cut for {self.lasts_s:.1f} s",
        }[self.kind]
        return f"t={self.at_s:5.1f} s  {self.kind:<13} {self.target:<12} {what}"


def chaos_schedule(seed: int, duration_s: float, agents: list[str]) -> list[Fault]:
    """The five faults at seeded times in the live run, one per slot of the fault window."""
    rng = random.Random(seed)
    kinds = list(FAULTS)
    rng.shuffle(kinds)
    start, end = WINDOW[0] * duration_s, WINDOW[1] * duration_s
    slot = (end - start) / len(kinds)
    fixed_targets = {"broker_kill": "broker", "broker_freeze": "broker", "cloud_kill": SECOND_CLOUD}
    faults = []
    for i, kind in enumerate(kinds):
        at = start + i * slot + rng.uniform(0.0, 0.3 * slot)
        lasts = 0.0
        if kind == "broker_freeze":
            lasts = 2.5 * CHAOS_KEEPALIVE_S + rng.uniform(0.0, 2.0)
        elif kind == "uplink_cut":
            lasts = min(20.0, max(6.0, 0.12 * duration_s)) + rng.uniform(0.0, 2.0)
        target = fixed_targets.get(kind) or agents[rng.randrange(len(agents))]
        faults.append(Fault(kind, round(at, 1), round(lasts, 1), target))
    return faults


# ------------------------------------------------------------------ probes


def broker_answers(port: int, timeout_s: float = 1.0) -> bool:
    """The broker's event loop answers an MQTT CONNECT (a CONNACK, even a refusal).

    A TCP connect alone is not enough: a frozen broker's kernel still accepts connections.
    """
    connect = b"\x10\x0c\x00\x04MQTT\x04\x02\x00\x05\x00\x00"  # v3.1.1, clean, empty id
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
            sock.settimeout(timeout_s)
            sock.sendall(connect)
            return sock.recv(1)[:1] == b"\x20"
    except OSError:
        return False


def get_json(url: str, timeout_s: float = 2.0) -> dict[str, Any]:
    """A local JSON endpoint's body ({} when it does not answer)."""
    import httpx

    try:
        body = httpx.get(url, timeout=timeout_s).json()
    except (httpx.HTTPError, ValueError):
        return {}
    return body if isinstance(body, dict) else {}


def claimed_by(database: Path, replica: str) -> int:
    """Cases the replica holds right now (claimed, no verdict yet) in the cloud's store."""
    try:
        with contextlib.closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True)) as db:
            row = db.execute(
                "SELECT COUNT(*) FROM ef_cases WHERE status = 'pending' AND claimed_by = ?",
                (replica,),
            ).fetchone()
    except sqlite3.Error:
        return 0
    return int(row[0])


@dataclass
class ChaosTargets:
    """What the faults reach: the processes through the supervisor, the rest by address."""

    broker_port: int
    cloud_urls: dict[str, str]  # component name → base URL
    cloud_replicas: dict[str, str]  # component name → MQTT client id (its claims' owner)
    database: Path
    agent_health: dict[str, str]  # device id → /healthz URL
    relays: dict[str, UplinkRelay]  # device id → its relay (the agent of the uplink cut)


class ChaosRunner:
    """Plays the schedule in a thread against the supervised processes."""

    def __init__(self, faults: list[Fault], supervisor: Supervisor, targets: ChaosTargets):
        self.faults = sorted(faults, key=lambda f: f.at_s)
        self.supervisor = supervisor
        self.targets = targets
        self._strike: dict[FaultKind, Callable[[Fault], None]] = {
            "broker_kill": self._broker_kill,
            "broker_freeze": self._broker_freeze,
            "cloud_kill": self._cloud_kill,
            "agent_kill": self._agent_kill,
            "uplink_cut": self._uplink_cut,
        }
        self._stop = threading.Event()
        self._frozen: int | None = None
        self._thread = threading.Thread(target=self._run, name="demo-chaos", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """End the schedule; a frozen broker is thawed and a cut uplink restored."""
        self._stop.set()
        self._thread.join(timeout=60)
        self._thaw()
        for relay in self.targets.relays.values():
            relay.restore()

    def _run(self) -> None:
        for fault in self.faults:
            if self._stop.wait(max(0.0, fault.at_s - self.supervisor.now_s())):
                return
            try:
                self._strike[fault.kind](fault)
            except Exception:  # said in the log; the rest of the schedule still plays
                log.exception("chaos: %s could not be applied", fault.describe())

    # --- the faults -----------------------------------------------------------------

    def _pid(self, name: str) -> int:
        return self.supervisor.components[name].child.process.pid

    def _kill(self, name: str, what: str, healthy: Callable[[], bool]) -> Incident:
        incident: Incident | None = None

        def restarted_and_healthy() -> bool:
            return incident is not None and incident.restarts > 0 and healthy()

        incident = self.supervisor.open_incident(name, what, restarted_and_healthy)
        with contextlib.suppress(ProcessLookupError):
            os.kill(self._pid(name), signal.SIGKILL)
        return incident

    def _broker_kill(self, fault: Fault) -> None:
        self._kill("broker", "kill -9", self._broker_and_clients_up)

    def _broker_freeze(self, fault: Fault) -> None:
        thawed = threading.Event()
        self.supervisor.open_incident(
            "broker",
            f"frozen (SIGSTOP) {fault.lasts_s:.1f} s > keepalive {CHAOS_KEEPALIVE_S} s",
            lambda: thawed.is_set() and self._broker_and_clients_up(),
        )
        self._frozen = self._pid("broker")
        with contextlib.suppress(ProcessLookupError):
            os.kill(self._frozen, signal.SIGSTOP)
        self._stop.wait(fault.lasts_s)
        self._thaw()
        thawed.set()

    def _thaw(self) -> None:
        if self._frozen is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._frozen, signal.SIGCONT)
            self._frozen = None

    def _cloud_kill(self, fault: Fault) -> None:
        url = self.targets.cloud_urls[fault.target]
        replica = self.targets.cloud_replicas[fault.target]
        held = 0
        for _ in range(60):  # up to 15 s for the replica to hold a case: mid-ingest
            held = claimed_by(self.targets.database, replica)
            if held or self._stop.wait(0.25):
                break
        incident = self._kill(
            fault.target,
            "kill -9",
            lambda: get_json(f"{url}/readyz").get("ready") is True,
        )
        incident.notes.append(f"{held} case(s) in hand" if held else "no case in hand")

    def _agent_kill(self, fault: Fault) -> None:
        url = self.targets.agent_health[fault.target]
        self._kill(
            fault.target,
            "kill -9",
            lambda: get_json(url).get("broker_connected") is True,
        )

    def _uplink_cut(self, fault: Fault) -> None:
        relay = self.targets.relays[fault.target]
        url = self.targets.agent_health[fault.target]
        restored = threading.Event()

        def drained() -> bool:
            body = get_json(url)
            depth = body.get("outbox", {}).get("depth")
            return (
                restored.is_set()
                and body.get("broker_connected") is True
                and depth is not None
                and depth <= 2
            )

        incident = self.supervisor.open_incident(
            f"{fault.target} uplink", f"uplink cut {fault.lasts_s:.1f} s", drained
        )
        relay.cut()
        peak = 0
        deadline = self.supervisor.now_s() + fault.lasts_s
        while self.supervisor.now_s() < deadline and not self._stop.is_set():
            depth = get_json(url, timeout_s=0.8).get("outbox", {}).get("depth")
            peak = max(peak, depth or 0)
            self._stop.wait(min(1.0, max(0.0, deadline - self.supervisor.now_s())))
        relay.restore()
        restored.set()
        incident.notes.append(f"outbox peaked at {peak}")

    def _broker_and_clients_up(self) -> bool:
        """The broker answers, every cloud replica and every agent is connected again (an
        agent whose uplink another fault holds cut right now is that fault's business)."""
        if not broker_answers(self.targets.broker_port):
            return False
        for url in self.targets.cloud_urls.values():
            if not get_json(f"{url}/readyz").get("broker", {}).get("connected"):
                return False
        relays = self.targets.relays
        return all(
            get_json(url).get("broker_connected") is True
            for device, url in self.targets.agent_health.items()
            if not (device in relays and relays[device].is_cut)
        )
