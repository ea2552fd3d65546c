"""What the demo's end-to-end tests need before they can run."""

from __future__ import annotations

from edgefleet.demo.stack import mosquitto_binary
from edgefleet.shared.errors import ConfigError


def demo_missing() -> str | None:
    """Why the demo cannot start here (Mosquitto not installed), or None."""
    try:
        mosquitto_binary()
    except ConfigError as exc:
        return f"{exc} (apt-get install mosquitto)"
    return None
