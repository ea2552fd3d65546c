"""Frames the executor refuses when overloaded are dropped frames of their stream too, and
the stream's telemetry counts them (not only the global Prometheus counter)."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np

from edgefleet.edge.agent import Agent
from edgefleet.shared.errors import Overloaded
from edgefleet.shared.messages import Detection, ModelInfo
from tests.support.broker import free_port
from tests.support.edge import build_settings, write_video
from tests.support.waiting import eventually

FRAMES = 10


class SheddingModel:
    """A model whose executor refuses every second request, as a full batcher queue does.

    Hand-written because the real executor's refusal depends on timing (queue full) or
    on the host's memory; through the Predictor seam the agent already takes a model by.
    """

    info = ModelInfo(name="shedding", version="1")

    def __init__(self) -> None:
        self.calls = 0
        self._lock = threading.Lock()

    def predict(self, image: np.ndarray, *, fmt: str = "rgb") -> list[Detection]:
        with self._lock:
            self.calls += 1
            call = self.calls
        if call % 2 == 0:
            raise Overloaded("batcher: 64 requests already waiting (max_queue=64)")
        return [Detection(text="LOT", score=0.99)]

    def close(self) -> None:
        pass


def test_frames_shed_by_the_executor_count_as_dropped_in_telemetry(tmp_path: Path) -> None:
    # given a stream played frame by frame (nothing is overwritten in its slot)
    video = write_video(tmp_path / "lot.mp4", [f"LOT {i}" for i in range(FRAMES)])
    settings = build_settings(
        {
            "device_id": "cam-01",
            "device_key": "k",
            "mqtt": {"host": "127.0.0.1", "port": free_port()},
            "streams": [{"id": "lot", "url": str(video), "realtime": False}],
            "policy": {"sample_share": 0.0},
            "outbox": {"path": str(tmp_path / "outbox.db")},
            "health": {"enabled": False},
            "state_dir": str(tmp_path / "state"),
        }
    )
    model = SheddingModel()
    agent = Agent(settings, model=model)
    # when every second frame is refused by the executor
    agent.start()
    try:
        eventually(lambda: agent.captures[0].finished and agent.pipeline.idle, 60, "video played")
        tel = agent.telemetry.collect(1.0)
    finally:
        agent.stop()
    # then the refused frames are the stream's dropped frames; the rest were processed
    assert model.calls == FRAMES
    assert tel.streams[0].frames_dropped == FRAMES // 2
    assert agent.pipeline.processed == FRAMES // 2
