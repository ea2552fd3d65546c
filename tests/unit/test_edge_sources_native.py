"""Frames in their decoder's format: the FFmpeg (PyAV) source, the Jetson GStreamer source,
the decoder setting, and the path from capture to the kernel without a colour conversion."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from pathlib import Path

import cv2
import numpy as np
import pytest
from pydantic import ValidationError

from edgefleet.edge.pipeline import Pipeline, Work
from edgefleet.edge.planes import bgr_crop
from edgefleet.edge.policy import Escalation, EscalationPolicy
from edgefleet.edge.settings import EdgeSettings, PipelineSettings, PolicySettings, SourceSettings
from edgefleet.edge.slot import ModelSlot
from edgefleet.edge.sources import (
    FfmpegSource,
    GstreamerSource,
    OpenCvSource,
    choose_decoder,
    jetson_pipeline,
    make_source,
)
from edgefleet.edge.sources.capture import Capture, valid_frame
from edgefleet.edge.sources.ffmpeg import CONVERTED, i420_from_planes
from edgefleet.edge.sources.gstreamer import has_nvdec_plugin, plugin_dirs
from edgefleet.edge.sources.opencv import has_gstreamer
from edgefleet.edge.telemetry import WindowStats
from edgefleet.shared import kernels
from edgefleet.shared.errors import ConfigError
from edgefleet.shared.kernels import reference
from edgefleet.shared.messages import Detection
from edgefleet.shared.models import load_model
from tests.support.waiting import eventually

needs_ffmpeg = pytest.mark.skipif(shutil.which("ffmpeg") is None, reason="needs ffmpeg")


def _settings(url: str, **kw) -> SourceSettings:
    return SourceSettings(
        id="n1", url=url, reconnect_min_s=0.05, reconnect_max_s=0.2, stall_timeout_s=1.0, **kw
    )


def _scene(i: int, w: int = 96, h: int = 64) -> np.ndarray:
    img = np.full((h, w, 3), 200, np.uint8)
    img[:, : (i % 6 + 1) * 12] = (30, 160, 60)
    cv2.putText(img, f"{i}", (40, 40), cv2.FONT_HERSHEY_SIMPLEX, 1.0, (10, 10, 120), 2)
    return img


def _opencv_video(path: Path, frames: int = 8, w: int = 96, h: int = 64) -> Path:
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), 25, (w, h))
    for i in range(frames):
        writer.write(_scene(i, w, h))
    writer.release()
    return path


def _ffmpeg_video(path: Path, pix_fmt: str, codec: str = "rawvideo", size: str = "96x64") -> Path:
    subprocess.run(
        [
            *("ffmpeg", "-v", "error", "-y", "-f", "lavfi", "-i", f"testsrc=size={size}:rate=10"),
            *("-frames:v", "5", "-c:v", codec, "-pix_fmt", pix_fmt, str(path)),
        ],
        check=True,
        timeout=60,
    )
    return path


def _read_all(source) -> list[tuple[np.ndarray, str]]:
    source.open()
    out = []
    while (image := source.read()) is not None:
        out.append((image, source.pixel_format))
    source.close()
    return out


def test_an_h264_or_mpeg4_file_comes_out_as_i420_planes_matching_opencvs_decode(
    tmp_path: Path,
) -> None:
    # given a file OpenCV wrote (MPEG-4 part 2, yuv420p; 96 wide: the decoder pads its rows)
    video = _opencv_video(tmp_path / "v.mp4")
    # when the FFmpeg source and OpenCV read it
    ours = _read_all(FfmpegSource(_settings(str(video))))
    theirs = _read_all(OpenCvSource(_settings(str(video))))
    # then every frame is I420 (H*3/2, W), contiguous, and converts to OpenCV's BGR
    assert len(ours) == len(theirs) == 8
    for (yuv, fmt), (bgr, _) in zip(ours, theirs, strict=True):
        assert fmt == "i420" and yuv.shape == (96, 96) and yuv.flags.c_contiguous
        assert valid_frame(yuv, fmt) is yuv
        diff = np.abs(cv2.cvtColor(yuv, cv2.COLOR_YUV2BGR_I420).astype(int) - bgr.astype(int))
        assert diff.mean() < 2.0, diff.mean()


def test_the_kernel_tensor_of_an_i420_frame_matches_the_reference_of_it_converted(
    tmp_path: Path,
) -> None:
    video = _opencv_video(tmp_path / "v.mp4", frames=2)
    (yuv, fmt), _ = _read_all(FfmpegSource(_settings(str(video))))
    tensor, _t = kernels.frame_to_tensor(yuv, fmt, (48, 80), std=(255.0, 255.0, 255.0))
    want, _r = reference.frame_to_tensor(yuv, fmt, (48, 80), std=(255.0, 255.0, 255.0))
    assert tensor.shape == want.shape == (1, 3, 48, 80)
    assert np.abs(tensor - want).max() <= 2.5 / 255


def test_planes_with_line_padding_are_copied_once_into_one_frame() -> None:
    # given I420 planes of a 6x4 picture with rows padded to 16 and 8 bytes, and an odd edge
    y = np.arange(16 * 5, dtype=np.uint8).reshape(5, 16)
    u = np.full((3, 8), 7, np.uint8)
    v = np.full((3, 8), 9, np.uint8)
    u[:, :3] = [[1, 2, 3], [4, 5, 6], [0, 0, 0]]
    planes = [(y.tobytes(), 16), (u.tobytes(), 8), (v.tobytes(), 8)]
    # when made into a frame of the 7x5 picture (odd: the last row and column go)
    out = i420_from_planes(planes, 7, 5, "i420")
    # then it is (4*3/2, 6): Y rows without padding, then U, then V, each 3x2
    assert out.shape == (6, 6)
    np.testing.assert_array_equal(out[:4], y[:4, :6])
    flat = out.reshape(-1)
    np.testing.assert_array_equal(flat[24:30].reshape(2, 3), [[1, 2, 3], [4, 5, 6]])
    assert (flat[30:] == 9).all()
    # and NV12's interleaved chroma rows are cut the same way
    uv = np.arange(8 * 3, dtype=np.uint8).reshape(3, 8)
    nv12 = i420_from_planes([(y.tobytes(), 16), (uv.tobytes(), 8)], 6, 4, "nv12")
    np.testing.assert_array_equal(nv12[4:], uv[:2, :6])


@needs_ffmpeg
def test_nv12_video_comes_out_as_nv12(tmp_path: Path) -> None:
    video = _ffmpeg_video(tmp_path / "nv12.nut", "nv12")
    frames = _read_all(FfmpegSource(_settings(str(video))))
    assert [fmt for _, fmt in frames] == ["nv12"] * 5
    assert frames[0][0].shape == (96, 96)
    bgr = cv2.cvtColor(frames[0][0], cv2.COLOR_YUV2BGR_NV12)
    assert bgr.std() > 20  # testsrc's colour bars, not a blank buffer


def _decoded(video: Path) -> list[np.ndarray]:
    """The file's frames as the decoder gives them (PyAV's array of each, no conversion)."""
    import av

    with av.open(str(video)) as container:
        return [frame.to_ndarray() for frame in container.decode(video=0)]


def _read_counted(
    video: Path, pix_fmt: str, note: str, caplog
) -> tuple[list[tuple[np.ndarray, str]], float, int]:
    """The file's frames through the FFmpeg source, the swscale passes counted for
    `pix_fmt` meanwhile, and how often the source logged `note` about it."""
    before = CONVERTED.labels("n1", pix_fmt)._value.get()
    with caplog.at_level(logging.WARNING):
        frames = _read_all(FfmpegSource(_settings(str(video))))
    logged = sum(f"{pix_fmt} {note}" in r.getMessage() for r in caplog.records)
    return frames, CONVERTED.labels("n1", pix_fmt)._value.get() - before, logged


@needs_ffmpeg
def test_a_webcams_yuyv_is_repacked_to_i420_and_counted(tmp_path: Path, caplog) -> None:
    # given a YUYV 4:2:2 video (what most USB webcams send)
    video = _ffmpeg_video(tmp_path / "yuyv.nut", "yuyv422")
    # when it is read
    frames, counted, notes = _read_counted(video, "yuyv422", "is repacked to I420", caplog)
    # then frames are I420 (the kernels' own), each repack counted, the reason logged once
    assert [fmt for _, fmt in frames] == ["i420"] * 5 and frames[0][0].shape == (96, 96)
    assert (counted, notes) == (5, 1)
    # and the picture is the webcam's: luma as sent, each chroma sample the mean of the
    # two rows 4:2:2 has where 4:2:0 has one (no colour conversion)
    for (image, _), yuyv in zip(frames, _decoded(video), strict=True):
        assert yuyv.shape == (64, 96, 2)
        assert np.array_equal(image[:64], yuyv[:, :, 0])
        for plane, chroma in enumerate((yuyv[:, 0::2, 1], yuyv[:, 1::2, 1])):  # U, then V
            rows = chroma.astype(int)
            mean = (rows[0::2] + rows[1::2] + 1) // 2
            ours = image[64:].reshape(-1)[plane * 32 * 48 : (plane + 1) * 32 * 48]
            assert np.array_equal(ours.reshape(32, 48), mean)


@needs_ffmpeg
def test_ten_bit_video_is_repacked_to_the_same_i420_as_eight_bit(tmp_path: Path) -> None:
    deep = _read_all(
        FfmpegSource(_settings(str(_ffmpeg_video(tmp_path / "10.nut", "yuv420p10le"))))
    )
    flat = _read_all(FfmpegSource(_settings(str(_ffmpeg_video(tmp_path / "8.nut", "yuv420p")))))
    assert [fmt for _, fmt in deep] == ["i420"] * 5
    for (a, _), (b, _) in zip(deep, flat, strict=True):
        assert np.abs(a.astype(int) - b.astype(int)).max() <= 1


@needs_ffmpeg
def test_an_rgb_video_is_converted_to_bgr_and_counted(tmp_path: Path, caplog) -> None:
    video = _ffmpeg_video(tmp_path / "rgb.nut", "rgb24")
    frames, counted, notes = _read_counted(video, "rgb24", "is converted to BGR", caplog)
    assert [fmt for _, fmt in frames] == ["bgr"] * 5 and frames[0][0].shape == (64, 96, 3)
    assert (counted, notes) == (5, 1)
    for (image, _), rgb in zip(frames, _decoded(video), strict=True):
        assert np.array_equal(image, rgb[:, :, ::-1])


@needs_ffmpeg
def test_full_range_jpeg_video_is_i420_with_a_note(tmp_path: Path, caplog) -> None:
    video = _ffmpeg_video(tmp_path / "mjpeg.avi", "yuvj420p", codec="mjpeg")
    with caplog.at_level(logging.WARNING):
        frames = _read_all(FfmpegSource(_settings(str(video))))
    assert [fmt for _, fmt in frames] == ["i420"] * 5
    assert any("full-range" in r.getMessage() for r in caplog.records)


def test_the_capture_thread_hands_out_i420_frames_in_order_then_finishes(tmp_path: Path) -> None:
    video = _opencv_video(tmp_path / "v.mp4", frames=10)
    settings = _settings(str(video), realtime=False)
    capture = Capture(settings, FfmpegSource(settings)).start()
    seen = []
    try:
        while not (capture.finished and not capture.alive and not capture.pending):
            frame = capture.get(timeout=0.2)
            if frame is not None:
                seen.append((frame.index, frame.fmt, frame.image.shape))
    finally:
        capture.stop()
    assert seen == [(i, "i420", (96, 96)) for i in range(10)]
    assert capture.dropped == 0 and capture.invalid == 0 and capture.state == "down"


def test_a_looping_file_starts_again(tmp_path: Path) -> None:
    video = _opencv_video(tmp_path / "v.mp4", frames=4)
    settings = _settings(str(video), loop=True)
    capture = Capture(settings, FfmpegSource(settings)).start()
    try:
        eventually(lambda: capture.frames > 10)
        assert capture.state == "live" and not capture.finished
    finally:
        capture.stop()


def test_a_missing_or_broken_file_is_a_down_stream_with_the_reason(tmp_path: Path) -> None:
    bogus = tmp_path / "notes.mp4"
    bogus.write_bytes(b"this is not a video at all" * 100)
    for url, why in ((str(tmp_path / "nope.mp4"), "no such video file"), (str(bogus), "not a")):
        settings = _settings(url)
        capture = Capture(settings, FfmpegSource(settings)).start()
        try:
            eventually(lambda c=capture: c.reconnects >= 1)
            assert why in (capture.last_error or "") and capture.frames == 0 and capture.alive
        finally:
            capture.stop()


def test_a_dead_rtsp_peer_is_a_down_stream_not_a_hang() -> None:
    # nothing listens on this port: open must fail fast and the thread keep trying
    settings = _settings("rtsp://127.0.0.1:9/live", open_timeout_s=1.0)
    source = FfmpegSource(settings)
    capture = Capture(settings, source).start()
    try:
        eventually(lambda: capture.reconnects >= 1)
        assert "cannot be opened" in (capture.last_error or "") and capture.alive
    finally:
        capture.stop()


def test_yuv_frames_are_checked_for_shape() -> None:
    frame = np.zeros((72, 64), np.uint8)
    assert valid_frame(frame, "i420") is frame and valid_frame(frame, "nv12") is frame
    assert valid_frame(np.zeros((71, 64), np.uint8), "i420") is None  # not H*3/2
    assert valid_frame(np.zeros((72, 63), np.uint8), "nv12") is None  # odd width
    assert valid_frame(np.zeros((72, 64, 3), np.uint8), "i420") is None
    assert valid_frame(np.zeros((6, 4), np.uint8), "i420") is None  # too small
    assert valid_frame(np.zeros((72, 128), np.uint8)[:, ::2], "i420") is None  # not rows
    assert valid_frame(frame, "yuyv") is None


def _here(pyav: bool, nvdec: bool = False) -> dict[str, bool]:
    """What the host has, by decoder: PyAV (ffmpeg) and NVDEC (gstreamer)."""
    return {"ffmpeg": pyav, "gstreamer": nvdec}


def _decoder(settings: SourceSettings, pyav: bool, nvdec: bool = False) -> str:
    return choose_decoder(settings, _here(pyav, nvdec))[0]


def test_the_decoder_setting_picks_the_source() -> None:
    file = _settings("/data/clip.mp4")
    assert _decoder(file, pyav=True) == "ffmpeg"
    assert _decoder(file, pyav=False) == "opencv"
    assert _decoder(_settings("/data/clip.mp4", decoder="opencv"), pyav=True) == "opencv"
    own = _settings("videotestsrc ! appsink", decoder="gstreamer")
    assert _decoder(own, pyav=True) == "opencv"  # the user's own pipeline: OpenCV runs it
    assert isinstance(make_source(file), FfmpegSource)  # PyAV is installed here
    assert isinstance(make_source(_settings("/x.mp4", decoder="opencv")), OpenCvSource)
    jetson = make_source(_settings("rtsp://cam/live", decoder="gstreamer"))
    assert isinstance(jetson, GstreamerSource) and jetson.pixel_format == "nv12"


def test_auto_takes_nvdec_where_it_loads_and_says_why(caplog) -> None:
    for url in ("rtsp://cam/live", "/data/clip.mp4", "udp://0.0.0.0:5000", "http://cam/mjpg"):
        decoder, why = choose_decoder(_settings(url), _here(True, True))
        assert (decoder, why) == (
            "gstreamer",
            "NVDEC: OpenCV has GStreamer and nvv4l2decoder loads",
        )
    # a camera gives raw frames: nothing for NVDEC to decode
    assert choose_decoder(_settings("/dev/video0"), _here(True, True)) == (
        "ffmpeg",
        "a v4l2 source; PyAV is installed",
    )
    # a decoder the user set wins over NVDEC, and the user's own pipeline stays theirs
    assert (
        _decoder(_settings("rtsp://cam/live", decoder="ffmpeg"), pyav=True, nvdec=True) == "ffmpeg"
    )
    assert _decoder(_settings("videotestsrc ! appsink"), pyav=True, nvdec=True) == "opencv"
    assert choose_decoder(_settings("rtsp://cam/live"), _here(False, False))[1] == (
        "no NVDEC here and PyAV is not installed"
    )
    with caplog.at_level(logging.INFO, logger="edgefleet.edge.sources"):
        make_source(_settings("/data/clip.mp4"))  # this machine: no nvv4l2decoder
    assert "stream n1: decoder ffmpeg (no NVDEC here; PyAV is installed)" in caplog.messages


def test_the_nvdec_plugin_is_found_where_gstreamer_looks(tmp_path, monkeypatch) -> None:
    empty, jetpack = tmp_path / "empty", tmp_path / "jetpack"
    empty.mkdir()
    jetpack.mkdir()
    env = {"GST_PLUGIN_PATH": f"{empty}{os.pathsep}", "GST_PLUGIN_SYSTEM_PATH": str(jetpack)}
    assert plugin_dirs(env) == [empty, jetpack]  # the system path replaces the built-in one
    assert Path("/usr/lib/aarch64-linux-gnu/gstreamer-1.0") in plugin_dirs({})
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))  # no gst-inspect-1.0
    assert not has_nvdec_plugin([empty, jetpack])
    (jetpack / "libgstnvvideo4linux2.so").write_bytes(b"\x7fELF")
    assert has_nvdec_plugin([empty, jetpack])
    # elsewhere, gst-inspect-1.0 answers for the registry
    (tmp_path / "bin").mkdir()
    inspect = tmp_path / "bin" / "gst-inspect-1.0"
    inspect.write_text('#!/bin/sh\n[ "$1" = --exists ] && [ "$2" = nvv4l2decoder ]\n')
    inspect.chmod(0o755)
    assert has_nvdec_plugin([empty])
    inspect.write_text("#!/bin/sh\nexit 1\n")
    assert not has_nvdec_plugin([empty])


@pytest.mark.parametrize(
    ("url", "kind", "want"),
    [
        (
            "rtsp://u:p@cam/live",
            "rtsp",
            'rtspsrc location="rtsp://u:p@cam/live" latency=200 protocols=tcp ! parsebin ! '
            "nvv4l2decoder ! nvvidconv ! video/x-raw,format=NV12 ! "
            "appsink drop=true max-buffers=1 sync=false",
        ),
        (
            '/data/a "b".mp4',
            "file",
            'filesrc location="/data/a \\"b\\".mp4" ! parsebin ! nvv4l2decoder ! nvvidconv ! '
            "video/x-raw,format=NV12 ! appsink drop=true max-buffers=1 sync=false",
        ),
        (
            "1",
            "v4l2",
            'v4l2src device="/dev/video1" ! nvvidconv ! video/x-raw,format=NV12 ! '
            "appsink drop=true max-buffers=1 sync=false",
        ),
        ("udp://0.0.0.0:5000", "udp", 'urisourcebin uri="udp://0.0.0.0:5000" ! parsebin'),
    ],
)
def test_the_jetson_pipeline_decodes_on_nvdec_into_nv12(url: str, kind: str, want: str) -> None:
    assert jetson_pipeline(url, kind).startswith(want)
    assert jetson_pipeline(url, kind).endswith("video/x-raw,format=NV12 ! " + _SINK_TAIL)


_SINK_TAIL = "appsink drop=true max-buffers=1 sync=false"


def test_the_gstreamer_decoder_without_gstreamer_says_why() -> None:
    if has_gstreamer():
        pytest.skip("this OpenCV has GStreamer")
    source = GstreamerSource(_settings("rtsp://admin:hunter2@cam/live", decoder="gstreamer"))
    with pytest.raises(Exception) as err:
        source.open()
    assert "no GStreamer support" in str(err.value) and "hunter2" not in source.describe()


@pytest.mark.jetson
@pytest.mark.gstreamer
def test_a_file_decoded_on_the_jetson_comes_out_as_nv12(tmp_path: Path) -> None:
    video = _opencv_video(tmp_path / "a.mp4", frames=5, w=320, h=240)  # MPEG-4: NVDEC reads it
    frames = _read_all(GstreamerSource(_settings(str(video), decoder="gstreamer")))
    assert frames and all(f.shape == (360, 320) and fmt == "nv12" for f, fmt in frames)


def test_yuv_crops_convert_only_their_pixels() -> None:
    bgr = np.zeros((64, 96, 3), np.uint8)
    bgr[10:30, 20:50] = (20, 120, 220)
    yuv = cv2.cvtColor(bgr, cv2.COLOR_BGR2YUV_I420)
    crop = bgr_crop(yuv, "i420", (21, 11, 49, 29))  # odd corners: the window is 2-aligned
    assert crop.shape == (18, 28, 3)
    assert np.abs(crop.astype(int) - (20, 120, 220)).max() <= 4
    whole = bgr_crop(yuv, "i420")
    assert whole.shape == (64, 96, 3)


def test_no_stage_converts_a_whole_frame_from_the_ffmpeg_source_to_the_model(
    tmp_path: Path, monkeypatch
) -> None:
    # given a text video read by the FFmpeg source, the real OCR model, escalation in
    # tracks mode, and spies on every colour conversion there is on the way
    frames = 6
    video = tmp_path / "text.mp4"
    writer = cv2.VideoWriter(str(video), cv2.VideoWriter_fourcc(*"mp4v"), 10, (320, 160))
    for i in range(frames):
        img = np.full((160, 320, 3), 230, np.uint8)
        cv2.putText(img, f"LOT {40 + i}", (20, 90), cv2.FONT_HERSHEY_DUPLEX, 1.6, (20, 20, 20), 3)
        writer.write(img)
    writer.release()
    settings = SourceSettings(id="text", url=str(video), realtime=False)
    capture = Capture(settings, make_source(settings))
    conversions: list[tuple[str, tuple[int, ...]]] = []

    def spy(name, real):
        def wrapped(src, *a, **k):
            shape = src.shape if isinstance(src, np.ndarray) else (src.height, src.width)
            conversions.append((name, shape))
            return real(src, *a, **k)

        return wrapped

    monkeypatch.setattr(cv2, "cvtColor", spy("cvtColor", cv2.cvtColor))
    monkeypatch.setattr(kernels, "to_rgb", spy("to_rgb", kernels.to_rgb))
    import av.video.frame

    for method in ("to_ndarray", "reformat"):
        real = getattr(av.video.frame.VideoFrame, method)
        monkeypatch.setattr(av.video.frame.VideoFrame, method, spy(method, real), raising=False)
    sunk: list[list[Detection]] = []
    frame_cases: list[Escalation] = []

    def sink(work: Work, escalations: list[Escalation]) -> None:
        sunk.append(work.detections)
        frame_cases.extend(e for e in escalations if e.track_id is None)

    model = load_model("ppocr6-tiny")
    pipeline = Pipeline(
        [capture],
        ModelSlot(model),
        EscalationPolicy(PolicySettings(sample_share=1.0, attach="frame", seed=1)),
        sink,
        WindowStats(),
        PipelineSettings(),
    ).start()
    capture.start()
    try:
        # when every frame has gone through capture, the model and the policy
        eventually(lambda: capture.finished and pipeline.idle, timeout_s=120)
    finally:
        capture.stop()
        pipeline.stop()
        model.close()
    # then the model read the text off the I420 frames, and the only whole-frame
    # conversions are the JPEGs of the frames escalated (every frame is sampled; the
    # de-duplication and the rate limit let only some through): none per frame
    assert len(sunk) == frames
    assert sum(any("LOT" in d.text for d in lines) for lines in sunk) >= frames // 2
    whole = [c for c in conversions if c[1] in ((240, 320), (160, 320, 3))]
    assert frame_cases and len(frame_cases) < frames
    assert whole == [("cvtColor", (240, 320))] * len(frame_cases)
    assert not [c for c in conversions if c[0] in ("to_ndarray", "reformat")]  # no swscale


@pytest.fixture
def still_decoder(monkeypatch):
    """The test-only decoder's module on the sources' list, and the cache rebuilt."""
    from edgefleet.edge import sources

    monkeypatch.setattr(sources, "MODULES", [*sources.MODULES, "tests.support.still_decoder"])
    sources.decoders.cache_clear()
    yield
    sources.decoders.cache_clear()


def test_a_decoder_added_by_one_file_and_one_line_is_named_built_and_read(
    still_decoder, tmp_path
) -> None:
    from tests.support.still_decoder import StillSource

    still = tmp_path / "still.png"
    cv2.imwrite(str(still), np.full((36, 64, 3), 200, np.uint8))
    settings = _settings(str(still), decoder="still")
    assert choose_decoder(settings) == ("still", "decoder still is set")
    source = make_source(settings)
    assert isinstance(source, StillSource)
    source.open()
    frames = [source.read() for _ in range(4)]
    source.close()
    assert [f is not None and f.shape for f in frames] == [(36, 64, 3)] * 3 + [False]
    # under auto it stays behind the shipped decoders, which take every file
    assert _decoder(_settings(str(still)), pyav=False) == "opencv"


def test_a_decoder_no_module_declares_is_refused_with_the_known_ones() -> None:
    stream = {"id": "n1", "url": "/x.png", "decoder": "still"}
    with pytest.raises(
        ValidationError, match=r"stream n1: unknown decoder 'still'; one of auto, gstreamer, "
    ):
        EdgeSettings(device_id="d1", device_key="k" * 43, streams=[stream])
    with pytest.raises(ConfigError, match=r"stream n1: unknown decoder 'still'"):
        make_source(_settings("/x.png", decoder="still"))
