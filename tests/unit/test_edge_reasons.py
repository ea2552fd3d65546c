"""Frame reasons: one rule per file, tried in rank order through the policy."""

from __future__ import annotations

import pytest

from edgefleet.edge import reasons
from edgefleet.edge.policy import EscalationPolicy
from edgefleet.edge.reasons import rules
from edgefleet.edge.settings import PolicySettings
from edgefleet.shared.messages import Detection

SURE = [Detection(text="GRR-7092", score=0.99, box=(0, 0, 10, 10))]


def policy(**settings) -> EscalationPolicy:
    return EscalationPolicy(PolicySettings(seed=1, **settings))


@pytest.fixture
def listed(monkeypatch):
    """Put modules on the rules' list, and the cache rebuilt around the test."""

    def add(*modules: str) -> None:
        monkeypatch.setattr(reasons, "MODULES", [*reasons.MODULES, *modules])
        rules.cache_clear()

    yield add
    rules.cache_clear()


def test_the_shipped_rules_in_their_order_and_what_each_decides():
    assert [r.reason for r in rules()] == ["error", "unsure", "empty", "sampled"]
    p = policy(escalate="frames", sample_share=0.0)
    assert p.reason([], expect_result=True, failed=True) == "error"
    assert policy(escalate_errors=False).reason([], expect_result=True, failed=True) is None
    unsure = [Detection(text="x", score=0.5, box=(0, 0, 1, 1))]
    assert p.reason(unsure, expect_result=True, failed=False) == "unsure"
    assert p.reason([], expect_result=True, failed=False) == "empty"
    assert p.reason([], expect_result=False, failed=False) is None
    assert policy(sample_share=1.0).reason(SURE, expect_result=False, failed=False) == "sampled"


def test_the_sample_draws_only_where_no_earlier_rule_answered():
    """The seeded sequence of draws is the same as before rules were files: a frame that
    failed or was unsure takes no draw."""
    a, b = policy(sample_share=0.5), policy(sample_share=0.5)
    for _ in range(5):
        a.reason([], expect_result=False, failed=True)  # error: no draw
    drawn_a = [a.reason(SURE, expect_result=False, failed=False) for _ in range(20)]
    drawn_b = [b.reason(SURE, expect_result=False, failed=False) for _ in range(20)]
    assert drawn_a == drawn_b and "sampled" in drawn_a and None in drawn_a


def test_a_reason_added_by_one_file_and_one_line_decides_in_its_place(listed):
    p = policy(sample_share=0.0)
    assert p.reason(SURE, expect_result=False, failed=False) is None
    listed("tests.support.watch_reason")
    assert [r.rank for r in rules()] == [0, 1, 2, 2, 3]
    assert p.reason(SURE, expect_result=False, failed=False) == "sampled"
    assert p.reason([], expect_result=True, failed=True) == "error"  # the failure still first


def test_a_rule_for_a_reason_the_wire_does_not_know_is_refused(listed, tmp_path, monkeypatch):
    (tmp_path / "glare_reason.py").write_text(
        "from edgefleet.edge.reasons import Rule\nRULE = Rule('glare', lambda facts: True, 5)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    listed("glare_reason")
    with pytest.raises(RuntimeError, match="reason 'glare' is not in the wire's EscalationReason"):
        rules()
