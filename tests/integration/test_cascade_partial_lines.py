"""A line entering the frame, through the real edge policy and tracker, a real Mosquitto and
a real cloud with its primary model: the device asks about the whole line, and an answer
the cloud gave for a cut crop, arriving after the track showed the whole line, never
replaces the whole reading."""

from __future__ import annotations

import secrets
from pathlib import Path

import cv2
import numpy as np

from edgefleet.bench.harness import escalation_case, escalation_wire
from edgefleet.cloud.services import CloudServices
from edgefleet.cloud.settings import CloudSettings
from edgefleet.edge.policy import Escalation, EscalationPolicy
from edgefleet.edge.settings import BudgetSettings, PolicySettings, TrackSettings
from edgefleet.edge.tracks import report
from edgefleet.edge.verdicts import VerdictBook
from edgefleet.shared.messages import Detection
from edgefleet.shared.mqtt import MqttSettings, publish
from tests.integration.test_cloud_track_cases import listen

TEXT = "HLXU 4471920"
FACE, SCALE, THICK = cv2.FONT_HERSHEY_SIMPLEX, 0.9, 2


def _scene(frames: int) -> list[tuple[np.ndarray, Detection]]:
    """The plate slides in from the left border, 14 pixels a frame; each frame with the
    detection the edge makes of what shows (the characters fully in view)."""
    (tw, th), base = cv2.getTextSize(TEXT, FACE, SCALE, THICK)
    pad = 10
    plate_w, plate_h = tw + 2 * pad, th + base + 2 * pad
    out = []
    for index in range(frames):
        x0 = 14 * index - plate_w + 60
        frame = np.full((360, 640, 3), 120, np.uint8)
        cv2.rectangle(frame, (x0, 150), (x0 + plate_w, 150 + plate_h), (215, 215, 215), -1)
        cv2.putText(frame, TEXT, (x0 + pad, 150 + pad + th), FACE, SCALE, (30, 30, 30), THICK)
        shown = [
            ch for k, ch in enumerate(TEXT)
            if x0 + pad + cv2.getTextSize(TEXT[:k], FACE, SCALE, THICK)[0][0] >= 0
        ]
        text = "".join(shown).strip()
        box = (float(max(0, x0)), 150.0, float(x0 + plate_w), float(150 + plate_h))
        out.append((frame, Detection(text=text, score=0.55, box=box)))
    return out


def _policy(**tracks) -> EscalationPolicy:
    return EscalationPolicy(
        PolicySettings(
            sample_share=0.0,
            dedup_window_s=0.0,
            rate_per_min=600.0,
            budget=BudgetSettings(share=1.0, max_score=1.0, burst=8),
            tracks=TrackSettings(**tracks),
        ),
        clock=lambda: 0.0,
    )


def _send(device, cam, escalation: Escalation, index: int) -> str:
    case = escalation_case(
        "cam-edge",
        schema="ef.escalation/2",
        content_type="image/jpeg",
        edge=[(d.text or "", d.score) for d in escalation.edge_result or ()],
        track_id=escalation.track_id,
        tiles=list(escalation.tiles),
        frame_index=index,
        reason=escalation.reason,
    )
    publish(device, escalation_wire(case, cam.device_key, escalation.jpeg), qos=1)
    return case.case_id


def test_a_line_entering_the_frame_is_reported_whole_whatever_the_cloud_read_of_a_part(
    broker, tmp_path: Path
) -> None:
    # given a real cloud and a device whose policy asks about a cut line after 3 frames
    settings = CloudSettings(
        data_dir=tmp_path,
        mqtt=MqttSettings(host=broker.host, port=broker.port),
        ingest={"share_group": f"cut-{secrets.token_hex(3)}"},
        models={"preload": False, "timeout_s": 120},
    )
    services = CloudServices.build(settings)
    cam = services.fleet_registry.enroll("cam-edge")
    services.start()
    device, verdicts = listen(broker, "cam-edge-dev", "cam-edge")
    try:
        assert services.ingest is not None and services.ingest.wait_connected(30)
        policy = _policy(ready_frames=2, max_wait_frames=3)
        book = VerdictBook(tracker=policy.tracker, budget=policy.budget)
        frames = _scene(40)
        sent: list[tuple[int, str]] = []
        for index, (frame, detection) in enumerate(frames):
            for escalation in policy.decide_all("cam", index, frame, [detection]):
                sent.append((index, _send(device, cam, escalation, index)))
        # when the cut line's case is answered (the cloud read the part it was shown)
        track = policy.tracker.live("cam")[0]
        (cut_at, cut_case), (whole_at, whole_case) = sent
        assert cut_at == 2 and frames[whole_at][1].text == TEXT
        assert verdicts.wait({cut_case, whole_case}, 180)
        part = verdicts.got[cut_case]
        assert part.result and (part.result[0].text or "").replace(" ", "") != TEXT.replace(
            " ", ""
        )
        # and that answer reaches the device after the track showed the whole line
        book.receive(part)
        # then the device reports the whole reading
        assert report(track).text == TEXT
        # and the answer to the whole line's crops, which the cloud read whole, stands
        whole = verdicts.got[whole_case]
        assert [d.text for d in whole.result] == [TEXT]
        book.receive(whole)
        assert report(track).text == TEXT and report(track).source == "cloud"

        # and with the shipped settings the only case waits for the whole line
        fresh = _policy()
        cases = [
            (index, escalation)
            for index, (frame, detection) in enumerate(frames)
            for escalation in fresh.decide_all("cam", index, frame, [detection])
        ]
        assert len(cases) == 1
        index, escalation = cases[0]
        assert escalation.edge_result is not None and escalation.edge_result[0].text == TEXT
        assert escalation.tiles and all(
            frames[tile.frame_index][1].text == TEXT for tile in escalation.tiles
        )
    finally:
        device.loop_stop()
        device.disconnect()
        services.close()
