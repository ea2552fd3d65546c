"""The demo video: deterministic, decodable, and its truth says where the text is."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import pytest

from edgefleet.demo.report import (
    DeviceScore,
    is_correction,
    jpeg_bytes_per_frame,
    score_device,
    total_score,
)
from edgefleet.demo.scenes.text import container_check_digit
from edgefleet.demo.scoring import best_match_accuracy, char_accuracy, edit_distance
from edgefleet.demo.stack import Device
from edgefleet.demo.video import (
    GroundTruth,
    VideoSpec,
    render_video,
    truth_path,
)
from edgefleet.shared.errors import ConfigError

SMALL = VideoSpec(width=320, height=180, fps=5, duration_s=2, seed=3)


def _frames(path: Path) -> list[np.ndarray]:
    cap = cv2.VideoCapture(str(path))
    frames = []
    while True:
        ok, frame = cap.read()
        if not ok:
            break
        frames.append(frame)
    cap.release()
    return frames


@pytest.mark.parametrize("suffix", [".mp4", ".avi"])
def test_render_writes_a_decodable_video_and_its_truth(tmp_path: Path, suffix: str) -> None:
    # given a small spec, when rendered
    video = tmp_path / f"clip{suffix}"
    truth = render_video(video, SMALL)
    # then the video decodes to the stated number and size of frames
    frames = _frames(video)
    assert len(frames) == SMALL.frame_count == 10
    assert frames[0].shape == (180, 320, 3)
    # and the truth file round-trips to the same object
    assert GroundTruth.load(truth_path(video)) == truth
    assert len(truth.frames) == 10
    assert truth.frames[0].items  # the lines that do not cross the frame are in view


def test_a_crossing_line_enters_cut_leaves_and_comes_back_with_another_text(
    tmp_path: Path,
) -> None:
    spec = SMALL.model_copy(
        update={"lines": 1, "crossing_share": 1.0, "duration_s": 40, "hard_share": 0.0}
    )
    truth = render_video(tmp_path / "cross.avi", spec)
    in_view = [frame.items for frame in truth.frames]
    # it starts outside the frame, and is in the truth only once mostly in view
    assert not in_view[0] and any(in_view)
    first = next(i for i, items in enumerate(in_view) if items)
    box = in_view[first][0].box
    assert box[0] == 0 or box[2] == spec.width  # still cut by a border
    # and after a pass, another text comes in
    texts = [items[0].text for items in in_view if items]
    assert len(set(texts)) >= 2


def test_far_lines_are_drawn_smaller(tmp_path: Path) -> None:
    near = render_video(tmp_path / "near.avi", SMALL.model_copy(
        update={"lines": 1, "far_share": 0.0, "crossing_share": 0.0}))
    far = render_video(tmp_path / "far.avi", SMALL.model_copy(
        update={"lines": 1, "far_share": 1.0, "crossing_share": 0.0}))

    def height(truth: GroundTruth) -> int:
        box = truth.frames[0].items[0].box
        return box[3] - box[1]

    assert height(far) < 0.7 * height(near)


def test_same_seed_same_video_other_seed_other_video(tmp_path: Path) -> None:
    a = render_video(tmp_path / "a.avi", SMALL)
    b = render_video(tmp_path / "b.avi", SMALL)
    c = render_video(tmp_path / "c.avi", SMALL.model_copy(update={"seed": 4}))
    assert a.lines == b.lines and a.frames == b.frames
    assert [f.tobytes() for f in _frames(tmp_path / "a.avi")] == [
        f.tobytes() for f in _frames(tmp_path / "b.avi")
    ]
    assert [ln.text for ln in c.lines] != [ln.text for ln in a.lines]


def test_boxes_lie_in_the_frame_and_hold_the_text(tmp_path: Path) -> None:
    # given a clip on a flat background (so any ink inside a box is the text's), no line
    # faded by distance
    spec = SMALL.model_copy(
        update={"background": "gradient", "hard_share": 0.0, "far_share": 0.0}
    )
    truth = render_video(tmp_path / "v.avi", spec)
    frames = _frames(tmp_path / "v.avi")
    for frame_truth, frame in zip(truth.frames, frames, strict=True):
        for item in frame_truth.items:
            x0, y0, x1, y1 = item.box
            assert 0 <= x0 < x1 <= spec.width and 0 <= y0 < y1 <= spec.height
            crop = cv2.cvtColor(frame[y0:y1, x0:x1], cv2.COLOR_BGR2GRAY)
            # then the plate has both ink and paper: strong contrast inside the box
            assert int(crop.max()) - int(crop.min()) > 120


def test_lines_move(tmp_path: Path) -> None:
    truth = render_video(tmp_path / "v.avi", SMALL)
    first = {i.line: i.box for i in truth.frames[0].items}
    last = {i.line: i.box for i in truth.frames[-1].items}
    assert any(first[k] != last[k] for k in first)


def test_hard_share_sets_the_number_of_hard_lines(tmp_path: Path) -> None:
    spec = SMALL.model_copy(update={"lines": 4, "hard_share": 0.5})
    truth = render_video(tmp_path / "v.avi", spec)
    assert sum(line.hard for line in truth.lines) == 2
    assert {line.kind for line in truth.lines} == {"container", "plate", "sign"}


def test_container_numbers_carry_a_valid_iso6346_check_digit(tmp_path: Path) -> None:
    # the textbook example CSQU 305438 has check digit 3
    assert container_check_digit("CSQU305438") == 3
    truth = render_video(tmp_path / "v.avi", SMALL.model_copy(update={"lines": 3, "seed": 0}))
    for line in truth.lines:
        if line.kind == "container":
            assert container_check_digit(line.text[:10]) == int(line.text[10])


def test_unknown_container_format_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"\.mkv"):
        render_video(tmp_path / "v.mkv", SMALL)


def test_bad_spec_is_rejected() -> None:
    with pytest.raises(ValueError, match="fps"):
        VideoSpec(fps=0)
    with pytest.raises(ValueError, match="colour"):
        VideoSpec.model_validate({"colour": "red"})


def test_accuracy_scoring() -> None:
    assert edit_distance("kitten", "sitting") == 3
    assert char_accuracy("pd008hn", "PD 008 HN") == 1.0
    assert char_accuracy("D0CK12", "DOCK 12") == pytest.approx(5 / 6)
    assert char_accuracy("", "EXIT") == 0.0
    # each true line is scored against the prediction that reads it best
    assert best_match_accuracy(["EXIT", "MSCU1234565"], ["MSCU1234565", "EXIT"]) == 1.0
    assert best_match_accuracy([], ["EXIT", "STOP"]) == 0.0
    assert best_match_accuracy(["EXIT", "STEP"], ["EXIT", "STOP"]) == pytest.approx(0.875)
    assert best_match_accuracy(["anything"], []) == 1.0


# ----------------------------------------------------------------- the demo's scoring


def _device(tmp_path: Path, truth: GroundTruth | None, rows: list[dict]) -> Device:
    results = tmp_path / "results.jsonl"
    results.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"kind": "fra')
    return Device("cam-01", tmp_path, tmp_path / "v.avi", truth, results, 0)


def test_scoring_edge_alone_and_with_the_clouds_corrections(tmp_path: Path) -> None:
    # given a clip whose frame 0 and 1 read ["AB", "CD"] (a hand-made truth)
    truth = render_video(tmp_path / "v.avi", SMALL.model_copy(update={"crossing_share": 0.0}))
    truth = truth.model_copy(
        update={
            "frames": [
                f.model_copy(
                    update={
                        "items": [
                            i.model_copy(update={"text": t})
                            for i, t in zip(f.items, ["AB", "CD", "EF"], strict=True)
                        ]
                    }
                )
                for f in truth.frames
            ]
        }
    )
    # the edge read frame 0 right and frame 1 half wrong; both were escalated: the cloud
    # read frame 1 right, answered frame 0 only `busy`, and a third case is unanswered
    rows = [
        {"kind": "frame", "stream_id": "cam", "frame_index": 0, "texts": ["AB", "CD", "EF"]},
        {"kind": "escalated", "case_id": "case-0", "stream_id": "cam", "frame_index": 0},
        {"kind": "frame", "stream_id": "cam", "frame_index": 1, "texts": ["AB", "XX", "EF"]},
        {"kind": "escalated", "case_id": "case-1", "stream_id": "cam", "frame_index": 1},
        {"kind": "escalated", "case_id": "case-2", "stream_id": "cam", "frame_index": 1},
    ]

    def record(edge: list[str], cloud: list[str], level: int) -> dict:
        return {
            "edge_result": [{"text": t} for t in edge],
            "verdict": {"fallback_level": level, "result": [{"text": t} for t in cloud]},
        }

    cases = {
        "case-0": record(["AB", "CD", "EF"], [], 3),
        "case-1": record(["AB", "XX", "EF"], ["A B", "CD", "EF"], 0),
    }
    score = score_device(_device(tmp_path, truth, rows), cases, uplink_bytes=3000)
    # then the half-written last line is ignored, and the numbers follow
    assert score.frames == 2 and score.escalated == 3 and score.verdicts == 2
    assert score.corrections == 1  # case-1: XX -> CD; spacing alone is no correction
    assert score.edge_accuracy == pytest.approx((1.0 + 2 / 3) / 2)
    assert score.combined_accuracy == pytest.approx(1.0)
    assert score.escalated_share == 1.5
    assert score.bytes_per_frame == 1500
    total = total_score([score, DeviceScore("cam-02")])
    assert total.frames == 2 and total.edge_accuracy == score.edge_accuracy


def test_scoring_without_ground_truth_counts_but_does_not_score(tmp_path: Path) -> None:
    rows = [{"kind": "frame", "stream_id": "cam", "frame_index": 0, "texts": ["AB"]}]
    score = score_device(_device(tmp_path, None, rows), {}, uplink_bytes=10)
    assert score.frames == 1 and score.edge_accuracy is None


def test_a_verdict_without_edge_texts_or_with_same_reading_is_no_correction() -> None:
    base = {"fallback_level": 0, "cloud_texts": ["pd 008 hn"]}
    assert not is_correction({**base, "edge_texts": None})
    assert not is_correction({**base, "edge_texts": ["PD008HN"]})
    assert is_correction({**base, "edge_texts": ["PD0O8HN"]})
    assert not is_correction({**base, "edge_texts": ["X"], "fallback_level": 3})


def test_jpeg_baseline_is_the_mean_size_of_the_videos_frames_as_jpeg(tmp_path: Path) -> None:
    render_video(tmp_path / "v.avi", SMALL)
    frames = _frames(tmp_path / "v.avi")
    expected = [len(cv2.imencode(".jpg", f, [cv2.IMWRITE_JPEG_QUALITY, 85])[1]) for f in frames]
    measured = jpeg_bytes_per_frame(tmp_path / "v.avi", samples=len(frames))
    assert measured == pytest.approx(sum(expected) / len(expected))
    assert jpeg_bytes_per_frame(tmp_path / "missing.avi") is None


def _users_clip(path: Path) -> Path:
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), 5, (160, 120))
    for i in range(5):
        writer.write(np.full((120, 160, 3), 40 * i, np.uint8))
    writer.release()
    return path


def test_users_videos_are_cycled_over_the_devices_without_truth(tmp_path: Path) -> None:
    from edgefleet.demo.steps import prepare_videos

    # given two of the user's own clips, no ground truth beside them
    a, b = _users_clip(tmp_path / "a.mp4"), _users_clip(tmp_path / "b.mp4")
    # when three devices are prepared
    scenes = prepare_videos(tmp_path / "w", 3, [a, b], seed=0)
    # then the clips are used as they are, in turn, and nothing is rendered
    assert scenes == [(a, None), (b, None), (a, None)]
    assert not (tmp_path / "w").exists()


def test_a_users_video_with_its_ground_truth_is_scored(tmp_path: Path) -> None:
    from edgefleet.demo.steps import prepare_videos

    video = tmp_path / "scene.mp4"
    truth = render_video(video, SMALL)
    [(path, loaded)] = prepare_videos(tmp_path / "w", 1, [video], seed=0)
    assert path == video and loaded == truth


def test_a_foreign_json_beside_a_users_video_is_a_clear_error(tmp_path: Path) -> None:
    from edgefleet.demo.steps import prepare_videos

    video = _users_clip(tmp_path / "clip.mp4")
    (tmp_path / "clip.json").write_text('{"camera": "dock 3"}')
    with pytest.raises(ConfigError, match=r"clip\.json lies beside --video clip\.mp4 but is not"):
        prepare_videos(tmp_path / "w", 1, [video], seed=0)


def test_a_file_that_is_no_video_is_refused_before_anything_starts(tmp_path: Path) -> None:
    from edgefleet.demo.steps import prepare_videos

    notes = tmp_path / "notes.mp4"
    notes.write_text("not a video")
    with pytest.raises(ConfigError, match="OpenCV cannot decode a frame"):
        prepare_videos(tmp_path / "w", 1, [notes], seed=0)
    with pytest.raises(ConfigError, match="no such file"):
        prepare_videos(tmp_path / "w", 1, [tmp_path / "gone.mp4"], seed=0)


def test_a_reel_plays_its_scenarios_in_turn_with_one_truth_for_all(tmp_path: Path) -> None:
    # given a spec of two scenarios of the bench's set, 12 frames between them
    spec = SMALL.model_copy(update={
        "width": 640, "height": 360, "duration_s": 12 / SMALL.fps,
        "scenarios": ("occluded", "entering"),
    })
    video = tmp_path / "reel.mp4"
    truth = render_video(video, spec)
    # then the video holds every frame, each clip its half, and its truth round-trips
    assert len(_frames(video)) == len(truth.frames) == 12
    assert GroundTruth.load(truth_path(video)) == truth
    # and each line of the truth is of one clip only: ids run on, texts and kinds are known
    by_id = {line.id: line for line in truth.lines}
    assert len(by_id) == len(truth.lines)
    clip_of = {item.line: frame.index // 6 for frame in truth.frames for item in frame.items}
    assert set(clip_of) == set(by_id)
    assert {clip_of[i] for i in by_id} == {0, 1}
    for frame in truth.frames:
        for item in frame.items:
            assert item.text == by_id[item.line].text
            assert 0 <= item.box[0] < item.box[2] <= spec.width
    # and rendering again gives the same truth
    assert render_video(tmp_path / "again.mp4", spec) == truth.model_copy(
        update={"video": "again.mp4"})


def test_a_reel_of_an_unknown_scenario_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown scenarios"):
        VideoSpec(scenarios=("entering", "fog"))
