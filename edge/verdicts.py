"""Cloud verdicts matched to the cases this agent sent, with the edge/cloud agreement rate."""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import Counter

from shared.messages import CloudVerdict, Detection

log = logging.getLogger(__name__)

VERDICTS = Counter("ef_edge_verdicts_total", "Cloud verdicts received", ["outcome"])


@dataclass(frozen=True)
class MatchedVerdict:
    """A verdict with the edge result it answers (None if the case was not known here)."""

    verdict: CloudVerdict
    stream_id: str | None
    edge_result: list[Detection] | None
    agrees: bool | None


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
        self._pending: OrderedDict[str, tuple[str, list[Detection]]] = OrderedDict()
        self._max = max_pending
        self._lock = threading.Lock()
        self.recent: deque[MatchedVerdict] = deque(maxlen=keep_recent)
        self.callbacks: list[Callable[[MatchedVerdict], None]] = []
        self.matched = 0
        self.agreed = 0
        self.unmatched = 0

    def expect(self, case_id: str, stream_id: str, edge_result: list[Detection]) -> None:
        with self._lock:
            self._pending[case_id] = (stream_id, edge_result)
            while len(self._pending) > self._max:
                self._pending.popitem(last=False)

    def receive(self, verdict: CloudVerdict) -> MatchedVerdict:
        with self._lock:
            known = self._pending.pop(verdict.case_id, None)
            if known is None:
                self.unmatched += 1
                matched = MatchedVerdict(verdict, None, None, None)
            else:
                agrees = result_key(known[1]) == result_key(verdict.result)
                self.matched += 1
                self.agreed += int(agrees)
                matched = MatchedVerdict(verdict, known[0], known[1], agrees)
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
