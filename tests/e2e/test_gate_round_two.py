"""Issue 30 through real Envoy: odd shapes never fail open (item 1), and text the chat
template renders is counted (item 6). Each request here passed unjudged, or under its
limit, before; now ICE answers it itself and the backend never sees it."""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest

from .harness import CHAT, E2E, JUDGED_ROUTES, MESSAGES, PROBE, PROBE_HEADERS

ODD = {"type": [], "text": "hi"}
ODD_PART: dict[str, dict[str, Any]] = {
    CHAT: {"messages": [{"role": "user", "content": [ODD]}]},
    "/v1/chat/completions/batch": {"messages": [[{"role": "user", "content": [ODD]}]]},
    MESSAGES: {"messages": [{"role": "user", "content": [ODD]}]},
    "/v1/responses": {"input": [{"role": "user", "content": [ODD]}]},
    "/inference/v1/generate": {"token_ids": [1, 2], "content_parts": [ODD], "sampling_params": {}},
    "/invocations": {"messages": [{"role": "user", "content": [ODD]}]},
    "/v1/embeddings": {"messages": [{"role": "user", "content": [ODD]}]},
}
HUGE = "7" * (sys.get_int_max_str_digits() + 1)


def odd_part(path: str) -> bytes:
    return json.dumps(
        {"model": "dev-model", "n": 64, "max_tokens": 10**8, **ODD_PART[path]}
    ).encode()


def huge_integer(path: str) -> bytes:
    doc = json.dumps({"model": "dev-model", "n": 64, "max_tokens": 10**8, **ODD_PART[path]})
    doc = doc.replace(json.dumps([ODD]), '"hi"')
    return (doc[:-1] + f', "metadata": {{"x": {HUGE}}}}}').encode()


CASES = [
    *(pytest.param(p, odd_part(p), "invalid_type", id=f"part_type{p}") for p in ODD_PART),
    *(pytest.param(p, huge_integer(p), "invalid_json", id=f"huge_int{p}") for p in ODD_PART),
]


def assert_still_judging(stack: E2E) -> None:
    reply = stack.post(CHAT, PROBE, PROBE_HEADERS)
    assert reply.status == 200, reply
    assert reply.header("x-ice-decision") == "pass"


@pytest.mark.parametrize(("path", "body", "code"), CASES)
def test_an_odd_type_or_a_too_long_integer_is_the_apis_400_never_a_pass(
    stack: E2E, path: str, body: bytes, code: str
) -> None:
    route = JUDGED_ROUTES[path]
    before = stack.ice_metric("ice_bad_requests_total", route=route, reason=code)
    reply = stack.post(path, body)
    assert reply.status == 400, reply
    doc = reply.json()
    if path == MESSAGES:
        assert doc["type"] == "error"
    assert doc["error"]["code"] == code
    assert reply.header("x-ice-decision") == "reject"
    assert reply.header("x-ice-reason") == code
    assert stack.received() == []
    assert stack.ice_metric("ice_judge_errors_total") == 0
    after = stack.ice_metric("ice_bad_requests_total", route=route, reason=code)
    assert after == before + 1
    assert_still_judging(stack)


TEXT = ("The memory of the cache holds blocks of tokens; why it fills is the question. " * 800)[
    :60_000
]
BASE = [{"role": "user", "content": "hi"}]
RENDERED: dict[str, dict[str, Any]] = {
    "documents": {"messages": BASE, "documents": [{"text": TEXT}]},
    "kwargs_documents": {"messages": BASE, "chat_template_kwargs": {"documents": [{"text": TEXT}]}},
    "reasoning": {"messages": [*BASE, {"role": "assistant", "content": "", "reasoning": TEXT}]},
    "reasoning_content": {
        "messages": [*BASE, {"role": "assistant", "content": "", "reasoning_content": TEXT}]
    },
}


@pytest.mark.parametrize("field", sorted(RENDERED))
def test_text_the_template_renders_is_refused_like_the_same_text_in_a_message(
    stack: E2E, field: str
) -> None:
    for body in ({"messages": [*BASE, {"role": "user", "content": TEXT}]}, RENDERED[field]):
        reply = stack.post(CHAT, {"model": "dev-model", "max_tokens": 7000, **body})
        assert reply.status == 400, reply
        assert reply.json()["error"]["code"] == "context_length_exceeded"
        assert reply.header("x-ice-decision") == "reject"
    assert stack.received() == []
    assert_still_judging(stack)
