"""Every source OpenCV can open: files, RTSP, UDP/MPEG-TS, HTTP MJPEG, V4L2, GStreamer."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import cv2
import numpy as np

from edgefleet.edge.sources.base import Decoder, VideoSource
from edgefleet.edge.sources.settings import SourceSettings
from edgefleet.shared.errors import SourceDisconnected
from edgefleet.shared.logs import redact_url

log = logging.getLogger(__name__)

_BACKENDS = {
    "file": cv2.CAP_FFMPEG,
    "rtsp": cv2.CAP_FFMPEG,
    "udp": cv2.CAP_FFMPEG,
    "http": cv2.CAP_FFMPEG,
    "v4l2": cv2.CAP_V4L2,
    "gstreamer": cv2.CAP_GSTREAMER,
}


# Secrets that are not `user:password@` in a URL: GStreamer rtspsrc's `user-pw=` property
# and the `?pwd=...` query parameters many HTTP cameras take.
_SECRET_PARAMS = re.compile(
    r"(?i)\b(user-pw|proxy-pw|password|passwd|pwd|pass|token|access_token)="
    r"(\"[^\"]*\"|'[^']*'|[^\s&!]+)"
)


def safe_url(url: str) -> str:
    """The source url or pipeline as it may be logged: credentials replaced by ***."""
    return _SECRET_PARAMS.sub(r"\1=***", redact_url(url))


def guess_kind(url: str) -> str:
    """Source kind from the url: scheme, /dev/video*, a GStreamer pipeline, else a file."""
    lowered = url.strip().lower()
    if "!" in url and "appsink" in lowered:
        return "gstreamer"
    for scheme, kind in (
        ("rtsp://", "rtsp"),
        ("rtsps://", "rtsp"),
        ("udp://", "udp"),
        ("rtp://", "udp"),
        ("http://", "http"),
        ("https://", "http"),
    ):
        if lowered.startswith(scheme):
            return kind
    if re.fullmatch(r"/dev/video\d+|\d+", lowered):
        return "v4l2"
    return "file"


def open_params(kind: str, open_timeout_s: float, read_timeout_s: float, version: str) -> list[int]:
    """The open/read timeouts for the backends that take them when opening.

    OpenCV passes open parameters a backend does not know to its setProperty and refuses
    to open when that fails. FFmpeg (files, RTSP, UDP, HTTP) takes both; GStreamer since
    OpenCV 4.7 (JetPack 5 ships 4.5); V4L2 takes none: a camera given them would never
    open. V4L2 reads end on OpenCV's own select() timeout (10 s,
    OPENCV_VIDEOIO_V4L_SELECT_TIMEOUT), and the stall watchdog reports the stream meanwhile.
    """
    if kind == "v4l2":
        return []
    if kind == "gstreamer":
        major, minor = (int(part) for part in re.findall(r"\d+", version)[:2])
        if (major, minor) < (4, 7):
            return []
    return [
        cv2.CAP_PROP_OPEN_TIMEOUT_MSEC,
        int(open_timeout_s * 1000),
        cv2.CAP_PROP_READ_TIMEOUT_MSEC,
        int(read_timeout_s * 1000),
    ]


class OpenCvSource(VideoSource):
    """A cv2.VideoCapture with open/read timeouts, so a dead peer cannot block forever."""

    def __init__(self, settings: SourceSettings):
        self.settings = settings
        self.kind = guess_kind(settings.url) if settings.kind == "auto" else settings.kind
        self._cap: cv2.VideoCapture | None = None
        self._fps: float | None = None

    @property
    def is_file(self) -> bool:
        return self.kind == "file"

    @property
    def native_fps(self) -> float | None:
        return self._fps

    def describe(self) -> str:
        return f"{self.kind} {safe_url(self.settings.url)}"

    def open(self) -> None:
        self.close()
        url = self.settings.url
        if self.kind == "file" and not Path(url).is_file():
            hint = (
                "a GStreamer pipeline must end in `appsink`"
                if "!" in url
                else "check the stream url"
            )
            raise SourceDisconnected(f"no such video file: {safe_url(url)}", hint=hint)
        if self.kind == "gstreamer" and not has_gstreamer():
            raise SourceDisconnected(
                "this OpenCV has no GStreamer support",
                hint="use the Jetson image (OpenCV built with GStreamer) or an rtsp/file url",
            )
        target: str | int = url
        if self.kind == "v4l2":
            target = int(url.removeprefix("/dev/video"))
        params = open_params(
            self.kind, self.settings.open_timeout_s, self.settings.stall_timeout_s, cv2.__version__
        )
        cap = cv2.VideoCapture(target, _BACKENDS[self.kind], params)
        if not cap.isOpened():
            cap.release()
            what = "not a readable video" if self.kind == "file" else "cannot be opened"
            raise SourceDisconnected(f"{self.describe()}: {what}")
        fps = cap.get(cv2.CAP_PROP_FPS)
        self._fps = fps if 0 < fps < 1000 else None
        self._cap = cap

    def read(self) -> np.ndarray | None:
        if self._cap is None:
            raise SourceDisconnected(f"{self.describe()}: not open")
        ok, frame = self._cap.read()
        if not ok:
            if self.kind == "file":
                return None
            raise SourceDisconnected(f"{self.describe()}: no frame (stream ended or timed out)")
        return frame

    def close(self) -> None:
        if self._cap is not None:
            self._cap.release()
            self._cap = None


_BUILD_INFO: str | None = None


def has_gstreamer(build_info: str | None = None) -> bool:
    """Whether this OpenCV was built with GStreamer (its build information says `YES`)."""
    global _BUILD_INFO
    if build_info is None:
        if _BUILD_INFO is None:
            _BUILD_INFO = cv2.getBuildInformation()
        build_info = _BUILD_INFO
    return re.search(r"^\s*GStreamer:\s*YES", build_info, re.MULTILINE) is not None


# The decoder every OpenCV build has: the last resort, and the one a GStreamer pipeline
# url always goes through.
DECODER = Decoder(
    "opencv",
    OpenCvSource,
    frozenset({"file", "rtsp", "udp", "http", "v4l2", "gstreamer"}),
    lambda: True,
    chosen="",
    absent="",
    rank=2,
)
