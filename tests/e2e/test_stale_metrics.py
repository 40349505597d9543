"""When the backend's /metrics stops making sense ICE stops claiming a level, but never blocks."""

from __future__ import annotations

from .harness import CHAT, E2E, HIGH, HIGH_SCORE, MAX_AGE_S


def test_garbage_metrics_turn_pressure_unknown_and_requests_still_pass(stack: E2E) -> None:
    stack.set_state(HIGH, level="high", score=HIGH_SCORE)
    errors_before = stack.ice_metric("ice_scrape_errors_total", pool="default")
    stack.set_raw_metrics(b"\x00 this is {not prometheus text\n}}}\n")
    stack.wait_pressure("unknown", timeout_s=MAX_AGE_S + 10)
    # At high pressure this sheddable request would be refused; with no pressure known ICE
    # neither sheds nor caps.
    body = {"model": "dev-model", "messages": [{"role": "user", "content": "hi"}]}
    reply = stack.post(CHAT, {**body, "max_tokens": 5000}, {"x-priority": "sheddable"})
    assert reply.status == 200, reply
    assert reply.ice_headers() == {"x-mem-pressure": "unknown", "x-ice-decision": "pass"}
    rec = stack.only_received()
    assert rec.ice_headers() == {"x-mem-pressure": "unknown", "x-ice-decision": "pass"}
    assert rec.json()["max_tokens"] == 5000
    assert stack.ice_metric("ice_scrape_errors_total", pool="default") > errors_before

    stack.restore_metrics()
    stack.wait_pressure("high", HIGH_SCORE)
    reply = stack.post(CHAT, {**body, "max_tokens": 5000}, {"x-priority": "sheddable"})
    assert reply.status == 429
    assert reply.header("x-mem-pressure") == "high"


def test_unreachable_metrics_turn_pressure_unknown(stack: E2E) -> None:
    """A page that times out counts as no answer; the last snapshot ages out."""
    stack.set_state(HIGH, level="high", score=HIGH_SCORE)
    stack.backend("PUT", "/_dev/state", b'{"metrics_delay_s": 1.0}')  # over scrape_timeout_s
    stack.wait_pressure("unknown", timeout_s=MAX_AGE_S + 10)
    reply = stack.post(CHAT, {"model": "m", "messages": [], "max_tokens": 9})
    assert reply.status == 200
    assert reply.header("x-mem-pressure") == "unknown"
    assert reply.header("x-mem-pressure-score") is None
