"""Video sources: one interface (`VideoSource`), one capture thread per stream (`Capture`)."""

from __future__ import annotations

from edgefleet.edge.settings import SourceSettings
from edgefleet.edge.sources.base import Frame, VideoSource
from edgefleet.edge.sources.ffmpeg import FfmpegSource, has_pyav
from edgefleet.edge.sources.gstreamer import GstreamerSource, jetson_pipeline
from edgefleet.edge.sources.opencv import OpenCvSource, guess_kind


def pick_decoder(settings: SourceSettings, pyav: bool | None = None) -> str:
    """The decoder a stream gets: its setting, `auto` = ffmpeg when PyAV is importable,
    else opencv. A GStreamer pipeline url is the user's own pipeline: OpenCV runs it."""
    kind = guess_kind(settings.url) if settings.kind == "auto" else settings.kind
    if kind == "gstreamer":
        return "opencv"
    if settings.decoder == "auto":
        return "ffmpeg" if (has_pyav() if pyav is None else pyav) else "opencv"
    return settings.decoder


def make_source(settings: SourceSettings) -> VideoSource:
    """The source for one stream's settings, by its decoder (`pick_decoder`)."""
    decoder = pick_decoder(settings)
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
    "guess_kind",
    "jetson_pipeline",
    "make_source",
    "pick_decoder",
]
