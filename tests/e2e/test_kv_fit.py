"""ICE's KV-block rules through real Envoy: the request's blocks against the pool's free and
usable blocks, as the backend's vllm:cache_config_info and kv_cache_usage_perc report them."""

from __future__ import annotations

import json

from ext_proc.schemas.openai import OPENAI_CHAT

from .harness import CHAT, E2E, KV_TIGHT

# KV_TIGHT: 101 blocks of 16 tokens, 10% used → 90 free blocks (1,440 tokens); 100 usable.
FREE_TOKENS = 90 * 16
# room for a whole context: 200,000 blocks, 10% used
BIG_ROOM = {**KV_TIGHT, "num_gpu_blocks": 200_000}
USABLE_TOKENS = 100 * 16


def chat(content: str, max_tokens: int | None = None) -> dict[str, object]:
    body: dict[str, object] = {
        "model": "dev-model",
        "messages": [{"role": "user", "content": content}],
    }
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    return body


def input_tokens(body: dict[str, object]) -> int:
    return OPENAI_CHAT.features(json.loads(json.dumps(body))).input_tokens


def test_output_is_lowered_to_what_the_free_blocks_hold(stack: E2E) -> None:
    stack.set_state(KV_TIGHT, level="low", score="6")
    body = chat("Summarise the history of paging in operating systems.", max_tokens=4000)
    reply = stack.post(CHAT, body)
    assert reply.status == 200, reply
    assert reply.header("x-ice-reason") == "kv_free_blocks"
    assert reply.header("x-ice-original-max-tokens") == "4000"
    sent = stack.only_received().json()["max_tokens"]
    # whole blocks: ceil((input + out) / 16) ≤ 90 ⇔ input + out ≤ 1,440
    assert sent == FREE_TOKENS - input_tokens(body)


def test_a_request_that_fits_the_free_blocks_passes(stack: E2E) -> None:
    stack.set_state(KV_TIGHT, level="low", score="6")
    reply = stack.post(CHAT, chat("Hi", max_tokens=200))
    assert reply.status == 200 and reply.header("x-ice-decision") == "pass"


def test_input_beyond_the_free_blocks_is_shed_unless_critical(stack: E2E) -> None:
    stack.set_state(KV_TIGHT, level="low", score="6")
    body = chat("word " * 1200, max_tokens=16)  # 1,507 tokens: over 1,440 free, under 1,600
    assert input_tokens(body) + 16 > FREE_TOKENS and input_tokens(body) + 1 <= USABLE_TOKENS
    reply = stack.post(CHAT, body)
    assert reply.status == 429, reply
    assert reply.json()["error"]["code"] == "kv_exhausted"
    assert reply.header("retry-after") is not None
    assert stack.post(CHAT, body, {"x-priority": "critical"}).status == 200


def test_input_beyond_an_idle_backend_is_a_400_naming_the_blocks(stack: E2E) -> None:
    stack.set_state(KV_TIGHT, level="low", score="6")
    body = chat("word " * 2000, max_tokens=16)  # ~2,500 tokens > 100 usable blocks × 16
    assert input_tokens(body) + 1 > USABLE_TOKENS
    reply = stack.post(CHAT, body)
    assert reply.status == 400, reply
    err = reply.json()["error"]
    assert err["code"] == "kv_capacity_exceeded" and "100 blocks" in err["message"]
    assert reply.header("x-ice-decision") == "reject"
    assert stack.received() == []


def test_a_chat_request_without_a_limit_is_judged_for_the_rest_of_the_context(
    stack: E2E,
) -> None:
    """vLLM runs a chat request that sends no limit to max_model_len − prompt (8,192 here),
    not 16 tokens: ICE judges it for that, and injects the limit the free blocks hold."""
    stack.set_state(KV_TIGHT, level="low", score="6")
    body = chat("Summarise the history of paging in operating systems.")
    body["n"] = 4
    reply = stack.post(CHAT, body)
    assert reply.status == 200, reply
    assert reply.header("x-ice-decision") == "downgrade"
    assert reply.header("x-ice-reason") == "kv_free_blocks"
    sent = stack.only_received().json()
    # 4 samples of one prompt of 21 tokens: each ceil((21 + out) / 16) blocks, the 3 others
    # sharing its one full prompt block (the pool caches prefixes):
    # 4 × ceil((21 + out) / 16) − 3 ≤ 90 ⇔ ceil((21 + out) / 16) ≤ 23 ⇔ out ≤ 368 − 21
    assert input_tokens(body) == 21
    assert sent["max_tokens"] == 23 * 16 - 21
    assert sent["n"] == 4


def test_a_chat_request_without_a_limit_that_fits_passes_untouched(stack: E2E) -> None:
    stack.set_state(BIG_ROOM, level="low", score="6")
    body = chat("Hi")
    reply = stack.post(CHAT, body)
    assert reply.status == 200 and reply.header("x-ice-decision") == "pass", reply
    assert "max_tokens" not in stack.only_received().json()
