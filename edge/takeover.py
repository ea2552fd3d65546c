"""Another agent with our device id, told from the broker's side of it.

A device connects with one fixed client id, and the broker hands that id's session to
whoever connects last. Mosquitto 2.0 closes the older connection without a reason code
(no "session taken over"), so two agents on one device id look like connections that
last only until the other's reconnect. The newcomer is the one that never held a
connection for long: after `STREAK` such losses in a row it stops; the agent that had
held its session keeps it. A failed connect (broker down) ends the streak.
"""

from __future__ import annotations

STREAK = 3  # short connections in a row: one loss is a broker restart or a network blip


class TakeoverWatch:
    """Fed by the uplink's connect callbacks (monotonic seconds); says when to stop."""

    def __init__(self, short_s: float):
        self.short_s = short_s
        self._since: float | None = None  # when the current connection was acknowledged
        self._streak = 0
        self._held_long = False

    def connected(self, now: float) -> None:
        self._since = now

    def failed(self) -> None:
        """A connect attempt the broker did not accept: not a takeover."""
        self._streak = 0

    def lost(self, now: float) -> bool:
        """A connection the broker closed; True when this agent is the newcomer of a takeover."""
        if self._since is None:
            return False
        lasted, self._since = now - self._since, None
        if lasted >= self.short_s:
            self._held_long, self._streak = True, 0
            return False
        self._streak += 1
        return self._streak >= STREAK and not self._held_long

    @property
    def contested(self) -> bool:
        """Connections keep being taken over while this agent holds the device id."""
        return self._streak >= STREAK
