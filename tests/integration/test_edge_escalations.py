"""A synthetic video through the whole agent (real PP-OCR, real Mosquitto).

Escalations arrive signed, with decodable images and the right metadata; telemetry and
status follow the contract; a signed verdict comes back and is matched and counted;
health endpoints answer; SIGTERM-style stop publishes `offline`.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import cv2
import numpy as np

from edgefleet.edge.agent import Agent
from edgefleet.shared.messages import CloudVerdict, Detection, EscalationCase
from edgefleet.shared.topics import Topics
from tests.support.broker import MosquittoBroker
from tests.support.edge import (
    DEVICE,
    Collector,
    build_settings,
    edge_settings,
    text_frame,
    write_video,
)
from tests.support.waiting import eventually

TEXTS = [f"GATE {i:02d}" for i in range(12)]


def _get(port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_synthetic_video_escalations_arrive_signed_with_images_and_metadata(
    broker: MosquittoBroker, tmp_path: Path
) -> None:
    # given a video whose frame i shows TEXTS[i], and an agent escalating every frame
    video = write_video(tmp_path / "gate.mp4", TEXTS)
    collector = Collector(broker, "cloud-escalations")
    agent = Agent(build_settings(edge_settings(tmp_path, broker, str(video))))
    verdicts = []
    agent.add_verdict_callback(verdicts.append)
    tracked: list = []
    agent.on_tracks.append(lambda stream, index, reports: tracked.append((index, reports)))
    agent.start()
    try:
        # when the video has played
        eventually(
            lambda: sum(c.track_id is None for c, _ in collector.cases.values()) >= len(TEXTS),
            120,
            "all escalations",
        )
        eventually(lambda: collector.telemetry, 30, "telemetry")

        # then every frame arrived once as a verified case, with its image and metadata
        assert collector.rejected == []
        # (beside them, unsure text tracks may have been sent as track cases)
        frames = [c for c in collector.cases.values() if c[0].track_id is None]
        cases = sorted(frames, key=lambda c: c[0].frame_index)
        assert [c.frame_index for c, _ in cases] == list(range(len(TEXTS)))
        read_right = 0
        for case, image in cases:
            assert isinstance(case, EscalationCase)
            assert case.device_id == DEVICE and case.stream_id == "gate"
            assert case.reason == "sampled" and case.content_type == "image/jpeg"
            assert case.model.name == "ppocr6-tiny" and case.model.sha256
            decoded = cv2.imdecode(np.frombuffer(image, np.uint8), cv2.IMREAD_COLOR)
            assert decoded.shape == (240, 320, 3)
            expected = text_frame(TEXTS[case.frame_index])
            assert np.abs(decoded.astype(int) - expected.astype(int)).mean() < 8
            texts = [d.text for d in case.edge_result]
            read_right += texts == [TEXTS[case.frame_index]]
        assert read_right >= len(TEXTS) * 0.75  # the real OCR read most frames exactly
        # and downstream, each frame reported its live tracks (the edge's vote so far)
        assert sorted(index for index, _ in tracked) == list(range(len(TEXTS)))
        assert all(r.source == "edge" and r.track_id for _, reports in tracked for r in reports)

        # telemetry and status follow the contract
        tel = collector.telemetry[-1]
        assert tel.streams[0].stream_id == "gate"
        assert tel.model is not None and tel.model.name == "ppocr6-tiny"
        assert tel.gpu is None  # a CPU host
        seqs = [t.seq for t in collector.telemetry]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
        assert any(s.state == "online" for s, _ in collector.statuses)

        # when the cloud answers a case on `results`, signed with the device key
        case, _ = cases[3]
        verdict = CloudVerdict(
            device_id=DEVICE,
            trace_id=case.trace_id,
            case_id=case.case_id,
            result=[Detection(text=t.text, score=0.99) for t in case.edge_result],
            model="ppocr-heavy@4.0",
            route="ocr",
            fallback_level=0,
            latency_ms=12.5,
        )
        collector.send(verdict, Topics().results(DEVICE))
        # then the agent matches it to the case and counts agreement
        eventually(lambda: verdicts, 20, "verdict callback")
        assert verdicts[0].verdict.case_id == case.case_id and verdicts[0].agrees is True
        assert (verdicts[0].stream_id, verdicts[0].frame_index) == ("gate", case.frame_index)
        assert agent.verdicts.agreement_rate == 1.0
        # and the agreement rate reaches the cloud in the next telemetry
        eventually(
            lambda: collector.telemetry[-1].agreement_rate == 1.0, 30, "agreement in telemetry"
        )

        # and the local HTTP port answers health, readiness, metrics and verdicts
        port = agent.health.port
        status, body = _get(port, "/healthz")
        health = json.loads(body)
        assert status == 200 and health["streams"][0]["frames"] == len(TEXTS)
        status, body = _get(port, "/readyz")  # the file has ended: not live, so not ready
        assert status == 503 and "streams not live" in json.loads(body)["reasons"][0]
        status, body = _get(port, "/metrics")
        assert status == 200 and b"ef_edge_stage_seconds_bucket" in body
        assert b'ef_edge_frame_latency_seconds_count{stream="gate"}' in body
        status, body = _get(port, "/verdicts")
        local = json.loads(body)["verdicts"][0]
        assert local["agrees"] is True and local["frame_index"] == case.frame_index
        assert local["verdict"]["case_id"] == case.case_id and local["stream_id"] == "gate"
        assert health["agreement_rate"] == 1.0

        # when a verdict names a track this agent does not know (ended long ago, or from
        # before a restart), then it is recorded, not an error
        stray = verdict.model_copy(update={"case_id": "case-stray-1", "track_id": "gate-x-1"})
        collector.send(stray, Topics().results(DEVICE))
        eventually(lambda: len(verdicts) >= 2, 20, "second verdict callback")
        assert verdicts[1].track_known is False and agent.verdicts.unknown_tracks == 1
        status, body = _get(port, "/verdicts")
        assert json.loads(body)["verdicts"][-1]["track_known"] is False
    finally:
        agent.stop()
    # graceful stop: `offline` is published and is what a newcomer gets, retained
    eventually(lambda: collector.statuses[-1][0].state == "offline", 20, "offline status")
    collector.close()
    late = Collector(broker, "cloud-late-joiner")
    eventually(lambda: late.statuses, 20, "retained status")
    assert late.statuses[-1][0].state == "offline" and late.statuses[-1][1] is True
    late.close()


def test_forged_verdicts_are_rejected(broker: MosquittoBroker, tmp_path: Path) -> None:
    # given a running agent with no streams
    agent = Agent(build_settings(edge_settings(tmp_path, broker, "unused", streams=[])))
    seen = []
    agent.add_verdict_callback(seen.append)
    agent.start()
    collector = Collector(broker, "cloud-forger")
    try:
        eventually(agent.uplink.connected.is_set, 30, "agent connection")
        # when a verdict signed with another key arrives, then one with the right key
        forged = CloudVerdict(
            device_id=DEVICE,
            trace_id="a" * 32,
            case_id="forged-case-1",
            result=[],
            model="x",
            route="r",
            fallback_level=0,
            latency_ms=1.0,
        )
        from edgefleet.shared.mqtt import publish
        from edgefleet.shared.wire import encode

        bad = encode(forged, b"not the key", Topics().results(DEVICE))
        publish(collector.client, bad, qos=1).wait_for_publish(10)
        good = forged.model_copy(update={"case_id": "unknown-case-2"})
        collector.send(good, Topics().results(DEVICE))
        # then only the genuine one reaches the application (unmatched: not our case)
        eventually(lambda: seen, 20, "genuine verdict")
        assert [m.verdict.case_id for m in seen] == ["unknown-case-2"]
        assert seen[0].agrees is None and agent.verdicts.unmatched == 1
    finally:
        agent.stop()
        collector.close()
