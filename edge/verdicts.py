"""Cloud verdicts matched to the cases this agent sent, with the edge/cloud agreement rate."""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import Counter

from edgefleet.shared.messages import CloudVerdict, Detection

log = logging.getLogger(__name__)

VERDICTS = Counter("ef_edge_verdicts_total", "Cloud verdicts received", ["outcome"])


@dataclass(frozen=True)
class MatchedVerdict:
    """A verdict with the case it answers: stream, frame and edge result (None each if the
    case was not known here), so the application can correct that very frame."""

    verdict: CloudVerdict
    stream_id: str | None
    edge_result: list[Detection] | None
    agrees: bool | None
    frame_index: int | None = None


def result_key(detections: list[Detection]) -> frozenset[str]:
    """What two results must share to agree: their texts or labels, normalised."""
    return frozenset(
        " ".join((d.text or d.label or "").split()).casefold()
        for d in detections
        if (d.text or d.label)
    )


class VerdictBook:
    """Remembers pending cases (bounded), matches verdicts, counts agreement."""

    def __init__(self, max_pending: int = 10_000, keep_recent: int = 100):
        self._pending: OrderedDict[str, tuple[str, list[Detection], int | None]] = OrderedDict()
        self._max = max_pending
        self._lock = threading.Lock()
        self.recent: deque[MatchedVerdict] = deque(maxlen=keep_recent)
        self.callbacks: list[Callable[[MatchedVerdict], None]] = []
        self.matched = 0
        self.agreed = 0
        self.unmatched = 0

    def expect(
        self,
        case_id: str,
        stream_id: str,
        edge_result: list[Detection],
        frame_index: int | None = None,
    ) -> None:
        """Remember a case sent to the cloud; its verdict will carry these back."""
        with self._lock:
            self._pending[case_id] = (stream_id, edge_result, frame_index)
            while len(self._pending) > self._max:
                self._pending.popitem(last=False)

    def receive(self, verdict: CloudVerdict) -> MatchedVerdict:
        with self._lock:
            known = self._pending.pop(verdict.case_id, None)
            if known is None:
                self.unmatched += 1
                matched = MatchedVerdict(verdict, None, None, None)
            else:
                stream_id, edge_result, frame_index = known
                agrees = result_key(edge_result) == result_key(verdict.result)
                self.matched += 1
                self.agreed += int(agrees)
                matched = MatchedVerdict(verdict, stream_id, edge_result, agrees, frame_index)
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

    @property
    def agreement_rate(self) -> float | None:
        with self._lock:
            return self.agreed / self.matched if self.matched else None
