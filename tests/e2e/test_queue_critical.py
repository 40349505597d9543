"""``queue.critical: wait`` through real Envoy and ICE, against the dev backend: a critical
request the pool has no room for waits in ICE rather than going upstream over the room, goes
on when room appears, and at its deadline goes on anyway: never refused."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import pytest

from .harness import CHAT, E2E, IDLE, KV_TIGHT, Recorded, request, running_stack

WAIT_MS = 1500
QUEUE = f"""    on_kv_shortfall: shed
    client_priority: trust
    queue: {{enabled: true, max_queue_wait_ms: {WAIT_MS}, critical: wait}}
"""
# KV_TIGHT: 90 free blocks of 16 tokens; this body needs ~1,507 + 16 tokens: it does not fit
BODY = {
    "model": "dev-model",
    "messages": [{"role": "user", "content": "word " * 1200}],
    "max_tokens": 16,
}


@pytest.fixture(scope="module")
def waiting(tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2E]:
    with running_stack(tmp_path_factory.mktemp("queue-critical"), profile_extra=QUEUE) as e2e:
        yield e2e


@pytest.fixture(autouse=True)
def _reset(waiting: E2E) -> None:
    waiting.reset()


def post(e2e: E2E) -> tuple[float, object]:
    start = time.monotonic()
    reply = request(
        e2e.envoy_port,
        "POST",
        CHAT,
        json.dumps(BODY).encode(),
        {"content-type": "application/json", "x-priority": "critical"},
    )
    return time.monotonic() - start, reply


def ours(e2e: E2E) -> list[Recorded]:
    return [r for r in e2e.received() if r.json().get("messages") == BODY["messages"]]


def test_a_critical_request_without_room_waits_and_goes_on_when_room_appears(
    waiting: E2E,
) -> None:
    waiting.set_state(KV_TIGHT, level="low", score="6")
    timer = threading.Timer(0.6, lambda: waiting.set_state(IDLE, level="low", score="0"))
    timer.start()
    try:
        took, reply = post(waiting)
    finally:
        timer.cancel()
    assert reply.status == 200, reply  # type: ignore[attr-defined]
    waited = int(reply.header("x-ice-queued-ms"))  # type: ignore[attr-defined]
    assert 0 < waited < WAIT_MS and took * 1000 >= waited
    (sent,) = ours(waiting)
    assert sent.header("x-ice-queued-ms") == str(waited)
    assert waiting.ice_metric("ice_queue_outcomes_total", outcome="admitted") >= 1


def test_a_critical_request_still_without_room_at_its_deadline_goes_on_not_429(
    waiting: E2E,
) -> None:
    waiting.set_state(KV_TIGHT, level="low", score="6")
    took, reply = post(waiting)
    assert reply.status == 200, reply  # type: ignore[attr-defined]
    assert int(reply.header("x-ice-queued-ms")) >= WAIT_MS  # type: ignore[attr-defined]
    assert took * 1000 >= WAIT_MS
    assert len(ours(waiting)) == 1
    assert waiting.ice_metric("ice_queue_outcomes_total", outcome="passed") >= 1
