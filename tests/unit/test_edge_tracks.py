"""Text tracks on synthetic sequences, the escalation budget under floods, and verdicts
acting on tracks (open, ended, unknown)."""

from __future__ import annotations

import cv2
import numpy as np

from edgefleet.edge.budget import EscalationBudget
from edgefleet.edge.policy import EscalationPolicy
from edgefleet.edge.settings import BudgetSettings, PolicySettings, TrackSettings
from edgefleet.edge.tracks import Tracker, report, similarity
from edgefleet.edge.verdicts import VerdictBook
from edgefleet.shared.messages import CloudVerdict, Detection
from tests.support.clock import FakeClock


def _frame(seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 255, (240, 320, 3), dtype=np.uint8)


def _det(text: str, score: float, x: float, y: float = 50.0, w: float = 80.0) -> Detection:
    return Detection(text=text, score=score, box=(x, y, x + w, y + 20.0))


def _verdict(
    case_id: str, track_id: str | None, text: str, score: float = 0.97, **kw
) -> CloudVerdict:
    return CloudVerdict(
        device_id="cam-01",
        trace_id="0" * 32,
        case_id=case_id,
        result=[Detection(text=text, score=score)] if text else [],
        model="ppocr6-small@6.0",
        route="default",
        fallback_level=0,
        latency_ms=12.0,
        track_id=track_id,
        **kw,
    )


def test_a_moving_line_is_one_track_and_its_reading_is_the_weighted_vote() -> None:
    # given one line drifting right 4 px a frame, read right on most frames
    tracker = Tracker(TrackSettings())
    reads = [("MSCU1234565", 0.9), ("MSCU1Z34565", 0.6), ("MSCU1234565", 0.8), ("MSCU1234S65", 0.5)]
    # and a second, still line elsewhere
    tracks = []
    for i, (text, score) in enumerate(reads):
        got = tracker.update(
            "s", i, _frame(i), [_det(text, score, 10 + 4 * i), _det("EXIT", 0.99, 200, 150)]
        )
        tracks.append([t.track_id for t in got])
    # then each line keeps one track id across the frames
    assert len({ids[0] for ids in tracks}) == 1 and len({ids[1] for ids in tracks}) == 1
    assert tracks[0][0] != tracks[0][1]
    track = tracker.get(tracks[0][0])
    assert track is not None and track.frames == 4
    # and its reading is the confidence-weighted vote: 1.7 of 2.8 for the right text
    text, score = track.reading()
    assert text == "MSCU1234565" and abs(score - 1.7 / 4) < 1e-9
    assert track.agreement() == 0.5
    # and it keeps at most max_crops crops
    assert 1 <= len(track.crops) <= TrackSettings().max_crops


def test_a_different_text_in_the_same_place_after_a_gap_is_a_new_track() -> None:
    tracker = Tracker(TrackSettings(max_gap=2))
    first = tracker.update("s", 0, _frame(), [_det("GATE 7", 0.9, 10)])[0]
    # a low overlap and an unlike reading do not join
    other = tracker.update("s", 1, _frame(), [_det("DOCK 12", 0.9, 70)])[0]
    assert other.track_id != first.track_id
    # after max_gap frames unseen the first track ends (it is still found by id)
    tracker.update("s", 5, _frame(), [])
    assert first.ended and tracker.get(first.track_id) is first
    assert similarity("GATE 7", "gate7") == 1.0


def test_each_unsure_track_is_escalated_once_with_its_best_crops_tiled() -> None:
    # given a generous budget and a line read unsurely on every frame
    policy = EscalationPolicy(
        PolicySettings(sample_share=0.0, budget=BudgetSettings(share=1.0, burst=5)),
        clock=FakeClock(),
    )
    cases = []
    for i in range(10):
        frame = _frame(i)
        cv2.putText(frame, "AB12", (20 + 3 * i, 65), cv2.FONT_HERSHEY_SIMPLEX, 0.6, (0, 0, 0), 2)
        cases += policy.decide_all("s", i, frame, [_det("AB12", 0.4, 15 + 3 * i)])
    # then exactly one case, once the track was read on ready_frames frames
    assert len(cases) == 1
    case = cases[0]
    assert case.track_id is not None and case.reason == "unsure" and case.crop is None
    assert 1 <= len(case.tiles) <= 3 and case.edge_result is not None
    assert case.edge_result[0].text == "AB12"
    # and the tiles lie inside the one JPEG, one under the other
    img = cv2.imdecode(np.frombuffer(case.jpeg, np.uint8), cv2.IMREAD_COLOR)
    bottom = max(t.y + t.h for t in case.tiles)
    assert bottom == img.shape[0] and max(t.w for t in case.tiles) == img.shape[1]


