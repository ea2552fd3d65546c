"""Escalation policy: reasons, token bucket, de-duplication, crop and JPEG."""

from __future__ import annotations

import cv2
import numpy as np

from edgefleet.edge.policy import EscalationPolicy, TokenBucket, dhash, hamming
from edgefleet.edge.settings import PolicySettings
from edgefleet.shared.messages import Detection
from tests.support.clock import FakeClock


def _frame(seed: int, size: tuple[int, int] = (120, 160)) -> np.ndarray:
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)
    return cv2.resize(small, (size[1], size[0]), interpolation=cv2.INTER_NEAREST)


def _det(score: float, box=(10.0, 10.0, 50.0, 30.0), text: str = "AB") -> Detection:
    return Detection(text=text, score=score, box=box)


def _policy(clock: FakeClock | None = None, **kw) -> EscalationPolicy:
    settings = PolicySettings(**{"sample_share": 0.0, "seed": 1, **kw})
    return EscalationPolicy(settings, clock=clock or FakeClock())


def test_reasons() -> None:
    p = _policy(escalate="frames", unsure_low=0.3, unsure_high=0.7)
    assert p.reason([_det(0.5)], expect_result=False, failed=False) == "unsure"
    # in tracks mode the band is unused: the budget picks unsure tracks instead
    assert _policy().reason([_det(0.5)], expect_result=False, failed=False) is None
    assert p.reason([_det(0.95)], expect_result=False, failed=False) is None
    assert p.reason([_det(0.1)], expect_result=False, failed=False) is None
    assert p.reason([], expect_result=True, failed=False) == "empty"
    assert p.reason([], expect_result=False, failed=False) is None
    assert p.reason([], expect_result=False, failed=True) == "error"
    assert _policy(escalate_errors=False).reason([], expect_result=False, failed=True) is None
    assert _policy(escalate_empty=False).reason([], expect_result=True, failed=False) is None


def test_sampled_share_is_roughly_the_configured_share() -> None:
    p = _policy(sample_share=0.2, seed=7)
    hits = sum(
        p.reason([_det(0.99)], expect_result=False, failed=False) == "sampled" for _ in range(2000)
    )
    assert 300 < hits < 500
    assert _policy(sample_share=1.0).reason([], expect_result=False, failed=False) == "sampled"


def test_token_bucket_limits_and_refills() -> None:
    clock = FakeClock()
    bucket = TokenBucket(rate_per_s=1.0, burst=3, clock=clock)
    assert [bucket.take() for _ in range(4)] == [True, True, True, False]
    clock.now += 1.0
    assert bucket.take() is True
    assert bucket.take() is False
    clock.now += 100
    assert sum(bucket.take() for _ in range(10)) == 3


def test_rate_limit_is_per_stream_and_counted() -> None:
    clock = FakeClock()
    p = _policy(clock, rate_per_min=60, burst=2, dedup_window_s=0)
    a = [p.passes("a", _frame(i)) for i in range(4)]
    b = [p.passes("b", _frame(10 + i)) for i in range(2)]
    assert a == [True, True, False, False]
    assert b == [True, True]
    assert p.suppressed["rate"] == 2
    clock.now += 1.0
    assert p.passes("a", _frame(99)) is True


def test_near_identical_frames_are_sent_once_per_window() -> None:
    clock = FakeClock()
    p = _policy(clock, rate_per_min=6000, burst=100, dedup_window_s=10)
    frame = _frame(1)
    noisy = np.clip(
        frame.astype(np.int16) + np.random.default_rng(0).integers(-3, 4, frame.shape), 0, 255
    ).astype(np.uint8)
    assert hamming(dhash(frame), dhash(noisy)) <= 4
    assert p.passes("s", frame) is True
    assert p.passes("s", noisy) is False  # same scene, a little noise
    assert p.passes("s", _frame(2)) is True  # a different scene
    assert p.suppressed["duplicate"] == 1
    clock.now += 11  # the window has passed
    assert p.passes("s", frame) is True


