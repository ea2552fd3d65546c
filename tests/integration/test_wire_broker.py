"""Wire format v1 through a real Mosquitto, with an outside MQTT 5 client as the sender."""

from __future__ import annotations

import hashlib
import hmac
import queue
import shutil
import subprocess
import uuid

import pytest

from edgefleet.shared import mqtt as efmqtt
from edgefleet.shared.errors import PayloadRejected
from edgefleet.shared.messages import DeviceTelemetry, EscalationCase, EscalationCounters, ModelInfo
from edgefleet.shared.mqtt import MqttSettings
from edgefleet.shared.topics import Channel, Topics
from edgefleet.shared.wire import Verifier, WireMessage, encode
from tests.support.waiting import eventually

KEY = b"device-key-of-cam-01-32-bytes!!!"
TOPICS = Topics()

pytestmark = pytest.mark.skipif(
    shutil.which("mosquitto_pub") is None, reason="mosquitto-clients is not installed"
)


@pytest.fixture
def received(broker):
    """Messages the broker delivers to a paho MQTT 5 subscriber of every channel."""
    inbox: queue.Queue[WireMessage] = queue.Queue()
    subscribed = queue.Queue()
    settings = MqttSettings(host=broker.host, port=broker.port)
    client = efmqtt.make_client(settings, f"test-{uuid.uuid4().hex[:8]}")
    client.on_message = lambda c, u, msg: inbox.put(efmqtt.from_paho(msg))
    client.on_subscribe = lambda *args: subscribed.put(True)
    client.on_connect = lambda c, u, f, rc, p: c.subscribe(
        [(TOPICS.all_devices(ch), 1) for ch in (Channel.TELEMETRY, Channel.ESCALATIONS)]
    )
    efmqtt.connect(client, settings, clean_start=True)
    subscribed.get(timeout=10)
    yield inbox
    client.loop_stop()
    client.disconnect()


def mosquitto_pub(broker, topic: str, props: list[tuple[str, str]], *payload_args: str) -> None:
    cmd = ["mosquitto_pub", "-V", "5", "-q", "1", "-h", broker.host, "-p", str(broker.port)]
    cmd += ["-t", topic, *payload_args]
    for name, value in props:
        if name == "content-type":
            cmd += ["-D", "publish", "content-type", value]
        else:
            cmd += ["-D", "publish", "user-property", name, value]
    subprocess.run(cmd, check=True, timeout=10)


def test_outside_client_json_message_is_accepted(broker, received):
    # given a telemetry document signed per the wire format by hand, outside our code
    doc = DeviceTelemetry(
        device_id="cam-01",
        seq=1,
        uptime_s=3.0,
        escalations=EscalationCounters(sent=0, pending=0, dropped=0),
        outbox_depth=0,
        cpu_pct=2.0,
        ram_used_mb=100.0,
    ).model_dump_json()
    sig = hmac.new(KEY, b"\n" + doc.encode(), hashlib.sha256).hexdigest()
    # when mosquitto_pub sends it
    mosquitto_pub(
        broker,
        TOPICS.telemetry("cam-01"),
        [("ef-schema", "ef.telemetry/1"), ("ef-sig", sig)],
        "-m",
        doc,
    )
    # then our verifier accepts what the broker delivers
    wire = received.get(timeout=10)
    verified = Verifier(key_for_device={"cam-01": KEY}.get).verify(wire)
    assert verified.message.seq == 1


def test_outside_client_escalation_image_and_tampered_copies(broker, received, tmp_path):
    jpeg = b"\xff\xd8\xff\xe0" + bytes(range(256)) * 4 + b"\xff\xd9"
    image = tmp_path / "crop.jpg"
    image.write_bytes(jpeg)
    meta = EscalationCase(
        device_id="cam-01",
        stream_id="gate",
        frame_index=42,
        reason="unsure",
        model=ModelInfo(name="ppocr", version="4"),
        content_type="image/jpeg",
    ).model_dump_json()
    good_sig = hmac.new(KEY, meta.encode() + b"\n" + jpeg, hashlib.sha256).hexdigest()
    topic = TOPICS.escalations("cam-01")
    props = [("ef-schema", "ef.escalation/1"), ("ef-meta", meta), ("content-type", "image/jpeg")]

    mosquitto_pub(broker, topic, [*props, ("ef-sig", good_sig)], "-f", str(image))
    mosquitto_pub(broker, topic, [*props, ("ef-sig", "ab" * 32)], "-f", str(image))
    mosquitto_pub(broker, topic, props, "-f", str(image))

    verifier = Verifier(key_for_device={"cam-01": KEY}.get)
    first = verifier.verify(received.get(timeout=10))
    assert first.image == jpeg and first.message.frame_index == 42
    for expected in ("bad_signature", "unsigned"):
        with pytest.raises(PayloadRejected) as err:
            verifier.verify(received.get(timeout=10))
        assert err.value.reason == expected


def test_our_encoder_round_trips_through_the_broker(broker, received):
    settings = MqttSettings(host=broker.host, port=broker.port)
    publisher = efmqtt.make_client(settings, "pub-test")
    efmqtt.connect(publisher, settings, clean_start=True)
    eventually(publisher.is_connected, 10, "the publisher connected to the broker")
    try:
        message = EscalationCase(
            device_id="cam-01",
            stream_id="gate",
            frame_index=1,
            reason="empty",
            model=ModelInfo(name="ppocr", version="4"),
            content_type="image/png",
        )
        png = b"\x89PNG\r\n\x1a\n" + b"\x00" * 100
        info = efmqtt.publish(publisher, encode(message, KEY, TOPICS.escalations("cam-01"), png))
        info.wait_for_publish(timeout=10)
        verified = Verifier(key_for_device={"cam-01": KEY}.get).verify(received.get(timeout=10))
        assert verified.message == message and verified.image == png
    finally:
        publisher.loop_stop()
        publisher.disconnect()


def test_own_broker_restarts_on_its_port_and_keeps_retained_messages(own_broker):
    # given a retained message on a broker of this test's own
    topic = TOPICS.status("cam-01")
    mosquitto_pub(own_broker, topic, [], "-r", "-m", "kept")
    port = own_broker.port
    # when the broker is stopped and started again mid-test
    own_broker.restart()
    assert own_broker.running and own_broker.port == port
    # then an outside client finds the message, restored from the persistence directory
    sub = ["mosquitto_sub", "-h", own_broker.host, "-p", str(port), "-t", topic]
    got = subprocess.run(
        [*sub, "-C", "1", "-W", "10"],
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert got.stdout.strip() == "kept", got.stderr + own_broker.log_tail()
    own_broker.kill()
    assert not own_broker.running
