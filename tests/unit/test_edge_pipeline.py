"""The pipeline's bookkeeping: it is idle only once the last frame has left the post stage."""

from __future__ import annotations

import threading
from pathlib import Path

import cv2
import numpy as np

from edgefleet.edge.pipeline import Pipeline, Work
from edgefleet.edge.policy import Escalation, EscalationPolicy
from edgefleet.edge.settings import PipelineSettings, PolicySettings, SourceSettings
from edgefleet.edge.slot import ModelSlot
from edgefleet.edge.sources import OpenCvSource
from edgefleet.edge.sources.capture import Capture
from edgefleet.edge.telemetry import WindowStats
from edgefleet.shared.messages import Detection, ModelInfo
from tests.support.waiting import eventually


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
        ModelSlot(model),
        EscalationPolicy(PolicySettings()),
        sink,
        WindowStats(),
        PipelineSettings(),
    ).start()
    capture.start()
    try:
        # when the file has ended and its frame is inside the post stage
        eventually(lambda: capture.finished and entered.is_set())
        # then the pipeline is not idle yet, and is once the frame has gone through
        assert not pipeline.idle
        release.set()
        eventually(lambda: pipeline.idle)
        assert sunk == [0]
    finally:
        release.set()
        capture.stop()
        pipeline.stop()


class RecordingModel(ConstantModel):
    """Keeps what the pipeline handed over: the pixels and the format it said they are in."""

    def __init__(self) -> None:
        self.seen: list[tuple[np.ndarray, str]] = []

    def predict(self, image: np.ndarray, *, fmt: str = "rgb") -> list[Detection]:
        self.seen.append((image, fmt))
        return super().predict(image, fmt=fmt)


def test_frames_go_to_the_model_as_captured_without_colour_conversion(
    tmp_path: Path, monkeypatch
) -> None:
    # given a two-frame video whose frames are blue in BGR, and a spy on cvtColor
    video = tmp_path / "blue.mp4"
    writer = cv2.VideoWriter(str(video), cv2.VideoWriter_fourcc(*"mp4v"), 10, (64, 48))
    for _ in range(2):
        writer.write(np.full((48, 64, 3), (200, 0, 0), np.uint8))
    writer.release()
    settings = SourceSettings(id="blue", url=str(video), realtime=False)
    delivered: list[np.ndarray] = []

    class Recorded(OpenCvSource):
        """The file's frames, each kept as the source returned it."""

        def read(self) -> np.ndarray | None:
            image = super().read()
            if image is not None:
                delivered.append(image)
            return image

    capture = Capture(settings, Recorded(settings))
    converted: list[tuple[int, ...]] = []
    real_cvt = cv2.cvtColor
    monkeypatch.setattr(
        cv2, "cvtColor", lambda s, *a, **k: (converted.append(s.shape), real_cvt(s, *a, **k))[1]
    )
    model = RecordingModel()
    pipeline = Pipeline(
        [capture],
        ModelSlot(model),
        # no drift sample: a sampled frame is turned grey for its de-duplication hash,
        # which is the policy's conversion, not the path to the model
        EscalationPolicy(PolicySettings(sample_share=0.0)),
        lambda work, escalations: None,
        WindowStats(),
        PipelineSettings(),
    ).start()
    capture.start()
    try:
        # when both frames have gone through
        eventually(lambda: capture.finished and pipeline.idle and len(model.seen) == 2)
    finally:
        capture.stop()
        pipeline.stop()
    # then the model got the capture's own BGR buffers, said to be BGR, and no stage
    # converted a frame's colours
    assert [fmt for _, fmt in model.seen] == ["bgr", "bgr"]
    assert all(image is frame for (image, _), frame in zip(model.seen, delivered, strict=True))
    assert model.seen[0][0][0, 0, 0] > 150  # blue first: still OpenCV's order
    assert converted == []
