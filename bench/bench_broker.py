"""The broker with a fleet's real connections: Mosquitto's memory and CPU per device.

Run: `edgefleet bench broker --devices 5000`. The other benchmarks play many devices over a
few connections; a fleet holds one connection per device. Here every device is enrolled
in a registry, the broker runs exactly as `edgefleet fleet broker-files` configures it
(dynamic-security plugin: each device's password, its bound client id, its ACLs), and
each device connects for real with its own credentials, subscribes to its results topic
(as the agent does) and publishes telemetry every `--period` seconds (QoS 1) to the
cloud's shared subscription, which one consumer drains. The figures: the broker's RSS
idle, with every device connected, and after `--seconds` of traffic; its CPU per 1,000
messages; and whether every device got in (a refusal is counted, not hidden).

All device connections are driven by one thread through paho's external-loop hooks
(no thread per device), so the machine spends its cores on the broker, not the swarm.
"""

from __future__ import annotations

import json
import selectors
import tempfile
import threading
import time
from pathlib import Path
from typing import Annotated, Any

import typer

app = typer.Typer(add_completion=False)


class Swarm:
    """Many paho clients on one selector: paho reads, writes and pings when told."""

    def __init__(self) -> None:
        self.selector = selectors.DefaultSelector()
        self.clients: list[Any] = []
        self.connected = 0
        self.subscribed = 0
        self.refused = 0

    def add(self, client: Any) -> None:
        sel = self.selector
        read, write = selectors.EVENT_READ, selectors.EVENT_WRITE
        client.on_socket_open = lambda c, u, sock: sel.register(sock, read, c)
        client.on_socket_close = lambda c, u, sock: sel.unregister(sock)
        client.on_socket_register_write = lambda c, u, sock: sel.modify(sock, read | write, c)
        client.on_socket_unregister_write = lambda c, u, sock: sel.modify(sock, read, c)
        self.clients.append(client)

    def turn(self, timeout_s: float) -> None:
        for key, mask in self.selector.select(timeout_s):
            client = key.data
            if mask & selectors.EVENT_READ:
                client.loop_read()
            if mask & selectors.EVENT_WRITE:
                client.loop_write()

    def misc(self) -> None:
        for client in self.clients:
            client.loop_misc()


def _rss_mb(pid: int) -> float:
    import psutil

    return psutil.Process(pid).memory_info().rss / 2**20


