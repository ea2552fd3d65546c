"""Video sources: one interface (`VideoSource`), one capture thread per stream (`Capture`)."""

from __future__ import annotations

import logging

from edgefleet.edge.settings import SourceSettings
from edgefleet.edge.sources.base import Frame, VideoSource
from edgefleet.edge.sources.ffmpeg import FfmpegSource, has_pyav
from edgefleet.edge.sources.gstreamer import GstreamerSource, jetson_pipeline, nvdec_available
from edgefleet.edge.sources.opencv import OpenCvSource, guess_kind

log = logging.getLogger(__name__)

# Streams NVDEC decodes (a V4L2 camera gives raw or MJPEG frames: nothing for NVDEC).
_NVDEC_KINDS = ("rtsp", "file", "udp", "http")


def choose_decoder(
    settings: SourceSettings, pyav: bool | None = None, nvdec: bool | None = None
) -> tuple[str, str]:
    """The decoder a stream gets and why: its setting, or for `auto` the Jetson's hardware
    decoder (gstreamer) where NVDEC is available and the stream is encoded, else ffmpeg when
    PyAV is importable, else opencv. A GStreamer pipeline url is the user's own pipeline:
    OpenCV runs it."""
    kind = guess_kind(settings.url) if settings.kind == "auto" else settings.kind
    if kind == "gstreamer":
        return "opencv", "the url is a GStreamer pipeline: OpenCV runs it as given"
    if settings.decoder != "auto":
        return settings.decoder, f"decoder {settings.decoder} is set"
    if kind in _NVDEC_KINDS and (nvdec_available() if nvdec is None else nvdec):
        return "gstreamer", "NVDEC: OpenCV has GStreamer and nvv4l2decoder loads"
    if has_pyav() if pyav is None else pyav:
        why = "no NVDEC here" if kind in _NVDEC_KINDS else f"a {kind} source"
        return "ffmpeg", f"{why}; PyAV is installed"
    return "opencv", "no NVDEC here and PyAV is not installed"


def make_source(settings: SourceSettings) -> VideoSource:
    """The source for one stream's settings, by its decoder (`choose_decoder`, logged)."""
    decoder, why = choose_decoder(settings)
    log.info("stream %s: decoder %s (%s)", settings.id, decoder, why)
    if decoder == "ffmpeg":
        return FfmpegSource(settings)
    if decoder == "gstreamer":
        return GstreamerSource(settings)
    return OpenCvSource(settings)


__all__ = [
    "FfmpegSource",
    "Frame",
    "GstreamerSource",
    "OpenCvSource",
    "VideoSource",
    "choose_decoder",
    "guess_kind",
    "jetson_pipeline",
    "make_source",
    "nvdec_available",
]