def test_a_track_its_own_frames_disagree_on_is_escalated_as_disagreement() -> None:
    policy = EscalationPolicy(
        PolicySettings(sample_share=0.0, budget=BudgetSettings(share=1.0)), clock=FakeClock()
    )
    reads = ["HL591RJ", "HL59IRJ", "HLS91RJ"]
    cases = []
    for i, text in enumerate(reads):
        cases += policy.decide_all("s", i, _frame(i), [_det(text, 0.7, 10 + i)])
    assert [c.reason for c in cases] == ["disagreement"]


def test_the_budget_holds_under_a_flood_of_unsure_tracks() -> None:
    # given a 10% budget and a flood: every frame brings new, very unsure text
    budget = EscalationBudget(BudgetSettings(share=0.1, burst=2), clock=FakeClock())
    sent = 0
    for _ in range(1000):
        budget.frame("s")
        sent += sum(budget.consider("s", 0.05 + 0.001 * (k % 7)) for k in range(3))
    # then the cases stay within 10% of the frames (plus the saved-up burst)
    assert sent <= 0.1 * 1000 + 2
    assert sent >= 0.1 * 1000 - 2  # and the budget is spent, not wasted
    # and the threshold tracks the unsure end of the recent distribution
    assert budget.threshold("s") < 0.06


def test_the_budget_goes_to_the_least_sure_tracks() -> None:
    budget = EscalationBudget(BudgetSettings(share=0.1, burst=1), clock=FakeClock())
    rng = np.random.default_rng(0)
    picked, passed = [], []
    for _ in range(2000):
        budget.frame("s")
        score = float(rng.uniform(0.3, 0.97))
        (picked if budget.consider("s", score) else passed).append(score)
    assert np.mean(picked) < np.mean(passed) - 0.2


def test_a_fresh_stream_starts_with_its_burst_saved_up() -> None:
    # given a 10% budget with a burst of 3, and a camera that has just come up
    budget = EscalationBudget(BudgetSettings(share=0.1, burst=3), clock=FakeClock())
    budget.frame("s")
    # then three unsure tracks of its first frame are asked about at once, a fourth is not
    assert [budget.consider("s", 0.1) for _ in range(4)] == [True, True, True, False]
    # and a stream without a budget (the tracks alone) has nothing saved up
    none = EscalationBudget(BudgetSettings(share=0.0, burst=3), clock=FakeClock())
    none.frame("s")
    assert not none.consider("s", 0.1)


def test_credit_that_is_short_goes_to_the_least_sure_track_of_the_frame() -> None:
    # given credit for one case, and two lines that become ready on the same frame: the
    # sure one detected first, the unsure one second
    policy = EscalationPolicy(
        PolicySettings(sample_share=0.0, budget=BudgetSettings(share=0.34, burst=1)),
        clock=FakeClock(),
    )
    cases = []
    for i in range(3):
        lines = [_det("GATE 7", 0.95, 10 + i), _det("HL591RJ", 0.3, 150 + i, y=150.0)]
        cases += policy.decide_all("s", i, _frame(i), lines)
    # then the one case asks about the unsure line
    assert len(cases) == 1 and cases[0].edge_result is not None
    assert cases[0].edge_result[0].text == "HL591RJ"


def test_buckets_where_the_cloud_always_agrees_stop_being_escalated() -> None:
    settings = BudgetSettings(share=1.0, burst=100, agree_streak=4, explore_every=5)
    budget = EscalationBudget(settings, clock=FakeClock())
    for _ in range(4):
        budget.verdict(0.85, agrees=True)  # bucket 8: the cloud agreed every time
        budget.verdict(0.45, agrees=False)  # bucket 4: it disagreed
    for _ in range(30):  # credit for 30 cases
        budget.frame("s")
    sent_high = sum(budget.consider("s", 0.85) for _ in range(10))
    sent_low = sum(budget.consider("s", 0.45) for _ in range(10))
    # then the agreeing bucket only gets the exploration share, the other everything
    assert sent_high == 2 and sent_low == 10
    assert budget.agreement()[8] == 1.0 and budget.agreement()[4] == 0.0


