"""FFmpeg through PyAV: files, RTSP, UDP, HTTP and V4L2, frames in the decoder's own format.

OpenCV's capture converts every decoded frame to BGR (swscale, a full-frame pass) before
the kernel converts it again to RGB while resizing. Here the decoder's planes go out as
they come: yuv420p/yuvj420p as "i420", nv12 as "nv12", both (H*3/2, W) uint8, built with
one copy of each plane (the decoder's rows carry line padding, and its buffers are reused
for the next frame, so a frame that outlives `read` must own its pixels). No colour
conversion, no resize. Other YUV layouts (a webcam's yuyv422, NV21, 10-bit video) are
repacked to I420 by swscale: chroma resampled and bit depth reduced, no colour matrix,
1.7-43x cheaper than converting them to BGR (13x for YUYV; `REPACKED`). Anything else
(RGB, grey, MJPEG's yuvj422p, where swscale's BGR path is the cheaper) is converted to
BGR. Both are counted in `ef_edge_frames_converted_total` with the format, so a camera
that costs a pass per frame shows on the metrics.

Colour: the kernels convert YUV as BT.601 limited range (`cv2.COLOR_YUV2RGB_*`). Full-range
video (yuvj420p, MJPEG cameras) and BT.709 (most HD streams) are handed over as they are
and read as BT.601 limited: contrast is stretched by about 1.16 (range) and hues shift by
a few levels (matrix). `open` logs it once per stream; OCR is insensitive to both.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from prometheus_client import Counter

from edgefleet.edge.sources.base import Decoder, VideoSource
from edgefleet.edge.sources.opencv import guess_kind, safe_url
from edgefleet.edge.sources.settings import SourceSettings
from edgefleet.shared.errors import ConfigError, SourceDisconnected

if TYPE_CHECKING:
    from av.container import InputContainer
    from av.video.frame import VideoFrame
    from av.video.stream import VideoStream

log = logging.getLogger(__name__)

CONVERTED = Counter(
    "ef_edge_frames_converted_total",
    "Frames a source colour-converted (a pixel format the kernels do not take)",
    ["stream", "pix_fmt"],
)

# The decoder's formats that go out as they are, and the pixel format they become.
NATIVE = {"yuv420p": "i420", "yuvj420p": "i420", "nv12": "nv12"}
# The formats swscale repacks to I420 faster than it converts them to BGR, one thread,
# 1080p, ms (I420 / BGR): yuyv422 0.25 / 3.23, uyvy422 0.61 / 3.28, yvyu422 1.94 / 3.21,
# nv21 0.08 / 3.44, p010le 1.55 / 3.27, yuv420p10le 1.47 / 2.92, yuv422p10le 1.81 / 3.20,
# yuv444p 1.87 / 7.78 (`edgefleet bench edge --no-pipeline`, which prints them all).
REPACKED = frozenset(
    {"yuyv422", "uyvy422", "yvyu422", "nv21", "p010le", "yuv420p10le", "yuv422p10le", "yuv444p"}
)
# A packet the decoder refused: not a frame. The capture thread counts it as invalid
# (and gives up on the stream after `max_invalid_frames` in a row).
GARBAGE = np.empty(0, np.uint8)
# FFmpeg's AVColorRange / AVColorSpace values that differ from what the kernels assume.
_FULL_RANGE = 2  # AVCOL_RANGE_JPEG
_BT601 = {0, 2, 5, 6}  # RGB/unspecified (nothing better known), unspecified, BT470BG, SMPTE170M


def _reason(exc: Exception) -> str:
    """FFmpeg's reason without the url it names (which may carry credentials)."""
    return str(getattr(exc, "strerror", None) or type(exc).__name__)


def has_pyav() -> bool:
    """Whether PyAV is importable (the `auto` decoder then picks ffmpeg)."""
    try:
        import av  # noqa: F401
    except ImportError:
        return False
    return True


