"""`edgefleet bench cloud --parts triton`: the same escalations answered by the cloud's
primary in process and through Triton Inference Server, side by side in one run.

Both runs: a real Mosquitto, one orchestrator (MQTT ingest, the cascade, the store), the
same signed cases from a second process, each its own image of text (no verdict cache
hits), the primary `ppocr6-cloud`. In process, its ONNX Runtime sessions run in the
orchestrator; on Triton, the forward passes go to nvidia-pytriton's tritonserver (its
Python backend running ONNX Runtime, the repository `cloud triton-repo --backend python`
writes) over gRPC, pre- and post-processing staying in the orchestrator. Figures: cases/s
from first publish to last verdict, p50/p95 publish to verdict, the orchestrator's CPU per
case (this process; the publisher runs in another) and Triton's (its server and stubs).
"""

from __future__ import annotations

import statistics
import threading
import time
from pathlib import Path
from typing import Any

PRIMARY = "ppocr6-cloud"


def _plates(count: int) -> list[bytes]:
    """PNG plates, each with its own text."""
    import cv2
    import numpy as np

    from edgefleet.shared.imaging import encode_png

    out = []
    for i in range(count):
        img = np.full((120, 480, 3), 255, np.uint8)
        cv2.putText(img, f"EF-{i:04d} OK", (10, 80), cv2.FONT_HERSHEY_SIMPLEX, 1.8, (0, 0, 0), 4)
        out.append(encode_png(img))
    return out


def _publish(
    host: str, port: int, device: str, key: bytes, images: list[bytes]
) -> tuple[float, list[float], dict[int, int]]:
    """(client side) Publish one signed case per image and wait for every verdict:
    cases/s end to end, ms from each publish to its verdict, verdicts per fallback level."""
    import json

    from edgefleet.bench.harness import escalation_case, escalation_wire
    from edgefleet.shared.mqtt import MqttSettings, connect, make_client, publish
    from edgefleet.shared.topics import Topics

    settings = MqttSettings(host=host, port=port)
    client = make_client(settings, f"{device}-bench")
    got: dict[str, float] = {}
    levels: dict[int, int] = {}
    done, ready = threading.Event(), threading.Event()

    def on_message(c, u, message) -> None:
        body = json.loads(message.payload)
        if "case_id" in body and body["case_id"] not in got:  # not the lag status
            got[body["case_id"]] = time.perf_counter()
            levels[body["fallback_level"]] = levels.get(body["fallback_level"], 0) + 1
        if len(got) >= len(images):
            done.set()

    client.on_message = on_message
    client.on_subscribe = lambda *a: ready.set()
    client.on_connect = lambda c, *a: c.subscribe(Topics().results(device), qos=1)
    connect(client, settings, clean_start=True)
    ready.wait(30)
    cases = [escalation_case(device, frame_index=i, edge=[("X", 0.3)]) for i in range(len(images))]
    wires = [
        (c.case_id, escalation_wire(c, key, png)) for c, png in zip(cases, images, strict=True)
    ]
    sent: dict[str, float] = {}
    started = time.perf_counter()
    for case_id, wire in wires:
        sent[case_id] = time.perf_counter()
        publish(client, wire, qos=1)
    done.wait(1800)
    elapsed = time.perf_counter() - started
    client.loop_stop()
    client.disconnect()
    latencies = [(got[c] - sent[c]) * 1000 for c in sent if c in got]
    rate = len(images) / elapsed if len(got) >= len(images) else float("nan")
    return rate, latencies, levels


