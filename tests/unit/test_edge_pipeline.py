"""The pipeline's bookkeeping: it is idle only once the last frame has left the post stage."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import cv2
import numpy as np

from edgefleet.edge.pipeline import Pipeline, Work
from edgefleet.edge.policy import Escalation, EscalationPolicy
from edgefleet.edge.settings import PipelineSettings, PolicySettings, SourceSettings
from edgefleet.edge.sources import OpenCvSource
from edgefleet.edge.sources.capture import Capture
from edgefleet.edge.telemetry import WindowStats
from edgefleet.shared.messages import Detection, ModelInfo


def wait_for(predicate: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError("condition not met in time")


class ConstantModel:
    """Stands in for the executor here: the bookkeeping under test is the pipeline's."""

    info = ModelInfo(name="constant", version="1")

    def predict(self, image: np.ndarray, *, fmt: str = "rgb") -> list[Detection]:
        return [Detection(text="LOT", score=0.99)]

    def close(self) -> None:
        pass


def test_the_pipeline_is_not_idle_while_the_last_frame_is_post_processed(tmp_path: Path) -> None:
    # given a one-frame video played frame by frame, and a post stage that we hold
    video = tmp_path / "one.mp4"
    writer = cv2.VideoWriter(str(video), cv2.VideoWriter_fourcc(*"mp4v"), 10, (64, 48))
    writer.write(np.zeros((48, 64, 3), np.uint8))
    writer.release()
    settings = SourceSettings(id="one", url=str(video), realtime=False)
    capture = Capture(settings, OpenCvSource(settings))
    model = ConstantModel()
    entered, release = threading.Event(), threading.Event()
    sunk: list[int] = []

    def sink(work: Work, escalations: list[Escalation]) -> None:
        entered.set()
        release.wait(30)
        sunk.append(work.frame.index)

    pipeline = Pipeline(
        [capture],
        lambda: model,
        EscalationPolicy(PolicySettings()),
        sink,
        WindowStats(),
        PipelineSettings(),
    ).start()
    capture.start()
    try:
        # when the file has ended and its frame is inside the post stage
        wait_for(lambda: capture.finished and entered.is_set())
        # then the pipeline is not idle yet, and is once the frame has gone through
        assert not pipeline.idle
        release.set()
        wait_for(lambda: pipeline.idle)
        assert sunk == [0]
    finally:
        release.set()
        capture.stop()
        pipeline.stop()
