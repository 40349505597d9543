"""The coarse verdict (a request judged from its size), hand-computed.

P = min(bytes + 256, max_model_len); the output is min_output_tokens (16 here); a pass never
rewrites and is held in the ledger; a refusal is a 429 with Retry-After, never a 400.
"""

from __future__ import annotations

import time

from ext_proc.admit.headeronly import (
    H_JUDGED,
    TEMPLATE_SLACK_TOKENS,
    coarse_features,
    coarse_tokens,
)
from ext_proc.admit.outcome import Continue, Respond
from ext_proc.admit.pipeline import Pipeline, RequestFacts
from ext_proc.policy.decision import Pass, Reject
from ext_proc.policy.load import parse_policy
from ext_proc.schemas import BY_NAME
from ext_proc.signals.snapshot import BackendSignals, PoolSnapshot

POLICY = parse_policy(
    """
profiles:
  default: {max_model_len: 32768, output_buffer_tokens: 512, min_output_tokens: 16}
routes:
  chat: {profile: default}
"""
)


def snap(usage: float, blocks: int = 10_001, waiting: float = 0.0) -> PoolSnapshot:
    backend = BackendSignals(
        url="u", kv_cache_usage=usage, num_requests_waiting=waiting, num_gpu_blocks=blocks,
        block_size=16,
    )  # fmt: skip
    return PoolSnapshot(pool="default", backends=(backend,), taken_at_s=time.monotonic())


def judge(
    nbytes: int, snapshot: PoolSnapshot, priority: str = "standard"
) -> tuple[Pipeline, object]:
    pipeline = Pipeline(POLICY, lambda _pool: snapshot)
    route = pipeline.router.resolve((("x-ice-route", "chat"),))
    facts = RequestFacts(adapter=BY_NAME["openai.chat"], priority=priority)  # type: ignore[arg-type]
    verdict = pipeline.on_size(route, facts, nbytes)
    pipeline.record(route, verdict)
    return pipeline, verdict


def test_prompt_bound_is_bytes_plus_template_slack_capped_by_the_context() -> None:
    assert TEMPLATE_SLACK_TOKENS == 256
    assert coarse_tokens(1000, None) == 1256
    assert coarse_tokens(1000, 1200) == 1200  # no sequence holds more than max_model_len
    f = coarse_features(BY_NAME["openai.embeddings"], 10, None)
    assert (f.input_tokens, f.generates, f.max_tokens, f.input_tokens_source) == (
        266,
        False,
        None,
        "bound",
    )


def test_a_fitting_request_passes_untouched_and_says_it_was_judged_from_headers() -> None:
    # 20,000 bytes → P = 20,256; + 16 output = 20,272 tokens = 1,267 blocks of 16;
    # free = floor(10,000 × 0.7) = 7,000
    pipeline, verdict = judge(20_000, snap(0.3))
    assert isinstance(verdict.decision, Pass)  # type: ignore[attr-defined]
    outcome = verdict.outcome  # type: ignore[attr-defined]
    assert isinstance(outcome, Continue) and outcome.body is None
    headers = dict(outcome.headers)
    assert headers[H_JUDGED] == "headers"
    assert headers["x-ice-decision"] == "pass"
    # held in the ledger like a full verdict
    snapshot = pipeline.lookup("default")
    assert snapshot is not None and sum(pipeline.views.ledger(snapshot).values()) == 1267


def test_a_request_whose_bound_does_not_fit_the_free_blocks_gets_a_429() -> None:
    # 120,000 bytes → P = min(120,256, 32,768) = 32,768, which leaves the context no room for
    # output (the ladder's min(16, 32,768 − P) = 0): 2,048 blocks of 16;
    # free = floor(10,000 × (1 − 0.85)) = 1,500 < 2,048
    _, verdict = judge(120_000, snap(0.85))
    decision = verdict.decision  # type: ignore[attr-defined]
    assert isinstance(decision, Reject)
    assert (decision.status, decision.reason) == (429, "kv_exhausted")
    assert "needs 2048 KV-cache blocks" in decision.message
    assert "has 1500 free" in decision.message
    outcome = verdict.outcome  # type: ignore[attr-defined]
    assert isinstance(outcome, Respond) and outcome.status == 429
    headers = dict(outcome.headers)
    assert headers[H_JUDGED] == "headers" and "retry-after" in headers


def test_pressure_sheds_sheddable_requests_without_reading_them() -> None:
    _, verdict = judge(100, snap(1.0, blocks=10**7, waiting=8), priority="sheddable")
    decision = verdict.decision  # type: ignore[attr-defined]
    assert isinstance(decision, Reject)
    assert (decision.status, decision.reason) == (429, "memory_pressure")


def test_the_first_in_flight_pass_is_seen_by_the_next_coarse_verdict() -> None:
    snapshot = snap(0.3)  # 7,000 free blocks
    pipeline = Pipeline(POLICY, lambda _pool: snapshot)
    route = pipeline.router.resolve((("x-ice-route", "chat"),))
    facts = RequestFacts(adapter=BY_NAME["openai.chat"])
    outcomes = []
    for _ in range(3):  # P = 32,768, no room for output: 2,048 blocks each, 3 × 2,048 ≤ 7,000
        v = pipeline.on_size(route, facts, 200_000)
        pipeline.record(route, v)
        outcomes.append(v.decision)
    fourth = pipeline.on_size(route, facts, 200_000)  # 7,000 − 6,144 = 856 < 2,048
    assert all(isinstance(d, Pass) for d in outcomes)
    assert isinstance(fourth.decision, Reject) and fourth.decision.reason == "kv_exhausted"
