"""Scene cuts: a frame unlike the stream's one before (a cut, a camera moved to a preset, a
video looping) ends the stream's tracks, since what their lines read before says nothing
of the lines now in their boxes."""

from __future__ import annotations

import cv2
import numpy as np
from prometheus_client import Counter

from edgefleet.edge.planes import gray
from edgefleet.shared.messages import StreamId

CUTS = Counter(
    "ef_edge_scene_cuts_total",
    "Frames unlike the one before (a cut, a camera moved to a preset, a video looping): "
    "the stream's tracks end there",
)


def thumbnail(image: np.ndarray, fmt: str) -> np.ndarray:
    """The frame's brightness at 32x18: what a cut changes and motion, noise or a moving
    line barely do. Every n-th pixel of about 128 per row is averaged: a whole 1080p
    frame costs several times more, on every frame of every stream."""
    plane = gray(image, fmt)
    step = max(1, plane.shape[1] // 128)
    small = cv2.resize(plane[::step, ::step], (32, 18), interpolation=cv2.INTER_AREA)
    return small.astype(np.float32).mean(axis=2) if small.ndim == 3 else small.astype(np.float32)


class SceneCuts:
    """Each stream's last frame, in brief; a frame is a cut when it differs from it by
    more than `level` grey levels on average (0: never). Not thread-safe: the tracker
    calls it under its lock."""

    def __init__(self, level: float) -> None:
        self.level = level
        self._thumbs: dict[StreamId, np.ndarray] = {}

    def cut(self, stream_id: StreamId, image: np.ndarray, fmt: str) -> bool:
        """Whether this frame (in pixel format `fmt`) is unlike the stream's one before."""
        if not self.level:
            return False
        thumb, last = thumbnail(image, fmt), self._thumbs.get(stream_id)
        self._thumbs[stream_id] = thumb
        if last is None or float(np.abs(thumb - last).mean()) <= self.level:
            return False
        CUTS.inc()
        return True

    def forget(self, stream_id: StreamId) -> None:
        """The stream stopped: its next frame starts afresh."""
        self._thumbs.pop(stream_id, None)
