"""The coarse verdict (a request judged from its size), hand-computed.

The worst request of a body of L bytes (``ext_proc.policy.coarse``): P = min(L + 256,
max_model_len) prompt tokens; S = max_sequences (16) sequences, unshared; O = M − P output
tokens each, to the end of the context (M = 32,768 here). It passes only where every body of
that size would pass untouched: no shedding, no output cap at the level, and the worst
request's blocks 16 × ceil(M / 16) = 32,768 within the free blocks; otherwise a 429 with
Retry-After, never a 400.

These cases judge the ladder after ``refuse_unbounded``: every API ICE judges reads a field
no body size bounds (``unread_risk``; ``tests/admit/test_coarse_bounds.py``), so here, as a test
double, ``unread_risk`` finds none.
"""

from __future__ import annotations

import time

import pytest

from ext_proc.admit.outcome import Continue, Respond
from ext_proc.admit.pipeline import Pipeline, RequestFacts
from ext_proc.admit.queue import queueable
from ext_proc.policy import coarse
from ext_proc.policy.coarse import (
    H_JUDGED,
    TEMPLATE_SLACK_TOKENS,
    coarse_features,
    coarse_tokens,
)
from ext_proc.policy.decision import Pass, Reject, Wait
from ext_proc.policy.evaluate import Case
from ext_proc.policy.load import parse_policy
from ext_proc.policy.settings import Profile
from ext_proc.schemas import BY_NAME
from ext_proc.signals.snapshot import BackendSignals, PoolSnapshot

POLICY = parse_policy(
    """
profiles:
  default: {max_model_len: 32768, output_buffer_tokens: 512, min_output_tokens: 16}
  ignore: {max_model_len: 32768, output_buffer_tokens: 512, on_kv_shortfall: ignore}
  unbounded: {output_buffer_tokens: 512}
  defaulted: {output_buffer_tokens: 512, default_output_tokens: 600}
  queued:
    max_model_len: 32768
    output_buffer_tokens: 512
    queue: {enabled: true, max_queue_wait_ms: 50}
routes:
  chat: {profile: default}
  ignore: {profile: ignore}
  unbounded: {profile: unbounded}
  defaulted: {profile: defaulted}
  queued: {profile: queued}
"""
)


@pytest.fixture(autouse=True)
def _nothing_unbounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(coarse, "unread_risk", lambda *_args: None)


def snap(usage: float, blocks: int = 10_001, waiting: float = 0.0) -> PoolSnapshot:
    backend = BackendSignals(
        url="u", kv_cache_usage=usage, num_requests_waiting=waiting, num_gpu_blocks=blocks,
        block_size=16,
    )  # fmt: skip
    return PoolSnapshot(pool="default", backends=(backend,), taken_at_s=time.monotonic())


def judge(
    nbytes: int, snapshot: PoolSnapshot, priority: str = "standard", route_name: str = "chat"
) -> tuple[Pipeline, object]:
    pipeline = Pipeline(POLICY, lambda _pool: snapshot)
    route = pipeline.router.resolve((("x-ice-route", route_name),))
    facts = RequestFacts(adapter=BY_NAME["openai.chat"], priority=priority)  # type: ignore[arg-type]
    verdict = pipeline.on_size(route, facts, nbytes)
    pipeline.recorder.record(route, verdict)
    return pipeline, verdict


def reject_of(verdict: object) -> Reject:
    decision = verdict.decision  # type: ignore[attr-defined]
    assert isinstance(decision, Reject), decision
    return decision


