"""Only ICE sets its verdict headers: client-sent copies never reach the backend as sent."""

from __future__ import annotations

import pytest

from .harness import CHAT, E2E, HIGH, HIGH_SCORE, MESSAGES, VERDICT_HEADERS

SPOOFED = {
    "x-mem-pressure": "low",
    "x-mem-pressure-score": "0",
    "x-downgraded": "true",
    "x-ice-decision": "pass",
    "x-ice-reason": "ok",
    "x-ice-original-max-tokens": "7",
    "X-ICE-Anything": "1",
    "X-Mem-Pressure-Extra": "spoof",
}
BODY = {"model": "dev-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 64}


@pytest.mark.parametrize("path", [CHAT, MESSAGES], ids=["openai", "anthropic"])
def test_spoofed_verdict_headers_are_replaced_by_ices_own(stack: E2E, path: str) -> None:
    stack.set_state(HIGH, level="high", score=HIGH_SCORE)
    reply = stack.post(path, BODY, SPOOFED)
    assert reply.status == 200, reply
    rec = stack.only_received()
    ice = {"x-mem-pressure": "high", "x-mem-pressure-score": HIGH_SCORE, "x-ice-decision": "pass"}
    for seen in (rec, reply):
        # Each of ICE's headers exactly once with ICE's value; every other spoofed one gone.
        for name in {*VERDICT_HEADERS, "x-ice-anything", "x-mem-pressure-extra"}:
            want = [ice[name]] if name in ice else []
            assert seen.headers_named(name) == want, (name, seen.header_list)


def test_spoofed_downgrade_headers_are_overwritten_on_a_downgrade(stack: E2E) -> None:
    stack.set_state(HIGH, level="high", score=HIGH_SCORE)
    body = {**BODY, "max_tokens": 5000}
    reply = stack.post(CHAT, body, {**SPOOFED, "x-ice-original-max-tokens": "1"})
    assert reply.status == 200, reply
    rec = stack.only_received()
    assert rec.json()["max_tokens"] == 1024
    assert rec.headers_named("x-ice-original-max-tokens") == ["5000"]
    assert rec.headers_named("x-downgraded") == ["true"]
    assert rec.headers_named("x-ice-decision") == ["downgrade"]
    assert rec.headers_named("x-ice-reason") == ["pressure_cap"]
    assert rec.headers_named("x-ice-anything") == []
