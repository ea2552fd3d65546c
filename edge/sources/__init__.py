"""Video sources: one interface (`VideoSource`), one capture thread per stream (`Capture`)."""

from __future__ import annotations

import functools
import importlib
import logging
from collections.abc import Mapping

from edgefleet.edge.sources.base import Decoder, Frame, VideoSource
from edgefleet.edge.sources.ffmpeg import FfmpegSource
from edgefleet.edge.sources.gstreamer import GstreamerSource, jetson_pipeline, nvdec_available
from edgefleet.edge.sources.opencv import OpenCvSource, guess_kind
from edgefleet.edge.sources.settings import SourceSettings
from edgefleet.shared.errors import ConfigError

log = logging.getLogger(__name__)

# One line per decoder module: adding a decoder is its file (its `DECODER`) and its line.
MODULES = [
    "edgefleet.edge.sources.gstreamer",
    "edgefleet.edge.sources.ffmpeg",
    "edgefleet.edge.sources.opencv",
]


@functools.lru_cache(maxsize=1)
def decoders() -> dict[str, Decoder]:
    """Every declared decoder by name, in the order `auto` tries them (cached)."""
    declared = [importlib.import_module(module).DECODER for module in MODULES]
    return {d.name: d for d in sorted(declared, key=lambda d: d.rank)}


def choose_decoder(
    settings: SourceSettings, present: Mapping[str, bool] | None = None
) -> tuple[str, str]:
    """The decoder a stream gets and why: its setting, or for `auto` the first decoder
    that decodes this kind of source and is here (the Jetson's NVDEC through GStreamer,
    then ffmpeg when PyAV is importable, then OpenCV). A GStreamer pipeline url is the
    user's own pipeline: OpenCV runs it. `present` overrides what the host has, by name."""
    kind = guess_kind(settings.url) if settings.kind == "auto" else settings.kind
    if kind == "gstreamer":
        return "opencv", "the url is a GStreamer pipeline: OpenCV runs it as given"
    if settings.decoder != "auto":
        return settings.decoder, f"decoder {settings.decoder} is set"
    passed: list[str] = []
    for decoder in decoders().values():
        if kind not in decoder.kinds:
            reason = f"a {kind} source"
        elif present.get(decoder.name, True) if present else decoder.present():
            return decoder.name, "; ".join(p for p in (" and ".join(passed), decoder.chosen) if p)
        else:
            reason = decoder.absent
        if reason not in passed:
            passed.append(reason)
    raise ConfigError(f"stream {settings.id}: no decoder for a {kind} source")


def make_source(settings: SourceSettings) -> VideoSource:
    """The source for one stream's settings, by its decoder (`choose_decoder`, logged)."""
    decoder, why = choose_decoder(settings)
    known = decoders()
    if decoder not in known:
        raise ConfigError(
            f"stream {settings.id}: unknown decoder {decoder!r}; one of auto, {', '.join(known)}"
        )
    log.info("stream %s: decoder %s (%s)", settings.id, decoder, why)
    return known[decoder].build(settings)


__all__ = [
    "Decoder",
    "FfmpegSource",
    "Frame",
    "GstreamerSource",
    "OpenCvSource",
    "VideoSource",
    "choose_decoder",
    "decoders",
    "guess_kind",
    "jetson_pipeline",
    "make_source",
    "nvdec_available",
]
