"""A free local TCP port for a server about to start (the demo's broker, cloud and agents;
the benchmarks' and tests' servers)."""

from __future__ import annotations

import random
import socket

# below Linux's ephemeral range (32768-60999): a port handed out here is not taken by an
# outgoing connection's source port before the server that is given it binds
LISTEN_PORTS = range(20_000, 32_000)


def free_port() -> int:
    """A port nothing listens on now, chosen outside the ephemeral range."""
    for _ in range(200):
        port = random.choice(LISTEN_PORTS)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