def test_the_worst_request_of_a_size_is_its_bound_times_every_sequence_with_the_safe_output() -> (
    None
):
    assert TEMPLATE_SLACK_TOKENS == 256
    assert coarse_tokens(1000, None) == 1256
    assert coarse_tokens(1000, 1200) == 1200  # no sequence holds more than max_model_len
    profile = POLICY.profiles["default"]
    f = coarse_features(BY_NAME["openai.chat"], 1000, profile)
    # P = 1,256; O = 32,768 − 1,256 = 31,512; S = 16, unshared
    assert (f.input_tokens, f.max_tokens, f.samples, f.sequences) == (1256, 31_512, 16, 16)
    assert not f.reads_prefix_cache and f.input_tokens_source == "bound"
    f = coarse_features(BY_NAME["openai.chat"], 40_000, profile)  # P = 32,768: O = 0
    assert (f.input_tokens, f.max_tokens) == (32_768, 0)
    f = coarse_features(BY_NAME["openai.embeddings"], 10, Profile("p"))
    assert (f.input_tokens, f.generates, f.max_tokens, f.sequences) == (266, False, None, 1)


def test_a_body_whose_worst_request_fits_passes_untouched_and_is_held_as_that_request() -> None:
    # 20,000 bytes → P = 20,256, O = 32,768 − 20,256 = 12,512: P + O = 32,768 tokens =
    # 2,048 blocks of 16 per sequence, × 16 = 32,768 blocks;
    # free = floor(50,000 × 0.7) = 35,000 ≥ 32,768
    pipeline, verdict = judge(20_000, snap(0.3, blocks=50_001))
    assert isinstance(verdict.decision, Pass)  # type: ignore[attr-defined]
    outcome = verdict.outcome  # type: ignore[attr-defined]
    assert isinstance(outcome, Continue) and outcome.body is None
    headers = dict(outcome.headers)
    assert headers[H_JUDGED] == "headers"
    assert headers["x-ice-decision"] == "pass"
    snapshot = pipeline.lookup("default")
    assert snapshot is not None and sum(pipeline.views.ledger(snapshot).values()) == 32_768


def test_a_body_whose_worst_request_does_not_fit_gets_a_429_even_when_one_sequence_would() -> None:
    # the same 20,000 bytes on 30,000 blocks at 30 %: free 21,000 < 32,768 (one sequence of
    # P + 16, 1,267 blocks, would fit: the old coarse verdict passed it); its 16 sequences
    # with one output token each, 16 × ⌈20,257 / 16⌉ = 20,272 blocks, fit the 30,000
    _, verdict = judge(20_000, snap(0.3, blocks=30_001))
    decision = reject_of(verdict)
    assert (decision.status, decision.reason) == (429, "kv_exhausted")
    assert "16 sequences of up to 32768 tokens, 32768 KV-cache blocks" in decision.message
    assert "has 21000 free blocks" in decision.message
    outcome = verdict.outcome  # type: ignore[attr-defined]
    assert isinstance(outcome, Respond) and outcome.status == 429
    headers = dict(outcome.headers)
    assert headers[H_JUDGED] == "headers" and "retry-after" in headers


def test_a_level_with_an_output_cap_refuses_an_unread_body_whatever_the_room() -> None:
    # high: 100 × (0.40 × 0.97 + 0.25 × 3/8) / 0.65 = 74.1; the cap there is 1,024, which an
    # unread body cannot be held to (the full verdict would downgrade n:16, max_tokens:1e6)
    for priority in ("standard", "critical"):
        _, verdict = judge(100, snap(0.97, blocks=10**7, waiting=3), priority=priority)
        decision = reject_of(verdict)
        assert (decision.status, decision.reason) == (429, "memory_pressure")
        assert "capped at 1024 tokens" in decision.message
        assert decision.retry_after_s is not None


