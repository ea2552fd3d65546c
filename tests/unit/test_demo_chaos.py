"""The chaos schedule of `edgefleet demo --chaos`: seeded, complete, inside the run."""

from __future__ import annotations

import socket
import threading

from edgefleet.demo.chaos import FAULTS, WINDOW, broker_answers, chaos_schedule
from edgefleet.demo.proxy import UplinkRelay

AGENTS = ["demo-cam-01", "demo-cam-02", "demo-cam-03"]


def test_the_same_seed_gives_the_same_schedule() -> None:
    assert chaos_schedule(7, 120.0, AGENTS) == chaos_schedule(7, 120.0, AGENTS)


def test_other_seeds_give_other_schedules() -> None:
    schedules = {tuple(chaos_schedule(seed, 120.0, AGENTS)) for seed in range(5)}
    assert len(schedules) == 5


def test_every_fault_once_inside_the_window_and_in_order() -> None:
    for seed in range(20):
        faults = chaos_schedule(seed, 60.0, AGENTS)
        assert sorted(f.kind for f in faults) == sorted(FAULTS)
        times = [f.at_s for f in faults]
        assert times == sorted(times)
        assert all(WINDOW[0] * 60 <= t <= WINDOW[1] * 60 for t in times)
        by_kind = {f.kind: f for f in faults}
        assert by_kind["broker_freeze"].lasts_s > 5  # longer than the keepalive
        assert by_kind["uplink_cut"].lasts_s > 0
        assert by_kind["agent_kill"].target in AGENTS
        assert by_kind["uplink_cut"].target in AGENTS
        assert by_kind["cloud_kill"].target == "cloud-b"


def _echo_server() -> tuple[socket.socket, threading.Thread]:
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=lambda c=conn: _echo(c), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return server, thread


def _echo(conn: socket.socket) -> None:
    with conn:
        while data := conn.recv(1024):
            conn.sendall(data)


def test_the_relay_relays_and_a_cut_closes_the_link_until_restored() -> None:
    server, _ = _echo_server()
    relay = UplinkRelay(server.getsockname()[1]).start()
    try:
        # given a client connected through the relay
        client = socket.create_connection(("127.0.0.1", relay.port), timeout=5)
        client.sendall(b"ping")
        assert client.recv(4) == b"ping"
        # when the link is cut, then the client's socket is closed under it
        relay.cut()
        assert client.recv(4) == b""
        # and a new connection is turned away until the link is restored
        refused = socket.create_connection(("127.0.0.1", relay.port), timeout=5)
        assert refused.recv(4) == b""
        relay.restore()
        again = socket.create_connection(("127.0.0.1", relay.port), timeout=5)
        again.sendall(b"pong")
        assert again.recv(4) == b"pong"
        assert relay.refused >= 1
    finally:
        relay.close()
        server.close()


def test_broker_answers_needs_an_mqtt_answer_not_only_a_tcp_accept() -> None:
    # a listener that accepts but never answers (a frozen broker's kernel does that)
    silent = socket.create_server(("127.0.0.1", 0))
    try:
        assert broker_answers(silent.getsockname()[1], timeout_s=0.3) is False
    finally:
        silent.close()
