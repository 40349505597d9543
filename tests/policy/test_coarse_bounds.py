"""A verdict without the body is never more permissive than one with it (issue 44, item 2).

The coarse verdict (``ext_proc.policy.coarse``) passes a body it has not read only when
no body of that size could get a stricter full verdict. A body sets ``n``, ``best_of`` and
its output limit in a few bytes whatever its size, and holds at most ⌈L / 2⌉ list items
(prompts, inputs, media parts: each a JSON value and a comma). Where one of these can make
the full verdict refuse or cut (``unread_risk``), the coarse verdict is a 429 ``ice_busy``
with Retry-After (the profile's ``retry_after_min_s``), never a pass. Hand-computed cases.
"""

from __future__ import annotations

import time

import pytest

from ext_proc.admit.outcome import Respond
from ext_proc.admit.pipeline import Pipeline, RequestFacts
from ext_proc.admit.queue import queueable
from ext_proc.policy import coarse
from ext_proc.policy.coarse import (
    COARSE_LADDER,
    H_JUDGED,
    MIN_ITEM_BYTES,
    coarse_ladder,
    most_items,
    refuse_unbounded,
    unread_risk,
)
from ext_proc.policy.decision import Pass, Reject
from ext_proc.policy.load import parse_policy
from ext_proc.policy.settings import Profile
from ext_proc.schemas import BY_NAME
from ext_proc.signals.snapshot import BackendSignals, PoolSnapshot

POLICY = parse_policy(
    """
profiles:
  default: {max_model_len: 8192, output_buffer_tokens: 512, retry_after_min_s: 3}
  queued:
    max_model_len: 8192
    output_buffer_tokens: 512
    queue: {enabled: true, max_queue_wait_ms: 50}
  # nothing a few bytes set is bounded by the profile but the media parts (raised)
  open: {max_media_parts: 1000000, max_tokens_cap: {}}
  open_ignore: {max_media_parts: 1000000, max_tokens_cap: {}, on_kv_shortfall: ignore}
  truncating:
    max_media_parts: 1000000
    max_tokens_cap: {}
    on_kv_shortfall: ignore
    truncation: {enabled: true, budget_tokens: {high: 1000}}
routes:
  chat: {profile: default}
  invocations: {profile: default}
  queued: {profile: queued}
  open: {profile: open}
  open_ignore: {profile: open_ignore}
  truncating: {profile: truncating}
"""
)

CALM = 0.0  # kv_cache_usage: the "calm" page


def snap(usage: float, blocks: int = 1_000_001, waiting: float = 0.0) -> PoolSnapshot:
    backend = BackendSignals(
        url="u", kv_cache_usage=usage, num_requests_waiting=waiting, num_gpu_blocks=blocks,
        block_size=16,
    )  # fmt: skip
    return PoolSnapshot(pool="default", backends=(backend,), taken_at_s=time.monotonic())


def on_size(
    route_name: str,
    schema: str,
    nbytes: int,
    snapshot: PoolSnapshot | None,
    priority: str = "standard",
) -> tuple[Pipeline, object]:
    pipeline = Pipeline(POLICY, lambda _pool: snapshot)
    route = pipeline.router.resolve((("x-ice-route", route_name),))
    facts = RequestFacts(adapter=BY_NAME[schema], priority=priority)  # type: ignore[arg-type]
    return pipeline, pipeline.on_size(route, facts, nbytes)


def reject_of(verdict: object) -> Reject:
    decision = verdict.decision  # type: ignore[attr-defined]
    assert isinstance(decision, Reject), decision
    return decision


# --- the bounds, pure ---------------------------------------------------------------------


def test_a_body_of_l_bytes_holds_at_most_half_as_many_list_items() -> None:
    # n items need n values and n − 1 commas: 2n − 1 ≤ L
    assert MIN_ITEM_BYTES == 2
    assert [most_items(n) for n in (0, 1, 2, 3, 32, 33, 7_000_000)] == [
        0, 1, 1, 2, 16, 17, 3_500_000,
    ]  # fmt: skip
    assert len("[" + ",".join(["0"] * 17) + "]") - 2 == 33  # 17 items in 33 bytes


SCHEMAS_WITH_N = (
    "openai.chat",
    "openai.completions",
    "openai.chat_batch",
    "sagemaker.invocations",
    "vllm.generate",
    "sglang.generate",
)


