"""`sampled`: the drift sample, a seeded share of frames asked about whatever they show."""

from __future__ import annotations

from edgefleet.edge.reasons import FrameFacts, Rule, Verdict


def drawn(facts: FrameFacts) -> Verdict:
    share = facts.settings.sample_share
    return share > 0 and facts.draw() < share


RULE = Rule("sampled", drawn, rank=3)
