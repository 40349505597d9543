"""The ladder's truncation rule: which budget applies, and when shedding wins
(hand-computed budgets; pure)."""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType

import pytest

from ext_proc.policy.decision import (
    Downgrade,
    Pass,
    Reject,
    Truncated,
    TruncateHistory,
    verdict_headers,
)
from ext_proc.policy.evaluate import evaluate
from ext_proc.policy.pressure import Pressure
from ext_proc.policy.settings import Level, Profile, TruncationSpec
from ext_proc.schemas import RequestFeatures

SPEC = TruncationSpec(
    budget_tokens=MappingProxyType({Level.HIGH: 6000, Level.CRITICAL: 3000}),
    low_efficiency_budget_tokens=5000,
)
PROFILE = Profile(
    name="t", max_model_len=8192, output_buffer_tokens=1024, min_output_tokens=16, truncation=SPEC
)
LOW = Pressure(10.0, Level.LOW)
HIGH = Pressure(70.0, Level.HIGH)
CRITICAL = Pressure(95.0, Level.CRITICAL)


def feats(input_tokens: int, schema: str = "openai.chat") -> RequestFeatures:
    return RequestFeatures(schema, "m", input_tokens, 256, "max_tokens", False, 10)


@pytest.mark.parametrize(
    ("input_tokens", "pressure", "efficiency", "expected"),
    [
        (5000, LOW, None, None),  # low has no budget; context room is plenty
        (6000, HIGH, None, None),  # exactly the budget
        (6001, HIGH, None, TruncateHistory(HIGH, 6000, "pressure_budget")),
        (3001, CRITICAL, None, TruncateHistory(CRITICAL, 3000, "pressure_budget")),
        # efficiency 0.30 < 0.45: the low-efficiency budget 5000
        (5001, LOW, 0.30, TruncateHistory(LOW, 5000, "cache_efficiency")),
        (5001, LOW, 0.50, None),
        # both apply at high: the smaller wins
        (6001, HIGH, 0.30, TruncateHistory(HIGH, 5000, "cache_efficiency")),
        # input > 8192 - 16 = 8176: budget 8192 - 1024 = 7168
        (8177, LOW, None, TruncateHistory(LOW, 7168, "context_budget")),
        (8176, LOW, None, None),
        (8177, None, None, TruncateHistory(None, 7168, "context_budget")),
    ],
)
def test_truncation_budget(
    input_tokens: int, pressure: Pressure | None, efficiency: float | None, expected: object
) -> None:
    # critical priority: never shed, so shedding does not hide the rule
    decision = evaluate(
        feats(input_tokens), pressure, PROFILE, "critical", cache_efficiency=efficiency
    )
    if expected is None:
        assert not isinstance(decision, TruncateHistory)
    else:
        assert decision == expected


def test_a_context_budget_falls_back_to_min_output_when_the_buffer_is_the_whole_context() -> None:
    profile = replace(PROFILE, max_model_len=2048, output_buffer_tokens=2048)
    decision = evaluate(feats(2040), LOW, profile, "standard")
    assert decision == TruncateHistory(LOW, 2048 - 16, "context_budget")


def test_shedding_wins_over_truncation() -> None:
    decision = evaluate(feats(7000), CRITICAL, PROFILE, "sheddable")
    assert isinstance(decision, Reject) and decision.status == 429


def test_completions_and_profiles_without_truncation_are_never_truncated() -> None:
    assert not isinstance(
        evaluate(feats(7000, "openai.completions"), HIGH, PROFILE, "standard"), TruncateHistory
    )
    plain = replace(PROFILE, truncation=None)
    assert not isinstance(evaluate(feats(7000), HIGH, plain, "standard"), TruncateHistory)


def test_truncated_headers_show_what_was_dropped_and_any_downgrade() -> None:
    done = Truncated(
        then=Downgrade(HIGH, 512, 2048, "pressure_cap"),
        reason="pressure_budget",
        dropped_messages=6,
        saved_tokens=2100,
        mode="recency",
        fallback="deadline",
    )
    assert verdict_headers(done) == [
        ("x-mem-pressure", "high"),
        ("x-mem-pressure-score", "70"),
        ("x-ice-decision", "truncate"),
        ("x-ice-truncated", "messages=6;tokens=2100;mode=recency;fallback=deadline"),
        ("x-downgraded", "true"),
        ("x-ice-original-max-tokens", "2048"),
        ("x-ice-reason", "pressure_budget"),
    ]
    plain = Truncated(Pass(LOW), "context_budget", 2, 300, "semantic")
    assert ("x-ice-truncated", "messages=2;tokens=300;mode=semantic") in verdict_headers(plain)
