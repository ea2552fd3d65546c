"""The OCR benchmark: its images follow from the seed alone (a re-run reads the same
bytes), and its contenders read them in turns."""

from __future__ import annotations

import cv2
import numpy as np

from edgefleet.bench import bench_ocr
from edgefleet.bench.ocr_scenes import easy_scene, scenes


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
