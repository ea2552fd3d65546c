"""`error`: the model failed on the frame. A failed frame is asked about for this reason
or not at all (its empty result says nothing)."""

from __future__ import annotations

from edgefleet.edge.reasons import FrameFacts, Rule, Verdict


def failed(facts: FrameFacts) -> Verdict:
    if not facts.failed:
        return False
    return True if facts.settings.escalate_errors else None


RULE = Rule("error", failed, rank=0)
