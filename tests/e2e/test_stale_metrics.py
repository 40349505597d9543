"""When the backend's /metrics stops making sense ICE stops claiming a level, but never blocks."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

from ext_proc.schemas.openai import OPENAI_CHAT

from .harness import CHAT, E2E, HIGH, HIGH_SCORE, KV_TIGHT, MAX_AGE_S


def test_garbage_metrics_turn_pressure_unknown_and_requests_still_pass(stack: E2E) -> None:
    stack.set_state(HIGH, level="high", score=HIGH_SCORE)
    errors_before = stack.ice_metric("ice_scrape_errors_total", pool="default")
    stack.set_raw_metrics(b"\x00 this is {not prometheus text\n}}}\n")
    stack.wait_pressure("unknown", timeout_s=MAX_AGE_S + 10)
    # At high pressure this sheddable request would be refused; with no pressure known ICE
    # neither sheds nor caps, and judges the KV room from its own ledger (x-ice-stale: ledger).
    body = {"model": "dev-model", "messages": [{"role": "user", "content": "hi"}]}
    reply = stack.post(CHAT, {**body, "max_tokens": 5000}, {"x-priority": "sheddable"})
    assert reply.status == 200, reply
    unknown = {"x-mem-pressure": "unknown", "x-ice-decision": "pass", "x-ice-stale": "ledger"}
    assert reply.ice_headers() == unknown
    rec = stack.only_received()
    assert rec.ice_headers() == unknown
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


def test_with_no_live_view_ices_own_holds_still_bound_admission(stack: E2E) -> None:
    """The view expired (metrics unreachable): ICE still knows what it passed and has not
    seen end. KV_TIGHT's last view: 100 usable blocks of 16. Two requests in flight hold
    ceil((15 + 700) / 16) = 45 blocks each (90); a third asking 700 gets what the other 10
    blocks hold (10 × 16 − 15 = 145 tokens), marked x-ice-stale: ledger."""
    prompt = OPENAI_CHAT.features(chat(700)).input_tokens
    assert prompt == 15
    stack.set_state(KV_TIGHT, level="low", score="6")
    stack.post(CHAT, chat(5))  # ICE's view of KV_TIGHT
    stack.backend("PUT", "/_dev/state", b'{"metrics_delay_s": 1.0}')  # over scrape_timeout_s
    stack.wait_pressure("unknown", timeout_s=MAX_AGE_S + 10)
    slow = {"x-dev-stream-delay-ms": "250"}  # the dev backend streams ~16 events
    with ThreadPoolExecutor(2) as pool:
        held = [pool.submit(stack.post, CHAT, chat(700, stream=True), slow) for _ in range(2)]
        time.sleep(1.0)  # both judged and still streaming
        reply = stack.post(CHAT, chat(700))
        firsts = [f.result() for f in held]
    assert [r.status for r in firsts] == [200, 200]
    assert all(r.header("x-ice-decision") == "pass" for r in firsts)
    assert reply.status == 200, reply
    assert reply.header("x-ice-stale") == "ledger", (
        reply.ice_headers(),
        [r.ice_headers() for r in firsts],
    )
    assert reply.header("x-ice-decision") == "downgrade"
    assert reply.header("x-ice-reason") == "kv_free_blocks"
    assert reply.header("x-mem-pressure") == "unknown"
    assert stack.received()[-1].json()["max_tokens"] == 10 * 16 - 15


def chat(max_tokens: int, stream: bool = False) -> dict[str, object]:
    body: dict[str, object] = {
        "model": "dev-model",
        "messages": [{"role": "user", "content": "Summarise the history of paging."}],
        "max_tokens": max_tokens,
    }
    if stream:
        body["stream"] = True
    return body
