"""The demo's supervisor: a component that dies unasked is restarted, with backoff.

Each fault, whether the chaos schedule caused it or not, is an `Incident`: what happened,
when, and how long until the component (or the criterion the fault names, e.g. "the
agent's outbox drained") was healthy again. The live table shows the open and the last
closed ones; each is handed to `notify` (the dashboard's event feed) once closed, or at
`stop` if it never closed.

A component that keeps dying right after each restart (`give_up_after` in a row, none
staying up `stable_s`) is broken, not unlucky: the supervisor then raises with its log.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from edgefleet.demo.stack import Child
from edgefleet.shared.errors import EdgefleetError


@dataclass
class Incident:
    """One fault: what, when (seconds into the demo) and how long until healthy again."""

    component: str
    what: str
    at_s: float
    healthy: Callable[[], bool] | None = None  # the fault's own recovery criterion
    healthy_after_s: float | None = None
    restarts: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def closed(self) -> bool:
        return self.healthy_after_s is not None

    def line(self) -> str:
        """The event line: `t=12.3 s broker: killed (-9); restarted 1x; healthy after 2.1 s`."""
        parts = [f"t={self.at_s:.1f} s {self.component}: {self.what}", *self.notes]
        if self.restarts:
            parts.append(f"restarted {self.restarts}x")
        parts.append(
            f"healthy again after {self.healthy_after_s:.1f} s"
            if self.healthy_after_s is not None
            else "not healthy yet"
        )
        return "; ".join(parts)

    def as_json(self) -> dict[str, object]:
        return {
            "component": self.component,
            "what": self.what,
            "at_s": round(self.at_s, 3),
            "healthy_after_s": None
            if self.healthy_after_s is None
            else round(self.healthy_after_s, 3),
            "restarts": self.restarts,
            "notes": self.notes,
            "line": self.line(),
        }


class GaveUp(EdgefleetError):
    """A component died again and again right after its restarts: its log says why."""

    def __init__(self, child: Child, deaths: int):
        super().__init__(
            f"{child.name} stopped unexpectedly {deaths} times in a row (last exit code "
            f"{child.process.returncode}); its log ({child.log}) ends with:\n{child.tail()}",
            code="demo_failed",
        )


@dataclass
class Supervised:
    """A component: how to start it again, how to tell it is healthy, its current child."""

    name: str
    child: Child
    restart: Callable[[], Child]
    healthy: Callable[[], bool]
    on_restart: Callable[[Child], None] = lambda _: None
    deaths: int = 0  # in a row, none of the restarts stayed up `stable_s`
    restart_at: float | None = None
    up_since: float | None = None
    incident: Incident | None = None


class Supervisor:
    """Restarts dead components (backoff `base_s` · 2^(deaths-1), at most `cap_s`) and
    times each incident until its criterion holds. `tick` does one pass; `run` ticks
    in a thread until `stop`."""

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        base_s: float = 0.5,
        cap_s: float = 15.0,
        stable_s: float = 30.0,
        give_up_after: int = 6,
        notify: Callable[[Incident], None] = lambda _: None,
    ):
        self.clock = clock
        self.base_s, self.cap_s, self.stable_s = base_s, cap_s, stable_s
        self.give_up_after = give_up_after
        self.notify = notify
        self.started = clock()
        self.components: dict[str, Supervised] = {}
        self.incidents: list[Incident] = []
        self.failure: EdgefleetError | None = None
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, component: Supervised) -> None:
        with self._lock:
            component.up_since = self.clock()
            self.components[component.name] = component

    def forget(self, name: str) -> None:
        """Stop watching a component the demo is about to stop on purpose."""
        with self._lock:
            self.components.pop(name, None)

    def backoff_s(self, deaths: int) -> float:
        return float(min(self.cap_s, self.base_s * 2 ** max(0, deaths - 1)))

    def now_s(self) -> float:
        """Seconds since the supervisor started: the clock of every incident."""
        return self.clock() - self.started

    def open_incident(
        self, name: str, what: str, healthy: Callable[[], bool] | None = None
    ) -> Incident:
        """A fault about to hit `name` (the chaos schedule says so before it strikes)."""
        with self._lock:
            incident = Incident(name, what, self.now_s(), healthy)
            self.incidents.append(incident)
            component = self.components.get(name)
            if component is not None:
                if component.incident is not None and not component.incident.closed:
                    component.incident.notes.append(f"then {what}")
                    return component.incident
                component.incident = incident
            return incident

    def tick(self) -> None:
        """One pass: restart what is due, note what died, close what is healthy again."""
        with self._lock:
            for component in self.components.values():
                self._tick_one(component)

    def _tick_one(self, c: Supervised) -> None:
        now = self.clock()
        if c.restart_at is not None:
            if now >= c.restart_at:
                c.restart_at = None
                c.child = c.restart()
                c.on_restart(c.child)
                c.up_since = now
                if c.incident is not None:
                    c.incident.restarts += 1
            return
        if not c.child.alive():
            stayed = c.up_since is not None and now - c.up_since >= self.stable_s
            c.deaths = 1 if stayed else c.deaths + 1
            if c.deaths > self.give_up_after:
                raise GaveUp(c.child, c.deaths)
            code = c.child.process.returncode
            if c.incident is None or c.incident.closed:
                c.incident = Incident(c.name, f"exited unasked (code {code})", self.now_s())
                self.incidents.append(c.incident)
            else:
                c.incident.notes.append(f"exited (code {code})")
            c.restart_at = now + self.backoff_s(c.deaths)
            c.up_since = None
            return
        if c.up_since is not None and now - c.up_since >= self.stable_s:
            c.deaths = 0
        incident = c.incident
        if incident is not None and not incident.closed and (incident.healthy or c.healthy)():
            incident.healthy_after_s = self.now_s() - incident.at_s
            self.notify(incident)

    def close_incident(self, incident: Incident) -> None:
        """Time an incident that belongs to no supervised component (e.g. an uplink)."""
        if incident.closed or incident.healthy is None or not incident.healthy():
            return
        incident.healthy_after_s = self.now_s() - incident.at_s
        self.notify(incident)

    def tick_all(self) -> None:
        """`tick`, plus the incidents of no component (their criterion alone closes them)."""
        self.tick()
        with self._lock:
            owned = {id(c.incident) for c in self.components.values()}
            for incident in self.incidents:
                if id(incident) not in owned and not incident.closed:
                    self.close_incident(incident)

    # ------------------------------------------------------------------ the thread

    def start(self, every_s: float = 0.25) -> None:
        def loop() -> None:
            while not self._stop.wait(every_s):
                try:
                    self.tick_all()
                except EdgefleetError as exc:  # the live loop raises it on its next pass
                    self.failure = exc
                    return

        self._thread = threading.Thread(target=loop, name="demo-supervisor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop watching; the incidents still open are handed to `notify` as they are
        ("not healthy yet"), so that the event feed misses no fault."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        with self._lock:
            for incident in self.incidents:
                if not incident.closed:
                    self.notify(incident)

    def check(self) -> None:
        """Raise the supervisor's failure (a component it gave up on), if any."""
        if self.failure is not None:
            raise self.failure

    def recent(self, n: int = 6) -> list[Incident]:
        with self._lock:
            return list(self.incidents[-n:])
