"""Video sources and the capture thread: kinds, newest-frame slot, bad input, reconnects."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from pathlib import Path

import cv2
import numpy as np
import pytest

from edgefleet.edge.settings import SourceSettings
from edgefleet.edge.sources import OpenCvSource, VideoSource, guess_kind
from edgefleet.edge.sources.capture import Backoff, Capture, valid_frame
from edgefleet.edge.sources.opencv import has_gstreamer, open_params
from edgefleet.shared.errors import SourceDisconnected
from tests.support.waiting import eventually


def write_video(path: Path, frames: int = 12, fps: float = 25.0) -> Path:
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), fps, (64, 48))
    for i in range(frames):
        img = np.zeros((48, 64, 3), np.uint8)
        img[:, : (i % 8 + 1) * 8] = (0, 200, 0)
        writer.write(img)
    writer.release()
    return path


def _settings(url: str, **kw) -> SourceSettings:
    return SourceSettings(
        id="s1", url=url, reconnect_min_s=0.05, reconnect_max_s=0.2, stall_timeout_s=1.0, **kw
    )


class ScriptedSource(VideoSource):
    """A camera driven by the test: yields whatever `frames` produces (garbage included)."""

    kind = "scripted"

    def __init__(self, frames: Callable[[], object]):
        self.frames = frames
        self.opens = 0

    def open(self) -> None:
        self.opens += 1

    def read(self):
        time.sleep(0.005)
        return self.frames()

    def close(self) -> None:
        pass


@pytest.mark.parametrize(
    ("url", "kind"),
    [
        ("rtsp://user:pw@cam/stream", "rtsp"),
        ("udp://127.0.0.1:5000", "udp"),
        ("http://cam/mjpeg", "http"),
        ("/dev/video0", "v4l2"),
        ("0", "v4l2"),
        ("nvarguscamerasrc ! nvvidconv ! video/x-raw,format=BGRx ! appsink", "gstreamer"),
        ("/data/clip.mp4", "file"),
    ],
)
def test_kind_is_guessed_from_the_url(url: str, kind: str) -> None:
    assert guess_kind(url) == kind


@pytest.mark.parametrize(
    "url",
    [
        "rtsp://admin:hunter2@10.0.0.5:554/live",
        "rtspsrc location=rtsp://admin:hunter2@10.0.0.5/live latency=0 ! rtph264depay ! "
        "h264parse ! nvv4l2decoder ! nvvidconv ! video/x-raw,format=BGRx ! appsink",
        'rtspsrc location="rtsp://10.0.0.5/live" user-id=admin user-pw=hunter2 ! appsink',
        'rtspsrc location=rtsp://10.0.0.5/live user-id=admin user-pw="hunter2" ! appsink',
        "http://10.0.0.5/video.cgi?user=admin&pwd=hunter2&resolution=720",
        "http://10.0.0.5/mjpg?password=hunter2",
    ],
)
def test_credentials_never_appear_in_the_description(url: str) -> None:
    source = OpenCvSource(_settings(url))
    assert "hunter2" not in source.describe() and "10.0.0.5" in source.describe()


def test_backoff_is_capped_with_jitter() -> None:
    backoff = Backoff(0.5, 4.0, rng=random.Random(1))
    delays = [backoff.next_delay() for _ in range(8)]
    bases = [0.5, 1, 2, 4, 4, 4, 4, 4]
    assert all(b / 2 <= d <= b for d, b in zip(delays, bases, strict=True))
    assert len({round(d, 6) for d in delays[3:]}) > 1  # jittered, not a fixed cap
    backoff.reset()
    assert backoff.next_delay() <= 0.5


def test_garbage_frames_are_rejected() -> None:
    assert valid_frame(None) is None
    assert valid_frame(np.zeros((48, 64, 3), np.float32)) is None
    assert valid_frame(np.zeros((2, 2, 3), np.uint8)) is None
    assert valid_frame(np.zeros((48, 64, 5), np.uint8)) is None
    assert valid_frame(b"\xff\xd8garbage") is None
    assert valid_frame(np.zeros((48, 64), np.uint8)).shape == (48, 64, 3)
    assert valid_frame(np.zeros((48, 64, 4), np.uint8)).shape == (48, 64, 3)


def test_every_frame_mode_delivers_each_frame_in_order(tmp_path: Path) -> None:
    video = write_video(tmp_path / "v.mp4", frames=12)
    capture = Capture(_settings(str(video), realtime=False), OpenCvSource(_settings(str(video))))
    capture.start()
    seen = []

    def read_to_the_end() -> bool:
        frame = capture.get(timeout=0.2)
        if frame is not None:
            seen.append(frame.index)
            time.sleep(0.01)  # a slow consumer: the file waits for it
            return False
        return capture.finished and not capture.alive

    eventually(read_to_the_end, 30, "the file read to its end", detail=lambda: seen)
    capture.stop()
    assert seen == list(range(12))
    assert capture.dropped == 0
    assert capture.state == "down" and capture.finished


def test_realtime_keeps_only_the_newest_frame_and_counts_drops() -> None:
    image = np.zeros((48, 64, 3), np.uint8)
    source = ScriptedSource(lambda: image.copy())
    capture = Capture(_settings("scripted"), source).start()
    eventually(lambda: capture.frames > 30)
    first = capture.get(timeout=1.0)
    eventually(lambda: capture.frames > 60)
    second = capture.get(timeout=1.0)
    capture.stop()
    assert first is not None and second is not None
    assert second.index > first.index + 1  # it skipped to the newest
    assert capture.dropped >= second.index - first.index - 1
    assert capture.state == "live"


def test_missing_file_is_a_down_stream_not_a_crash(tmp_path: Path) -> None:
    settings = _settings(str(tmp_path / "nope.mp4"))
    capture = Capture(settings, OpenCvSource(settings)).start()
    eventually(lambda: capture.reconnects >= 2)
    assert capture.state in {"down", "connecting"} and capture.alive
    assert "no such video file" in (capture.last_error or "")
    capture.stop()
    assert not capture.alive


def test_a_file_that_is_not_a_video_is_a_down_stream(tmp_path: Path) -> None:
    bogus = tmp_path / "notes.mp4"
    bogus.write_bytes(b"this is not a video at all" * 100)
    settings = _settings(str(bogus))
    capture = Capture(settings, OpenCvSource(settings)).start()
    eventually(lambda: capture.reconnects >= 1)
    assert "not a readable video" in (capture.last_error or "")
    assert capture.frames == 0
    capture.stop()


def test_a_camera_returning_garbage_goes_down_and_recovers() -> None:
    # given a camera that returns garbage until told otherwise
    good = threading.Event()
    rng = np.random.default_rng(0)
    garbage = [None, b"junk", np.zeros((3, 3), np.uint8), rng.random((48, 64, 3))]

    def frames() -> object:
        if good.is_set():
            return np.zeros((48, 64, 3), np.uint8)
        return garbage[int(rng.integers(len(garbage)))]

    source = ScriptedSource(frames)
    capture = Capture(_settings("scripted", max_invalid_frames=5), source).start()
    # then the stream is reconnected, never live, and the thread survives
    eventually(lambda: capture.reconnects >= 2)
    assert capture.frames == 0 and capture.invalid >= 10
    assert "garbage" in (capture.last_error or "")
    assert capture.state != "live" and capture.alive
    # when the camera recovers, the stream goes live again
    good.set()
    eventually(lambda: capture.state == "live")
    assert capture.get(timeout=1.0) is not None
    capture.stop()


def test_a_source_that_stops_sending_is_marked_stalled_then_reconnected() -> None:
    blocked = threading.Event()

    class Hanging(ScriptedSource):
        def read(self):
            if blocked.is_set():
                time.sleep(1.5)  # a read that times out, as OpenCV's read timeout does
                raise SourceDisconnected("read timed out")
            return super().read()

    source = Hanging(lambda: np.zeros((48, 64, 3), np.uint8))
    capture = Capture(_settings("scripted"), source).start()
    eventually(lambda: capture.state == "live")
    blocked.set()
    eventually(lambda: (capture.check_stall(), capture.state == "stalled")[1])
    eventually(lambda: capture.reconnects >= 1)
    blocked.clear()
    eventually(lambda: capture.state == "live")
    capture.stop()


def test_gstreamer_pipeline_without_gstreamer_support_says_why() -> None:
    source = OpenCvSource(_settings("videotestsrc ! videoconvert ! appsink"))
    assert source.kind == "gstreamer"
    if has_gstreamer():
        pytest.skip("this OpenCV has GStreamer")
    with pytest.raises(SourceDisconnected) as err:
        source.open()
    assert "no GStreamer support" in err.value.message and "Jetson" in err.value.hint


def test_gstreamer_support_is_read_from_the_build_information() -> None:
    jetson = "  Video I/O:\n    FFMPEG:                      YES\n    GStreamer:    YES (1.20.3)\n"
    assert has_gstreamer(jetson)
    assert not has_gstreamer("    GStreamer:                   NO\n")


@pytest.mark.parametrize(
    ("kind", "version", "timeouts"),
    [
        ("file", "4.5.4", True),
        ("rtsp", "5.0.0", True),
        ("udp", "4.8.0", True),
        ("http", "4.8.0", True),
        ("gstreamer", "4.8.0", True),  # JetPack 6
        ("gstreamer", "4.5.4", False),  # JetPack 5: its GStreamer backend takes no timeouts
        ("v4l2", "4.8.0", False),
        ("v4l2", "5.0.0", False),
    ],
)
def test_timeouts_go_only_to_backends_that_take_them(
    kind: str, version: str, timeouts: bool
) -> None:
    params = open_params(kind, 2.0, 5.0, version)
    expected = [cv2.CAP_PROP_OPEN_TIMEOUT_MSEC, 2000, cv2.CAP_PROP_READ_TIMEOUT_MSEC, 5000]
    assert params == (expected if timeouts else [])


def test_a_backend_without_open_parameters_refuses_the_timeouts(tmp_path: Path) -> None:
    """Why V4L2 gets none: OpenCV's built-in MJPEG reader is, like V4L2, a backend without
    open parameters, and given the timeouts it does not open the same file at all."""
    video = tmp_path / "m.avi"
    writer = cv2.VideoWriter(str(video), cv2.VideoWriter_fourcc(*"MJPG"), 10, (64, 48))
    for _ in range(3):
        writer.write(np.zeros((48, 64, 3), np.uint8))
    writer.release()
    plain = cv2.VideoCapture(str(video), cv2.CAP_OPENCV_MJPEG)
    timed = cv2.VideoCapture(
        str(video), cv2.CAP_OPENCV_MJPEG, open_params("file", 1.0, 1.0, cv2.__version__)
    )
    assert plain.isOpened() and not timed.isOpened()
    plain.release()


def test_a_pipeline_without_appsink_is_explained_without_its_credentials() -> None:
    source = OpenCvSource(
        _settings("rtspsrc location=rtsp://cam/live user-id=admin user-pw=hunter2 ! fakesink")
    )
    with pytest.raises(SourceDisconnected) as err:
        source.open()
    assert "hunter2" not in err.value.message and "appsink" in err.value.hint
