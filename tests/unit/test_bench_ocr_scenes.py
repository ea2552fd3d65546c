"""The OCR benchmark: its images follow from the seed alone (a re-run reads the same
bytes), and its contenders read them in turns."""

from __future__ import annotations

import cv2
import numpy as np

from edgefleet.bench import bench_ocr
from edgefleet.demo.scenes.clips import Tally
from edgefleet.demo.scenes.scenarios import SCENARIOS, available_fonts
from edgefleet.demo.scenes.stills import TTF_FONTS, easy_scene, scenes, ttf_scenes


def test_same_seed_same_images_and_truth():
    a, b = scenes(2, 3, seed=11), scenes(2, 3, seed=11)
    assert [s.jpeg for s in a] == [s.jpeg for s in b]
    assert [s.truth for s in a] == [s.truth for s in b]
    assert [s.level for s in a] == ["easy", "easy", "hard", "hard", "hard"]
    assert scenes(1, 0, seed=12)[0].jpeg != a[0].jpeg


def test_an_easy_still_is_1080p_with_its_lines_inside():
    scene = easy_scene(5)
    image = cv2.imdecode(np.frombuffer(scene.jpeg, np.uint8), cv2.IMREAD_COLOR)
    assert image.shape == (1080, 1920, 3)
    assert 3 <= len(scene.truth) <= 5
    for line in scene.truth:
        x0, y0, x1, y1 = line.box
        assert 0 <= x0 < x1 <= 1920 and 0 <= y0 < y1 <= 1080 and line.text


def test_the_contenders_take_turns_image_by_image(monkeypatch):
    # given two contenders that note each read, and one that is not installed
    monkeypatch.setattr(bench_ocr, "PAUSE_S", 0)
    images = scenes(1, 2, seed=11)
    log: list[tuple[str, bytes]] = []

    def contender(name: str) -> bench_ocr.Maker:
        def make():
            def read(jpeg: bytes):
                log.append((name, jpeg))
                return [(line.text, line.box) for line in images[0].truth]

            return read, lambda: None

        return make

    def missing():
        raise ImportError("no", name="faster_paddle")

    makers = {"a": contender("a"), "b": contender("b"), "peer": missing}
    # when the benchmark measures them
    results = bench_ocr.measure(makers, images, rounds=1)
    # then each read every image after a warm-up, in turns that rotate from image to image
    assert [name for name, _ in log] == ["a", "b", "a", "b", "b", "a", "a", "b"]
    assert [jpeg for _, jpeg in log[2:]] == [s.jpeg for s in images for _ in range(2)]
    a, b, peer = results
    assert len(a.times["easy"]) == 1 and len(b.times["hard"]) == 2
    assert a.tallies["easy"].char_accuracy == 1.0  # it read the first image's truth
    assert peer.skipped.startswith("not installed (faster_paddle)") and not peer.times


def test_the_ttf_set_is_truetype_hard_frames_that_follow_from_the_seed():
    # given the TrueType hard set of one seed, twice, and of another seed
    a, b = ttf_scenes(6, seed=21), ttf_scenes(6, seed=21)
    other = ttf_scenes(2, seed=22)
    # then the same seed renders the same bytes and truth, another seed other bytes
    assert [s.jpeg for s in a] == [s.jpeg for s in b]
    assert [s.truth for s in a] == [s.truth for s in b]
    assert other[0].jpeg != a[0].jpeg
    # and every frame is a 640x360 TrueType frame with a line to read inside it
    for scene in a:
        assert scene.level == "ttf" and scene.truth
        assert scene.font.split("/")[0] in TTF_FONTS
        image = cv2.imdecode(np.frombuffer(scene.jpeg, np.uint8), cv2.IMREAD_COLOR)
        assert image.shape == (360, 640, 3)
        for line in scene.truth:
            x0, y0, x1, y1 = line.box
            assert 0 <= x0 < x1 <= 640 and 0 <= y0 < y1 <= 360 and line.text


def test_the_ttf_set_meets_every_font_and_scenario_in_turn():
    fonts = available_fonts(TTF_FONTS)
    seen = {s.font for s in ttf_scenes(4 * 10 * 4, seed=3)}  # four rounds of the scenarios
    assert {f.split("/")[0] for f in seen} == set(fonts)
    assert {f.split("/")[1] for f in seen} == set(SCENARIOS)
    if len(fonts) == len(TTF_FONTS):
        assert len(seen) == len(SCENARIOS) * len(TTF_FONTS)  # every pair, one clip each


def test_scenes_give_the_three_sets_in_order():
    levels = [s.level for s in scenes(1, 2, seed=11, ttf=2)]
    assert levels == ["easy", "hard", "hard", "ttf", "ttf"]


def test_the_bench_gives_the_verdict_over_tiny_and_the_gap_to_small(capsys):
    # given our reader and two peers timed and scored on the two hard sets
    def result(name: str, ms: float, read: float) -> bench_ocr.Result:
        r = bench_ocr.Result(name)
        for level in ("hard", "ttf"):
            r.times[level] = [ms / 1000]
            r.tallies[level] = Tally(chars=read * 10, exact=0, lines=10)
            r.settled[level] = r.tallies[level]
        return r

    ours = result("ours", 70, 0.80)
    tiny, small = result("faster-paddle-tiny", 100, 0.78), result("faster-paddle-small", 280, 0.9)
    # when the bench prints its verdict and the gap
    bench_ocr.verdict(ours, tiny, ["hard", "ttf"])
    bench_ocr.gap(ours, small, ["hard", "ttf"])
    out = capsys.readouterr().out
    # then both sets are met against tiny, and the gap to small is its difference
    assert out.count("p50 x0.70  char acc 0.8000 vs 0.7800  met") == 2
    assert out.count("p50 x0.25  char acc 0.8000 vs 0.9000  gap -0.1000") == 2
