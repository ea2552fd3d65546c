"""PP-OCR pieces: CTC, DB boxes, angle flips, crops; the pipeline's batching and inputs."""

from __future__ import annotations

import asyncio
import itertools
import threading

import cv2
import numpy as np
import pytest

from edgefleet.shared.errors import InvalidInput
from edgefleet.shared.executor.settings import BatcherSettings, ExecutionSettings
from edgefleet.shared.imaging.letterbox import LetterboxTransform
from edgefleet.shared.models import load_model
from edgefleet.shared.models.lines import crop_quad, pad_quad, width_ladder
from edgefleet.shared.models.outputs.angle import angle_flips
from edgefleet.shared.models.outputs.ctc import ctc_greedy, ppocr_charset
from edgefleet.shared.models.outputs.dbnet import DBParams, db_boxes, order_quad
from edgefleet.shared.models.preprocess import det_plan

CHARSET = ppocr_charset(list("ABC"))  # ["", "A", "B", "C", " "]


def one_hot(indices: list[int], conf: float = 0.9) -> np.ndarray:
    probs = np.full((len(indices), len(CHARSET)), (1 - conf) / (len(CHARSET) - 1), np.float32)
    probs[np.arange(len(indices)), indices] = conf
    return probs


def test_ctc_merges_repeats_drops_blanks_and_scores_kept_chars():
    # A A _ A B B _ _ C ' ': adjacent repeats merge, a blank separates real repeats
    seq = one_hot([1, 1, 0, 1, 2, 2, 0, 0, 3, 4])
    (text, score), (empty, zero) = ctc_greedy(
        np.stack([seq, one_hot([0, 0, 0])[:1].repeat(10, 0)]), CHARSET
    )
    assert text == "AABC "
    assert score == pytest.approx(0.9)
    assert (empty, zero) == ("", 0.0)
    with pytest.raises(ValueError, match="classes"):
        ctc_greedy(np.zeros((1, 3, 7), np.float32), CHARSET)


def test_db_finds_a_text_block_and_grows_it_back():
    prob = np.zeros((64, 128), np.float32)
    prob[20:30, 10:90] = 0.95  # the shrunk kernel of one text line
    quads, scores = db_boxes(prob, DBParams(unclip_ratio=1.5))
    assert quads.shape == (1, 4, 2) and 0.8 < scores[0] <= 0.95
    q = quads[0]
    # grown outwards on every side, still ordered tl, tr, br, bl
    assert q[0][0] < 10 and q[0][1] < 20 and q[2][0] > 89 and q[2][1] > 29
    assert np.array_equal(order_quad(q[[2, 0, 3, 1]]), q)
    # low-confidence blobs are dropped
    assert db_boxes(prob * 0.5, DBParams(thresh=0.3, box_thresh=0.6))[0].shape == (0, 4, 2)


def test_det_plan_stretches_to_the_nearest_step_or_letterboxes():
    # PP-OCR's rule: each side scaled and rounded to /32 on its own, the image fills it
    assert det_plan((360, 640), 640, stretch=True) == LetterboxTransform(
        360, 640, 352, 640, 352, 640, 0, 0
    )
    assert det_plan((1080, 1920), 512, stretch=True).dst_h == 288
    # the letterbox rounds the canvas up and pads the rest
    boxed = det_plan((360, 640), 640)
    assert (boxed.dst_h, boxed.new_h, boxed.pad_top) == (384, 360, 12)


def test_angle_flips_only_when_sure():
    probs = np.array([[0.05, 0.95], [0.2, 0.8], [0.9, 0.1]], np.float32)
    assert angle_flips(probs, ["0", "180"], 0.9) == [True, False, False]


def test_crop_rectifies_and_padding_grows():
    img = np.zeros((100, 200, 3), np.uint8)
    img[40:60, 50:150] = 255
    quad = np.array([[50, 40], [150, 40], [150, 60], [50, 60]], np.float32)
    crop = crop_quad(img, quad)
    assert crop.shape == (20, 100, 3) and crop.mean() > 250
    grown = pad_quad(quad, 0.5)
    assert np.allclose(grown, [[40, 30], [160, 30], [160, 70], [40, 70]])
    tall = crop_quad(img, np.array([[0, 0], [10, 0], [10, 50], [0, 50]], np.float32))
    assert tall.shape[:2] == (10, 50)  # vertical lines are turned to read horizontally


@pytest.fixture(scope="module")
def ppocr():
    settings = ExecutionSettings(batching=BatcherSettings(max_delay_ms=20, preferred_batch_size=3))
    with load_model("ppocr", settings=settings) as model:
        yield model


