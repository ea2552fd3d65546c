"""MQTT ingest against a real broker: backpressure by withholding acks (no unbounded
queue), and telemetry/status/reported reaching the device registry."""

from __future__ import annotations

import secrets
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import REGISTRY

from edgefleet.bench.harness import escalation_case, escalation_wire, verdict_of
from edgefleet.cloud.services import CloudServices
from edgefleet.cloud.settings import CloudSettings
from edgefleet.fleet.registry import DeviceDetail
from edgefleet.shared.imaging import encode_png
from edgefleet.shared.messages import (
    CloudVerdict,
    DeviceStatus,
    DeviceTelemetry,
    EscalationCounters,
    ModelInfo,
    ReportedState,
)
from edgefleet.shared.mqtt import MqttSettings, connect, make_client, publish
from edgefleet.shared.topics import Topics
from edgefleet.shared.wire import encode
from tests.support.bombs import jpeg_declaring
from tests.support.waiting import counter_value, eventually


class GateModel:
    """A model that answers only once the test opens the gate."""

    def __init__(self) -> None:
        self.info = ModelInfo(name="ppocr-heavy", version="gate")
        self.gate = threading.Event()
        self.calls = 0

    def predict(self, image_rgb, *, priority=0, timeout_s=None, tenant=None):
        self.calls += 1
        self.gate.wait()
        return []

    async def predict_async(self, image_rgb, *, priority=0, timeout_s=None, tenant=None):
        return self.predict(image_rgb)

    @property
    def memory_bytes(self) -> int:
        return 0

    def close(self) -> None:
        self.gate.set()


def _services(tmp: Path, broker, **overrides) -> CloudSettings:
    return CloudSettings(
        data_dir=tmp,
        mqtt=MqttSettings(host=broker.host, port=broker.port),
        ingest={"share_group": f"ing-{secrets.token_hex(3)}", "receive_maximum": 4},
        **overrides,
    )


def _device(broker, name: str, results_of: str | None = None):
    settings = MqttSettings(host=broker.host, port=broker.port)
    client = make_client(settings, name)
    got: list[CloudVerdict] = []
    ready = threading.Event()
    if results_of:

        def on_message(c, u, m) -> None:
            verdict = verdict_of(m.payload)
            if verdict is not None:  # not the cloud's lag status
                got.append(verdict)

        client.on_message = on_message
        client.on_subscribe = lambda *a: ready.set()
        client.on_connect = lambda c, *a: c.subscribe(Topics().results(results_of), qos=1)
    else:
        client.on_connect = lambda *a: ready.set()
    connect(client, settings, clean_start=True)
    assert ready.wait(30)
    return client, got


def _telemetry_stored() -> float:
    return counter_value("ef_cloud_ingest_total", channel="telemetry", outcome="stored")


def _telemetry(device_id: str) -> DeviceTelemetry:
    return DeviceTelemetry(
        device_id=device_id,
        seq=secrets.randbelow(1 << 40),
        uptime_s=1.0,
        escalations=EscalationCounters(sent=0, pending=0, dropped=0),
        outbox_depth=0,
        cpu_pct=1.0,
        ram_used_mb=1.0,
    )


def _backpressure_count() -> float:
    return REGISTRY.get_sample_value("ef_cloud_backpressure_total", {"source": "mqtt"}) or 0.0


