"""One interface for every video source, and the frame it yields."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from edgefleet.shared.messages import StreamId

if TYPE_CHECKING:
    from edgefleet.edge.sources.settings import SourceSettings


@dataclass
class Frame:
    """One decoded frame in the format its source delivers it, and when it was captured.

    `fmt` is `image`'s pixel format: "bgr" (H, W, 3) from OpenCV; "nv12" / "i420"
    (H*3/2, W) from sources that hand over raw camera buffers. The frame reaches the model
    as it is: the kernels convert while they resize.
    """

    stream_id: StreamId
    index: int
    image: np.ndarray
    captured: float = field(default_factory=time.monotonic)  # monotonic seconds
    wall_ts: float = field(default_factory=time.time)
    fmt: str = "bgr"


class VideoSource(ABC):
    """Open, read frames one by one, close. Called from one capture thread only."""

    kind: str = "source"
    pixel_format: str = "bgr"  # of the last frame `read` returned (see Frame.fmt)

    @abstractmethod
    def open(self) -> None:
        """Connect; raises SourceDisconnected with the reason if the source cannot open."""

    @abstractmethod
    def read(self) -> np.ndarray | None:
        """The next frame in `pixel_format` (BGR uint8 HxWx3, or NV12/I420 (H*3/2, W)), None
        at the end; SourceDisconnected on errors."""

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


@dataclass(frozen=True)
class Decoder:
    """What a decoder declares about itself, in its own module (`DECODER`).

    Under `decoder: auto` a stream takes the first decoder by `rank` that decodes its
    kind of source and is `present` on this host; `chosen` and `absent` say why, in the
    log line of the choice."""

    name: str
    build: Callable[[SourceSettings], VideoSource]
    kinds: frozenset[str]
    present: Callable[[], bool]
    chosen: str
    absent: str
    rank: int
