"""What each decision says about the request it judged: whether it goes upstream, and the
output limit ICE set on it (``ext_proc.policy.decision``, ``BodyVerdict``)."""

from __future__ import annotations

import pytest

from ext_proc.admit.outcome import Continue, log_fields
from ext_proc.admit.verdict import BodyVerdict
from ext_proc.policy.decision import (
    Decision,
    Downgrade,
    Pass,
    Reject,
    Truncated,
    TruncateHistory,
    Wait,
    verdict_headers,
)
from ext_proc.policy.evaluate import waits_where_it_can
from ext_proc.policy.pressure import Pressure
from ext_proc.policy.settings import Level, Profile, QueueSpec
from ext_proc.schemas.base import RequestFeatures

P = Pressure(70.0, Level.HIGH)
DOWN = Downgrade(P, max_tokens=256, original=4096, reason="pressure_cap")

CASES: list[tuple[Decision, bool, int | None]] = [
    (Pass(P), True, None),
    (DOWN, True, 256),
    (Reject(P, 429, "kv_exhausted", "no room", retry_after_s=2), False, None),
    (TruncateHistory(P, budget_tokens=1000, reason="pressure_budget"), False, None),
    (Truncated(Pass(P), "pressure_budget", 3, 900, "semantic"), True, None),
    (Truncated(DOWN, "pressure_budget", 3, 900, "recency", "deadline"), True, 256),
]
IDS = ["pass", "downgrade", "reject", "truncate", "truncated-pass", "truncated-downgrade"]


@pytest.mark.parametrize(("decision", "upstream", "granted"), CASES, ids=IDS)
def test_a_decision_says_whether_it_goes_upstream_and_the_limit_it_set(
    decision: Decision, upstream: bool, granted: int | None
) -> None:
    assert decision.goes_upstream is upstream
    assert decision.granted_max_tokens == granted
    verdict = BodyVerdict(decision, None, Continue([], None))
    assert verdict.goes_upstream is upstream
    assert verdict.granted_max_tokens == granted


def test_a_truncation_applies_the_decision_on_the_shorter_request() -> None:
    truncated = Truncated(DOWN, "context_budget", 1, 10, "semantic")
    assert truncated.applied is DOWN
    assert DOWN.applied is DOWN


def test_a_body_that_broke_the_api_goes_nowhere_and_sets_no_limit() -> None:
    verdict = BodyVerdict(None, None, Continue([], None), bad="invalid_json")
    assert verdict.goes_upstream is False
    assert verdict.granted_max_tokens is None


@pytest.mark.parametrize(
    ("decision", "requested", "granted"),
    [
        (DOWN, 4096, "256"),
        (Pass(P), 4096, "4096"),
        (Pass(P), None, None),
        (Truncated(DOWN, "pressure_budget", 2, 50, "semantic"), 4096, "256"),
        (Reject(P, 400, "context_length_exceeded", "too long"), 4096, None),
    ],
    ids=["downgrade", "pass", "pass-no-limit", "truncated-downgrade", "reject"],
)
def test_the_access_log_shows_the_limit_granted(
    decision: Decision, requested: int | None, granted: str | None
) -> None:
    features = RequestFeatures(
        schema="openai_chat",
        model=None,
        input_tokens=12,
        max_tokens=requested,
        max_tokens_field="max_tokens" if requested is not None else None,
        stream=False,
        message_count=1,
    )
    fields = dict(log_fields(decision, features))
    assert fields.get("max_tokens_granted") == granted


WAIT = Wait(P, "kv_exhausted", "The request needs 9 blocks; 4 are free.", retry_after_s=3)


def test_a_wait_is_its_429_where_it_cannot_wait() -> None:
    refused = WAIT.refusal()
    assert refused == Reject(P, 429, "kv_exhausted", WAIT.message, None, 3)
    assert not WAIT.goes_upstream and WAIT.granted_max_tokens is None
    # what it shows, should it be answered: the refusal's headers
    assert verdict_headers(WAIT) == verdict_headers(refused)


@pytest.mark.parametrize(
    ("profile", "can_wait", "waits"),
    [
        (Profile("p", queue=QueueSpec()), True, True),
        (Profile("p"), True, False),  # no queue: the 429
        (Profile("p", queue=QueueSpec(), mode="shadow"), True, False),  # shadow: never waits
        (Profile("p", queue=QueueSpec()), False, False),  # the caller cannot queue it
    ],
    ids=["queue", "no-queue", "shadow", "cannot-wait"],
)
def test_the_one_mapping_keeps_a_wait_only_where_there_is_a_queue_to_wait_in(
    profile: Profile, can_wait: bool, waits: bool
) -> None:
    got = waits_where_it_can(WAIT, profile, can_wait=can_wait)
    assert got == (WAIT if waits else WAIT.refusal())
    assert waits_where_it_can(DOWN, profile, can_wait=can_wait) is DOWN  # others as they are
