"""Video sources: one interface (`VideoSource`), one capture thread per stream (`Capture`)."""

from __future__ import annotations

from edgefleet.edge.settings import SourceSettings
from edgefleet.edge.sources.base import Frame, VideoSource
from edgefleet.edge.sources.opencv import OpenCvSource, guess_kind


def make_source(settings: SourceSettings) -> VideoSource:
    """The source for one stream's settings (every kind goes through OpenCV today)."""
    return OpenCvSource(settings)


__all__ = ["Frame", "OpenCvSource", "VideoSource", "guess_kind", "make_source"]
