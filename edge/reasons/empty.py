"""`empty`: nothing found on a stream where something is expected."""

from __future__ import annotations

from edgefleet.edge.reasons import FrameFacts, Rule, Verdict


def nothing_found(facts: FrameFacts) -> Verdict:
    return facts.expect_result and facts.settings.escalate_empty and not facts.detections


RULE = Rule("empty", nothing_found, rank=2)
