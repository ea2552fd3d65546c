"""The line reader, built from its own sessions: reads, flips, votes, and widths that never
depend on a line's batch-mates."""

from __future__ import annotations

from collections.abc import Iterator

import cv2
import numpy as np
import pytest

from edgefleet.shared.executor.settings import BatcherSettings, ExecutionSettings
from edgefleet.shared.models.frames import FrameIn
from edgefleet.shared.models.lines import LineReader, Reader, load_charset, vote
from edgefleet.shared.models.registry import ModelRegistry
from edgefleet.shared.models.session import Session, open_session
from edgefleet.shared.models.tasks import OcrOptions

SETTINGS = ExecutionSettings(
    backends=["onnxruntime-cpu"], intra_op_threads=1, batching=BatcherSettings(enabled=False)
)


def opened(name: str, shape: tuple[int, int]) -> Session:
    registry = ModelRegistry.default()
    h, w = shape
    return open_session(
        registry.get(name),
        registry,
        SETTINGS,
        item_shape=(8, 3, h, w),
        warmup_shape=(1, 3, h, w),
        max_batch=8,
    )


@pytest.fixture(scope="module")
def sessions() -> Iterator[tuple[Session, Session]]:
    rec, cls = opened("ppocr-rec", (48, 320)), opened("ppocr-cls", (48, 192))
    yield rec, cls
    rec.close()
    cls.close()


def reader_of(session: Session) -> Reader:
    return Reader.of(session, load_charset(session, ModelRegistry.default()))


def line_frame(texts: list[str]) -> tuple[FrameIn, list[np.ndarray]]:
    """A BGR frame with one printed line per text, and each line's quad (tl, tr, br, bl)."""
    img = np.full((60 * len(texts) + 20, 520, 3), 235, np.uint8)
    quads = []
    for k, text in enumerate(texts):
        (w, h), base = cv2.getTextSize(text, cv2.FONT_HERSHEY_DUPLEX, 1.2, 2)
        x, y = 20, 50 + 60 * k
        cv2.putText(img, text, (x, y), cv2.FONT_HERSHEY_DUPLEX, 1.2, (20, 20, 20), 2)
        x0, y0, x1, y1 = x - 6, y - h - 8, x + w + 6, y + base + 6
        quads.append(np.array([[x0, y0], [x1, y0], [x1, y1], [x0, y1]], np.float32))
    return FrameIn(img, "bgr"), quads


def test_the_reader_reads_each_line_of_a_frame_and_scores_it_by_its_vote(sessions):
    # given a reader of one recogniser, and a frame of two printed lines
    rec, _ = sessions
    lines = LineReader("test", OcrOptions(det="d", rec="r"), None, [reader_of(rec)])
    frame, quads = line_frame(["GATE 12", "MSCU1234565"])
    # when it reads them
    [reads] = lines.read([frame], [np.stack(quads)])
    # then each line's text comes back with one read's confidence as its vote and surest
    assert [text for text, _, _ in reads] == ["GATE 12", "MSCU1234565"]
    assert all(0.8 < vote_score == surest <= 1.0 for _, vote_score, surest in reads)
    # and a frame without lines costs no recogniser call
    assert lines.read([frame], [np.zeros((0, 4, 2), np.float32)]) == [[]]


def test_two_recognisers_vote_and_an_upside_down_line_is_flipped_by_the_classifier(sessions):
    # given a reader with a voter (the same recogniser twice) and the angle classifier
    rec, cls = sessions
    opts = OcrOptions(det="d", rec="r", cls="c", voters=["v"])
    lines = LineReader("test", opts, cls, [reader_of(rec), reader_of(rec)])
    frame, [quad] = line_frame(["MSCU1234565"])
    turned = FrameIn(np.ascontiguousarray(frame.pixels[::-1, ::-1]), "bgr")
    h, w = frame.hw
    upside_down = np.array([w - 1, h - 1], np.float32) - quad[[2, 3, 0, 1]]
    # when it reads the line upright and upside down
    [[upright]], [[flipped]] = (
        lines.read([frame], [quad[None]]),
        lines.read([turned], [upside_down[None]]),
    )
    # then both read right: two agreeing reads pool their confidence over two reads
    assert upright[0] == flipped[0] == "MSCU1234565"
    assert upright[1] == pytest.approx(upright[2], abs=1e-6)


def test_a_line_reads_the_same_whatever_lines_it_is_batched_with(sessions):
    # given a short line read alone, and read in one frame with much longer lines
    rec, _ = sessions
    lines = LineReader("test", OcrOptions(det="d", rec="r"), None, [reader_of(rec)])
    alone, [short] = line_frame(["AB 12"])
    crowded, quads = line_frame(["AB 12", "MSCU1234565 GATE", "TRUCK 4471 OUT"])
    [[first]] = lines.read([alone], [short[None]])
    [mixed] = lines.read([crowded], [np.stack(quads)])
    # then its padded width is its own, so its read and score are the same
    assert mixed[0] == pytest.approx(first)
    ratios = np.array([2.0, 2.0, 12.0])
    widths = lines.rec_widths(ratios)
    assert widths[0] == widths[1] < widths[2]


def test_the_vote_pools_spellings_equal_up_to_case_and_spacing():
    assert vote([("Gate 12", 0.6), ("GATE12", 0.3), ("CATE 12", 0.8)]) == pytest.approx(
        ("Gate 12", 0.3)
    )
    assert vote([("", 0.9)]) == ("", 0.0)


def test_only_lines_read_less_surely_than_the_floor_are_read_again_and_the_reads_vote(sessions):
    # given the tiny pipeline's recogniser as the reader and a second recogniser to reread
    rec, _ = sessions
    again = opened("ppocr6-small-rec", (48, 320))
    try:
        frame, quads = line_frame(["GATE 12", "MSCU1234565"])
        lines = np.stack(quads)

        def read(below: float) -> list:
            opts = OcrOptions(det="d", rec="r", reread="s", reread_below=below)
            reader = LineReader("test", opts, None, [reader_of(rec)], reader_of(again))
            [reads] = reader.read([frame], [lines])
            return reads

        # when no line is under the floor, each has one read: its vote is its confidence
        alone = read(1e-6)
        assert all(vote_score == surest for _, vote_score, surest in alone)
        # when every line is, each is read twice: they agree here, and the line's score is
        # the mean of the two reads' confidences, its surest the higher of them
        twice = read(1.0)
        assert [t for t, _, _ in twice] == [t for t, _, _ in alone] == ["GATE 12", "MSCU1234565"]
        assert all(
            surest >= first for (_, _, first), (_, _, surest) in zip(alone, twice, strict=True)
        )
        assert any(vote_score < surest for _, vote_score, surest in twice)
    finally:
        again.close()