def test_the_retry_after_of_an_unread_body_counts_the_output_the_backend_will_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Retry-After is sized from the tokens the refused request needs: its output is what the
    backend runs without a limit (``backend_output``: the profile's
    ``default_output_tokens``), not ``min_output_tokens``, as in the full verdict."""
    needs: list[int] = []
    real = Case.retry_after

    def record(self: Case, need_tokens: int) -> int:
        needs.append(need_tokens)
        return real(self, need_tokens)

    monkeypatch.setattr(Case, "retry_after", record)
    for route in ("unbounded", "defaulted"):
        _, verdict = judge(100, snap(0.97, blocks=10**7, waiting=3), route_name=route)
        assert reject_of(verdict).reason == "memory_pressure"
    # the same 16 sequences of the same prompt bound: 16 × (600 − 16) tokens more
    assert needs[1] - needs[0] == 16 * (600 - 16)


def test_critical_is_never_refused_for_room_and_ignore_never_checks_it() -> None:
    """Neither for the free blocks; both for blocks the backend does not hold at all."""
    # low pressure, 360 free blocks: 16 × ⌈357 / 16⌉ = 368 with one output token each fit
    # the 400 usable (the full verdict's kv_capacity_exceeded), the worst 32,768 do not
    tight = snap(0.1, blocks=401)
    assert isinstance(judge(100, tight, priority="critical")[1].decision, Pass)  # type: ignore[attr-defined]
    assert isinstance(judge(100, tight, route_name="ignore")[1].decision, Pass)  # type: ignore[attr-defined]
    assert reject_of(judge(100, tight)[1]).reason == "kv_exhausted"
    small = snap(0.1, blocks=101)  # 100 usable < 368
    for priority, route in (("critical", "chat"), ("standard", "ignore")):
        assert reject_of(judge(100, small, priority, route)[1]).reason == "ice_busy"


def test_an_output_no_max_model_len_bounds_is_refused_wherever_the_pool_is_known() -> None:
    decision = reject_of(judge(100, snap(0.0, blocks=10**8), route_name="unbounded")[1])
    assert decision.reason == "kv_exhausted" and "does not bound" in decision.message


def test_pressure_sheds_sheddable_requests_without_reading_them() -> None:
    _, verdict = judge(100, snap(1.0, blocks=10**7, waiting=8), priority="sheddable")
    decision = reject_of(verdict)
    assert (decision.status, decision.reason) == (429, "memory_pressure")
    assert "sheddable-priority requests are shed" in decision.message


def test_the_first_in_flight_pass_is_seen_by_the_next_coarse_verdict() -> None:
    snapshot = snap(0.3, blocks=100_001)  # 70,000 free blocks
    pipeline = Pipeline(POLICY, lambda _pool: snapshot)
    route = pipeline.router.resolve((("x-ice-route", "chat"),))
    facts = RequestFacts(adapter=BY_NAME["openai.chat"])
    outcomes = []
    for _ in range(2):  # P = 32,768, O = 0: 16 × 2,048 = 32,768 blocks each; 2 × ≤ 70,000
        v = pipeline.on_size(route, facts, 200_000)
        pipeline.recorder.record(route, v)
        outcomes.append(v.decision)
    third = pipeline.on_size(route, facts, 200_000)  # 70,000 − 65,536 = 4,464 < 32,768
    assert all(isinstance(d, Pass) for d in outcomes)
    assert isinstance(third.decision, Reject) and third.decision.reason == "kv_exhausted"


def test_a_coarse_refusal_for_memory_is_queued_on_a_route_with_a_queue() -> None:
    pipeline, verdict = judge(20_000, snap(0.3, blocks=30_001), route_name="queued")
    route = pipeline.router.resolve((("x-ice-route", "queued"),))
    decision = verdict.decision  # type: ignore[attr-defined]
    assert isinstance(decision, Wait) and decision.reason == "kv_exhausted"  # waits
    assert decision.refusal().status == 429  # its answer if it cannot wait
    assert queueable(route, verdict)  # type: ignore[arg-type]
    # judged again by the coarse ladder: the same worst request, now with room
    pipeline.lookup = lambda _pool: snap(0.3, blocks=50_001)
    again = pipeline.rejudge(route, RequestFacts(adapter=BY_NAME["openai.chat"]), verdict)  # type: ignore[arg-type]
    assert isinstance(again.decision, Pass)
    assert dict(again.outcome.headers)[H_JUDGED] == "headers"
