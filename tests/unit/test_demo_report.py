"""The demo's final report: every field present, each consistent with the agents' records."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from edgefleet.demo import cloud_only as demo_cloud_only
from edgefleet.demo.cloud_only import (
    CloudOnlyScore,
    cache_file,
    reader_key,
    sample_indexes,
    score_cloud_only,
)
from edgefleet.demo.report import (
    DeviceScore,
    agent_pace,
    pct,
    percentile,
    read_jsonl,
    report_table,
    score_device,
    story,
    total_score,
)
from edgefleet.demo.stack import Device
from edgefleet.demo.video import VideoSpec, render_video
from edgefleet.shared.models.registry import ModelRegistry

SMALL = VideoSpec(width=320, height=180, fps=5, duration_s=2, seed=3)
T0 = 1_700_000_000.0


def _rows(frames: int, cases: dict[str, tuple[float, float | None]]) -> list[dict]:
    """`frames` frame rows 0.25 s apart; per case, its escalation time and verdict time."""
    rows: list[dict] = [
        {"kind": "frame", "stream_id": "cam", "frame_index": i, "texts": [], "t": T0 + i / 4}
        for i in range(frames)
    ]
    for case_id, (sent, answered) in cases.items():
        rows.append(
            {
                "kind": "escalated",
                "case_id": case_id,
                "stream_id": "cam",
                "frame_index": 0,
                "t": T0 + sent,
            }
        )
        if answered is not None:
            rows.append(
                {
                    "kind": "verdict",
                    "case_id": case_id,
                    "stream_id": "cam",
                    "edge_texts": [],
                    "cloud_texts": ["X"],
                    "fallback_level": 0,
                    "t": T0 + answered,
                }
            )
    return rows


def _device(tmp_path: Path, name: str, rows: list[dict]) -> Device:
    results = tmp_path / f"{name}.jsonl"
    results.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return Device(name, tmp_path, tmp_path / "v.mp4", None, results, 0)


def _case(level: int) -> dict:
    return {"edge_result": [], "verdict": {"fallback_level": level, "result": [{"text": "X"}]}}


def test_verdict_latency_busy_and_unanswered_follow_the_agents_records(tmp_path: Path) -> None:
    # given an agent that escalated three cases: two answered on the device 0.5 s and 2 s
    # later (one of them `busy`), one never answered
    rows = _rows(8, {"a": (0.0, 0.5), "b": (1.0, 3.0), "c": (1.5, None)})
    device = _device(tmp_path, "cam-01", rows)
    # when scored with the cloud's records of the two answered cases
    score = score_device(device, {"a": _case(0), "b": _case(3)}, uplink_bytes=800)
    # then the latencies are the agent's own times, and the counts add up
    assert score.verdict_latencies_ms == pytest.approx([500.0, 2000.0])
    assert score.verdict_p95_ms == pytest.approx(2000.0)
    assert (score.escalated, score.verdicts, score.busy, score.unanswered) == (3, 2, 1, 1)
    assert score.frames == sum(1 for r in read_jsonl(device.results) if r["kind"] == "frame")


def test_fps_and_cpu_per_frame_count_the_frames_of_the_live_window() -> None:
    rows = _rows(8, {})  # frames at T0 + 0, 0.25, ... 1.75
    fps, cpu_ms = agent_pace(rows, T0 + 0.5, T0 + 1.5, cpu_s=0.4)
    assert fps == pytest.approx(4 / 1.0)  # frames 2..5 lie in [0.5, 1.5)
    assert cpu_ms == pytest.approx(100.0)
    assert agent_pace(rows, T0 + 10, T0 + 11, cpu_s=1.0) == (None, None)
    assert agent_pace(rows, T0, T0 + 1, cpu_s=None)[1] is None


def test_share_of_the_possible_gain_captured() -> None:
    score = DeviceScore("cam", frames=10, edge_accuracy=0.90, combined_accuracy=0.93)
    score.cloud_only_accuracy = 0.96
    assert score.gain_captured == pytest.approx(0.5)
    score.cloud_only_accuracy = 0.89  # the cloud reads worse: there is no gain to capture
    assert score.gain_captured is None


def test_percentile_is_the_nearest_rank() -> None:
    values = [float(v) for v in range(1, 21)]
    assert percentile(values, 95) == 19.0
    assert percentile([3.0], 95) == 3.0
    assert percentile([], 95) is None


def test_every_report_field_is_present_and_the_total_agrees_with_the_devices(
    tmp_path: Path,
) -> None:
    # given two devices' scores, as the demo completes them
    one = score_device(
        _device(tmp_path, "cam-01", _rows(4, {"a": (0.0, 1.0)})), {"a": _case(0)}, 4000
    )
    two = score_device(
        _device(tmp_path, "cam-02", _rows(6, {"b": (0.0, 3.0)})), {"b": _case(0)}, 1200
    )
    for score, fps, cpu in ((one, 4.0, 80.0), (two, 3.0, 100.0)):
        score.fps, score.cpu_ms_per_frame = fps, cpu
        score.jpeg_bytes_per_frame = 20_000.0
        score.edge_accuracy, score.combined_accuracy = 0.9, 0.92
        score.cloud_only_accuracy = 0.95
    total = total_score([one, two])
    # then the total pools counts and latencies, sums fps and weighs per-frame figures
    assert (total.frames, total.escalated, total.verdicts) == (10, 2, 2)
    assert total.fps == pytest.approx(7.0)
    assert total.cpu_ms_per_frame == pytest.approx((4 * 80 + 6 * 100) / 10)
    assert total.bytes_per_frame == pytest.approx(520.0)
    assert sorted(total.verdict_latencies_ms) == pytest.approx([1000.0, 3000.0])
    assert total.gain_captured == pytest.approx(0.4)
    # and report.json carries every field, the derived ones included
    row = one.as_json()
    for name in (
        "frames",
        "fps",
        "cpu_ms_per_frame",
        "edge_accuracy",
        "combined_accuracy",
        "cloud_only_accuracy",
        "gain_captured",
        "escalated",
        "escalated_share",
        "verdicts",
        "busy",
        "unanswered",
        "verdict_p95_ms",
        "bytes_uplinked",
        "bytes_per_frame",
        "jpeg_bytes_per_frame",
    ):
        assert row[name] is not None, name
    json.dumps(row)  # and it is JSON
    # and the printed story states the same figures
    text = "\n".join(story(total, 2))
    assert "edge-only accuracy 90.0 %, edge+cloud 92.0 %, 20.0 % of frames escalated" in text
    assert "cloud only (its primary model on sampled frames) 95.0 %" in text
    assert "captured 40.0 % of the possible gain" in text
    assert "2 of 2 escalated cases answered (0 busy, 0 unanswered)" in text
    assert "within 3,000 ms (p95 of the 2 that arrived while the agents ran)" in text
    assert "2 agents at 3.5 fps each on average, 92 ms of CPU per frame" in text
    assert report_table([one, two]).row_count == 3


def test_sampled_frames_spread_over_the_clip() -> None:
    assert sample_indexes(600, 10) == [30, 90, 150, 210, 270, 330, 390, 450, 510, 570]
    assert sample_indexes(3, 10) == [0, 1, 2]


def test_a_cached_cloud_only_score_is_reused_only_for_the_same_reader(tmp_path: Path) -> None:
    # given a rendered scene with a cloud-only score kept beside it for reader "aaa..."
    video = tmp_path / "scene.mp4"
    truth = render_video(video, SMALL)
    kept = CloudOnlyScore(model="ppocr-heavy", key="a" * 64, frames=[1, 5], accuracy=0.97)
    cache_file(video, "ppocr-heavy", "a" * 64).write_text(kept.model_dump_json())
    stop = threading.Event()
    # when asked for the same reader, then it is read back without asking the cloud
    cached = cache_file(video, "ppocr-heavy", "a" * 64)
    assert score_cloud_only(None, "ppocr-heavy", "a" * 64, video, truth, stop, cached) == kept
    # and another reader of that model is not answered from it (stopped before any request)
    stop.set()
    other = cache_file(video, "ppocr-heavy", "b" * 64)
    assert other != cached
    assert score_cloud_only(None, "ppocr-heavy", "b" * 64, video, truth, stop, other) is None


def test_a_reader_is_its_files_its_options_and_the_version(monkeypatch) -> None:
    # given the cloud's primary pipeline, keyed by its detector file
    key = reader_key("ppocr6-cloud", "a" * 64)
    assert key == reader_key("ppocr6-cloud", "a" * 64)
    # then another file, another model or another edgefleet is another reader
    assert key != reader_key("ppocr6-cloud", "b" * 64)
    assert key != reader_key("ppocr6-small", "a" * 64)
    monkeypatch.setattr(demo_cloud_only, "__version__", "0.0.0-other")
    assert key != reader_key("ppocr6-cloud", "a" * 64)
    monkeypatch.undo()
    # and so is the same file read with another option (the O/0 rule off) or another
    # recogniser file under the pipeline
    registry = ModelRegistry.default()
    cloud = registry.get("ppocr6-cloud")
    assert cloud.ocr is not None
    plain = cloud.model_copy(update={"ocr": cloud.ocr.model_copy(update={"word_kinds": None})})
    rec = registry.get(cloud.ocr.rec)
    other_rec = rec.model_copy(update={"sha256": "0" * 64})
    for changed in (plain, other_rec):
        edited = registry.merge(ModelRegistry([changed]))
        monkeypatch.setattr(ModelRegistry, "default", classmethod(lambda cls, r=edited: r))
        assert reader_key("ppocr6-cloud", "a" * 64) != key
    # a model the built-in manifest does not know is keyed by its file and the version
    assert reader_key("their-own-ocr", "a" * 64) != reader_key("their-own-ocr", "b" * 64)


def test_with_tracks_edge_plus_cloud_is_what_the_device_reported(tmp_path: Path) -> None:
    # given a scene with its truth, and an agent that recorded its tracks every frame
    truth = render_video(tmp_path / "scene.mp4", SMALL)
    device = Device("cam-t", tmp_path, tmp_path / "scene.mp4", truth, tmp_path / "r.jsonl", 0)
    rows: list[dict] = []
    for i in range(6):
        lines = truth.texts(i)
        wrong = [line[:-1] + "?" for line in lines]  # every line misread by one character
        rows.append({"kind": "frame", "stream_id": "cam", "frame_index": i, "texts": wrong})
        # the tracks' own votes stay wrong; from frame 3 on the cloud's answers are right
        reported = lines if i >= 3 else wrong
        rows.append(
            {
                "kind": "tracks",
                "stream_id": "cam",
                "frame_index": i,
                "texts": reported,
                "edge_texts": wrong,
            }
        )
    device.results.write_text("".join(json.dumps(r) + "\n" for r in rows))
    score = score_device(device, {}, uplink_bytes=1)
    # then the edge columns score the edge's reads, edge+cloud what the device reported
    assert score.edge_accuracy == pytest.approx(score.tracked_accuracy)
    assert score.edge_accuracy is not None and score.edge_accuracy < 1.0
    expected = (3 * score.edge_accuracy + 3 * 1.0) / 6
    assert score.combined_accuracy == pytest.approx(expected)
    # and the story says how far the cloud's answers moved the tracked reading
    told = " ".join(story(total_score([score]), devices=1))
    assert "the cloud's answers moved that by +" in told
    # a move that rounds to nothing reads +0.0, never -0.0
    flat = total_score([score])
    flat.combined_accuracy = flat.tracked_accuracy - 0.0004
    assert "moved that by +0.0 points" in " ".join(story(flat, devices=1))
    # and the final table gives each device its own tracks alone and the cloud's move
    table = report_table([score])
    columns = {c.header: list(c.cells) for c in table.columns}
    move = 100 * (expected - score.edge_accuracy)
    assert columns["tracks alone"][0] == pct(score.tracked_accuracy)
    assert columns["cloud's answers moved"][0] == f"{round(move, 1):+.1f}"