def test_decide_frame_and_crop_with_jpeg_quality() -> None:
    frame = _frame(3, (240, 320))
    dets = [_det(0.5, (100.0, 50.0, 140.0, 70.0)), _det(0.9, (150.0, 60.0, 200.0, 90.0))]
    whole = _policy(escalate="frames", attach="frame", jpeg_quality=90).decide("s", frame, dets)
    assert whole is not None and whole.reason == "unsure" and whole.crop is None
    img = cv2.imdecode(np.frombuffer(whole.jpeg, np.uint8), cv2.IMREAD_COLOR)
    assert img.shape == (240, 320, 3)
    crop = _policy(escalate="frames", attach="crop", crop_margin=0.1).decide("s", frame, dets)
    assert crop is not None and crop.crop == (90, 46, 210, 94)
    img = cv2.imdecode(np.frombuffer(crop.jpeg, np.uint8), cv2.IMREAD_COLOR)
    assert img.shape == (48, 120, 3)
    # no boxes: the whole frame goes even in crop mode
    boxless = _policy(attach="crop").decide("s", frame, [], failed=True)
    assert boxless is not None and boxless.crop is None
    low = _policy(jpeg_quality=10).encode(frame, None)
    high = _policy(jpeg_quality=95).encode(frame, None)
    assert len(low) < len(high)


def test_large_frames_are_downscaled() -> None:
    p = _policy(max_image_side=64)
    jpeg = p.encode(_frame(4, (240, 320)), None)
    assert cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR).shape == (48, 64, 3)


def test_confident_frames_are_not_escalated() -> None:
    assert _policy().decide("s", _frame(5), [_det(0.99)]) is None


def test_an_i420_frame_escalates_like_its_bgr_twin() -> None:
    # given the same picture as BGR and as I420 (what the FFmpeg source hands over)
    frame = _frame(3, (240, 320))
    yuv = cv2.cvtColor(frame, cv2.COLOR_BGR2YUV_I420)
    dets = [_det(0.5, (100.0, 50.0, 140.0, 70.0)), _det(0.9, (150.0, 60.0, 200.0, 90.0))]
    # when both are escalated, the crop and the whole frame
    for attach, shape in (("crop", (48, 120, 3)), ("frame", (240, 320, 3))):
        kw = {"escalate": "frames", "attach": attach, "crop_margin": 0.1, "jpeg_quality": 95}
        bgr_case = _policy(**kw).decide("s", frame, dets)
        yuv_case = _policy(**kw).decide("s", yuv, dets, fmt="i420")
        # then they show the same box in the same colours (4:2:0 chroma aside)
        assert bgr_case is not None and yuv_case is not None and yuv_case.crop == bgr_case.crop
        a = cv2.imdecode(np.frombuffer(bgr_case.jpeg, np.uint8), cv2.IMREAD_COLOR)
        b = cv2.imdecode(np.frombuffer(yuv_case.jpeg, np.uint8), cv2.IMREAD_COLOR)
        assert a.shape == b.shape == shape
        assert np.abs(a.astype(int) - b.astype(int)).mean() < 6


def test_tracks_keep_bgr_crops_of_i420_frames() -> None:
    frame = _frame(5, (240, 320))
    yuv = cv2.cvtColor(frame, cv2.COLOR_BGR2YUV_I420)
    p = _policy(escalate="tracks")
    det = _det(0.9, (101.0, 51.0, 181.0, 81.0), text="LOT 42")
    for index in range(3):
        p.decide_all("s", index, yuv, [det], fmt="i420")
    (track,) = p.tracker.update("s", 3, yuv, [det], "i420")
    crop = track.crops[0]
    x1, y1, x2, y2 = crop.box
    assert crop.image.shape == (y2 - y1, x2 - x1, 3)
    assert np.abs(crop.image.astype(int) - frame[y1:y2, x1:x2].astype(int)).mean() < 6
