"""Cloud verdicts matched to the cases this agent sent, with the edge/cloud agreement rate.

A verdict naming a track becomes that track's result (open or recently ended); its
agreement with the edge feeds the budget's score buckets, and the cloud's reported wait
its pace. A verdict for a case or track not known here is recorded, never an error.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import Counter

from edgefleet.edge.budget import EscalationBudget
from edgefleet.edge.tracks import Tracker
from edgefleet.shared.messages import CaseId, CloudVerdict, Detection, StreamId, TrackId

log = logging.getLogger(__name__)

VERDICTS = Counter("ef_edge_verdicts_total", "Cloud verdicts received", ["outcome"])


@dataclass(frozen=True)
class MatchedVerdict:
    """A verdict with the case it answers: stream, frame and edge result (None each if the
    case was not known here), so the application can correct that very frame."""

    verdict: CloudVerdict
    stream_id: StreamId | None
    edge_result: list[Detection] | None
    agrees: bool | None
    frame_index: int | None = None
    track_id: TrackId | None = None
    track_result: str | None = None  # the track's result now (the cloud's answer)
    track_known: bool | None = None  # None: the verdict names no track


_Expected = tuple[StreamId, list[Detection], int | None, float | None]


def result_key(detections: list[Detection]) -> frozenset[str]:
    """What two results must share to agree: their texts or labels, normalised."""
    return frozenset(
        " ".join((d.text or d.label or "").split()).casefold()
        for d in detections
        if (d.text or d.label)
    )


class VerdictBook:
    """Remembers pending cases (bounded), matches verdicts, counts agreement."""

    def __init__(
        self,
        max_pending: int = 10_000,
        keep_recent: int = 100,
        *,
        tracker: Tracker | None = None,
        budget: EscalationBudget | None = None,
    ):
        # case -> (stream, edge result, frame index, score)
        self._pending: OrderedDict[CaseId, _Expected] = OrderedDict()
        self.tracker, self.budget = tracker, budget
        self._max = max_pending
        self._lock = threading.Lock()
        self.recent: deque[MatchedVerdict] = deque(maxlen=keep_recent)
        self.callbacks: list[Callable[[MatchedVerdict], None]] = []
        self.matched = 0
        self.agreed = 0
        self.unmatched = 0
        self.unknown_tracks = 0

    def expect(
        self,
        case_id: CaseId,
        stream_id: StreamId,
        edge_result: list[Detection],
        frame_index: int | None = None,
        score: float | None = None,
    ) -> None:
        """Remember a case sent to the cloud (`score`: the edge's confidence in it)."""
        with self._lock:
            self._pending[case_id] = (stream_id, edge_result, frame_index, score)
            while len(self._pending) > self._max:
                self._pending.popitem(last=False)

    def receive(self, verdict: CloudVerdict) -> MatchedVerdict:
        track_result, track_known = self._apply_to_track(verdict)
        with self._lock:
            known = self._pending.pop(verdict.case_id, None)
            track = (verdict.track_id, track_result, track_known)
            if known is None:
                self.unmatched += 1
                matched = MatchedVerdict(verdict, None, None, None, None, *track)
            else:
                stream_id, edge_result, frame_index, score = known
                agrees = result_key(edge_result) == result_key(verdict.result)
                self.matched += 1
                self.agreed += int(agrees)
                matched = MatchedVerdict(
                    verdict, stream_id, edge_result, agrees, frame_index, *track
                )
                if self.budget is not None and score is not None and verdict.fallback_level < 2:
                    self.budget.verdict(score, agrees)
            self.recent.append(matched)
        VERDICTS.labels(
            "unmatched" if matched.agrees is None else ("agree" if matched.agrees else "disagree")
        ).inc()
        for callback in list(self.callbacks):
            try:
                callback(matched)
            except Exception:  # an application callback must not break the uplink
                log.exception("verdict callback failed")
        return matched

    def _apply_to_track(self, verdict: CloudVerdict) -> tuple[str | None, bool | None]:
        """The cloud's answer lands on its track: (the track's result, whether known)."""
        if self.budget is not None and verdict.expected_wait_s is not None:
            self.budget.cloud_wait(verdict.expected_wait_s)
        if verdict.track_id is None or self.tracker is None:
            return None, None
        if verdict.fallback_level >= 3:  # "busy": no answer to act on
            track = self.tracker.get(verdict.track_id)
        else:
            track = self.tracker.apply_verdict(verdict.track_id, verdict.result)
        if track is None:
            with self._lock:
                self.unknown_tracks += 1
            log.info("verdict %s for unknown track %s", verdict.case_id, verdict.track_id)
            return None, False
        return track.result()[0], True

    @property
    def agreement_rate(self) -> float | None:
        with self._lock:
            return self.agreed / self.matched if self.matched else None