def _cpu_s(pid: int) -> float:
    import psutil

    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def measure(devices: int, period_s: float, seconds: float, connect_rate: float) -> dict[str, Any]:
    import paho.mqtt.client as mqtt

    from edgefleet.bench.mosquitto import MosquittoBroker, free_port
    from edgefleet.fleet.acl import BrokerListener, write_broker_files
    from edgefleet.fleet.registry import DeviceRegistry
    from edgefleet.shared.db import Database
    from edgefleet.shared.mqtt import device_client_id
    from edgefleet.shared.topics import Channel, Topics

    topics = Topics()
    with tempfile.TemporaryDirectory(prefix="ef-broker-") as tmpdir:
        tmp = Path(tmpdir)
        db = Database.connect(f"sqlite:///{tmp / 'fleet.db'}")
        registry = DeviceRegistry(db)
        started = time.monotonic()
        enrolled = [registry.enroll(f"conn-{i:05d}") for i in range(devices)]
        cloud_password = registry.accounts.ensure_service("cloud")
        enroll_s = time.monotonic() - started
        port = free_port()
        files = write_broker_files(registry, tmp / "broker", BrokerListener(port, "127.0.0.1"))
        broker = MosquittoBroker(tmp / "broker", port, generated=files.config_file).start()
        try:
            time.sleep(1.0)  # let the plugin load its state before the idle reading
            idle_mb = _rss_mb(broker.pid)
            received = 0
            lock = threading.Lock()

            def consumed(c, u, message) -> None:
                nonlocal received
                with lock:
                    received += 1

            cloud = mqtt.Client(
                mqtt.CallbackAPIVersion.VERSION2, "ef-cloud-bench", protocol=mqtt.MQTTv5
            )
            cloud.username_pw_set("cloud", cloud_password)
            cloud.on_message = consumed
            ready = threading.Event()
            cloud.on_subscribe = lambda *a: ready.set()
            cloud.on_connect = lambda c, *a: c.subscribe(
                topics.all_devices(Channel.TELEMETRY, "bench"), qos=1
            )
            cloud.connect("127.0.0.1", port)
            cloud.loop_start()
            if not ready.wait(30):
                raise RuntimeError(f"the cloud account could not subscribe: {broker.log_tail()}")

            swarm = Swarm()

            def on_connect(c, u, flags, reason_code, props) -> None:
                if reason_code.is_failure:
                    swarm.refused += 1
                    return
                swarm.connected += 1
                c.subscribe(topics.results(u), qos=1)

            def on_subscribe(c, u, mid, codes, props) -> None:
                if all(not rc.is_failure for rc in codes):
                    swarm.subscribed += 1

            started = time.monotonic()
            for i, enrollment in enumerate(enrolled):
                client = mqtt.Client(
                    mqtt.CallbackAPIVersion.VERSION2,
                    device_client_id(enrollment.device_id),
                    protocol=mqtt.MQTTv5,
                    userdata=enrollment.device_id,
                )
                client.username_pw_set(enrollment.device_id, enrollment.broker_password)
                client.on_connect = on_connect
                client.on_subscribe = on_subscribe
                swarm.add(client)
                client.connect("127.0.0.1", port, keepalive=60)
                swarm.turn(0)
                pace = started + (i + 1) / connect_rate - time.monotonic()
                if pace > 0:
                    swarm.turn(pace)
            deadline = time.monotonic() + 120
            while swarm.subscribed + swarm.refused < devices and time.monotonic() < deadline:
                swarm.turn(0.1)
            connect_s = time.monotonic() - started
            connected_mb = _rss_mb(broker.pid)

            payload = json.dumps({"pad": "x" * 560}).encode()  # a telemetry message's size
            sent, tick = 0, 0
            cpu_before, traffic_started = _cpu_s(broker.pid), time.monotonic()
            per_tick = devices * 0.1 / period_s
            due = 0.0
            while time.monotonic() - traffic_started < seconds:
                due += per_tick
                while due >= 1:
                    client = swarm.clients[sent % devices]
                    client.publish(topics.telemetry(client.user_data_get()), payload, qos=1)
                    sent, due = sent + 1, due - 1
                tick += 1
                swarm.misc()
                until = traffic_started + tick * 0.1
                while time.monotonic() < until:
                    swarm.turn(max(0.0, until - time.monotonic()))
            deadline = time.monotonic() + 60
            while received < sent and time.monotonic() < deadline:
                swarm.turn(0.1)
            cpu = _cpu_s(broker.pid) - cpu_before
            traffic_mb = _rss_mb(broker.pid)
            for client in swarm.clients:
                client.disconnect()
            cloud.loop_stop()
            cloud.disconnect()
        finally:
            broker.kill()
            db.close()
    return {
        "devices": devices,
        "enroll_s": round(enroll_s, 1),
        "connected": swarm.connected,
        "subscribed": swarm.subscribed,
        "refused": swarm.refused,
        "connect_s": round(connect_s, 1),
        "idle_mb": round(idle_mb, 1),
        "connected_mb": round(connected_mb, 1),
        "traffic_mb": round(traffic_mb, 1),
        "kb_per_connection": round((connected_mb - idle_mb) * 1024 / max(1, swarm.connected), 1),
        "sent": sent,
        "received": received,
        "broker_cpu_ms_per_1000": round(cpu * 1e6 / max(1, received), 1),
        "msgs_per_s": round(sent / seconds, 1),
    }


@app.command()
def main(
    devices: Annotated[str, typer.Option(help="comma list of fleet sizes")] = "1000,5000",
    period: Annotated[float, typer.Option(help="telemetry period per device, s")] = 5.0,
    seconds: Annotated[float, typer.Option(help="traffic after everyone connected, s")] = 60.0,
    connect_rate: Annotated[float, typer.Option(help="new connections per second")] = 500.0,
) -> None:
    """Mosquitto's RSS and CPU with one real, authenticated connection per device.

    Example: edgefleet bench broker --devices 1000,5000 --seconds 60
    """
    rows = []
    for count in (int(n) for n in devices.split(",")):
        row = measure(count, period, seconds, connect_rate)
        rows.append(row)
        print(json.dumps(row), flush=True)
    print("\n## Mosquitto with one real connection per device (dynamic-security, per-device ACLs)")
    print(
        "| devices | connected / refused | broker RSS idle -> connected -> after traffic, MB "
        "| KB per connection | telemetry msg/s | broker CPU ms per 1,000 msgs | delivered |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(
            f"| {r['devices']} | {r['connected']} / {r['refused']} "
            f"| {r['idle_mb']} -> {r['connected_mb']} -> {r['traffic_mb']} "
            f"| {r['kb_per_connection']} | {r['msgs_per_s']} | {r['broker_cpu_ms_per_1000']} "
            f"| {r['received']} / {r['sent']} |"
        )


if __name__ == "__main__":
    app()
