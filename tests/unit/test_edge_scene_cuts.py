"""Scene cuts, built from their own constructor and through the tracker: a frame unlike
the stream's one before ends the stream's tracks, for good."""

from __future__ import annotations

import numpy as np
import pytest

from edgefleet.edge.scene_cuts import CUTS, SceneCuts, thumbnail
from edgefleet.edge.settings import TrackSettings
from edgefleet.edge.tracks import Tracker
from edgefleet.shared.messages import Detection
from tests.support.frames import as_format


def scene(level: int, seed: int = 0) -> np.ndarray:
    """A grey scene at `level` with a little noise and a moving bright bar (motion)."""
    rng = np.random.default_rng(seed)
    img = np.clip(rng.normal(level, 6, (360, 640, 3)), 0, 255).astype(np.uint8)
    x = 40 + 20 * seed
    img[150:170, x : x + 120] = 250
    return img


def test_a_frame_unlike_the_one_before_is_a_cut_and_motion_or_noise_is_not():
    cuts = SceneCuts(level=12.0)
    before = CUTS._value.get()
    # the first frame of a stream is never a cut; noise and a moving line are not either
    assert not cuts.cut("cam", scene(60, 0), "bgr")
    assert not cuts.cut("cam", scene(60, 1), "bgr")
    assert not cuts.cut("cam", scene(60, 2), "bgr")
    # a frame 80 grey levels brighter is, once; another stream keeps its own last frame
    assert cuts.cut("cam", scene(140, 3), "bgr")
    assert not cuts.cut("cam", scene(140, 4), "bgr")
    assert not cuts.cut("other", scene(200, 0), "bgr")
    assert CUTS._value.get() == before + 1
    # a stream forgotten starts afresh; level 0 never cuts
    cuts.forget("cam")
    assert not cuts.cut("cam", scene(10, 0), "bgr")
    off = SceneCuts(level=0.0)
    assert not off.cut("cam", scene(10), "bgr") and not off.cut("cam", scene(250), "bgr")


@pytest.mark.parametrize("fmt", ["nv12", "i420"])
def test_a_yuv_frame_is_judged_on_its_brightness_like_its_bgr_twin(fmt):
    bgr = scene(90, 1)
    yuv = as_format(np.ascontiguousarray(bgr[..., ::-1]), fmt)
    # (video luma is limited-range: a few levels off the BGR mean, far under a cut's 12)
    assert np.abs(thumbnail(yuv, fmt) - thumbnail(bgr, "bgr")).mean() < 6.0


def test_a_cut_ends_the_streams_tracks_and_the_same_text_after_it_is_a_new_track():
    tracker = Tracker(TrackSettings(cut_level=12.0))
    line = Detection(text="GATE 12", score=0.9, box=(100.0, 100.0, 220.0, 130.0))
    [first] = tracker.update("cam", 0, scene(60, 0), [line])
    [same] = tracker.update("cam", 1, scene(60, 1), [line])
    assert same is first and not first.ended
    # when the camera cuts to another scene where the same text shows in the same place
    [after] = tracker.update("cam", 2, scene(160, 2), [line])
    # then the old track ended there and is not taken up again: what it read says nothing
    # of the line in its box now
    assert first.ended and after is not first and after.track_id != first.track_id
    assert tracker.live("cam") == [after]
