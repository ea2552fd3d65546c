"""The cloud-only column of the demo's report: the cloud's primary model on sampled frames.

What would the fleet read if every frame went to the cloud? The demo asks the running
cloud (`POST /v1/infer/{model}`) to read a fixed, evenly spread sample of each scene's
frames and scores the answers against the ground truth. The answer depends on the scene
and on the reader: the model file, and for a pipeline its other files and options (an
option such as the O/0 rule changes reads with the same weights) and edgefleet's version.
For a cached scene it is kept beside it, keyed by all of these (`reader_key`), and the
next demo does not ask again.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
from pathlib import Path
from typing import Any

from edgefleet import __version__
from edgefleet.demo.scoring import best_match_accuracy
from edgefleet.demo.video import GroundTruth
from edgefleet.shared.config import Closed

SAMPLES = 10  # frames per scene: a few seconds of the cloud's time on a CPU


class CloudOnlyScore(Closed):
    """The primary model's accuracy over the sampled frames of one scene."""

    model: str
    key: str  # reader_key: what read the frames
    frames: list[int]
    accuracy: float


def sample_indexes(frame_count: int, samples: int = SAMPLES) -> list[int]:
    """`samples` frame indexes spread evenly over the clip (each in the middle of its share)."""
    count = min(samples, frame_count)
    return sorted({int((i + 0.5) * frame_count / count) for i in range(count)})


def reader_key(model: str, sha256: str) -> str:
    """What reads with `model` (its main file's `sha256`, as the cloud lists it): that file,
    the manifest's entries of the model and of every model it runs, and edgefleet's
    version; a change to any of them is another reader. A model the built-in manifest
    does not hold (the cloud's own manifest) is keyed by its file and the version."""
    from edgefleet.shared.errors import ModelNotFound
    from edgefleet.shared.models.registry import ModelRegistry

    registry = ModelRegistry.default()
    digest = hashlib.sha256(f"{sha256} {__version__}".encode())
    try:
        spec = registry.get(model)
        parts = [spec, *(registry.get(name) for name in spec.components())]
    except ModelNotFound:
        parts = []
    for part in parts:
        digest.update(part.model_dump_json().encode())
    return digest.hexdigest()


def cache_file(video: Path, model: str, key: str) -> Path:
    """Where a cached scene keeps the cloud-only score of one reader (`reader_key`)."""
    return video.parent / f"cloud-only-{model}-{key[:16]}.json"


def score_cloud_only(
    http: Any,
    model: str,
    key: str,
    video: Path,
    truth: GroundTruth,
    stop: threading.Event,
    cached: Path | None,
    samples: int = SAMPLES,
) -> CloudOnlyScore | None:
    """Read the sampled frames with the cloud's `model` and score them; None if the cloud
    did not answer every frame (or `stop` was set). `cached`: the file to reuse or fill,
    reused only when it was filled by the same reader (`key`)."""
    if cached is not None:
        try:
            found = CloudOnlyScore.model_validate_json(cached.read_text())
        except (OSError, ValueError):
            found = None
        if found is not None and found.model == model and found.key == key:
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
        key=key,
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
