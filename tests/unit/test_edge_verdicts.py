"""VerdictBook: cloud verdicts matched to their case (stream, frame, edge result), agreement."""

from __future__ import annotations

from edgefleet.edge.verdicts import MatchedVerdict, VerdictBook, result_key
from edgefleet.shared.messages import CloudVerdict, Detection


def _verdict(case_id: str, *texts: str) -> CloudVerdict:
    return CloudVerdict(
        device_id="cam-01",
        trace_id="a" * 32,
        case_id=case_id,
        result=[Detection(text=t, score=0.99) for t in texts],
        model="ppocr-heavy@4.0",
        route="ocr",
        fallback_level=0,
        latency_ms=5.0,
    )


def test_a_verdict_carries_the_stream_frame_and_edge_result_of_its_case() -> None:
    # given two cases the edge sent, from different frames
    book = VerdictBook()
    seen: list[MatchedVerdict] = []
    book.callbacks.append(seen.append)
    book.expect("case-aaaa", "gate", [Detection(text="GATE 07", score=0.5)], frame_index=7)
    book.expect("case-bbbb", "dock", [Detection(text="D0CK", score=0.4)], frame_index=12)
    # when the cloud answers both, one agreeing and one correcting
    first = book.receive(_verdict("case-aaaa", "gate  07"))
    second = book.receive(_verdict("case-bbbb", "DOCK"))
    # then each answer names its stream and frame, and agreement is counted
    assert (first.stream_id, first.frame_index, first.agrees) == ("gate", 7, True)
    assert (second.stream_id, second.frame_index, second.agrees) == ("dock", 12, False)
    assert second.edge_result == [Detection(text="D0CK", score=0.4)]
    assert seen == [first, second] and list(book.recent) == [first, second]
    assert book.agreement_rate == 0.5


def test_unknown_and_repeated_verdicts_are_unmatched_and_not_in_the_rate() -> None:
    book = VerdictBook()
    assert book.agreement_rate is None
    book.expect("case-aaaa", "gate", [], frame_index=0)
    assert book.receive(_verdict("case-aaaa")).agrees is True  # empty agrees with empty
    again = book.receive(_verdict("case-aaaa"))  # a redelivery: the case is no longer pending
    stranger = book.receive(_verdict("not-ours-1", "X"))
    assert again.agrees is None and again.frame_index is None and again.stream_id is None
    assert stranger.agrees is None
    assert (book.matched, book.unmatched, book.agreement_rate) == (1, 2, 1.0)


def test_pending_cases_are_bounded_oldest_first() -> None:
    book = VerdictBook(max_pending=2)
    for i in range(3):
        book.expect(f"case-000{i}", "gate", [], frame_index=i)
    assert book.receive(_verdict("case-0000")).agrees is None  # forgotten
    assert book.receive(_verdict("case-0002")).frame_index == 2


def test_a_failing_application_callback_does_not_stop_matching() -> None:
    book = VerdictBook()

    def broken(_: MatchedVerdict) -> None:
        raise RuntimeError("application bug")

    book.callbacks.append(broken)
    book.expect("case-aaaa", "gate", [], frame_index=3)
    assert book.receive(_verdict("case-aaaa")).frame_index == 3
    assert book.matched == 1


def test_results_agree_on_texts_or_labels_regardless_of_case_and_spacing() -> None:
    a = [Detection(text=" Gate  7 ", score=0.3), Detection(label="truck", score=0.9)]
    b = [Detection(label="TRUCK", score=0.5), Detection(text="gate 7", score=0.8)]
    assert result_key(a) == result_key(b)
    assert result_key([Detection(text="gate 1", score=1)]) != result_key(b)
