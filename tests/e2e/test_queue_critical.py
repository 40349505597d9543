"""``queue.critical: wait`` through real Envoy and ICE, against the dev backend: a critical
request the pool has no room for waits in ICE rather than going upstream over the room, goes
on when room appears, and at its deadline goes on anyway: never refused."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import pytest

from .harness import CHAT, E2E, IDLE, KV_TIGHT, request, running_stack
from .harness import queue_ours as ours
from .harness import queue_post as post

WAIT_MS = 1500
# the queue's body (harness.QUEUE_BODY) does not fit KV_TIGHT's 90 free blocks
QUEUE = f"""    on_kv_shortfall: shed
    client_priority: trust
    queue: {{enabled: true, max_queue_wait_ms: {WAIT_MS}, critical: wait}}
"""
CRITICAL = ("x-priority", "critical")


@pytest.fixture(scope="module")
def waiting(tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2E]:
    with running_stack(tmp_path_factory.mktemp("queue-critical"), profile_extra=QUEUE) as e2e:
        yield e2e


@pytest.fixture(autouse=True)
def _reset(waiting: E2E) -> None:
    waiting.reset()


def test_a_critical_request_without_room_waits_and_goes_on_when_room_appears(
    waiting: E2E,
) -> None:
    waiting.set_state(KV_TIGHT, level="low", score="6")
    timer = threading.Timer(0.6, lambda: waiting.set_state(IDLE, level="low", score="0"))
    timer.start()
    try:
        took, reply = post(waiting, CRITICAL)
    finally:
        timer.join(10)
    assert reply.status == 200, reply  # type: ignore[attr-defined]
    waited = int(reply.header("x-ice-queued-ms"))  # type: ignore[attr-defined]
    assert 0 < waited < WAIT_MS and took * 1000 >= waited
    assert reply.header("x-ice-decision") == "pass"  # type: ignore[attr-defined]
    assert waiting.ice_metric("ice_queue_outcomes_total", outcome="admitted") >= 1


def test_a_critical_request_still_without_room_at_its_deadline_goes_on_not_429(
    waiting: E2E,
) -> None:
    waiting.set_state(KV_TIGHT, level="low", score="6")
    took, reply = post(waiting, CRITICAL)
    assert reply.status == 200, reply  # type: ignore[attr-defined]
    assert int(reply.header("x-ice-queued-ms")) >= WAIT_MS  # type: ignore[attr-defined]
    assert took * 1000 >= WAIT_MS
    assert len(ours(waiting)) == 1
    assert waiting.ice_metric("ice_queue_outcomes_total", outcome="passed") >= 1


def test_a_small_request_arriving_while_a_critical_one_waits_goes_after_it(
    waiting: E2E,
) -> None:
    waiting.set_state(KV_TIGHT, level="low", score="6")
    got: dict[str, object] = {}
    first = threading.Thread(target=lambda: got.update(critical=post(waiting, CRITICAL)[1]))
    first.start()
    time.sleep(0.3)  # the critical request waits in ICE by now
    timer = threading.Timer(0.5, lambda: waiting.set_state(IDLE, level="low", score="0"))
    timer.start()
    try:
        small = {"model": "dev-model", "messages": [{"role": "user", "content": "hi"}]}
        reply = request(
            waiting.envoy_port,
            "POST",
            CHAT,
            json.dumps({**small, "max_tokens": 4}).encode(),
            {"content-type": "application/json"},
        )
    finally:
        first.join(10)
        timer.join(10)  # its set_state is done before the stack can stop
    # it fits KV_TIGHT's 90 free blocks on its own, yet it waited behind the critical one
    assert reply.status == 200, reply
    assert int(reply.header("x-ice-queued-ms")) > 0
    critical = got["critical"]
    assert critical.status == 200  # type: ignore[attr-defined]
    assert int(critical.header("x-ice-queued-ms")) < WAIT_MS  # type: ignore[attr-defined]
