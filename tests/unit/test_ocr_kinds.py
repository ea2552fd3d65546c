"""Word kinds: a letter among digits or a digit among letters read again by its word; the
rule, the CTC decoder with it, and the edge model's reads with it and without."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from edgefleet.demo.scenes.clips import frame_scores
from edgefleet.demo.scenes.stills import easy_scene
from edgefleet.shared.models.outputs.ctc import ctc_greedy, ppocr_charset
from edgefleet.shared.models.outputs.kinds import Kinds, settle_kinds


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
        ("7781-0X", "7781-OX"),  # a mark ends the word, as a space does
        ("B0B", "BOB"),
    ],
)
def test_o_and_0_take_the_kind_of_their_word_whatever_the_recogniser_says(read, settled):
    assert settle_kinds(read) == settled


@pytest.mark.parametrize(
    "read",
    [
        "HLXU0123456",  # a letter on one side, a digit on the other: the read stands
        "HLXUO123456",
        "0",  # a word of twins only
        "O O 00",
        "A 0 B",  # the neighbours are other words
        "",
        "PLATFORM 4",
        "2010",
        "RS 788 5M",  # another character settles only where the recogniser offers one
        "第0号",  # other scripts end a word: a digit among Chinese characters stays
        "3号门",
        "ΟΟLU",  # Greek capital omicrons are not Latin letters
    ],
)
def test_a_read_without_a_clear_word_or_an_offer_stands(read):
    assert settle_kinds(read) == read


def test_other_characters_take_what_the_recogniser_offers_of_their_words_kind():
    offers = {(7, True): "J", (1, False): "1"}
    asked: list[tuple[int, bool]] = []

    def alternative(i: int, letter: bool) -> str | None:
        asked.append((i, letter))
        return offers.get((i, letter))

    # the 5 of `5M` is among letters, the S of `7S8` among digits, the I of `AIB` fits
    assert settle_kinds("RS 788 5M", alternative) == "RS 788 JM"
    assert settle_kinds("7S8 AIB", alternative) == "718 AIB"
    # read left to right: the 7, whose one neighbour is still the S, is asked for a letter
    # first and offered none
    assert asked == [(7, True), (0, True), (1, False)]
    # no offer: the read stands; O and 0 are settled after the others, by the settled word
    assert settle_kinds("5O8", lambda i, letter: None) == "508"
    assert settle_kinds("S0M", lambda i, letter: None) == "SOM"


def test_only_latin_letters_and_digits_0_to_9_have_a_kind():
    charset = ppocr_charset(list("Aé号Ω٣0²Z"))  # with the blank and the space
    kinds = Kinds.of(charset)
    assert [c for c, k in zip(charset, kinds.letters, strict=True) if k] == ["A", "é", "Z"]
    assert [c for c, k in zip(charset, kinds.digits, strict=True) if k] == ["0"]


CHARSET = ppocr_charset(list("J5MO0"))  # ["", "J", "5", "M", "O", "0", " "]


def steps(rows: list[dict[int, float]]) -> np.ndarray:
    """(1, T, C) probabilities: each step's given classes, the rest of its mass on blank."""
    probs = np.zeros((1, len(rows), len(CHARSET)), np.float32)
    for t, row in enumerate(rows):
        for k, p in row.items():
            probs[0, t, k] = p
        probs[0, t, 0] = 1 - sum(row.values())
    return probs


@pytest.mark.parametrize(
    "offer,read",
    [(0.18, "JM"), (0.09, "5M")],  # J offered at or above the floor (0.1): read J
)
def test_ctc_settles_a_word_with_the_recogniser_s_offer_above_the_floor(offer, read):
    # 5 (0.77, with J at `offer`) then M: a digit among letters
    probs = steps([{2: 0.77, 1: offer}, {}, {3: 0.9}])
    kinds = Kinds.of(CHARSET)
    [(text, score)] = ctc_greedy(probs, CHARSET, kinds, 0.1)
    assert text == read
    assert score == pytest.approx((0.77 + 0.9) / 2)  # the recogniser's score, unchanged
    assert ctc_greedy(probs, CHARSET) == [("5M", score)]  # without kinds: as read


@pytest.mark.parametrize(
    "seed,text",
    [
        (1009, "DOCK 12"),
        (1006, "OOLU6788962"),
        (1017, "OOLU3279025"),
        (1024, "RN 640 WY"),
        (1004, "RS 788 JM"),  # the J read 5 at 0.77, J at 0.18
    ],
)
def test_the_edge_model_reads_these_words_right_only_with_the_rule(tiny, monkeypatch, seed, text):
    # given a clean 1080p still of the OCR benchmark with a line the recogniser reads
    # with a character of the wrong kind
    scene = easy_scene(seed)
    frame = cv2.imdecode(np.frombuffer(scene.jpeg, np.uint8), cv2.IMREAD_COLOR)
    truth = [line for line in scene.truth if line.text == text]

    def score() -> tuple[float, bool]:
        lines = tiny.predict_many([frame], fmt="bgr")[0]
        return frame_scores([(d.text or "", d.box) for d in lines], truth)[0]

    # when it is read with the rule (on by default) and without it
    assert tiny.lines.opts.word_kinds == 0.1
    settled = score()
    reading = tiny.lines.opts.model_copy(update={"word_kinds": None})
    monkeypatch.setattr(tiny.lines, "opts", reading)
    raw = score()
    # then only the rule reads it exactly
    assert settled == (1.0, True)
    assert not raw[1]
