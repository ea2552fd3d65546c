"""`unsure` (`escalate: frames`): a reading scored inside the unsure band."""

from __future__ import annotations

from edgefleet.edge.reasons import FrameFacts, Rule, Verdict


def in_band(facts: FrameFacts) -> Verdict:
    s = facts.settings
    if s.escalate != "frames":
        return False
    return any(s.unsure_low <= d.score < s.unsure_high for d in facts.detections)


RULE = Rule("unsure", in_band, rank=1)
