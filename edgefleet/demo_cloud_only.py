"""The cloud-only column of the demo's report: the cloud's primary model on sampled frames.

What would the fleet read if every frame went to the cloud? The demo asks the running
cloud (`POST /v1/infer/{model}`) to read a fixed, evenly spread sample of each scene's
frames and scores the answers against the ground truth. The answer depends only on the
scene and the model file, so for a cached scene it is kept beside it, keyed by the
model's name and sha256, and the next demo does not ask again.
"""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path
from typing import Any

from edgefleet.bench.scoring import best_match_accuracy
from edgefleet.demo_video import GroundTruth
from edgefleet.shared.config import Closed

SAMPLES = 10  # frames per scene: a few seconds of the cloud's time on a CPU


class CloudOnlyScore(Closed):
    """The primary model's accuracy over the sampled frames of one scene."""

    model: str
    sha256: str
    frames: list[int]
    accuracy: float


def sample_indexes(frame_count: int, samples: int = SAMPLES) -> list[int]:
    """`samples` frame indexes spread evenly over the clip (each in the middle of its share)."""
    count = min(samples, frame_count)
    return sorted({int((i + 0.5) * frame_count / count) for i in range(count)})


def cache_file(video: Path, model: str, sha256: str) -> Path:
    """Where a cached scene keeps the cloud-only score of one model file."""
    return video.parent / f"cloud-only-{model}-{sha256[:16]}.json"


def score_cloud_only(
    http: Any,
    model: str,
    sha256: str,
    video: Path,
    truth: GroundTruth,
    stop: threading.Event,
    cached: Path | None,
    samples: int = SAMPLES,
) -> CloudOnlyScore | None:
    """Read the sampled frames with the cloud's `model` and score them; None if the cloud
    did not answer every frame (or `stop` was set). `cached`: the file to reuse or fill."""
    if cached is not None:
        try:
            found = CloudOnlyScore.model_validate_json(cached.read_text())
        except (OSError, ValueError):
            found = None
        if found is not None and found.model == model and found.sha256 == sha256:
            return found
    import httpx

    frames = _frames_as_png(video, sample_indexes(len(truth.frames), samples))
    if not frames:
        return None
    total = 0.0
    for index, png in frames:
        if stop.is_set():
            return None
        try:
            response = http.post(
                f"/v1/infer/{model}",
                content=png,
                headers={"Content-Type": "image/png"},
                timeout=120.0,
            )
        except httpx.HTTPError:
            return None
        if response.status_code != 200:
            return None
        texts = [d.get("text") or "" for d in response.json().get("result", [])]
        total += best_match_accuracy(texts, truth.texts(index))
    score = CloudOnlyScore(
        model=model,
        sha256=sha256,
        frames=[index for index, _ in frames],
        accuracy=total / len(frames),
    )
    if cached is not None:
        tmp = cached.with_name(f".{cached.name}.tmp-{threading.get_ident()}")
        with contextlib.suppress(OSError):  # a read-only or deleted cache: still reported
            tmp.write_text(score.model_dump_json())
            tmp.replace(cached)
    return score


def _frames_as_png(video: Path, indexes: list[int]) -> list[tuple[int, bytes]]:
    """The frames at `indexes`, decoded in order (no seeking: exact on every codec)."""
    import cv2

    wanted = set(indexes)
    found: list[tuple[int, bytes]] = []
    capture = cv2.VideoCapture(str(video))
    try:
        index = 0
        while wanted:
            ok, frame = capture.read()
            if not ok:
                break
            if index in wanted:
                wanted.discard(index)
                encoded, data = cv2.imencode(".png", frame)
                if encoded:
                    found.append((index, data.tobytes()))
            index += 1
    finally:
        capture.release()
    return found
