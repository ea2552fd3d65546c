"""Helpers for the edge tests: a verifying subscriber, synthetic video, settings."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from edgefleet.edge.agent import Agent
from edgefleet.edge.settings import EdgeSettings
from edgefleet.shared.messages import (
    DeviceStatus,
    DeviceTelemetry,
    EscalationCase,
    Message,
    ReportedState,
    StreamTelemetry,
)
from edgefleet.shared.mqtt import MqttSettings, connect, from_paho, make_client, publish
from edgefleet.shared.topics import Channel, Topics
from edgefleet.shared.wire import ReplayedMessage, Verifier, encode
from tests.support.broker import MosquittoBroker
from tests.support.waiting import eventually

DEVICE = "cam-01"
KEY = bytes(range(32))


def persistent_broker(workdir: Path) -> MosquittoBroker:
    """A broker whose persistence really works when the tests run as root.

    Started as root, mosquitto drops to the `mosquitto` user, which cannot write under
    pytest's 0700 temp folders: its persistence file (and log) then silently never appear,
    and a restart forgets every session. `user root` keeps it able to write there.
    """
    extra = "user root" if os.geteuid() == 0 else ""
    return MosquittoBroker(workdir, extra_config=extra)


def text_frame(text: str, size: tuple[int, int] = (240, 320)) -> np.ndarray:
    img = np.full((*size, 3), 255, np.uint8)
    cv2.putText(img, text, (30, size[0] // 2 + 20), cv2.FONT_HERSHEY_SIMPLEX, 1.6, (0, 0, 0), 4)
    return img


def write_video(path: Path, texts: list[str], fps: float = 10.0) -> Path:
    """An MP4 whose frame i shows texts[i] (known frames for the assertions)."""
    frames = [text_frame(t) for t in texts]
    h, w = frames[0].shape[:2]
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), fps, (w, h))
    for frame in frames:
        writer.write(frame)
    writer.release()
    return path


def edge_settings(tmp_path: Path, broker: MosquittoBroker, url: str, **extra: Any) -> dict:
    """Settings (as the YAML dict) of an agent that escalates every new frame quickly."""
    data: dict[str, Any] = {
        "device_id": DEVICE,
        "device_key": KEY.hex(),
        "mqtt": {
            "host": broker.host,
            "port": broker.port,
            "reconnect_min_s": 1,
            "reconnect_max_s": 2,
        },
        "streams": [{"id": "gate", "url": url, "realtime": False}],
        "policy": {
            "sample_share": 1.0,
            "rate_per_min": 60_000,
            "burst": 1000,
            "dedup_window_s": 0,
            "jpeg_quality": 90,
        },
        "outbox": {"path": str(tmp_path / "outbox.db")},
        "telemetry_interval_s": 1.0,
        "health": {"port": 0},
        "state_dir": str(tmp_path / "state"),
    }
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    return data


def build_settings(data: dict) -> EdgeSettings:
    return EdgeSettings(**data)


def live_stream_agent(tmp_path: Path, broker: MosquittoBroker, stream: dict[str, Any]) -> Agent:
    """An agent (not started) on one live stream that gives up and reconnects fast (stall
    2 s, open 3 s, backoff 0.2-1 s), telemetry every 0.5 s, no sampled cases."""
    quick = {
        "stall_timeout_s": 2,
        "open_timeout_s": 3,
        "reconnect_min_s": 0.2,
        "reconnect_max_s": 1,
    }
    data = edge_settings(
        tmp_path,
        broker,
        "unused",
        device_id=DEVICE,
        streams=[{**quick, **stream}],
        policy={"sample_share": 0.0},
        telemetry_interval_s=0.5,
    )
    return Agent(build_settings(data))


class Collector:
    """A cloud-side subscriber: verifies every message like the cloud does, keeps them."""

    def __init__(self, broker: MosquittoBroker, client_id: str = "test-cloud"):
        self.broker = broker
        self.lock = threading.Lock()
        self.cases: dict[str, tuple[EscalationCase, bytes]] = {}
        self.deliveries: list[str] = []  # case ids in arrival order, duplicates included
        self.telemetry: list[DeviceTelemetry] = []
        self.statuses: list[tuple[DeviceStatus, bool]] = []
        self.rejected: list[str] = []
        self.reported: list[ReportedState] = []
        self.verifier = Verifier(key_for_device=lambda d: KEY if d == DEVICE else None)
        settings = MqttSettings(host=broker.host, port=broker.port, reconnect_max_s=2)
        self.client = make_client(settings, client_id)
        self.client.on_connect = self._on_connect
        self.client.on_message = self._on_message
        self.connected = threading.Event()
        connect(self.client, settings, clean_start=False)
        eventually(self.connected.is_set, 30, "collector connection")

    def last_stream(self) -> StreamTelemetry | None:
        """The first stream of the latest telemetry message, if one has come."""
        with self.lock:
            return self.telemetry[-1].streams[0] if self.telemetry else None

    def _on_connect(self, client, userdata, flags, rc, props) -> None:
        # what the device sends (not `results`/`desired`: those flow the other way, and a
        # retained one left on the session's broker by another test is not ours to verify)
        uplink = (Channel.STATUS, Channel.TELEMETRY, Channel.ESCALATIONS, Channel.REPORTED)
        client.subscribe([(Topics().for_device(DEVICE, c), 1) for c in uplink])
        self.connected.set()

    def _on_message(self, client, userdata, message: mqtt.MQTTMessage) -> None:
        wire = from_paho(message)
        try:
            verified = self.verifier.verify(wire)
        except ReplayedMessage as exc:
            verified = exc.verified
        except Exception as exc:
            with self.lock:
                self.rejected.append(f"{wire.topic}: {exc}")
            return
        msg: Message = verified.message
        with self.lock:
            if isinstance(msg, EscalationCase):
                self.deliveries.append(msg.case_id)
                self.cases[msg.case_id] = (msg, verified.image or b"")
            elif isinstance(msg, DeviceTelemetry):
                self.telemetry.append(msg)
            elif isinstance(msg, ReportedState):
                self.reported.append(msg)
            elif isinstance(msg, DeviceStatus):
                self.statuses.append((msg, bool(message.retain)))

    def send(self, message: Message, topic: str) -> None:
        info = publish(self.client, encode(message, KEY, topic), qos=1)
        info.wait_for_publish(10)

    def close(self) -> None:
        """Disconnect and end the persistent session (nothing queues for it afterwards)."""
        props = Properties(PacketTypes.DISCONNECT)
        props.SessionExpiryInterval = 0
        self.client.disconnect(properties=props)
        self.client.loop_stop()
