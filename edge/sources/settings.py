"""One video stream's settings: what every decoder is built from."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from edgefleet.shared.config import Closed

SourceKind = Literal["auto", "file", "rtsp", "udp", "http", "v4l2", "gstreamer"]


class SourceSettings(Closed):
    """One video stream."""

    id: str = Field(
        pattern=r"^[A-Za-z0-9_.-]{1,64}$", description="stream id, used in telemetry and cases"
    )
    url: str = Field(
        min_length=1,
        description="file path, rtsp://, udp://, http(s):// MJPEG URL, /dev/videoN or a "
        "GStreamer pipeline ending in appsink",
    )
    kind: SourceKind = Field("auto", description="source type; auto guesses from the url")
    decoder: str = Field(
        "auto",
        pattern=r"^[a-z0-9-]{1,32}$",
        description="who decodes: ffmpeg (PyAV: the decoder's YUV planes as they come), "
        "opencv (BGR), gstreamer (Jetson: nvv4l2decoder to NV12); auto = gstreamer for an "
        "encoded stream where OpenCV has GStreamer and nvv4l2decoder loads (a Jetson), else "
        "ffmpeg when PyAV is installed, else opencv (a GStreamer pipeline url always goes "
        "through OpenCV)",
    )
    realtime: bool = Field(
        True,
        description="files only: play at the file's frame rate and drop what the pipeline "
        "cannot keep up with; false = every frame, for evaluation",
    )
    loop: bool = Field(False, description="files only: start again at the end")
    expect_result: bool = Field(
        False, description="an empty result on this stream is suspicious (escalated as `empty`)"
    )
    stall_timeout_s: float = Field(
        5.0, gt=0, description="no frame for this long: the stream is `stalled` and reconnected"
    )
    open_timeout_s: float = Field(10.0, gt=0, description="give up opening after this long")
    reconnect_min_s: float = Field(0.5, gt=0, description="first reconnect delay")
    reconnect_max_s: float = Field(30.0, gt=0, description="reconnect delay cap (with jitter)")
    max_invalid_frames: int = Field(
        25, ge=1, description="this many garbage frames in a row count as a stream error"
    )
