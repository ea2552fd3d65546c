"""A test-only decoder: one still image file, read once, given as a stream of `frames`.

It shows what adding a decoder takes: this one file (the source and its `DECODER`) and its
module's line in `edgefleet.edge.sources.MODULES`.
"""

from __future__ import annotations

import cv2
import numpy as np

from edgefleet.edge.sources.base import Decoder, VideoSource
from edgefleet.edge.sources.settings import SourceSettings
from edgefleet.shared.errors import SourceDisconnected


class StillSource(VideoSource):
    kind = "still"
    frames = 3

    def __init__(self, settings: SourceSettings) -> None:
        self.settings = settings
        self._image: np.ndarray | None = None
        self._left = 0

    def open(self) -> None:
        self._image = cv2.imread(self.settings.url, cv2.IMREAD_COLOR)
        if self._image is None:
            raise SourceDisconnected(f"{self.settings.url}: not an image")
        self._left = self.frames

    def read(self) -> np.ndarray | None:
        if self._image is None or self._left == 0:
            return None
        self._left -= 1
        return self._image.copy()

    def close(self) -> None:
        self._image = None

    @property
    def is_file(self) -> bool:
        return True


DECODER = Decoder(
    "still",
    StillSource,
    frozenset({"file"}),
    lambda: True,
    chosen="a still image",
    absent="",
    rank=9,  # after OpenCV, which takes every file: only a stream that names it gets it
)
