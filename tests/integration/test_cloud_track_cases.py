"""Multi-crop track cases (`ef.escalation/2`) through a real Mosquitto and a real cloud
with its real primary model, and an old single-image `ef.escalation/1` case beside them."""

from __future__ import annotations

import secrets
import threading
from pathlib import Path

import cv2
import numpy as np

from edgefleet.bench.harness import escalation_case, escalation_wire
from edgefleet.cloud.services import CloudServices
from edgefleet.cloud.settings import CloudSettings
from edgefleet.edge.policy import tile_crops
from edgefleet.shared.imaging import encode_png
from edgefleet.shared.messages import CloudStatus, CloudVerdict, Tile
from edgefleet.shared.mqtt import MqttSettings, connect, make_client, publish
from edgefleet.shared.topics import Topics

TEXT = "EGLU7436450"


def line_crop(shift: int, blur: float) -> np.ndarray:
    """One crop of a text plate as the edge would cut it from a frame."""
    img = np.full((44, 230, 3), 205, np.uint8)
    cv2.putText(img, TEXT, (10 + shift, 32), cv2.FONT_HERSHEY_SIMPLEX, 0.8, (40, 40, 40), 2)
    return cv2.GaussianBlur(img, (0, 0), blur) if blur else img


class Verdicts:
    """The device side: verdicts on its results topic, each announced by an event."""

    def __init__(self) -> None:
        self.got: dict[str, CloudVerdict] = {}
        self.statuses: list[tuple[CloudStatus, bool]] = []  # (status, retained)
        self.arrived = threading.Condition()

    def on_message(self, client, userdata, message) -> None:
        schema = dict(message.properties.UserProperty)["ef-schema"]
        with self.arrived:
            if schema == "ef.cloud-status/1":
                status = CloudStatus.model_validate_json(message.payload)
                self.statuses.append((status, bool(message.retain)))
            else:
                verdict = CloudVerdict.model_validate_json(message.payload)
                self.got[verdict.case_id] = verdict
            self.arrived.notify_all()

    def wait(self, case_ids: set[str], timeout_s: float) -> bool:
        with self.arrived:
            return self.arrived.wait_for(lambda: case_ids <= set(self.got), timeout_s)

    def wait_status(self, timeout_s: float) -> bool:
        with self.arrived:
            return self.arrived.wait_for(lambda: bool(self.statuses), timeout_s)


def listen(broker, name: str, device: str) -> tuple[object, Verdicts]:
    """A client on the device's results topic; returns once it is subscribed."""
    settings = MqttSettings(host=broker.host, port=broker.port)
    verdicts = Verdicts()
    client = make_client(settings, name)
    subscribed = threading.Event()
    client.on_message = verdicts.on_message
    client.on_subscribe = lambda *a: subscribed.set()
    client.on_connect = lambda c, *a: c.subscribe(Topics().results(device), qos=1)
    connect(client, settings, clean_start=True)
    assert subscribed.wait(30)
    return client, verdicts


def test_a_tiled_track_case_gets_one_fused_verdict_and_a_v1_case_is_still_answered(
    broker, tmp_path: Path
) -> None:
    # given a real cloud (its default primary, loaded on first use) and a device
    settings = CloudSettings(
        data_dir=tmp_path,
        mqtt=MqttSettings(host=broker.host, port=broker.port),
        ingest={"share_group": f"trk-{secrets.token_hex(3)}"},
        models={"preload": False, "timeout_s": 120},
    )
    services = CloudServices.build(settings)
    cam = services.fleet_registry.enroll("cam-trk")
    services.start()
    device, verdicts = listen(broker, "cam-trk-dev", "cam-trk")
    later = None
    try:
        assert services.ingest.wait_connected(30)
        # when the edge sends one track's three crops tiled into one JPEG (v2)
        crops = [line_crop(0, 0.0), line_crop(3, 1.2), line_crop(6, 0.6)]
        strip, rects = tile_crops(crops, 1280)
        ok, jpeg = cv2.imencode(".jpg", strip, [cv2.IMWRITE_JPEG_QUALITY, 85])
        assert ok
        tiles = [
            Tile(x=x, y=y, w=w, h=h, frame_index=10 + k, crop=(100, 50, 100 + w, 50 + h))
            for k, (x, y, w, h) in enumerate(rects)
        ]
        track_case = escalation_case(
            "cam-trk",
            schema="ef.escalation/2",
            content_type="image/jpeg",
            edge=[("EGLU743645O", 0.42)],
            track_id="cam-7",
            tiles=tiles,
        )
        publish(device, escalation_wire(track_case, cam.device_key, jpeg.tobytes()), qos=1)
        # and an old device sends a single-image v1 case
        old_case = escalation_case("cam-trk", schema="ef.escalation/1", edge=[("EGLU", 0.3)])
        publish(device, escalation_wire(old_case, cam.device_key, encode_png(crops[0])), qos=1)

        # then the track gets one verdict: the tiles' reads fused, naming the track and the
        # cloud's lag
        assert verdicts.wait({track_case.case_id, old_case.case_id}, 180)
        track_verdict = verdicts.got[track_case.case_id]
        assert track_verdict.schema_id == "ef.verdict/2" and track_verdict.track_id == "cam-7"
        assert track_verdict.fallback_level == 0
        assert track_verdict.model.startswith(settings.models.primary)
        assert [d.text for d in track_verdict.result] == [TEXT]
        assert track_verdict.queue_depth is not None and track_verdict.expected_wait_s is not None
        # and the v1 case is answered as before, in its own version
        old_verdict = verdicts.got[old_case.case_id]
        assert old_verdict.schema_id == "ef.verdict/1" and old_verdict.track_id is None
        assert old_verdict.queue_depth is None
        assert [d.text for d in old_verdict.result] == [TEXT]
        # and the cloud's lag is retained on the results topic: a device connecting later
        # learns it before any verdict
        assert verdicts.wait_status(30)
        later, fresh = listen(broker, "cam-trk-later", "cam-trk")
        assert fresh.wait_status(30)
        status, retained = fresh.statuses[0]
        assert retained and status.device_id == "cam-trk" and status.expected_wait_s >= 0
    finally:
        for client in (device, later):
            if client is not None:
                client.loop_stop()
                client.disconnect()
        services.close()
