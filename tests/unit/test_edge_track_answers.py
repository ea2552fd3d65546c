"""When a track is asked about, and how long the cloud's answer stands on it: a line cut by
the frame's border, one that grows, one that changes, through the real tracker, policy and
verdict book (detections as the edge model gives them, on a real frame)."""

from __future__ import annotations

import numpy as np
import pytest

from edgefleet.edge.policy import EscalationPolicy
from edgefleet.edge.settings import BudgetSettings, PolicySettings, TrackSettings
from edgefleet.edge.tracks import RETIRED, Detection, fit, report
from edgefleet.edge.verdicts import VerdictBook
from edgefleet.shared.messages import CloudVerdict

W, H = 320, 240
WHOLE = "GRR-7092"


def _frame(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 255, (H, W, 3), dtype=np.uint8)


def _policy(**tracks) -> EscalationPolicy:
    settings = PolicySettings(
        sample_share=0.0,
        rate_per_min=600.0,
        dedup_window_s=0.0,
        budget=BudgetSettings(share=1.0, max_score=1.0, burst=8),
        tracks=TrackSettings(**tracks),
    )
    return EscalationPolicy(settings, clock=lambda: 0.0)


def _verdict(case_id: str, track_id: str, text: str, score: float = 0.98) -> CloudVerdict:
    return CloudVerdict(
        device_id="cam-01",
        trace_id="0" * 32,
        case_id=case_id,
        result=[Detection(text=text, score=score)],
        model="ppocr6-cloud@6.0",
        route="default",
        fallback_level=0,
        latency_ms=40.0,
        track_id=track_id,
    )


def _entering(index: int) -> Detection:
    """A line sliding in from the left border: cut (and read in part) for five frames."""
    shown = min(len(WHOLE), 2 + index)
    x2 = 10.0 * (shown + 2) + 4 * index
    x1 = 0.0 if shown < len(WHOLE) else x2 - 100.0
    return Detection(text=WHOLE[:shown] if shown < len(WHOLE) else WHOLE, score=0.6,
                     box=(x1, 60.0, x2, 84.0))


def _retired(*why: str) -> float:
    return sum(RETIRED.labels(w)._value.get() for w in why)


def test_a_line_entering_the_frame_is_asked_about_only_once_it_shows_whole() -> None:
    policy = _policy(ready_frames=3)
    sent = []
    for index in range(12):
        frame_cases = policy.decide_all("s", index, _frame(index), [_entering(index)])
        sent += [(index, case) for case in frame_cases]
        track = policy.tracker.live("s")[0]
        if index < 6:  # cut by the border: the track reports what shows now
            assert track.reading()[0] == WHOLE[: 2 + index]
    # the one case waited for three whole sightings, and shows only whole crops
    assert [index for index, _ in sent] == [8]
    case = sent[0][1]
    assert case.edge_result is not None and case.edge_result[0].text == WHOLE
    assert all(tile.crop is not None and tile.crop[0] > 0 for tile in case.tiles)
    assert track.cases == 1 and track.asked is not None and track.asked.whole


def test_a_late_answer_for_a_part_never_overturns_the_whole_reading() -> None:
    # given a track asked about while it was still cut (it waited its longest: 3 frames)
    policy = _policy(ready_frames=2, max_wait_frames=3)
    book = VerdictBook(tracker=policy.tracker, budget=policy.budget)
    cases = []
    for index in range(3):
        cases += policy.decide_all("s", index, _frame(index), [_entering(index)])
    assert len(cases) == 1 and cases[0].edge_result[0].text == "GRR-"
    track = policy.tracker.live("s")[0]
    assert track.asked is not None and not track.asked.whole
    # when the line comes whole and the edge reads it, then the cloud's answer to the cut
    # crop arrives
    for index in range(3, 9):
        cases += policy.decide_all("s", index, _frame(index), [_entering(index)])
    before = _retired("was_cut", "grew")
    matched = book.receive(_verdict("case-cut-0001", track.track_id, "GRF"))
    # then the device reports the whole reading, the answer is retired and counted
    assert matched.track_known and matched.track_result == WHOLE
    assert report(track).text == WHOLE and report(track).source == "edge"
    assert track.cloud is None and _retired("was_cut", "grew") == before + 1
    # and the whole line was asked about again, whose answer stands
    assert len(cases) == 2 and cases[1].edge_result[0].text == WHOLE
    book.receive(_verdict("case-whole-001", track.track_id, "GRR-7092"))
    assert report(track).source == "cloud" and report(track).text == WHOLE