def scene(text: str, size: tuple[int, int]) -> np.ndarray:
    img = np.full((*size, 3), 235, np.uint8)
    cv2.putText(img, text, (20, size[0] // 2), cv2.FONT_HERSHEY_DUPLEX, 1.2, (20, 20, 20), 2)
    return img


def test_info_memory_and_backends(ppocr):
    assert ppocr.info.name == "ppocr" and ppocr.info.backend == "onnxruntime-cpu"
    assert ppocr.info.precision == "fp32" and len(ppocr.info.sha256) == 64
    assert ppocr.memory_bytes > 15_000_000  # at least the weights of det + rec
    assert ppocr.backends == {"ppocr-det": "onnxruntime-cpu", "ppocr-rec": "onnxruntime-cpu"}
    from prometheus_client import REGISTRY

    for part in ppocr.backends:  # each component was timed loading and warming up in load
        labels = {"model": part, "backend": "onnxruntime-cpu"}
        assert REGISTRY.get_sample_value("ef_model_load_seconds_count", labels) >= 1
        assert REGISTRY.get_sample_value("ef_model_warmup_seconds_count", labels) >= 1


def test_batched_equals_one_by_one_for_different_sizes(ppocr):
    images = [scene("GATE 12", (200, 400)), scene("EXIT 7B", (300, 500)), scene("", (64, 64))]
    alone = [ppocr.predict_many([img])[0] for img in images]
    together = ppocr.predict_many(images)
    assert [[d.text for d in r] for r in together] == [["GATE 12"], ["EXIT 7B"], []]
    # padding a smaller canvas up to the batch's size moves boxes by a pixel at most
    for a, b in zip(alone, together, strict=True):
        assert [d.text for d in a] == [d.text for d in b]
        for da, db in zip(a, b, strict=True):
            assert np.allclose(da.box, db.box, atol=2.0)


def test_concurrent_threads_and_asyncio_go_through_the_batcher(ppocr):
    images = [scene(f"BAY {n}", (160, 360)) for n in (11, 22, 33)]
    results: dict[int, list] = {}
    threads = [
        threading.Thread(target=lambda i=i: results.__setitem__(i, ppocr.predict(images[i])))
        for i in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert [[d.text for d in results[i]] for i in range(3)] == [["BAY 11"], ["BAY 22"], ["BAY 33"]]

    async def both():
        return await asyncio.gather(*(ppocr.predict_async(img) for img in images[:2]))

    assert [[d.text for d in r] for r in asyncio.run(both())] == [["BAY 11"], ["BAY 22"]]
    assert ppocr.batcher is not None and ppocr.batcher.batches_run >= 1
    assert ppocr.qps() > 0


@pytest.mark.parametrize(
    "bad,why",
    [
        (np.zeros((10, 10), np.uint8), r"\(H, W, 3\)"),
        (np.zeros((10, 10, 4), np.uint8), r"\(H, W, 3\)"),
        (np.zeros((10, 10, 3), np.float32), "uint8"),
        (np.zeros((0, 10, 3), np.uint8), "empty"),
        ("not an image", "numpy array"),
    ],
)
def test_bad_inputs_are_typed_errors(ppocr, bad, why):
    with pytest.raises(InvalidInput, match=why):
        ppocr.predict(bad)
    with pytest.raises(InvalidInput, match=why):
        ppocr.predict_many([bad])


def test_tiny_and_extreme_aspect_images_do_not_crash(ppocr):
    assert ppocr.predict(np.full((1, 1, 3), 128, np.uint8)) == []
    assert ppocr.predict(np.full((8, 2000, 3), 255, np.uint8)) == []


@pytest.mark.parametrize("lo,hi", [(160, 1600), (320, 1600), (480, 1600), (320, 320)])
def test_recogniser_widths_climb_from_the_minimum_to_the_maximum(lo, hi):
    # a line is padded to the first width that holds it: few widths (few batches), none
    # more than 1.5x (and a step of 32) above the last
    ladder = width_ladder(lo, hi)
    assert ladder[0] == lo and ladder[-1] == hi
    steps = list(itertools.pairwise(ladder))
    assert all(a < b <= a * 1.5 + 32 for a, b in steps)
    assert all(b % 32 == 0 for _, b in steps[:-1])


def test_the_line_cap_keeps_the_largest_lines_in_their_order_and_counts_the_rest():
    from edgefleet.shared.models.ocr import capped

    # given five line quads of growing height, the tallest in the middle
    heights = [4, 6, 20, 8, 10]
    quads = np.array(
        [
            [[0, 30 * i], [100, 30 * i], [100, 30 * i + h], [0, 30 * i + h]]
            for i, h in enumerate(heights)
        ],
        np.float32,
    )
    # when capped at three, then the three largest are kept in their order, two left
    kept, left = capped(quads, 3)
    assert left == 2
    assert [float(q[2, 1] - q[1, 1]) for q in kept] == [20.0, 8.0, 10.0]
    # and without a cap (or under it) nothing is left
    assert capped(quads, None)[1] == 0 and capped(quads, 5)[1] == 0
