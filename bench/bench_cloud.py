"""The cloud orchestrator under concurrent load from a second process.

Run: `.venv/bin/python -m edgefleet.bench.bench_cloud` (defaults: 160 requests per point,
2,000 escalations, 1,000 devices x 5 telemetry messages).

- `POST /v1/infer/ppocr`: throughput and p50/p99 at 16 and 64 concurrent clients (httpx
  in a separate process), with the executor's dynamic batching on vs off (off = one
  image per forward pass, what a plain FastAPI + ONNX Runtime service does).
- MQTT escalation ingest: signed cases published at QoS 1 by a second process, routed to
  the rule-based level so the figure is the ingest path (verify, claim in SQLite, store,
  answer on the results topic); cases/s from first publish to last verdict received and
  p50/p99 ms from each publish to its verdict, and the consumer's CPU per case (this
  process's CPU time; the publisher runs in another),
  against a naive inline consumer (auto-ack, everything in paho's network thread).
- Telemetry ingest: 1,000 enrolled devices, each sending signed telemetry at QoS 1;
  messages/s until the registry has stored every one.
- `--parts triton`: the primary's escalations in process vs on Triton (bench/bench_triton.py).

Everything runs on a real Mosquitto, uvicorn serving create_app, SQLite on disk.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import socket
import statistics
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Annotated, Any

import typer

app = typer.Typer(add_completion=False)

OP_KEY = "bench-operator-key-0123456789"


# --- client side (runs in the second process) ------------------------------------------


def _http_load(url: str, image: bytes, concurrency: int, total: int) -> tuple[float, list[float]]:
    """`total` POSTs with `concurrency` in flight; (wall seconds, latencies in ms)."""
    import httpx

    async def run() -> tuple[float, list[float]]:
        latencies: list[float] = []
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        headers = {"Authorization": f"Bearer {OP_KEY}", "Content-Type": "image/png"}
        async with httpx.AsyncClient(base_url=url, limits=limits, timeout=300) as client:
            # warm the connections and the model
            await client.post("/v1/infer/ppocr", content=image, headers=headers)
            remaining = iter(range(total))

            async def worker() -> None:
                for _ in remaining:
                    started = time.perf_counter()
                    response = await client.post("/v1/infer/ppocr", content=image, headers=headers)
                    response.raise_for_status()
                    latencies.append((time.perf_counter() - started) * 1000)

            started = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(concurrency)))
            return time.perf_counter() - started, latencies

    return asyncio.run(run())


def _publish_cases(
    host: str, port: int, device: str, key: bytes, total: int
) -> tuple[float, list[float]]:
    """Publish `total` signed cases and wait for every verdict; (cases/s end to end,
    per-case ms from publish to its verdict received)."""
    import numpy as np

    from edgefleet.bench.harness import escalation_case, escalation_wire
    from edgefleet.shared.imaging import encode_png
    from edgefleet.shared.mqtt import MqttSettings, connect, make_client, publish
    from edgefleet.shared.topics import Topics

    settings = MqttSettings(host=host, port=port)
    client = make_client(settings, f"{device}-bench")
    got: dict[str, float] = {}
    sent: dict[str, float] = {}
    done = threading.Event()
    ready = threading.Event()

    def on_message(c, u, message) -> None:
        import json

        body = json.loads(message.payload)
        if "case_id" in body:  # a verdict, not the cloud's lag status
            got.setdefault(body["case_id"], time.perf_counter())
        if len(got) >= total:
            done.set()

    client.on_message = on_message
    client.on_subscribe = lambda *a: ready.set()
    client.on_connect = lambda c, *a: c.subscribe(Topics().results(device), qos=1)
    connect(client, settings, clean_start=True)
    ready.wait(30)
    png = encode_png(np.full((32, 96, 3), 180, np.uint8))
    cases = [escalation_case(device, frame_index=i, edge=[("X", 0.9)]) for i in range(total)]
    wires = [(case.case_id, escalation_wire(case, key, png)) for case in cases]
    started = time.perf_counter()
    for case_id, wire in wires:
        sent[case_id] = time.perf_counter()
        publish(client, wire, qos=1)
    done.wait(600)
    elapsed = time.perf_counter() - started
    client.loop_stop()
    client.disconnect()
    latencies = [(got[c] - sent[c]) * 1000 for c in sent if c in got]
    return (total / elapsed if len(got) >= total else float("nan")), latencies


def _publish_telemetry(
    host: str, port: int, devices: list[tuple[str, bytes]], per_device: int
) -> float:
    """Publish telemetry for every device; returns the wall-clock start (time.time())."""
    from edgefleet.shared.messages import DeviceTelemetry, EscalationCounters
    from edgefleet.shared.mqtt import MqttSettings, connect, make_client, publish
    from edgefleet.shared.topics import Topics
    from edgefleet.shared.wire import encode

    settings = MqttSettings(host=host, port=port, max_inflight=1000)
    client = make_client(settings, "telemetry-bench")
    connect(client, settings, clean_start=True)
    deadline = time.monotonic() + 30
    while not client.is_connected() and time.monotonic() < deadline:
        time.sleep(0.01)
    topics = Topics()
    wires = []
    for seq in range(per_device):
        for device, key in devices:
            message = DeviceTelemetry(
                device_id=device,
                seq=seq,
                uptime_s=float(seq),
                escalations=EscalationCounters(sent=seq, pending=0, dropped=0),
                outbox_depth=0,
                cpu_pct=10.0,
                ram_used_mb=100.0,
            )
            wires.append(encode(message, key, topics.telemetry(device)))
    started = time.time()
    infos = [publish(client, wire, qos=1) for wire in wires]
    for info in infos:
        info.wait_for_publish(120)
    client.loop_stop()
    client.disconnect()
    return started


# --- server side --------------------------------------------------------------------------


def _settings(tmp: Path, broker, *, batching: bool, rules: Path | None = None):
    from edgefleet.cloud.auth import key_digest
    from edgefleet.cloud.settings import CloudSettings

    sections: dict[str, Any] = dict(  # validated as the YAML file's sections are
        mqtt={"host": broker.host, "port": broker.port},
        api_keys=[{"name": "bench", "sha256": key_digest(OP_KEY)}],
        models={"served": ["ppocr"], "lighter": "ppocr", "primary": "ppocr", "timeout_s": 300},
        execution={
            "batching": {
                "enabled": batching,
                "max_batch_size": 16,
                "preferred_batch_size": 8,
                "max_queue": 1024,
                "max_delay_ms": 5,
                "timeout_s": 300,
            }
        },
        rules={"file": rules},
        queue={"workers": 4, "max_pending": 4096},
        ingest={"receive_maximum": 256},
    )
    return CloudSettings(data_dir=tmp, **sections)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


def _text_png() -> bytes:
    import cv2
    import numpy as np

    from edgefleet.shared.imaging import encode_png

    img = np.full((120, 480, 3), 255, np.uint8)
    cv2.putText(img, "EF-2048 OK", (10, 80), cv2.FONT_HERSHEY_SIMPLEX, 1.8, (0, 0, 0), 4)
    return encode_png(img)


def _wait_ready(url: str) -> None:
    import httpx

    deadline = time.monotonic() + 300
    while httpx.get(f"{url}/readyz", timeout=30).status_code != 200:
        if time.monotonic() > deadline:
            raise TimeoutError("server not ready")
        time.sleep(0.2)


class NaiveIngest:
    """What a user would write first: one paho client, auto-ack, each case verified,
    stored, run and answered inline in the network thread (no queue, no workers, acks
    before the case is stored). The same store, router and cascade as ours."""

    def __init__(self, services, broker) -> None:
        import paho.mqtt.client as mqtt

        from edgefleet.shared.mqtt import MqttSettings, connect, from_paho, make_client, publish
        from edgefleet.shared.topics import Channel, Topics
        from edgefleet.shared.wire import Verifier, encode

        self.services = services
        topics = Topics()
        verifier = Verifier(key_for_device=services.registry.device_key)
        settings = MqttSettings(host=broker.host, port=broker.port)
        self.client = make_client(settings, "naive-ingest")
        # out of the box, paho decodes PUBLISH properties itself (make_client installed
        # edgefleet.shared.publish_properties; ours installs it again when it starts)
        from paho.mqtt import _packet
        from paho.mqtt.properties import Properties

        _packet.Properties = Properties  # type: ignore[misc]
        self.connected = threading.Event()

        def answer(verdict) -> None:
            key = services.registry.device_key(verdict.device_id)
            publish(self.client, encode(verdict, key, topics.results(verdict.device_id)))

        services.processor.answers.publish = answer

        def on_message(client: mqtt.Client, userdata, message) -> None:
            import hashlib

            from edgefleet.cloud.jobs import Job
            from edgefleet.shared.messages import EscalationCase

            verified = verifier.verify(from_paho(message))
            if verified.image is None:  # telemetry: stored inline, one transaction each
                services.registry.record_telemetry(verified.message)
                return
            case, image = verified.message, verified.image
            assert isinstance(case, EscalationCase)  # the only message with an image
            job = Job(
                sort_key=(0, 0, 0),
                case=case,
                image=image,
                image_sha256=hashlib.sha256(image).hexdigest(),
                route=services.router.route(case, len(image)),
                source="mqtt",
                enqueued=time.monotonic(),
            )
            services.processor.runner.process(job)

        def on_connect(client, *args) -> None:
            client.subscribe(topics.all_devices(Channel.ESCALATIONS), qos=1)
            client.subscribe(topics.all_devices(Channel.TELEMETRY), qos=1)
            self.connected.set()

        self.client.on_message = on_message
        self.client.on_connect = on_connect
        connect(self.client, settings, clean_start=True)

    def stop(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


def _bench_infer(client, tmp: Path, broker, requests: int) -> None:
    from edgefleet.bench.harness import ServerThread
    from edgefleet.cloud.app import create_app

    image = _text_png()
    print("## /v1/infer/ppocr, clients in a second process")
    print("| batching | clients | requests | req/s | p50 ms | p99 ms |")
    print("| --- | --- | --- | --- | --- | --- |")
    rates: dict[tuple[bool, int], float] = {}
    for batching in (False, True):
        settings = _settings(tmp / f"infer-{batching}", broker, batching=batching)
        settings.ingest.enabled = False
        api = create_app(settings)
        with ServerThread(api) as server:
            _wait_ready(server.url)
            for concurrency in (16, 64):
                wall, lat = client.submit(
                    _http_load, server.url, image, concurrency, requests
                ).result()
                rates[(batching, concurrency)] = len(lat) / wall
                print(
                    f"| {'on' if batching else 'off'} | {concurrency} | {len(lat)} | "
                    f"{len(lat) / wall:.1f} | {statistics.median(lat):.0f} | {_pct(lat, 99):.0f} |",
                    flush=True,
                )
    for concurrency in (16, 64):
        ratio = rates[(True, concurrency)] / rates[(False, concurrency)]
        print(f"batching on / off at {concurrency} clients: {ratio:.2f}x throughput")


def _bench_ingest(client, tmp: Path, broker, cases: int, devices: int, per_device: int) -> None:
    from edgefleet.bench.harness import ServerThread
    from edgefleet.cloud.app import create_app

    rules = tmp / "rules.yaml"
    rules.write_text("default: {model: rules, timeout_s: 30}\n")
    # naive first: a fresh store, the same rule-based route
    naive_settings = _settings(tmp / "naive", broker, batching=True, rules=rules)
    naive_settings.models.preload = False
    naive_settings.ingest.enabled = False
    naive_api = create_app(naive_settings)
    naive_services = naive_api.state.services
    naive_dev = naive_services.fleet_registry.enroll("bench-naive")
    naive_fleet = [naive_services.fleet_registry.enroll(f"bench-{i:04d}") for i in range(devices)]
    naive = NaiveIngest(naive_services, broker)
    naive.connected.wait(30)
    time.sleep(0.5)
    cpu = time.process_time()
    naive_rate, naive_lat = client.submit(
        _publish_cases, broker.host, broker.port, naive_dev.device_id, naive_dev.device_key, cases
    ).result()
    naive_cpu = (time.process_time() - cpu) / cases * 1000
    total = devices * per_device
    naive_tel = _telemetry_rate(client, broker, naive_fleet, per_device, total)
    naive.stop()
    naive_services.close()

    settings = _settings(tmp / "ingest", broker, batching=True, rules=rules)
    settings.models.preload = False
    api = create_app(settings)
    services = api.state.services
    enrolled = [services.fleet_registry.enroll(f"bench-{i:04d}") for i in range(devices)]
    with ServerThread(api) as server:
        _wait_ready(server.url)
        first = enrolled[0]
        cpu = time.process_time()
        rate, lat = client.submit(
            _publish_cases, broker.host, broker.port, first.device_id, first.device_key, cases
        ).result()
        ours_cpu = (time.process_time() - cpu) / cases * 1000
        print(f"\n## MQTT escalation ingest: {cases} cases, QoS 1, one replica")
        print(
            "| ingest | cases/s (publish -> store -> verdict received) | p50 ms | p99 ms "
            "| consumer CPU ms per case |"
        )
        print("| --- | --- | --- | --- | --- |")
        for name, r, ms, c in (
            ("naive inline consumer (auto-ack)", naive_rate, naive_lat, naive_cpu),
            ("edgefleet (workers, ack after store)", rate, lat, ours_cpu),
        ):
            print(
                f"| {name} | {r:.0f} | {statistics.median(ms):.0f} | {_pct(ms, 99):.0f} | {c:.3f} |"
            )
        print(
            f"edgefleet / naive: {rate / naive_rate:.2f}x cases/s, {naive_cpu / ours_cpu:.2f}x "
            "cases per CPU-second"
        )
        ours_tel = _telemetry_rate(client, broker, enrolled, per_device, total)
        print(f"\n## Telemetry ingest: {devices} devices x {per_device} signed messages, QoS 1")
        print("| ingest | stored msgs/s |")
        print("| --- | --- |")
        print(f"| naive inline consumer (auto-ack, a transaction each) | {naive_tel:.0f} |")
        print(f"| edgefleet (batched transactions, ack after commit) | {ours_tel:.0f} |")
        print(f"edgefleet / naive: {ours_tel / naive_tel:.2f}x")


def _telemetry_rate(client, broker, enrolled, per_device: int, total: int) -> float:
    """Messages stored per second, from the first publish until the registry holds all."""
    before = _stored_telemetry()
    job = client.submit(
        _publish_telemetry,
        broker.host,
        broker.port,
        [(e.device_id, e.device_key) for e in enrolled],
        per_device,
    )
    deadline = time.monotonic() + 600
    while _stored_telemetry() - before < total and time.monotonic() < deadline:
        time.sleep(0.01)
    finished = time.time()
    return (_stored_telemetry() - before) / (finished - job.result())


@app.command()
def main(
    requests: Annotated[int, typer.Option(help="requests per (concurrency, batching) point")] = 160,
    cases: Annotated[int, typer.Option(help="MQTT escalations")] = 2000,
    devices: Annotated[int, typer.Option(help="simulated devices for telemetry")] = 1000,
    per_device: Annotated[int, typer.Option(help="telemetry messages per device")] = 5,
    parts: Annotated[
        str,
        typer.Option(
            help="comma list of: infer, ingest, triton (the primary in process vs on Triton)"
        ),
    ] = "infer,ingest",
    triton_cases: Annotated[
        int, typer.Option(help="escalations of each run of the triton part")
    ] = 40,
) -> None:
    """REST inference and MQTT/telemetry ingest under load from a second process.

    Example: edgefleet bench cloud --requests 160 --cases 2000
    """
    from edgefleet.shared.logs import configure_logging

    configure_logging("WARNING")
    ctx = multiprocessing.get_context("spawn")
    chosen = {p.strip() for p in parts.split(",")}
    with tempfile.TemporaryDirectory() as tmpdir, ProcessPoolExecutor(1, mp_context=ctx) as client:
        tmp = Path(tmpdir)
        with Broker(tmp / "mosquitto") as broker:
            if "infer" in chosen:
                _bench_infer(client, tmp, broker, requests)
            if "ingest" in chosen:
                _bench_ingest(client, tmp, broker, cases, devices, per_device)
            if "triton" in chosen:
                from edgefleet.bench.bench_triton import bench_triton

                bench_triton(client, tmp, broker, triton_cases)


class Broker:
    """A throwaway Mosquitto on a free loopback port (no persistence: a benchmark needs
    none), so `edgefleet bench cloud` runs from an installed package, not just a checkout."""

    host = "127.0.0.1"

    def __init__(self, workdir: Path) -> None:
        from edgefleet.bench.mosquitto import free_port

        self.port = free_port()
        self.workdir = workdir
        self._process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Broker:
        from edgefleet.bench.mosquitto import mosquitto_binary

        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "mosquitto.conf"
        config.write_text(
            f"listener {self.port} {self.host}\nallow_anonymous true\n"
            "max_queued_messages 100000\nmax_inflight_messages 0\n"
            "message_size_limit 16777216\n"
        )
        self._process = subprocess.Popen(
            [mosquitto_binary(), "-c", str(config)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection((self.host, self.port), timeout=0.2).close()
                return self
            except OSError:
                if self._process.poll() is not None or time.monotonic() > deadline:
                    self.__exit__()
                    raise RuntimeError(f"mosquitto did not start on port {self.port}") from None
                time.sleep(0.05)

    def __exit__(self, *exc: object) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            self._process = None


def _stored_telemetry() -> float:
    from prometheus_client import REGISTRY

    # the registry's own count: the same for the naive consumer and for ours
    return REGISTRY.get_sample_value("ef_fleet_telemetry_recorded_total") or 0.0


if __name__ == "__main__":
    app()