@pytest.mark.parametrize("max_pending", [2, 64], ids=["case-queue-full", "window-full"])
def test_slow_processing_holds_messages_at_the_broker_not_in_memory(
    broker, tmp_path: Path, max_pending: int
) -> None:
    # given one worker stuck on a gated model and a receive maximum of 4 (and a case queue
    # that is either smaller than that window or has room to spare: counted either way)
    gate = GateModel()
    settings = _services(
        tmp_path,
        broker,
        models={"preload": False, "timeout_s": 120},
        queue={"workers": 1, "max_pending": max_pending},
    )
    services = CloudServices.build(settings, loader=lambda name: gate)
    cam = services.fleet_registry.enroll("cam-bp")
    services.start()
    client, verdicts = _device(broker, "cam-bp-dev", results_of="cam-bp")
    try:
        assert services.ingest.wait_connected(30)
        before = _backpressure_count()
        png = encode_png(np.full((16, 16, 3), 90, np.uint8))
        cases = [escalation_case("cam-bp", frame_index=i) for i in range(20)]
        sent = [publish(client, escalation_wire(c, cam.device_key, png), qos=1) for c in cases]
        # when the orchestrator has taken all it may (1 running + 3 queued)
        eventually(
            lambda: gate.calls == 1 and services.processor.depth == 3,
            60,
            "1 case running and 3 queued",
            detail=lambda: (gate.calls, services.processor.depth),
        )
        # and the broker has routed all 20 (PUBACKs), and whatever it sent the orchestrator
        # before a QoS 0 telemetry message (not held by the window) has been read
        for info in sent:
            info.wait_for_publish(30)
        telemetry_before = _telemetry_stored()
        barrier = encode(_telemetry("cam-bp"), cam.device_key, Topics().telemetry("cam-bp"))
        publish(client, barrier, qos=0)
        eventually(lambda: _telemetry_stored() > telemetry_before, 30, "the telemetry barrier")
        # then no more came in: the other 16 wait at the broker, and it was counted
        assert services.processor.depth == 3
        assert _backpressure_count() > before
        # and once the model answers, every case is processed exactly once
        gate.gate.set()
        eventually(
            lambda: len({v.case_id for v in verdicts}) >= len(cases),
            120,
            f"a verdict for each of the {len(cases)} cases",
            detail=lambda: f"{len(verdicts)} verdicts",
        )
        assert {v.case_id for v in verdicts} == {c.case_id for c in cases}
        assert set(services.store.ledger.attempts().values()) == {1}
    finally:
        gate.gate.set()
        client.loop_stop()
        client.disconnect()
        services.close()


def test_telemetry_status_and_reported_reach_the_registry(broker, tmp_path: Path) -> None:
    settings = _services(tmp_path, broker, models={"preload": False})
    services = CloudServices.build(settings)
    cam = services.fleet_registry.enroll("cam-tl")
    services.start()
    client, _ = _device(broker, "cam-tl-dev")
    topics = Topics()
    try:
        assert services.ingest.wait_connected(30)
        messages = [
            (
                DeviceStatus(device_id="cam-tl", state="online", agent_version="1.2.3"),
                topics.status("cam-tl"),
            ),
            (
                DeviceTelemetry(
                    device_id="cam-tl",
                    seq=1,
                    uptime_s=5.0,
                    escalations=EscalationCounters(sent=3, pending=0, dropped=0),
                    outbox_depth=7,
                    cpu_pct=42.0,
                    ram_used_mb=512.0,
                ),
                topics.telemetry("cam-tl"),
            ),
            (
                ReportedState(
                    device_id="cam-tl", deployment_id="dep-1", image="edge:1", status="healthy"
                ),
                topics.reported("cam-tl"),
            ),
        ]
        for message, topic in messages:
            publish(client, encode(message, cam.device_key, topic), qos=1)
        read: list[DeviceDetail] = []

        def all_three_in() -> bool:
            read[:] = [services.fleet_registry.get_device("cam-tl")]
            return bool(read[0].online and read[0].outbox_depth == 7 and read[0].reported)

        eventually(all_three_in, 30, "status, telemetry and reported in", detail=lambda: read)
        device = read[0]
        assert device.agent_version == "1.2.3" and device.cpu_pct == 42.0
        assert device.reported["deployment_id"] == "dep-1"
    finally:
        client.loop_stop()
        client.disconnect()
        services.close()