def _cloud(tmp: Path, broker, manifest: Path | None) -> tuple[Any, Any]:
    from edgefleet.cloud.services import CloudServices
    from edgefleet.cloud.settings import CloudSettings

    rules = tmp / "rules.yaml"
    tmp.mkdir(parents=True, exist_ok=True)
    rules.write_text(f"default: {{model: {PRIMARY}, timeout_s: 300}}\n")
    sections: dict[str, Any] = dict(  # validated as the YAML file's sections are
        mqtt={"host": broker.host, "port": broker.port},
        rules={"file": rules},
        models={"primary": PRIMARY, "lighter": PRIMARY, "served": [PRIMARY],
                "manifest": manifest, "timeout_s": 300},
        execution={"batching": {"max_batch_size": 8, "preferred_batch_size": 4,
                                "max_queue": 1024, "timeout_s": 300}},
        queue={"workers": 4, "max_pending": 4096},
        # a group of its own: the run before's session would take a share of the cases
        ingest={"client_id": f"bench-triton-{tmp.name}", "share_group": f"bt-{tmp.name}"},
    )  # fmt: skip
    settings = CloudSettings(data_dir=tmp, **sections)
    services = CloudServices.build(settings)
    device = services.fleet_registry.enroll(f"bench-{tmp.name}")
    services.start()
    deadline = time.monotonic() + 300
    while services.pool.loaded(PRIMARY) is None:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{PRIMARY} did not load: {services.pool.status()}")
        time.sleep(0.1)
    if services.ingest is None or not services.ingest.wait_connected(30):
        raise RuntimeError("the cloud's ingest did not connect to the broker")
    return services, device


def _manifest(path: Path, url: str) -> Path:
    import yaml

    from edgefleet.shared.models import ModelRegistry

    entry = (
        ModelRegistry.default()
        .get(PRIMARY)
        .model_dump(mode="json", exclude={"base_dir"}, exclude_none=True)
    )
    entry["triton"] = {"url": url, "protocol": "grpc"}
    path.write_text(yaml.safe_dump({"models": [entry]}))
    return path


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


def bench_triton(client, tmp: Path, broker, cases: int) -> None:
    """Print the side-by-side table (markdown)."""
    from edgefleet.bench.triton_server import TritonServer
    from edgefleet.cloud.triton.repository import RepositoryOptions, write_repository
    from edgefleet.shared.models import ModelRegistry

    images = _plates(cases)
    options = RepositoryOptions(backend="python", kind="cpu", intra_op_threads=0)
    write_repository(tmp / "triton-repo", ModelRegistry.default(), [PRIMARY], options)
    server = TritonServer(tmp / "triton-repo", tmp / "triton").start()
    rows: list[tuple[str, float, list[float], float, float | None, dict[int, int]]] = []
    try:
        on_triton = _manifest(tmp / "m.yaml", server.grpc_url)
        for where, manifest in (
            ("in process (ONNX Runtime)", None),
            ("Triton, gRPC (Python backend, ONNX Runtime)", on_triton),
        ):
            services, device = _cloud(tmp / f"cloud-{len(rows)}", broker, manifest)
            cpu, triton_cpu = time.process_time(), server.cpu_seconds()
            rate, lat, levels = client.submit(
                _publish, broker.host, broker.port, device.device_id, device.device_key, images
            ).result()
            cpu = (time.process_time() - cpu) / cases * 1000
            triton_cpu = (server.cpu_seconds() - triton_cpu) / cases * 1000
            services.close()
            rows.append((where, rate, lat, cpu, triton_cpu if manifest else None, levels))
    finally:
        server.kill()
    print(f"\n## {PRIMARY} in process vs on Triton: {cases} escalations over MQTT, one replica")
    print(
        "| forward pass | cases/s | p50 ms | p95 ms | orchestrator CPU ms per case "
        "| Triton CPU ms per case | answered by the primary |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for where, rate, lat, cpu, tcpu, levels in rows:
        server_cpu = f"{tcpu:.0f}" if tcpu is not None else "-"
        print(
            f"| {where} | {rate:.2f} | {statistics.median(lat):.0f} | {_pct(lat, 95):.0f} "
            f"| {cpu:.0f} | {server_cpu} | {levels.get(0, 0)}/{cases} |"
        )
    (_, local_rate, _, local_cpu, _, _), (_, remote_rate, _, remote_cpu, _, _) = rows
    print(
        f"Triton / in process: {remote_rate / local_rate:.2f}x cases/s, the orchestrator's "
        f"CPU per case {remote_cpu / local_cpu:.2f}x"
    )
