"""The agent built whole: every part exists before `start()`, a case is stored serialised
once and signed from those bytes, a failed swap leaves the running model in place.

No broker is needed: the agent's MQTT port has nobody listening, so everything it sends
waits in its outbox, which is what these tests read.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np
import pytest

from edgefleet.edge.agent import Agent
from edgefleet.edge.execution import edge_execution, usable_cores
from edgefleet.edge.settings import EdgeSettings
from edgefleet.shared.errors import EdgefleetError
from edgefleet.shared.messages import (
    Detection,
    EscalationCase,
    ModelInfo,
    ModelRef,
    ReportedState,
)
from edgefleet.shared.topics import Topics
from edgefleet.shared.wire import Verifier, encode, sign
from tests.support.broker import free_port
from tests.support.edge import KEY, write_video
from tests.support.waiting import eventually

DEVICE = "cam-01"


class CountingModel:
    """A hand-written Predictor: reads every frame as one unsure line, counts its closes."""

    info = ModelInfo(name="counting", version="1")

    def __init__(self) -> None:
        self.closed = 0
        self.calls = 0
        self._lock = threading.Lock()

    def predict(self, rgb: np.ndarray) -> list[Detection]:
        with self._lock:
            self.calls += 1
        return [Detection(text="LOT 7", score=0.5)]

    def close(self) -> None:
        self.closed += 1


def _settings(tmp_path: Path, streams: list[dict]) -> EdgeSettings:
    return EdgeSettings(
        device_id=DEVICE,
        device_key=KEY.hex(),
        mqtt={"host": "127.0.0.1", "port": free_port(), "reconnect_max_s": 2},
        streams=streams,
        policy={"sample_share": 1.0, "rate_per_min": 60_000, "burst": 1000, "dedup_window_s": 0},
        outbox={"path": str(tmp_path / "outbox.db")},
        health={"enabled": False},
        state_dir=str(tmp_path / "state"),
    )


def test_every_part_exists_before_start_and_stop_without_start_closes_once(
    tmp_path: Path,
) -> None:
    # given an agent built but not started
    model = CountingModel()
    video = write_video(tmp_path / "gate.mp4", ["LOT 7"])
    agent = Agent(_settings(tmp_path, [{"id": "gate", "url": str(video)}]), model=model)
    # then its parts answer already: readiness says why it is not ready, telemetry and
    # health can be assembled, the model is in its slot
    assert agent.report.ready() == (False, ["streams not live: gate"])
    assert agent.report.health()["broker_connected"] is False
    assert agent.telemetry.collect(1.0).model == model.info
    assert agent.current_models() == []  # a model without a sha256 is not a deployed one
    assert [c.stream_id for c in agent.captures] == ["gate"]
    # when it is stopped without having started, then it closes cleanly, the model once
    agent.stop()
    agent.stop()
    assert model.closed == 1 and model.calls == 0


def test_a_case_is_stored_serialised_once_and_signed_from_those_bytes(tmp_path: Path) -> None:
    # given an agent whose broker is away, escalating the frames of a short video
    video = write_video(tmp_path / "gate.mp4", [f"LOT {i}" for i in range(3)])
    stream = {"id": "gate", "url": str(video), "realtime": False}
    agent = Agent(_settings(tmp_path, [stream]), model=CountingModel())
    cases: list[EscalationCase] = []
    agent.add_escalation_callback(cases.append)
    # when it runs until the first case is in the outbox
    agent.start()
    try:
        eventually(lambda: len(cases) >= 1, 60, "a case")
        stored = next(i for i in agent.outbox.read(0) if i.kind == "escalation")
    finally:
        agent.stop()
    case = cases[0]
    # then the outbox holds the case's JSON, as made once, and its JPEG
    assert stored.message.json == case.model_dump_json().encode()
    assert stored.message.image is not None and stored.message.image.startswith(b"\xff\xd8\xff")
    # and signing those bytes gives wire format v1, which the cloud's verifier accepts
    topic = Topics().escalations(DEVICE)
    wire = sign(stored.message, KEY, topic)
    assert wire == encode(case, KEY, topic, stored.message.image)
    verified = Verifier(key_for_device=lambda d: KEY if d == DEVICE else None).verify(wire)
    assert verified.message == case


def test_a_report_goes_into_the_outbox_retained(tmp_path: Path) -> None:
    agent = Agent(_settings(tmp_path, []), model=CountingModel())
    try:
        state = ReportedState(device_id=DEVICE, deployment_id="d1", image="", status="healthy")
        agent.publish_reported(state)
        (item,) = agent.outbox.read(0)
        assert item.kind == "reported" and item.retain
        assert item.message.json == state.model_dump_json().encode()
    finally:
        agent.stop()


def test_a_swap_that_cannot_load_leaves_the_running_model_open(tmp_path: Path) -> None:
    # given a running model and a deployed model the registry does not know
    model = CountingModel()
    agent = Agent(_settings(tmp_path, []), model=model)
    ref = ModelRef(name="no-such-model", version="2", url="http://fleet/m.onnx", sha256="ab" * 32)
    try:
        # when the updater asks for the swap, then it fails and nothing changed
        with pytest.raises(EdgefleetError):
            agent.swap_model(ref, tmp_path / "m.onnx")
        with agent.model.lease() as running:
            assert running is model
        assert model.closed == 0 and agent.current_models() == []
    finally:
        agent.stop()


def test_the_edge_splits_the_cores_it_may_run_on_not_the_hosts(monkeypatch) -> None:
    # given a process pinned to 2 of a host's 16 cores (a container's cpuset)
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    # then two inference workers get one ONNX Runtime thread each, not eight, and idle
    # threads do not spin on the cores decode and post need
    assert usable_cores() == 2
    assert edge_execution(2).intra_op_threads == 1
    assert edge_execution(1).intra_op_threads == 2 and not edge_execution(1).spinning