def test_an_mqtt_case_whose_image_will_not_decode_is_refused_and_not_stored(
    broker, tmp_path: Path
) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text("rules:\n  - {name: ok, when: {stream: ok}, route: {model: rules}}\n")
    settings = _services(tmp_path, broker, models={"preload": False}, rules={"file": rules})
    services = CloudServices.build(settings)
    cam = services.fleet_registry.enroll("cam-bad")
    services.start()
    client, verdicts = _device(broker, "cam-bad-dev", results_of="cam-bad")
    try:
        assert services.ingest.wait_connected(30)
        good_png = encode_png(np.full((16, 16, 3), 90, np.uint8))
        truncated = good_png[: len(good_png) // 2]  # right magic, broken body
        bad = escalation_case("cam-bad")
        good = escalation_case("cam-bad", stream_id="ok", edge=[("OK", 0.9)])
        refused = {"source": "mqtt", "outcome": "image_invalid"}
        before = REGISTRY.get_sample_value("ef_cloud_cases_total", refused) or 0.0
        publish(client, escalation_wire(bad, cam.device_key, truncated), qos=1)
        publish(client, escalation_wire(good, cam.device_key, good_png), qos=1)

        def answered() -> bool:
            return any(v.case_id == good.case_id for v in verdicts)

        def counted() -> bool:
            return (REGISTRY.get_sample_value("ef_cloud_cases_total", refused) or 0.0) > before

        eventually(
            lambda: answered() and counted(),  # (one 30 s for both)
            30,
            "the good case answered and the bad one counted refused",
            detail=lambda: {"answered": answered(), "counted": counted()},
        )
        assert bad.case_id not in services.store.ledger.attempts()
        assert all(v.case_id != bad.case_id for v in verdicts)
        # and both copies that arrived are in the store's audit, the refused one unstored
        accounts = {row["case_id"]: row for row in services.store.ledger.accounts()}
        assert accounts[bad.case_id]["deliveries"] == 1 and accounts[bad.case_id]["status"] is None
        assert accounts[good.case_id]["deliveries"] == 1 and accounts[good.case_id]["answered"]
    finally:
        client.loop_stop()
        client.disconnect()
        services.close()


def _batches() -> float:
    return REGISTRY.get_sample_value("ef_cloud_light_batch_size_count") or 0.0


def test_a_trickle_of_telemetry_is_stored_in_few_transactions(broker, tmp_path: Path) -> None:
    # given a replica whose telemetry batches may wait 2 s for more messages
    ingest = {
        "share_group": f"ing-{secrets.token_hex(3)}",
        "receive_maximum": 64,
        "light_flush_s": 2.0,
        "light_workers": 1,
    }
    settings = CloudSettings(
        data_dir=tmp_path,
        mqtt=MqttSettings(host=broker.host, port=broker.port),
        ingest=ingest,
        models={"preload": False},
    )
    services = CloudServices.build(settings)
    cam = services.fleet_registry.enroll("cam-trickle")
    services.start()
    client, _ = _device(broker, "cam-trickle-dev")
    try:
        assert services.ingest.wait_connected(30)
        stored, batches = _telemetry_stored(), _batches()
        # when a device sends 20 telemetry messages a few milliseconds apart
        for _ in range(20):
            message = _telemetry("cam-trickle")
            publish(client, encode(message, cam.device_key, Topics().telemetry("cam-trickle")))
            time.sleep(0.005)
        # then all are stored, in one or two transactions (without the wait: about 20)
        eventually(lambda: _telemetry_stored() - stored >= 20, timeout_s=15, what="20 stored")
        assert _batches() - batches <= 2
    finally:
        client.loop_stop()
        client.disconnect()
        services.close()


def test_mqtt_cases_refused_by_the_decode_budget_are_counted_and_settled(
    broker, tmp_path: Path
) -> None:
    # given a cloud whose MQTT ingest may hold 4 cases un-acked, and whose decode budget
    # (the one REST and /v1/infer draw on too) is taken by another decode
    settings = _services(tmp_path, broker, models={"preload": False}, images={"decode_wait_s": 0})
    services = CloudServices.build(settings)
    cam = services.fleet_registry.enroll("cam-big")
    services.start()
    client, _ = _device(broker, "cam-big-dev")
    busy = {"source": "mqtt", "outcome": "decode_budget_busy"}
    too_large = {"source": "mqtt", "outcome": "payload_too_large"}
    before = REGISTRY.get_sample_value("ef_cloud_cases_total", busy) or 0.0
    before_large = REGISTRY.get_sample_value("ef_cloud_cases_total", too_large) or 0.0
    image = encode_png(np.full((64, 64, 3), 90, np.uint8))
    try:
        assert services.ingest.wait_connected(30)
        with services.decode_budget.reserve(services.decode_budget.total_bytes):
            # when the device sends more cases than the ingest may hold un-acked
            for _ in range(6):
                publish(client, escalation_wire(escalation_case("cam-big"), cam.device_key, image))
            # then each is refused, counted and acknowledged (else the broker would send no
            # more than 4 of them)
            eventually(
                lambda: (
                    (REGISTRY.get_sample_value("ef_cloud_cases_total", busy) or 0.0) >= before + 6
                ),
                30,
                "six cases refused as decode_budget_busy",
            )
        # and a declared-dimension bomb is refused by its decode bytes, before decoding
        bomb = escalation_case("cam-big", content_type="image/jpeg")
        publish(client, escalation_wire(bomb, cam.device_key, jpeg_declaring(16384, 2441)))
        eventually(
            lambda: (
                (REGISTRY.get_sample_value("ef_cloud_cases_total", too_large) or 0.0) > before_large
            ),
            30,
            "the bomb refused as payload_too_large",
        )
        assert services.decode_budget.reserved == 0
    finally:
        client.loop_stop()
        client.disconnect()
        services.close()
