"""O and 0 settled by their word: the rule, and the edge model's reads with it and without."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from edgefleet.bench.hard_scenes import frame_scores
from edgefleet.bench.ocr_scenes import easy_scene
from edgefleet.shared.executor.settings import BatcherSettings, ExecutionSettings
from edgefleet.shared.models import load_model
from edgefleet.shared.models.decoders.twins import settle_twins


@pytest.mark.parametrize(
    "read,settled",
    [
        ("D0CK 12", "DOCK 12"),  # between letters: O
        ("00LU6788962", "OOLU6788962"),  # a run of twins looks past itself, to the L
        ("0OLU1234567", "OOLU1234567"),
        ("RN 64O WY", "RN 640 WY"),  # after digits, at the word's end: 0
        ("GATE 7O", "GATE 70"),
        ("O12", "012"),
        ("PLATF0RM-4", "PLATFORM-4"),
        ("7781-0X", "7781-OX"),  # punctuation ends the look, as a space does
        ("B0B", "BOB"),
    ],
)
def test_a_twin_takes_the_kind_of_its_word(read, settled):
    assert settle_twins(read) == settled


@pytest.mark.parametrize(
    "read",
    [
        "HLXU0123456",  # a letter on one side, a digit on the other: the model decides
        "HLXUO123456",
        "0",  # a word of twins only
        "O O 00",
        "A 0 B",  # the neighbours are other words
        "",
        "PLATFORM 4",  # already settled
        "2010",
    ],
)
def test_a_twin_without_a_clear_word_stays_as_read(read):
    assert settle_twins(read) == read


@pytest.fixture(scope="module")
def tiny():
    settings = ExecutionSettings(
        backends=["onnxruntime-cpu"], intra_op_threads=1, batching=BatcherSettings(enabled=False)
    )
    with load_model("ppocr6-tiny", settings=settings) as model:
        assert model.opts.twins  # on by default
        yield model


@pytest.mark.parametrize(
    "seed,text",
    [(1009, "DOCK 12"), (1006, "OOLU6788962"), (1017, "OOLU3279025"), (1024, "RN 640 WY")],
)
def test_the_edge_model_reads_twins_right_only_with_the_rule(tiny, monkeypatch, seed, text):
    # given a clean 1080p still of the OCR benchmark with a line the recogniser reads with
    # O and 0 swapped
    scene = easy_scene(seed)
    frame = cv2.imdecode(np.frombuffer(scene.jpeg, np.uint8), cv2.IMREAD_COLOR)
    truth = [line for line in scene.truth if line.text == text]

    def score() -> tuple[float, bool]:
        lines = tiny.predict_many([frame], fmt="bgr")[0]
        return frame_scores([(d.text or "", d.box) for d in lines], truth)[0]

    # when it is read with the rule and without it
    settled = score()
    monkeypatch.setattr(tiny, "opts", tiny.opts.model_copy(update={"twins": False}))
    raw = score()
    # then only the rule reads it exactly
    assert settled == (1.0, True)
    assert not raw[1]
