"""From an escalation decision to a case in the outbox, serialised once.

The case is built, fitted to what an MQTT user property holds, serialised, and stored
with its image; the uplink later signs those very bytes. Only once it is stored does the
verdict book expect an answer and do the application's callbacks hear of it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from prometheus_client import Counter

from edgefleet.edge.outbox import Outbox
from edgefleet.edge.pipeline import Work
from edgefleet.edge.policy import Escalation
from edgefleet.edge.slot import ModelSlot
from edgefleet.edge.verdicts import VerdictBook
from edgefleet.shared.messages import EscalationCase
from edgefleet.shared.wire import serialise_case

log = logging.getLogger(__name__)

META_TRIMMED = Counter(
    "ef_edge_case_meta_trimmed_total", "Cases whose edge result was cut to fit in ef-meta"
)


class CaseWriter:
    """Called from the pipeline's post stage, one escalation at a time."""

    def __init__(self, device_id: str, *, outbox: Outbox, verdicts: VerdictBook, model: ModelSlot):
        self.device_id = device_id
        self.outbox = outbox
        self.verdicts = verdicts
        self.model = model
        self.created = 0
        self.callbacks: list[Callable[[EscalationCase], None]] = []

    def write(self, work: Work, escalation: Escalation) -> EscalationCase | None:
        """Store the case of `escalation`; None when the full outbox dropped it (counted)."""
        frame = work.frame
        edge_result = (
            list(escalation.edge_result)
            if escalation.edge_result is not None
            else work.detections[:1000]
        )
        case = EscalationCase(
            device_id=self.device_id,
            stream_id=frame.stream_id,
            frame_index=frame.index,
            reason=escalation.reason,
            edge_result=edge_result,
            model=work.model or self.model.info,
            content_type="image/jpeg",
            crop=escalation.crop,
            track_id=escalation.track_id,
            tiles=list(escalation.tiles),
        )
        fitted, message = serialise_case(case, escalation.jpeg)
        if len(fitted.edge_result) < len(case.edge_result):
            META_TRIMMED.inc()
            log.warning(
                "case %s: %d of %d edge lines kept so its metadata fits in MQTT",
                case.case_id,
                len(fitted.edge_result),
                len(case.edge_result),
            )
        if not self.outbox.put(message):
            return None
        self.created += 1
        self.verdicts.expect(
            fitted.case_id,
            frame.stream_id,
            fitted.edge_result,
            frame_index=frame.index,
            score=escalation.score,
        )
        for callback in self.callbacks:
            callback(fitted)
        return fitted