def i420_from_planes(
    planes: Sequence[tuple[memoryview | bytes, int]], width: int, height: int, fmt: str
) -> np.ndarray:
    """One contiguous (H*3/2, W) frame from the decoder's planes (buffer, line size).

    Each plane is copied once, its line padding dropped; an odd last row or column is
    dropped too (4:2:0 needs even sizes).
    """
    w, h = width - width % 2, height - height % 2
    out = np.empty((h * 3 // 2, w), np.uint8)
    flat = out.reshape(-1)
    y_buf, y_line = planes[0]
    out[:h] = np.frombuffer(y_buf, np.uint8)[: y_line * h].reshape(h, y_line)[:, :w]
    if fmt == "nv12":
        uv_buf, uv_line = planes[1]
        rows = np.frombuffer(uv_buf, np.uint8)[: uv_line * (h // 2)].reshape(h // 2, uv_line)
        out[h:] = rows[:, :w]
        return out
    quarter = (h // 2) * (w // 2)
    for i, (buf, line) in enumerate(planes[1:3]):
        rows = np.frombuffer(buf, np.uint8)[: line * (h // 2)].reshape(h // 2, line)
        start = h * w + i * quarter
        flat[start : start + quarter].reshape(h // 2, w // 2)[:] = rows[:, : w // 2]
    return out


class FfmpegSource(VideoSource):
    """PyAV container + decoder; `pixel_format` is the format of the last frame read."""

    def __init__(self, settings: SourceSettings):
        self.settings = settings
        self.kind = guess_kind(settings.url) if settings.kind == "auto" else settings.kind
        if self.kind == "gstreamer":
            raise ConfigError("a GStreamer pipeline url goes through OpenCV, not PyAV")
        self._container: InputContainer | None = None
        self._frames: Iterator[VideoFrame | None] | None = None
        self._fps: float | None = None
        self._noted: set[str] = set()
        self.pixel_format = "i420"

    @property
    def is_file(self) -> bool:
        return self.kind == "file"

    @property
    def native_fps(self) -> float | None:
        return self._fps

    def describe(self) -> str:
        return f"{self.kind} {safe_url(self.settings.url)} (ffmpeg)"

    def open(self) -> None:
        import av

        self.close()
        url = self.settings.url
        if self.kind == "file" and not Path(url).is_file():
            raise SourceDisconnected(
                f"no such video file: {safe_url(url)}", hint="check the stream url"
            )
        options: dict[str, str] = {}
        fmt: str | None = None
        if self.kind == "rtsp":
            options["rtsp_transport"] = "tcp"
        if self.kind == "v4l2":
            fmt = "v4l2"
            if re.fullmatch(r"\d+", url.strip()):
                url = f"/dev/video{url.strip()}"
        try:
            container = av.open(
                url,
                format=fmt,
                options=options,
                timeout=(self.settings.open_timeout_s, self.settings.stall_timeout_s),
            )
        except (av.FFmpegError, OSError) as exc:
            what = "not a readable video" if self.kind == "file" else "cannot be opened"
            raise SourceDisconnected(f"{self.describe()}: {what} ({_reason(exc)})") from None
        if not container.streams.video:
            container.close()
            raise SourceDisconnected(f"{self.describe()}: no video stream")
        stream = container.streams.video[0]
        # Slice threads only: frame threading would hold each frame back by one frame per
        # decoder thread (camera-to-result latency) and take the inference workers' cores.
        stream.thread_type = "SLICE"
        rate = stream.average_rate or stream.guessed_rate
        fps = float(rate) if rate else 0.0
        self._fps = fps if 0 < fps < 1000 else None
        self._container = container
        self._frames = self._decode(container, stream)

    def _decode(
        self, container: InputContainer, stream: VideoStream
    ) -> Iterator[VideoFrame | None]:
        """Frames of the stream; a packet the decoder refuses yields None (counted invalid)."""
        import av

        for packet in container.demux(stream):
            try:
                frames = packet.decode()
            except av.InvalidDataError:
                yield None
                continue
            yield from frames

    def read(self) -> np.ndarray | None:
        import av

        if self._frames is None:
            raise SourceDisconnected(f"{self.describe()}: not open")
        try:
            frame = next(self._frames)
        except StopIteration:
            if self.kind == "file":
                return None
            raise SourceDisconnected(f"{self.describe()}: no frame (stream ended)") from None
        except (av.FFmpegError, OSError) as exc:
            what = "read failed" if self.kind == "file" else "no frame"
            raise SourceDisconnected(f"{self.describe()}: {what} ({_reason(exc)})") from None
        if frame is None:
            return GARBAGE
        return self._pixels(frame)

    def _pixels(self, frame: VideoFrame) -> np.ndarray:
        name = frame.format.name
        native = NATIVE.get(name)
        if native is None and name not in REPACKED:
            CONVERTED.labels(self.settings.id, name).inc()
            self._note(name, f"pixel format {name} is converted to BGR on every frame (swscale)")
            self.pixel_format = "bgr"
            return np.asarray(frame.reformat(format="bgr24", threads=1).to_ndarray())
        if frame.color_range == _FULL_RANGE:
            self._note("range", "full-range video is read as limited range (contrast x1.16)")
        if frame.colorspace not in _BT601:
            self._note("matrix", f"colour matrix {frame.colorspace} is read as BT.601")
        if native is None:  # the same YUV in I420's layout: swscale on the capture thread only
            CONVERTED.labels(self.settings.id, name).inc()
            self._note(name, f"pixel format {name} is repacked to I420 on every frame (swscale)")
            frame, native = frame.reformat(format="yuv420p", threads=1), "i420"
        self.pixel_format = native
        planes = [(memoryview(plane), plane.line_size) for plane in frame.planes]  # no copy
        return i420_from_planes(planes, frame.width, frame.height, native)

    def _note(self, key: str, message: str) -> None:
        if key not in self._noted:
            self._noted.add(key)
            log.warning("stream %s: %s", self.settings.id, message)

    def close(self) -> None:
        self._frames = None
        if self._container is not None:
            container, self._container = self._container, None
            container.close()


DECODER = Decoder(
    "ffmpeg",
    FfmpegSource,
    frozenset({"file", "rtsp", "udp", "http", "v4l2"}),
    has_pyav,
    chosen="PyAV is installed",
    absent="PyAV is not installed",
    rank=1,
)