def test_the_budget_shrinks_while_the_cloud_is_behind() -> None:
    def spend(wait_s: float) -> int:
        budget = EscalationBudget(BudgetSettings(share=0.2, burst=1, max_wait_s=2.0))
        budget.cloud_wait(wait_s)
        sent = 0
        for _ in range(500):
            budget.frame("s")
            sent += budget.consider("s", 0.1)
        return sent

    assert spend(0.5) == 100
    assert spend(8.0) == 25  # four times the allowed wait: a quarter of the budget


def test_verdicts_act_on_open_ended_and_unknown_tracks() -> None:
    tracker = Tracker(TrackSettings(max_gap=1))
    budget = EscalationBudget(BudgetSettings())
    book = VerdictBook(tracker=tracker, budget=budget)
    seen: list = []
    book.callbacks.append(seen.append)
    track = tracker.update("s", 0, _frame(), [_det("HL 591 RJ", 0.5, 10)])[0]
    book.expect("case-open-1", "s", [_det("HL 591 RJ", 0.5, 10)], frame_index=0, score=0.5)
    # an open track: its result becomes the cloud's answer, in the callback too
    matched = book.receive(_verdict("case-open-1", track.track_id, "HL 591 BJ", expected_wait_s=9))
    assert matched.track_known and matched.track_result == "HL 591 BJ"
    assert track.result() == ("HL 591 BJ", 0.97) and seen[-1] is matched
    assert matched.agrees is False and budget.agreement()[5] == 0.0
    # an ended track still takes a late verdict
    tracker.update("s", 5, _frame(), [])
    assert track.ended
    late = book.receive(_verdict("case-late-01", track.track_id, "HL 591 RJ"))
    assert late.track_known and track.result()[0] == "HL 591 RJ"
    # an unknown track (e.g. from before a restart: ids differ between runs) is recorded,
    # not an error
    assert Tracker(TrackSettings()).update("s", 0, _frame(), [_det("A", 0.5, 10)])[0].track_id != (
        track.track_id
    )
    unknown = book.receive(_verdict("case-unkn-01", "s-999", "EXIT"))
    assert unknown.track_known is False and book.unknown_tracks == 1
    assert list(book.recent)[-1] is unknown


def test_an_answer_less_sure_than_the_tracks_own_vote_does_not_overturn_it() -> None:
    # given a track twenty frames read alike, surely (its vote 0.9)
    tracker = Tracker(TrackSettings())
    book = VerdictBook(tracker=tracker)
    for i in range(20):
        track = tracker.update("s", i, _frame(), [_det("PD 008 HN", 0.9, 10 + i)])[0]
    assert track.reading() == ("PD 008 HN", 0.9)
    # when the cloud reads a blurred crop of it less surely, and differently
    unsure = book.receive(_verdict("case-blur-01", track.track_id, "PO 008 HN", 0.33))
    # then the track keeps its vote, reported as the edge's, with the answer kept beside
    assert unsure.track_known and unsure.track_result == "PD 008 HN"
    assert track.outcome() == ("PD 008 HN", 0.9, False)
    assert track.cloud is not None and track.cloud.text == "PO 008 HN"
    assert report(track).source == "edge"
    # and an empty answer (the cloud found no text) does not blank it either
    book.receive(_verdict("case-none-01", track.track_id, ""))
    assert track.result() == ("PD 008 HN", 0.9)
    # but an answer at least as sure as the vote stands
    sure = book.receive(_verdict("case-sure-01", track.track_id, "PB 008 HN", 0.9))
    assert sure.track_result == "PB 008 HN" and report(track).source == "cloud"


def test_a_cases_per_minute_budget_holds_on_the_clock() -> None:
    # given 6 cases a minute per stream (no frame share), 10 frames a second for 2 minutes
    clock = FakeClock()
    budget = EscalationBudget(BudgetSettings(share=0.0, per_min=6.0, burst=2), clock=clock)
    sent = 0
    for _ in range(1200):
        clock.now += 0.1
        budget.frame("s")
        sent += budget.consider("s", 0.1)
    # then 12 cases went, give or take the saved-up burst
    assert 11 <= sent <= 12 + 2
