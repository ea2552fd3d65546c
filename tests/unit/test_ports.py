"""A free port for a server about to start is never one the kernel hands out as an
outgoing connection's source port."""

from __future__ import annotations

import socket
from pathlib import Path

from edgefleet.shared.ports import LISTEN_PORTS, free_port


def _ephemeral() -> range:
    low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
    return range(int(low), int(high) + 1)


def test_the_ports_handed_out_lie_outside_the_ephemeral_range_and_can_be_bound() -> None:
    ephemeral = _ephemeral()
    assert LISTEN_PORTS.stop <= ephemeral.start
    for _ in range(20):
        port = free_port()
        assert port not in ephemeral
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))

