"""Jetson hardware decode: GStreamer's nvv4l2decoder → nvvidconv → NV12 → appsink, via OpenCV.

OpenCV's GStreamer backend hands an appsink buffer of `video/x-raw,format=NV12` over as
it is: one 8-bit channel, (H*3/2, W) (cap_gstreamer.cpp, `determineFrameDims`: NV12, NV21,
YV12 and I420 are "1 channel, height is 1.5x larger"); it never colour-converts raw YUV,
whatever CAP_PROP_CONVERT_RGB says: the backend's setProperty ignores that property, and
(OpenCV 4.x) any setProperty on a playing pipeline stops and restarts it, an RTSP
reconnect, so it is not set at all. The frame reaches the kernel in the format the decoder
wrote, with one copy (OpenCV's, out of the GStreamer buffer). Some OpenCV 4.x builds copy
that buffer as one block without row strides: keep widths a multiple of 4 there.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from pathlib import Path

import cv2

from edgefleet.edge.sources.base import Decoder
from edgefleet.edge.sources.opencv import OpenCvSource, has_gstreamer, open_params, safe_url
from edgefleet.edge.sources.settings import SourceSettings
from edgefleet.shared.errors import ConfigError, SourceDisconnected

# appsink: the newest buffer only (the capture thread keeps the newest frame anyway), and
# no clock sync, so a file is read as fast as the pipeline asks (Capture paces files).
_SINK = "video/x-raw,format=NV12 ! appsink drop=true max-buffers=1 sync=false"


# Where GStreamer looks for plugins when the environment names none (Debian's multiarch
# folders; JetPack puts nvv4l2decoder, libgstnvvideo4linux2.so, in the aarch64 one).
_PLUGIN_DIRS = (
    "/usr/lib/aarch64-linux-gnu/gstreamer-1.0",
    "/usr/lib/x86_64-linux-gnu/gstreamer-1.0",
    "/usr/lib/gstreamer-1.0",
    "/usr/local/lib/gstreamer-1.0",
)
_NVDEC_PLUGIN = "libgstnvvideo4linux2.so"


def plugin_dirs(environ: dict[str, str] | None = None) -> list[Path]:
    """The folders GStreamer loads plugins from: GST_PLUGIN_PATH, then the system path
    (GST_PLUGIN_SYSTEM_PATH replaces the built-in folders, as it does for GStreamer)."""
    env = os.environ if environ is None else environ
    named = [p for p in env.get("GST_PLUGIN_PATH", "").split(os.pathsep) if p]
    system = env.get("GST_PLUGIN_SYSTEM_PATH_1_0", env.get("GST_PLUGIN_SYSTEM_PATH"))
    rest = [p for p in system.split(os.pathsep) if p] if system is not None else _PLUGIN_DIRS
    return [Path(p) for p in (*named, *rest)]


def has_nvdec_plugin(dirs: list[Path] | None = None) -> bool:
    """Whether GStreamer can load nvv4l2decoder: its plugin file in a plugin folder, or,
    where the file lies elsewhere, `gst-inspect-1.0 --exists` says so."""
    if any((d / _NVDEC_PLUGIN).is_file() for d in (plugin_dirs() if dirs is None else dirs)):
        return True
    inspect = shutil.which("gst-inspect-1.0")
    if inspect is None:
        return False
    try:
        found = subprocess.run(
            [inspect, "--exists", "nvv4l2decoder"], capture_output=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return found.returncode == 0


@functools.cache
def nvdec_available() -> bool:
    """NVDEC through GStreamer: an OpenCV built with GStreamer and nvv4l2decoder loadable.
    Asked once per process: neither changes while it runs."""
    return has_gstreamer() and has_nvdec_plugin()


def _quoted(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def jetson_pipeline(url: str, kind: str, latency_ms: int = 200) -> str:
    """The GStreamer pipeline that decodes `url` on the Jetson's NVDEC into NV12.

    parsebin finds the depayloader and parser for whatever codec the stream carries
    (H.264, H.265, ...); a camera (V4L2) gives raw frames, which nvvidconv turns to NV12.
    """
    decode = "parsebin ! nvv4l2decoder ! nvvidconv"
    if kind == "rtsp":
        source = f"rtspsrc location={_quoted(url)} latency={latency_ms} protocols=tcp"
    elif kind == "file":
        source = f"filesrc location={_quoted(url)}"
    elif kind in ("udp", "http"):
        source = f"urisourcebin uri={_quoted(url)}"
    elif kind == "v4l2":
        device = f"/dev/video{url.strip()}" if re.fullmatch(r"\d+", url.strip()) else url
        source, decode = f"v4l2src device={_quoted(device)}", "nvvidconv"
    else:
        raise ConfigError(f"decoder gstreamer cannot build a pipeline for a {kind} source")
    return f"{source} ! {decode} ! {_SINK}"


class GstreamerSource(OpenCvSource):
    """OpenCV's capture on `jetson_pipeline(url)`; frames are NV12 (H*3/2, W). Reading,
    closing and the frame rate are the OpenCV source's; only opening differs."""

    pixel_format = "nv12"

    def __init__(self, settings: SourceSettings):
        super().__init__(settings)
        self.pipeline = jetson_pipeline(settings.url, self.kind)

    def describe(self) -> str:
        return f"{self.kind} {safe_url(self.settings.url)} (gstreamer nvv4l2decoder)"

    def open(self) -> None:
        self.close()
        if not has_gstreamer():
            raise SourceDisconnected(
                "this OpenCV has no GStreamer support",
                hint="decoder gstreamer needs the Jetson image (OpenCV built with GStreamer)",
            )
        params = open_params(
            "gstreamer",
            self.settings.open_timeout_s,
            self.settings.stall_timeout_s,
            cv2.__version__,
        )
        cap = cv2.VideoCapture(self.pipeline, cv2.CAP_GSTREAMER, params)
        if not cap.isOpened():
            cap.release()
            raise SourceDisconnected(f"{self.describe()}: cannot be opened")
        fps = cap.get(cv2.CAP_PROP_FPS)
        self._fps = fps if 0 < fps < 1000 else None
        self._cap = cap


# Streams NVDEC decodes (a V4L2 camera gives raw or MJPEG frames: nothing for NVDEC).
DECODER = Decoder(
    "gstreamer",
    GstreamerSource,
    frozenset({"rtsp", "file", "udp", "http"}),
    nvdec_available,
    chosen="NVDEC: OpenCV has GStreamer and nvv4l2decoder loads",
    absent="no NVDEC here",
    rank=0,
)
