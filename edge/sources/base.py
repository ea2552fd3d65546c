"""One interface for every video source, and the frame it yields."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import numpy as np

from edgefleet.shared.messages import StreamId


@dataclass
class Frame:
    """One decoded frame (BGR, as OpenCV yields it) and when it was captured."""

    stream_id: StreamId
    index: int
    image: np.ndarray
    captured: float = field(default_factory=time.monotonic)  # monotonic seconds
    wall_ts: float = field(default_factory=time.time)


class VideoSource(ABC):
    """Open, read frames one by one, close. Called from one capture thread only."""

    kind: str = "source"

    @abstractmethod
    def open(self) -> None:
        """Connect; raises SourceDisconnected with the reason if the source cannot open."""

    @abstractmethod
    def read(self) -> np.ndarray | None:
        """The next frame (BGR uint8 HxWx3), None at the end; SourceDisconnected on errors."""

    @abstractmethod
    def close(self) -> None:
        """Release the device or connection; safe to call twice."""

    @property
    def native_fps(self) -> float | None:
        """Frames per second the source declares (files: playback pace), if known."""
        return None

    @property
    def is_file(self) -> bool:
        """A finite, seekable source: ends are normal, not errors."""
        return False

    def describe(self) -> str:
        """Where this source reads from, safe to log (no credentials)."""
        return self.kind
