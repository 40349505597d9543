"""ICE's KV-block rules through real Envoy: the request's blocks against the pool's free and
usable blocks, as the backend's vllm:cache_config_info and kv_cache_usage_perc report them."""

from __future__ import annotations

import json

from ext_proc.schemas.openai import OPENAI_CHAT

from .harness import CHAT, E2E, KV_TIGHT

# KV_TIGHT: 101 blocks of 16 tokens, 10% used → 90 free blocks (1,440 tokens); 100 usable.
FREE_TOKENS = 90 * 16
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
