"""One capture thread per stream: newest frame only, stall detection, reconnect with backoff.

The pipeline never works on a stale backlog: the thread overwrites the single slot, and
every frame overwritten before the pipeline took it is counted as dropped. A file in
"every frame" mode waits for the pipeline instead (evaluation: nothing is dropped).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable

import numpy as np
from prometheus_client import Counter, Gauge, Histogram

from edgefleet.edge.sources.base import Frame, VideoSource
from edgefleet.edge.sources.settings import SourceSettings
from edgefleet.shared.errors import SourceDisconnected
from edgefleet.shared.messages import StreamState

log = logging.getLogger(__name__)

FRAMES = Counter("ef_edge_frames_captured_total", "Frames read from sources", ["stream"])
DROPPED = Counter("ef_edge_frames_dropped_total", "Frames overwritten before use", ["stream"])
INVALID = Counter("ef_edge_frames_invalid_total", "Garbage frames from sources", ["stream"])
RECONNECTS = Counter("ef_edge_stream_reconnects_total", "Stream reconnects", ["stream"])
STATE = Gauge("ef_edge_stream_state", "1 for the stream's current state", ["stream", "state"])
DECODE = Histogram(
    "ef_edge_decode_seconds",
    "Time to read and decode one frame (the capture stage)",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5),
)
STATES: tuple[StreamState, ...] = ("connecting", "live", "stalled", "down")


class Backoff:
    """Capped exponential backoff with jitter ("equal jitter": half fixed, half random)."""

    def __init__(self, initial_s: float, max_s: float, rng: random.Random | None = None):
        self.initial_s, self.max_s = initial_s, max_s
        self.attempt = 0
        self._rng = rng or random.Random()

    def next_delay(self) -> float:
        base = min(self.max_s, self.initial_s * (2.0**self.attempt))
        self.attempt += 1
        return base / 2 + self._rng.uniform(0, base / 2)

    def reset(self) -> None:
        self.attempt = 0


def valid_frame(
    image: object, fmt: str = "bgr", max_pixels: int = 8192 * 8192
) -> np.ndarray | None:
    """The frame as BGR uint8 HxWx3 (fmt "bgr") or (H*3/2, W) NV12/I420 with even sides,
    or None if it is garbage (wrong type, shape, size)."""
    if not isinstance(image, np.ndarray) or image.dtype != np.uint8:
        return None
    if fmt in ("nv12", "i420"):
        if image.ndim != 2 or image.shape[0] % 3 or not image.flags.c_contiguous:
            return None
        h, w = image.shape[0] * 2 // 3, image.shape[1]
        if h % 2 or w % 2 or h < 8 or w < 8 or h * w > max_pixels:
            return None
        return image
    if fmt != "bgr":
        return None
    if image.ndim == 2:
        image = np.repeat(image[:, :, None], 3, axis=2)
    if image.ndim != 3 or image.shape[2] not in (3, 4):
        return None
    h, w = image.shape[:2]
    if h < 8 or w < 8 or h * w > max_pixels:
        return None
    return image[:, :, :3] if image.shape[2] == 4 else image


class Capture:
    """Runs one source on its own thread and hands out only its newest frame."""

    def __init__(
        self,
        settings: SourceSettings,
        source: VideoSource,
        *,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.settings = settings
        self.stream_id = settings.id
        self.source = source
        self.state: StreamState = "connecting"
        self.last_error: str | None = None
        self.frames = 0
        self.dropped = 0
        self.invalid = 0
        self.reconnects = 0
        self.finished = False  # a file without loop played to its end
        self._clock = clock
        self._backoff = Backoff(settings.reconnect_min_s, settings.reconnect_max_s)
        self._every_frame = source.is_file and not settings.realtime
        self.on_frame: Callable[[], None] = lambda: None  # the pipeline's wake-up
        self._slot: Frame | None = None
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._last_frame_at = clock()
        self._thread = threading.Thread(target=self._run, name=f"capture-{self.stream_id}")
        self._set_state("connecting")

    # --- consumer side -----------------------------------------------------------------

    def start(self) -> Capture:
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def get(self, timeout: float = 0.5) -> Frame | None:
        """The newest frame not yet taken, or None after `timeout`."""
        with self._cond:
            if self._slot is None:
                self._cond.wait(timeout)
            frame, self._slot = self._slot, None
            self._cond.notify_all()
            return frame

    def take(self) -> Frame | None:
        """The newest frame not yet taken, without waiting."""
        with self._cond:
            frame, self._slot = self._slot, None
            if frame is not None:
                self._cond.notify_all()
            return frame

    def count_shed(self) -> None:
        """A frame the pipeline took but the executor refused (overloaded): dropped as well."""
        with self._cond:
            self.dropped += 1
        DROPPED.labels(self.stream_id).inc()

    @property
    def pending(self) -> bool:
        """A frame waits in the slot."""
        return self._slot is not None

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def check_stall(self) -> None:
        """Mark the stream stalled when no frame came for stall_timeout_s (from the watchdog)."""
        if self.state == "live" and self._clock() - self._last_frame_at > (
            self.settings.stall_timeout_s
        ):
            self._set_state("stalled")

    # --- capture thread ----------------------------------------------------------------

    def _set_state(self, state: StreamState) -> None:
        if state != self.state:
            log.info("stream %s: %s -> %s", self.stream_id, self.state, state)
        self.state = state
        for name in STATES:
            STATE.labels(self.stream_id, name).set(1 if name == state else 0)

    def _run(self) -> None:
        first = True
        while not self._stop.is_set():
            if not first:
                self.reconnects += 1
                RECONNECTS.labels(self.stream_id).inc()
            first = False
            self._set_state("connecting")
            went_live = False
            try:
                self.source.open()
                went_live = self._read_loop()
                if self.finished or self._stop.is_set():
                    break
            except SourceDisconnected as exc:
                self.last_error = exc.message
                log.warning("stream %s: %s", self.stream_id, exc.message)
            except Exception as exc:  # a source bug must not kill the thread: reconnect
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.exception("stream %s failed", self.stream_id)
            finally:
                self.source.close()
            if went_live:
                self._backoff.reset()
            self._set_state("down" if self.state != "stalled" else "stalled")
            self._stop.wait(self._backoff.next_delay())
        self.source.close()
        if self.finished:
            self._set_state("down")

    def _read_loop(self) -> bool:
        """Read until the end, an error or stop; True if at least one good frame came."""
        went_live = False
        invalid_run = 0
        index = 0
        fps = self.source.native_fps if self.source.is_file and self.settings.realtime else None
        started = self._clock()
        self._last_frame_at = self._clock()
        while not self._stop.is_set():
            began = time.perf_counter()
            raw = self.source.read()
            DECODE.observe(time.perf_counter() - began)
            now = self._clock()
            if raw is None:
                if self.settings.loop:
                    self.source.open()
                    index, started = 0, self._clock()
                    continue
                if self.source.is_file:
                    self.finished = True
                    log.info("stream %s: file ended", self.stream_id)
                return went_live
            fmt = self.source.pixel_format
            image = valid_frame(raw, fmt)
            if image is None:
                self.invalid += 1
                INVALID.labels(self.stream_id).inc()
                invalid_run += 1
                if invalid_run >= self.settings.max_invalid_frames:
                    raise SourceDisconnected(f"{invalid_run} garbage frames in a row")
                if now - self._last_frame_at > self.settings.stall_timeout_s:
                    self._set_state("stalled")
                    raise SourceDisconnected("no valid frame within the stall timeout")
                continue
            invalid_run = 0
            self._last_frame_at = now
            if fps:  # realtime file: pace to the file's clock
                delay = started + index / fps - self._clock()
                if delay > 0 and self._stop.wait(delay):
                    return went_live
            if not went_live:
                went_live = True
                self.last_error = None
            if self.state != "live":
                self._set_state("live")
            self._offer(Frame(self.stream_id, index, image, fmt=fmt))
            index += 1
        return went_live

    def _offer(self, frame: Frame) -> None:
        self.frames += 1
        FRAMES.labels(self.stream_id).inc()
        with self._cond:
            if self._every_frame:
                while self._slot is not None and not self._stop.is_set():
                    self._cond.wait(0.2)
            elif self._slot is not None:
                self.dropped += 1
                DROPPED.labels(self.stream_id).inc()
            self._slot = frame
            self._cond.notify_all()
        self.on_frame()
