"""ICE's three decisions through real Envoy: pass, downgrade (rewrite) and reject (429/400)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import anthropic
import openai
import pytest

from ext_proc.schemas.anthropic_messages import ANTHROPIC_MESSAGES
from ext_proc.schemas.base import SchemaAdapter
from ext_proc.schemas.openai import OPENAI_CHAT, OPENAI_COMPLETIONS

from .harness import (
    CAP_CRITICAL,
    CAP_HIGH,
    CHAT,
    CHAT_RAW,
    COMPLETIONS,
    CRITICAL,
    CRITICAL_SCORE,
    E2E,
    HIGH,
    HIGH_SCORE,
    LONG_INPUT,
    LOW,
    LOW_SCORE,
    MAX_MODEL_LEN,
    MESSAGES,
    MSGS,
    OUTPUT_BUFFER,
    RETRY_AFTER_S,
    Recorded,
    Reply,
    assert_verdict,
    chat_raw,
    raw_body,
)

COMPLETIONS_RAW = (
    '{"prompt" : "Say hi ✓ in three   words",\n "model": "dev-model",'
    ' @LIMIT@,"echo":false, "logit_bias": {"50256": -100}}'
)
MESSAGES_RAW = (
    '{ "model":"dev-model", "system" : "Be brief — très bref.",\n'
    '  @LIMIT@,\n  "messages":[{"role":"user","content":[{"type":"text",'
    '"text":"Hallo ✓"}]}],  "metadata": {"user_id":"u-1"}, "top_k" : 5 }'
)


def assert_length_consistent(rec: Recorded) -> None:
    json.loads(rec.body)  # the backend got valid JSON
    length = rec.header("content-length")
    if length is not None:
        assert int(length) == len(rec.body)


def budget(adapter: SchemaAdapter, body: bytes) -> int:
    """What ICE must lower a too-large limit to: max_model_len − input − buffer."""
    input_tokens = adapter.features(json.loads(body)).input_tokens
    return MAX_MODEL_LEN - input_tokens - OUTPUT_BUFFER


def test_pass_at_low_pressure_forwards_the_body_byte_for_byte_with_verdict_headers(
    stack: E2E,
) -> None:
    stack.set_state(LOW, level="low", score=LOW_SCORE)
    body = chat_raw("256")
    reply = stack.post(CHAT, body)
    assert reply.status == 200, reply
    assert reply.json()["object"] == "chat.completion"
    assert_verdict(reply, decision="pass", level="low", score=LOW_SCORE)
    rec = stack.only_received()
    assert rec.path == CHAT
    assert rec.body == body
    assert_verdict(rec, decision="pass", level="low", score=LOW_SCORE)
    assert_length_consistent(rec)


@pytest.mark.parametrize(
    ("path", "adapter", "template"),
    [
        (CHAT, OPENAI_CHAT, CHAT_RAW),
        (COMPLETIONS, OPENAI_COMPLETIONS, COMPLETIONS_RAW),
        (MESSAGES, ANTHROPIC_MESSAGES, MESSAGES_RAW),
    ],
    ids=["chat", "completions", "messages"],
)
def test_context_budget_downgrade_rewrites_only_the_limit(
    stack: E2E, path: str, adapter: SchemaAdapter, template: str
) -> None:
    body = raw_body(template, '"max_tokens" :  100000')
    expected = budget(adapter, body)
    assert 0 < expected < MAX_MODEL_LEN - OUTPUT_BUFFER
    reply = stack.post(path, body)
    assert reply.status == 200, reply
    common = {"decision": "downgrade", "level": "low", "score": "0"}
    assert_verdict(reply, **common, reason="context_budget", original="100000")
    rec = stack.only_received()
    assert rec.body == raw_body(template, f'"max_tokens" :  {expected}')
    assert_verdict(rec, **common, reason="context_budget", original="100000")
    assert_length_consistent(rec)


def test_context_budget_downgrade_rewrites_max_completion_tokens(stack: E2E) -> None:
    body = raw_body(CHAT_RAW, '"max_completion_tokens":100000')
    expected = budget(OPENAI_CHAT, body)
    reply = stack.post(CHAT, body)
    assert reply.status == 200, reply
    common = {"decision": "downgrade", "level": "low", "score": "0"}
    assert_verdict(reply, **common, reason="context_budget", original="100000")
    rec = stack.only_received()
    assert rec.body == raw_body(CHAT_RAW, f'"max_completion_tokens":{expected}')
    assert "max_tokens" not in rec.json()
    assert_verdict(rec, **common, reason="context_budget", original="100000")
    assert_length_consistent(rec)


def test_context_budget_downgrade_rewrites_both_limit_fields(stack: E2E) -> None:
    body = raw_body(CHAT_RAW, '"max_tokens": 200000, "max_completion_tokens" :100000')
    expected = budget(OPENAI_CHAT, body)
    reply = stack.post(CHAT, body)
    assert reply.status == 200, reply
    # The smaller of the two limits is the one the client asked for.
    common = {"decision": "downgrade", "level": "low", "score": "0"}
    assert_verdict(reply, **common, reason="context_budget", original="100000")
    rec = stack.only_received()
    limits = f'"max_tokens": {expected}, "max_completion_tokens" :{expected}'
    assert rec.body == raw_body(CHAT_RAW, limits)
    assert_verdict(rec, **common, reason="context_budget", original="100000")
    assert_length_consistent(rec)


def test_high_pressure_injects_the_cap_into_a_request_without_a_limit(stack: E2E) -> None:
    stack.set_state(HIGH, level="high", score=HIGH_SCORE)
    body = b'{"model": "dev-model",  "messages": [{"role": "user", "content": "hi"}], "n": 1 }\n'
    reply = stack.post(CHAT, body)
    assert reply.status == 200, reply
    assert_verdict(
        reply, decision="downgrade", level="high", score=HIGH_SCORE, reason="pressure_cap"
    )
    rec = stack.only_received()
    assert_verdict(rec, decision="downgrade", level="high", score=HIGH_SCORE, reason="pressure_cap")
    sent = json.loads(body)
    got = rec.json()
    assert got == {**sent, "max_tokens": CAP_HIGH}
    assert list(got)[-1] == "max_tokens"
    assert rec.body.startswith(body[: body.rindex(b"1") + 1])  # everything before is unchanged
    assert_length_consistent(rec)


def test_high_pressure_lowers_a_limit_above_the_cap(stack: E2E) -> None:
    stack.set_state(HIGH, level="high", score=HIGH_SCORE)
    reply = stack.post(CHAT, {"model": "dev-model", "messages": MSGS, "max_tokens": 5000})
    assert reply.status == 200
    assert_verdict(
        reply,
        decision="downgrade",
        level="high",
        score=HIGH_SCORE,
        reason="pressure_cap",
        original="5000",
    )
    assert stack.only_received().json()["max_tokens"] == CAP_HIGH


def test_standard_request_under_the_cap_passes_at_high_pressure(stack: E2E) -> None:
    stack.set_state(HIGH, level="high", score=HIGH_SCORE)
    body = {"model": "dev-model", "messages": MSGS, "max_tokens": 64}
    reply = stack.post(CHAT, body)
    assert reply.status == 200
    assert_verdict(reply, decision="pass", level="high", score=HIGH_SCORE)
    assert stack.only_received().json() == body


def assert_shed(reply: Reply, *, level: str, score: str) -> None:
    assert reply.status == 429, reply
    assert reply.header("retry-after") == str(RETRY_AFTER_S)
    assert reply.header("content-type") == "application/json"
    assert_verdict(reply, decision="reject", level=level, score=score, reason="memory_pressure")


def test_sheddable_request_is_rejected_429_at_high_pressure(stack: E2E) -> None:
    stack.set_state(HIGH, level="high", score=HIGH_SCORE)
    body = {"model": "dev-model", "messages": MSGS, "max_tokens": 64}
    reply = stack.post(CHAT, body, {"x-priority": "sheddable"})
    assert_shed(reply, level="high", score=HIGH_SCORE)
    error = reply.json()["error"]
    assert error["code"] == "memory_pressure"
    assert error["type"] == "rate_limit_error"
    assert stack.received() == []


def test_completions_route_defaults_to_sheddable(stack: E2E) -> None:
    stack.set_state(HIGH, level="high", score=HIGH_SCORE)
    reply = stack.post(COMPLETIONS, {"model": "dev-model", "prompt": "hi", "max_tokens": 8})
    assert_shed(reply, level="high", score=HIGH_SCORE)
    assert reply.json()["error"]["code"] == "memory_pressure"
    assert stack.received() == []


@pytest.mark.parametrize("path", [CHAT, MESSAGES], ids=["chat", "messages"])
def test_standard_request_is_rejected_429_at_critical_pressure(stack: E2E, path: str) -> None:
    stack.set_state(CRITICAL, level="critical", score=CRITICAL_SCORE)
    body = {"model": "dev-model", "messages": MSGS, "max_tokens": 64}
    reply = stack.post(path, body)
    assert_shed(reply, level="critical", score=CRITICAL_SCORE)
    doc = reply.json()
    if path == MESSAGES:
        assert doc["type"] == "error"
        assert doc["error"]["type"] == "rate_limit_error"
        assert doc["error"]["code"] == "memory_pressure"
    else:
        assert doc["error"]["code"] == "memory_pressure"
    assert stack.received() == []


def test_critical_priority_is_never_shed_only_capped(stack: E2E) -> None:
    stack.set_state(CRITICAL, level="critical", score=CRITICAL_SCORE)
    body = {"model": "dev-model", "messages": MSGS, "max_tokens": 2048}
    reply = stack.post(CHAT, body, {"x-priority": "critical"})
    assert reply.status == 200, reply
    assert_verdict(
        reply,
        decision="downgrade",
        level="critical",
        score=CRITICAL_SCORE,
        reason="pressure_cap",
        original="2048",
    )
    rec = stack.only_received()
    assert rec.json() == {**body, "max_tokens": CAP_CRITICAL}


def test_concurrent_requests_are_judged_each_on_its_own(stack: E2E) -> None:
    """Interleaved streams keep their own priority, limit and body (no state shared)."""
    stack.set_state(HIGH, level="high", score=HIGH_SCORE)

    def send(i: int) -> tuple[int, Reply]:
        priority = "sheddable" if i % 3 == 0 else "standard"
        content = f"request number {i} " + "pad " * (i * 37)
        body = {"model": "dev-model", "messages": [{"role": "user", "content": content}]}
        body["max_tokens"] = 500 + 200 * i
        return i, stack.post(CHAT, body, {"x-priority": priority})

    with ThreadPoolExecutor(max_workers=12) as pool:
        replies = dict(pool.map(send, range(36)))
    for i, reply in replies.items():
        if i % 3 == 0:
            assert reply.status == 429, (i, reply)
            continue
        assert reply.status == 200, (i, reply)
        asked = 500 + 200 * i
        if asked > CAP_HIGH:
            assert reply.header("x-ice-original-max-tokens") == str(asked)
            assert reply.header("x-ice-decision") == "downgrade"
        else:
            assert reply.header("x-ice-decision") == "pass"
    got = {int(r.json()["messages"][0]["content"].split()[2]): r for r in stack.received()}
    assert sorted(got) == [i for i in range(36) if i % 3]
    for i, rec in got.items():
        assert rec.json()["max_tokens"] == min(500 + 200 * i, CAP_HIGH)
        assert rec.header("x-ice-decision") == replies[i].header("x-ice-decision")


@pytest.mark.parametrize("path", [CHAT, MESSAGES], ids=["openai", "anthropic"])
def test_input_over_max_model_len_is_rejected_400_in_the_api_format(stack: E2E, path: str) -> None:
    body = {"model": "dev-model", "messages": [{"role": "user", "content": LONG_INPUT}]}
    body["max_tokens"] = 16
    reply = stack.post(path, body)
    assert reply.status == 400, reply
    assert reply.header("retry-after") is None
    assert_verdict(
        reply, decision="reject", level="low", score="0", reason="context_length_exceeded"
    )
    doc = reply.json()
    if path == MESSAGES:
        assert doc["type"] == "error"
        assert doc["error"]["type"] == "invalid_request_error"
        assert doc["error"]["code"] == "context_length_exceeded"
    else:
        assert doc["error"]["code"] == "context_length_exceeded"
        assert doc["error"]["type"] == "invalid_request_error"
        assert doc["error"]["param"] == "messages"
    assert str(MAX_MODEL_LEN) in doc["error"]["message"]
    assert stack.received() == []


# --- the official SDKs see ICE's answers as their own API's responses ---------------------


def openai_client(stack: E2E) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key="x", max_retries=0)


def anthropic_client(stack: E2E) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=stack.base_url, api_key="x", max_retries=0)


def test_openai_sdk_parses_passed_and_downgraded_replies(stack: E2E) -> None:
    msgs: Any = MSGS
    with openai_client(stack) as client:
        raw = client.chat.completions.with_raw_response.create(
            model="dev-model", messages=msgs, max_tokens=100000
        )
        assert raw.headers["x-ice-decision"] == "downgrade"
        chat = raw.parse()
        assert chat.choices[0].message.content == " ".join(f"tok{i}" for i in range(16))
        completion = client.completions.create(model="dev-model", prompt="hi", max_tokens=3)
        assert completion.choices[0].text == "tok0 tok1 tok2"
    assert [r.json()["max_tokens"] for r in stack.received()] == [
        budget(OPENAI_CHAT, json.dumps({"messages": MSGS}).encode()),
        3,
    ]


def test_openai_sdk_raises_rate_limit_error_on_shed(stack: E2E) -> None:
    stack.set_state(HIGH, level="high", score=HIGH_SCORE)
    msgs: Any = MSGS
    with openai_client(stack) as client, pytest.raises(openai.RateLimitError) as caught:
        client.chat.completions.create(
            model="dev-model",
            messages=msgs,
            max_tokens=8,
            extra_headers={"x-priority": "sheddable"},
        )
    assert caught.value.status_code == 429
    assert caught.value.code == "memory_pressure"
    assert caught.value.response.headers["retry-after"] == str(RETRY_AFTER_S)
    assert caught.value.response.headers["x-ice-decision"] == "reject"
    assert stack.received() == []


def test_openai_sdk_raises_bad_request_on_oversized_input(stack: E2E) -> None:
    msgs: Any = [{"role": "user", "content": LONG_INPUT}]
    with openai_client(stack) as client, pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="dev-model", messages=msgs, max_tokens=8)
    assert caught.value.code == "context_length_exceeded"
    assert stack.received() == []


def test_anthropic_sdk_parses_a_passed_reply(stack: E2E) -> None:
    with anthropic_client(stack) as client:
        msg = client.messages.create(
            model="dev-model",
            max_tokens=4,
            system="Be brief.",
            messages=[MSGS[0]],  # type: ignore[list-item]
        )
    assert msg.type == "message"
    assert msg.content[0].type == "text"
    assert msg.content[0].text == "tok0 tok1 tok2 tok3"
    assert msg.stop_reason == "max_tokens"
    assert stack.only_received().header("x-ice-decision") == "pass"


def test_anthropic_sdk_raises_rate_limit_error_on_shed(stack: E2E) -> None:
    stack.set_state(CRITICAL, level="critical", score=CRITICAL_SCORE)
    with anthropic_client(stack) as client, pytest.raises(anthropic.RateLimitError) as caught:
        client.messages.create(model="dev-model", max_tokens=4, messages=[MSGS[0]])  # type: ignore[list-item]
    assert caught.value.status_code == 429
    body: Any = caught.value.body
    assert body["type"] == "error"
    assert body["error"]["type"] == "rate_limit_error"
    assert body["error"]["code"] == "memory_pressure"
    assert caught.value.response.headers["retry-after"] == str(RETRY_AFTER_S)
    assert stack.received() == []


def test_anthropic_sdk_raises_bad_request_on_oversized_input(stack: E2E) -> None:
    with anthropic_client(stack) as client, pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(
            model="dev-model", max_tokens=4, messages=[{"role": "user", "content": LONG_INPUT}]
        )
    body: Any = caught.value.body
    assert body["error"]["code"] == "context_length_exceeded"
    assert stack.received() == []