@pytest.mark.parametrize("schema", SCHEMAS_WITH_N)
def test_an_api_whose_body_names_n_has_no_sequence_bound(schema: str) -> None:
    for nbytes in (10, 7_000_000):
        assert unread_risk(schema, nbytes, POLICY.profiles["default"]) == "sequences"
        # not even on a profile that bounds nothing else
        assert unread_risk(schema, nbytes, POLICY.profiles["open"]) == "sequences"


@pytest.mark.parametrize("schema", sorted(BY_NAME))
def test_every_api_reads_media_parts_whose_tokens_no_size_bounds(schema: str) -> None:
    """Today every coarse verdict is a refusal: each API ICE judges reads media parts (a
    URL or a header prices them), whatever else it reads."""
    for nbytes in (1, 13, 7_000_000):
        assert unread_risk(schema, nbytes, Profile("p")) is not None
    assert unread_risk(schema, 13, Profile("p")) in ("sequences", "media_parts")
    # a schema this module does not know reads everything
    assert unread_risk("some.new_api", 13, Profile("p")) == "sequences"


@pytest.fixture
def bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """APIs that read none of the unbounded fields, as a test double: ``test.plain``
    (generating), ``test.stored`` (a stored context only), and embeddings without media."""
    monkeypatch.setitem(coarse._UNBOUNDED, "test.plain", frozenset())
    monkeypatch.setitem(coarse._UNBOUNDED, "test.stored", frozenset({"stored_context"}))
    monkeypatch.setitem(coarse._UNBOUNDED, "openai.embeddings", frozenset())
    monkeypatch.setitem(coarse._UNBOUNDED, "anthropic.messages", frozenset())


CASES = [
    # (schema, bytes, profile, risk): the first field a body of that size may set past the
    # profile, in the order the full ladder reads them
    ("test.plain", 100, Profile("p"), None),  # no max_model_len: the later rules judge it
    # with a context length, a limit of 1e9 is cut to the context budget
    ("test.plain", 100, Profile("p", max_model_len=32768), "limit"),
    # P = 40,000 + 256 ≥ 32,768: some body of that size has no room for output (400)
    ("test.plain", 40_000, Profile("p", max_model_len=32768), "context"),
    ("test.plain", 32_512, Profile("p", max_model_len=32768), "context"),  # P = M: no room
    ("test.stored", 30, Profile("p", stored_context="reject"), "stored_context"),
    ("test.stored", 30, Profile("p"), None),
    ("openai.embeddings", 13, Profile("p"), None),  # 7 inputs, no context
    ("openai.embeddings", 4096, Profile("p"), None),  # 2,048 inputs ≤ 2,048
    ("openai.embeddings", 4097, Profile("p"), "inputs"),  # 2,049 > 2,048
    ("openai.embeddings", 13, Profile("p", max_model_len=268), "context"),  # 269 > 268
    ("openai.embeddings", 13, Profile("p", max_model_len=269), None),  # an embedding may fill it
]  # fmt: skip


@pytest.mark.parametrize(
    ("schema", "nbytes", "profile", "risk"), CASES, ids=[f"{c[0]}-{c[1]}-{c[3]}" for c in CASES]
)
@pytest.mark.usefixtures("bounded")
def test_the_first_field_an_unread_body_may_set_past_the_profile(
    schema: str, nbytes: int, profile: Profile, risk: str | None
) -> None:
    assert unread_risk(schema, nbytes, profile) == risk


def test_the_ladder_for_a_size_refuses_first_when_a_field_is_unbounded() -> None:
    profile = POLICY.profiles["default"]
    ladder = coarse_ladder("openai.chat", 7_000_000, profile)
    assert len(ladder) == len(COARSE_LADDER) + 1 and ladder[1:] == COARSE_LADDER
    assert refuse_unbounded("sequences").__name__ == "refuse_unbounded_sequences"


@pytest.mark.usefixtures("bounded")
def test_a_body_nothing_unbounded_applies_to_gets_the_rest_of_the_ladder() -> None:
    assert coarse_ladder("openai.embeddings", 13, Profile("p")) == COARSE_LADDER


# --- the cases, on the calm page ------------------------------------------------------