def test_a_line_that_grows_past_its_answer_retires_it_and_is_asked_again() -> None:
    # given a small plate far away, read in part, asked about and answered
    policy = _policy(ready_frames=2, regrow=1.6)
    book = VerdictBook(tracker=policy.tracker, budget=policy.budget)
    cases = []

    def seen(index: int, text: str, height: float) -> None:
        box = (100.0, 100.0, 100.0 + 5 * height, 100.0 + height)
        cases.extend(policy.decide_all("s", index, _frame(index), [Detection(
            text=text, score=0.5, box=box)]))

    for index in range(3):
        seen(index, "LOAD", 10.0)
    track = policy.tracker.live("s")[0]
    assert len(cases) == 1
    book.receive(_verdict("case-far-0001", track.track_id, "LOAD"))
    assert report(track).source == "cloud"
    # when it comes closer (twice the height) and the edge reads more of it
    before = _retired("grew")
    for index in range(3, 30):
        seen(index, "LOADING BAY 4", min(20.0, 10.0 + 0.5 * index))
    # then the shorter answer is retired, the longer reading reported, a new case sent
    assert report(track).text == "LOADING BAY 4" and _retired("grew") == before + 1
    assert len(cases) == 2 and track.cases == 2


def test_an_answer_for_a_half_hidden_line_gives_way_once_the_line_reads_longer() -> None:
    # given a line half behind a post, read as its visible part, asked and answered so
    policy = _policy(ready_frames=2)
    book = VerdictBook(tracker=policy.tracker, budget=policy.budget)

    def seen(index: int, text: str, score: float) -> None:
        box = (100.0, 100.0, 100.0 + 14.0 * len(text), 120.0)  # the visible part's box
        policy.decide_all("s", index, _frame(index), [Detection(text=text, score=score,
                                                               box=box)])

    for index in range(3):
        seen(index, "CUSTOM", 0.5)
    track = policy.tracker.live("s")[0]
    assert track.asked is not None and track.asked.text == "CUSTOM"
    book.receive(_verdict("case-hid-0001", track.track_id, "CUSTOM", score=0.67))
    assert report(track).text == "CUSTOM" and report(track).source == "cloud"
    # when the post no longer hides its last letter and the edge reads it, less surely
    before = _retired("grew")
    for index in range(3, 30):
        seen(index, "CUSTOMS", 0.3)
    # then the answer to the part gives way to the longer reading: one letter is enough
    assert track.reading()[0] == "CUSTOMS"
    assert report(track).text == "CUSTOMS" and _retired("grew") == before + 1


def test_an_answer_that_fits_stands_and_another_plate_in_its_place_is_a_new_track() -> None:
    policy = _policy(ready_frames=2)
    book = VerdictBook(tracker=policy.tracker, budget=policy.budget)
    box = (100.0, 100.0, 180.0, 120.0)
    for index in range(3):
        policy.decide_all("s", index, _frame(index), [Detection(text="PD 008 HN", score=0.4,
                                                               box=box)])
    track = policy.tracker.live("s")[0]
    book.receive(_verdict("case-fits-001", track.track_id, "PO 008 HN"))
    for index in range(3, 20):  # the edge keeps its misread: the answer still fits
        policy.decide_all("s", index, _frame(index), [Detection(text="PD 008 HN", score=0.4,
                                                               box=box)])
    assert report(track).text == "PO 008 HN" and report(track).source == "cloud"
    # a different plate in the same place (a gate, a camera's cut, a video looping)
    cases = []
    for index in range(20, 80):
        cases += policy.decide_all("s", index, _frame(index), [Detection(
            text="EXIT", score=0.45, box=box)])
        if index == 18 + TrackSettings().change_frames:  # a misread, as far as it can tell
            assert policy.tracker.live("s") == [track]
    # then after `change_frames` of it, it is another track, reported and asked about
    (now,) = policy.tracker.live("s")
    assert now is not track and now.first_frame == 20 and report(now).text == "EXIT"
    assert [case.track_id for case in cases] == [now.track_id]
    # and the old one ended with its own reading and answer, for a late verdict to land on
    assert track.ended and track.reading()[0] == "PD 008 HN"
    assert report(track).text == "PO 008 HN" and policy.tracker.get(track.track_id) is track


def test_a_line_half_hidden_for_a_while_keeps_its_track_and_its_whole_reading() -> None:
    policy = _policy(ready_frames=2)
    box = (100.0, 100.0, 240.0, 120.0)
    for index in range(6):
        policy.decide_all("s", index, _frame(index), [Detection(
            text="LOADING BAY 4", score=0.8, box=box)])
    (track,) = policy.tracker.live("s")
    for index in range(6, 11):  # a post hides all but its first letters
        policy.decide_all("s", index, _frame(index), [Detection(
            text="LOAD", score=0.8, box=(100.0, 100.0, 150.0, 120.0))])
    assert policy.tracker.live("s") == [track] and track.reading()[0] == "LOADING BAY 4"


def test_a_line_the_model_missed_for_a_while_keeps_its_track_and_its_answer() -> None:
    # given an answered track of a hard line
    policy = _policy(ready_frames=2, max_gap=2, revive_frames=20)
    book = VerdictBook(tracker=policy.tracker, budget=policy.budget)
    cases = []

    def seen(index: int, text: str, x: float) -> list:
        det = Detection(text=text, score=0.3, box=(x, 100.0, x + 90.0, 118.0))
        cases.extend(policy.decide_all("s", index, _frame(index), [det]))
        return policy.tracker.live("s")

    for index in range(4):
        seen(index, "HG 625 KM", 100.0 + 3 * index)
    (track,) = policy.tracker.live("s")
    book.receive(_verdict("case-hard-001", track.track_id, "HG 625 KM"))
    # when the model misses it for ten frames (the track ends) and reads it again, moved on
    for index in range(4, 14):
        policy.decide_all("s", index, _frame(index), [])
    assert track.ended and policy.tracker.live("s") == []
    (again,) = seen(14, "HG 625 RM", 142.0)
    # then it is the same track, with its answer, and no new case was sent
    assert again is track and not track.ended and report(track).text == "HG 625 KM"
    assert len(cases) == 1
    # but a different text there after the gap is a new track
    for index in range(15, 30):
        policy.decide_all("s", index, _frame(index), [])
    (other,) = seen(30, "EXIT", 142.0)
    assert other is not track



