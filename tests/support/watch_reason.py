"""A test-only rule: a frame is asked about (as `sampled`) when it reads a watched text.

It shows what adding a reason takes: this one file (its `RULE`) and its module's line in
`edgefleet.edge.reasons.MODULES`; a reason the wire does not know would also be a line of
`edgefleet.shared.messages.EscalationReason`.
"""

from __future__ import annotations

from edgefleet.edge.reasons import FrameFacts, Rule, Verdict

WATCHED = {"GRR-7092"}


def watched(facts: FrameFacts) -> Verdict:
    return any(d.text in WATCHED for d in facts.detections)


RULE = Rule("sampled", watched, rank=2)  # after `empty` (listed first), before the sample