def test_a_chat_with_n_500_is_not_passed_from_its_size_on_calm() -> None:
    """The issue: beside one slow upload a 7 MB chat with ``n: 500, max_tokens: 1000000``
    (alone: a 400 ``too_many_sequences``) reached the backend as a coarse pass."""
    for priority in ("standard", "critical"):
        pipeline, verdict = on_size("chat", "openai.chat", 7_000_000, snap(CALM), priority)
        decision = reject_of(verdict)
        assert (decision.status, decision.reason, decision.retry_after_s) == (429, "ice_busy", 3)
        assert "n, best_of" in decision.message
        outcome = verdict.outcome  # type: ignore[attr-defined]
        assert isinstance(outcome, Respond) and outcome.status == 429
        headers = dict(outcome.headers)
        assert headers[H_JUDGED] == "headers" and headers["retry-after"] == "3"
        assert b'"code":"ice_busy"' in outcome.body.replace(b" ", b"")
        snapshot = pipeline.lookup("default")
        assert snapshot is not None
        assert not pipeline.views.ledger(snapshot)  # nothing held


def test_an_invocations_body_of_many_prompts_is_not_passed_from_its_size() -> None:
    """The issue: an ``/invocations`` body of 1.6 M prompts × ``n: 4``."""
    _, verdict = on_size("invocations", "sagemaker.invocations", 8_000_030, snap(CALM))
    assert reject_of(verdict).reason == "ice_busy"


def test_a_refusal_for_an_unbounded_field_does_not_wait_in_the_queue() -> None:
    """The queue judges a coarse verdict again with ``COARSE_LADDER``, which pressure may
    let pass: a body refused for what it may set must never wait there."""
    pipeline, verdict = on_size("queued", "openai.chat", 20_000, snap(0.3, blocks=10_001))
    route = pipeline.router.resolve((("x-ice-route", "queued"),))
    assert reject_of(verdict).reason == "ice_busy"
    assert not queueable(route, verdict)  # type: ignore[arg-type]


# --- what the full verdict would edit: truncation, downgrades -------------------------------
# (on an API without media parts, the ``bounded`` test double: every real API reads them)


HIGH = snap(0.97, blocks=10**7, waiting=3)  # 100 × (0.40 × 0.97 + 0.25 × 3/8) / 0.65 = 74.1


@pytest.mark.usefixtures("bounded")
def test_a_level_that_would_truncate_history_refuses_an_unread_body() -> None:
    """At high pressure the profile truncates chat histories over 1,000 tokens: a body of
    2,000 bytes may hold P = 2,256 tokens, which the full verdict would truncate (an edit
    an unread body cannot get): 429 ``memory_pressure``. Low pressure: no budget, a pass."""
    _, verdict = on_size("truncating", "anthropic.messages", 2000, HIGH)
    decision = reject_of(verdict)
    assert (decision.status, decision.reason) == (429, "memory_pressure")
    assert "truncate" in decision.message and "1000 tokens" in decision.message
    _, verdict = on_size("truncating", "anthropic.messages", 2000, snap(CALM, blocks=10**7))
    assert isinstance(verdict.decision, Pass)  # type: ignore[attr-defined]


@pytest.mark.usefixtures("bounded")
def test_a_body_that_may_need_more_blocks_than_the_backend_holds_is_refused() -> None:
    """``on_kv_shortfall: ignore`` skips the free-block check, not the full verdict's 400
    ``kv_capacity_exceeded``: P = 20,256 prompt tokens and one output token need
    ⌈20,257 / 16⌉ = 1,267 blocks; 1,001 blocks hold 1,000 usable."""
    _, verdict = on_size("open_ignore", "anthropic.messages", 20_000, snap(CALM, blocks=1001))
    decision = reject_of(verdict)
    assert (decision.status, decision.reason) == (429, "ice_busy")
    assert "1267 KV-cache blocks" in decision.message and "holds 1000" in decision.message
    _, verdict = on_size("open_ignore", "anthropic.messages", 20_000, snap(CALM, blocks=1268))
    assert isinstance(verdict.decision, Pass)  # type: ignore[attr-defined]


@pytest.mark.usefixtures("bounded")
def test_a_coarse_pass_remains_where_every_body_of_the_size_passes_untouched() -> None:
    """No max_model_len, no cap, no sequences past one, media parts bounded: with the pool
    unknown the full verdict passes every such body untouched, and so does the coarse one."""
    _, verdict = on_size("open", "anthropic.messages", 20_000, None)
    assert isinstance(verdict.decision, Pass)  # type: ignore[attr-defined]
    _, verdict = on_size("open", "openai.chat", 20_000, None)
    assert reject_of(verdict).reason == "ice_busy"
