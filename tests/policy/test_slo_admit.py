"""``admission: slo``'s rule (ext_proc.policy.slo_admit; docs/slo.md, "Decisions"), each
branch against values computed by hand, alone and as the ladder's rule 2a."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ext_proc.policy.decision import Pass, Reject, Wait
from ext_proc.policy.evaluate import evaluate
from ext_proc.policy.load import parse_policy
from ext_proc.policy.pressure import Pressure
from ext_proc.policy.settings import Level, Profile, QueueSpec
from ext_proc.policy.slo_admit import SloCase, slo_decision, slo_retry_after_s
from ext_proc.schemas import RequestFeatures

LOW = Pressure(10.0, Level.LOW)
PROFILE = Profile(name="p", max_model_len=8192, admission="slo", retry_after_max_s=30)
QUEUED = replace(PROFILE, queue=QueueSpec())
DRAIN = 7  # the pool's drain-based Retry-After, given to the rule


def feats() -> RequestFeatures:
    return RequestFeatures(
        schema="openai.chat",
        model="m",
        input_tokens=800,
        max_tokens=64,
        max_tokens_field="max_tokens",
        stream=False,
        message_count=1,
    )


def case(**kw: float | None) -> SloCase:
    """T = 2 s, U = 50 ms; predicted t = 1.4 s, u = 40 ms, u₁ = 10 ms; nothing else running."""
    base = dict(
        ttft_target_s=2.0,
        tpot_target_s=0.05,
        waited_s=0.0,
        ttft_s=1.4,
        tpot_s=0.04,
        alone_tpot_s=0.01,
        tightest_tpot_s=None,
    )
    base.update(kw)
    return SloCase(**base)  # type: ignore[arg-type]


def judge(c: SloCase, priority: str = "standard") -> object:
    return slo_decision(c, priority, PROFILE, LOW, DRAIN)  # type: ignore[arg-type]


def test_within_both_targets_the_rule_says_nothing() -> None:
    assert judge(case()) is None
    # the ladder goes on: a pass
    assert evaluate(feats(), LOW, PROFILE, "standard", slo=case()) == Pass(LOW)


def test_a_ttft_over_its_target_is_refused_at_once_with_retry_after_from_the_prediction() -> None:
    # t = 3.4 s > T = 2 s: Retry-After = ceil(3.4 − 2) = 2 s
    got = judge(case(ttft_s=3.4))
    assert isinstance(got, Reject)
    assert (got.status, got.reason, got.retry_after_s) == (429, "slo_unreachable", 2)
    assert "3400 ms" in got.message and "2000 ms" in got.message
    # as the ladder's rule, even where a queue could hold it: never a wait that ends in a miss
    d = evaluate(feats(), LOW, QUEUED, "standard", slo=case(ttft_s=3.4))
    assert isinstance(d, Reject) and d.reason == "slo_unreachable"


def test_the_wait_so_far_counts_against_the_target() -> None:
    # budget = 2.0 − 0.7 = 1.3 s < t = 1.4 s: refused; ceil(1.4 − 2) = 0 → the minimum 1 s
    got = judge(case(waited_s=0.7))
    assert isinstance(got, Reject) and got.reason == "slo_unreachable"
    assert got.retry_after_s == PROFILE.retry_after_min_s == 1
    assert "700 ms of it spent waiting" in got.message
    # budget = 2.0 − 0.6 = 1.4 s = t: it makes it exactly
    assert judge(case(waited_s=0.6)) is None


def test_retry_after_is_clamped_to_the_profile() -> None:
    # ceil(100 − 2) = 98 s > retry_after_max_s = 30
    assert slo_retry_after_s(case(ttft_s=100.0), PROFILE) == 30
    assert slo_retry_after_s(case(ttft_s=2.01), PROFILE) == 1
    assert slo_retry_after_s(case(ttft_target_s=None), PROFILE) is None


def test_a_tpot_over_its_own_target_waits_in_the_queue() -> None:
    # u = 60 ms > U = 50 ms; u₁ = 10 ms ≤ U: it may fit once fewer sequences run
    got = judge(case(tpot_s=0.06))
    assert isinstance(got, Wait) and got.reason == "slo_tpot" and got.retry_after_s == DRAIN
    assert "60 ms" in got.message and "its own target (50 ms)" in got.message
    queued = evaluate(feats(), LOW, QUEUED, "standard", slo=case(tpot_s=0.06))
    assert isinstance(queued, Wait) and queued.reason == "slo_tpot"
    # without a queue: its 429
    plain = evaluate(feats(), LOW, PROFILE, "standard", slo=case(tpot_s=0.06))
    assert isinstance(plain, Reject) and (plain.status, plain.reason) == (429, "slo_tpot")


def test_a_request_that_would_push_a_running_requests_tpot_past_its_target_does_not_fit() -> None:
    # no target of its own; V = 35 ms < u = 40 ms
    got = judge(case(tpot_target_s=None, ttft_target_s=None, tightest_tpot_s=0.035))
    assert isinstance(got, Wait) and got.reason == "slo_tpot"
    assert "a request already running there (35 ms)" in got.message
    # V = 40 ms = u: fits
    assert judge(case(tightest_tpot_s=0.04)) is None
    # both over: the tighter bound is named (V = 30 ms < U = 50 ms)
    both = judge(case(tpot_s=0.06, tightest_tpot_s=0.03))
    assert isinstance(both, Wait) and "(30 ms)" in both.message


def test_a_tpot_target_no_single_sequence_meets_is_unreachable() -> None:
    # u₁ = 60 ms > U = 50 ms: never here
    got = judge(case(tpot_s=0.08, alone_tpot_s=0.06))
    assert isinstance(got, Reject) and got.reason == "slo_unreachable"
    assert got.retry_after_s == DRAIN


def test_sheddable_is_refused_where_standard_waits() -> None:
    got = judge(case(tpot_s=0.06), "sheddable")
    assert isinstance(got, Reject) and (got.status, got.reason) == (429, "slo_tpot")


def test_critical_keeps_its_guarantees() -> None:
    assert judge(case(ttft_s=99.0), "critical") is None
    assert judge(case(tpot_s=1.0, alone_tpot_s=1.0), "critical") is None
    assert evaluate(feats(), LOW, PROFILE, "critical", slo=case(ttft_s=99.0)) == Pass(LOW)


@pytest.mark.parametrize(
    "unknown",
    [
        {"ttft_s": None, "tpot_s": None},  # no prefill speed nor decode line yet
        {"ttft_target_s": None, "tpot_target_s": None},  # no target, nothing running with one
    ],
)
def test_what_cannot_be_predicted_is_judged_as_forecast(unknown: dict[str, None]) -> None:
    assert judge(case(**unknown)) is None


def test_the_policy_takes_admission_slo() -> None:
    policy = parse_policy(
        "profiles:\n  chat:\n    admission: slo\n    slo: {ttft_ms: 2000}\n"
        "  plain:\n    admission: forecast\n"
    )
    chat, plain = policy.profiles["chat"], policy.profiles["plain"]
    assert chat.admission == "slo" and chat.forecasts
    assert plain.admission == "forecast" and plain.forecasts
    assert not Profile(name="r").forecasts