def test_fit_cuts_a_reading_with_fewer_characters_than_its_box_holds() -> None:
    plate = (0.0, 0.0, 100.0, 20.0)  # five heights wide: room for a nine-character plate
    assert fit("ZT 481 TT", plate, 0.8) == 1.0
    assert fit("电", plate, 0.8) == pytest.approx(0.8 / 5.0)
    assert fit("", plate, 0.8) == 1.0 and fit("ZT", (0.0, 5.0, 10.0, 5.0), 0.8) == 1.0


def test_a_sure_read_of_one_glyph_for_a_whole_plate_is_asked_about_and_answered() -> None:
    # given a plate the edge reads as one wide glyph, surely, on every frame; the budget
    # asks only about tracks under 0.5
    settings = PolicySettings(
        sample_share=0.0,
        rate_per_min=600.0,
        dedup_window_s=0.0,
        budget=BudgetSettings(share=1.0, max_score=0.5, burst=8),
        tracks=TrackSettings(ready_frames=2),
    )
    policy = EscalationPolicy(settings, clock=lambda: 0.0)
    book = VerdictBook(tracker=policy.tracker, budget=policy.budget)
    box = (100.0, 100.0, 200.0, 120.0)
    cases = []
    for index in range(4):
        cases += policy.decide_all("s", index, _frame(index), [Detection(text="电", score=0.9,
                                                                         box=box)])
    # then its confidence is cut by its fit to the box, and it is asked about
    track = policy.tracker.live("s")[0]
    assert track.reading()[1] == pytest.approx(0.9 * 0.8 / 5.0)
    assert len(cases) == 1
    # and the cloud's whole plate, less sure than the edge's model was of its glyph, stands
    book.receive(_verdict("case-glyph-01", track.track_id, "ZT 481 TT", score=0.6))
    assert report(track).source == "cloud" and report(track).text == "ZT 481 TT"


def test_a_cut_ends_the_streams_tracks_and_the_lines_after_it_are_new_ones() -> None:
    # given a track answered on one scene
    policy = _policy(ready_frames=2)
    book = VerdictBook(tracker=policy.tracker, budget=policy.budget)
    box = (100.0, 100.0, 180.0, 120.0)
    scene, other = np.full((H, W, 3), 90, np.uint8), np.full((H, W, 3), 170, np.uint8)
    for index in range(4):
        policy.decide_all("s", index, scene, [Detection(text="PD 008 HN", score=0.4, box=box)])
    (before,) = policy.tracker.live("s")
    book.receive(_verdict("case-cut-0001", before.track_id, "PO 008 HN"))
    # when the video loops to a frame unlike the last, another plate in the same box
    cases = policy.decide_all("s", 4, other, [Detection(text="EXIT", score=0.4, box=box)])
    # then the old track ended at the cut with its answer, and the new line is its own track
    (after,) = policy.tracker.live("s")
    assert before.ended and report(before).text == "PO 008 HN"
    assert after is not before and report(after).text == "EXIT" and not cases
    # and frames that differ only by noise and motion cut nothing
    for index in range(5, 10):
        noise = np.random.default_rng(index).normal(0, 12, other.shape)
        frame = np.clip(other + noise, 0, 255).astype(np.uint8)
        policy.decide_all("s", index, frame, [Detection(text="EXIT", score=0.4, box=box)])
    assert policy.tracker.live("s") == [after] and after.seen == 6


def test_a_less_sure_answer_does_not_replace_a_surer_one_and_a_surer_one_does() -> None:
    # given a track the cloud answered surely
    policy = _policy(ready_frames=2)
    book = VerdictBook(tracker=policy.tracker, budget=policy.budget)
    box = (100.0, 100.0, 200.0, 120.0)
    for index in range(3):
        policy.decide_all("s", index, _frame(index), [Detection(text="PO 008 HN", score=0.3,
                                                               box=box)])
    track = policy.tracker.live("s")[0]
    book.receive(_verdict("case-pd-0001", track.track_id, "PD 008 HN", score=0.8))
    # when a later answer (another case of the track, or one held up) reads it less surely
    book.receive(_verdict("case-pd-0002", track.track_id, "PO 008 HN", score=0.3))
    # then the surer answer stands; a surer one still replaces it
    assert report(track).text == "PD 008 HN" and report(track).source == "cloud"
    book.receive(_verdict("case-pd-0003", track.track_id, "PD 008 HM", score=0.9))
    assert report(track).text == "PD 008 HM"
