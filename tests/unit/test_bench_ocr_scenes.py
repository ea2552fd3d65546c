"""The OCR benchmark's images follow from the seed alone: a re-run reads the same bytes."""

from __future__ import annotations

import cv2
import numpy as np

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
