"""Why a frame is escalated: one rule per reason, each declared in its own module (`RULE`),
tried in rank order; the first that answers decides. A track's own reason (`unsure` or
`disagreement`, from its votes) is the policy's (`EscalationPolicy.consider_track`)."""

from __future__ import annotations

import functools
import importlib
import typing
from collections.abc import Callable
from dataclasses import dataclass

from edgefleet.edge.settings import PolicySettings
from edgefleet.shared.messages import Detection, EscalationReason

# One line per rule module: adding a reason is its file (its `RULE`) and its line here. A
# reason the wire does not know yet is also a line of the contract (`EscalationReason`).
MODULES = [
    "edgefleet.edge.reasons.error",
    "edgefleet.edge.reasons.unsure",
    "edgefleet.edge.reasons.empty",
    "edgefleet.edge.reasons.sampled",
]


@dataclass(frozen=True)
class FrameFacts:
    """What a rule may look at: the frame's result, its stream's expectation, and a draw
    from the policy's seeded generator (taken only by a rule that calls it)."""

    detections: list[Detection]
    expect_result: bool
    failed: bool
    settings: PolicySettings
    draw: Callable[[], float]


# True: escalate for this reason; False: not this one, ask the next; None: not at all.
Verdict = bool | None


@dataclass(frozen=True)
class Rule:
    reason: EscalationReason
    applies: Callable[[FrameFacts], Verdict]
    rank: int


@functools.lru_cache(maxsize=1)
def rules() -> list[Rule]:
    """Every declared rule, in the order they are tried (cached)."""
    declared = [importlib.import_module(module).RULE for module in MODULES]
    known = typing.get_args(EscalationReason)
    for rule in declared:
        if rule.reason not in known:
            raise RuntimeError(f"reason {rule.reason!r} is not in the wire's EscalationReason")
    return sorted(declared, key=lambda r: r.rank)


def frame_reason(facts: FrameFacts) -> EscalationReason | None:
    """The reason of the first rule that answers, or None."""
    for rule in rules():
        verdict = rule.applies(facts)
        if verdict is None:
            return None
        if verdict:
            return rule.reason
    return None
