"""The admission queue through real Envoy and ICE, against the dev backend: a request the
pool has no room for waits, and goes on when room appears; it gets 429 queue_timeout when
none does; a client that leaves while queued never reaches the backend."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from .harness import CHAT, E2E, IDLE, KV_TIGHT, request, running_stack
from .harness import QUEUE_BODY as BODY
from .harness import queue_ours as ours
from .harness import queue_post as post

WAIT_MS = 2500
QUEUE = f"""    on_kv_shortfall: shed
    queue: {{enabled: true, max_queue_wait_ms: {WAIT_MS}, tenant_header: x-tenant}}
"""


@pytest.fixture(scope="module")
def queued(tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2E]:
    with running_stack(tmp_path_factory.mktemp("queue"), profile_extra=QUEUE) as e2e:
        yield e2e


@pytest.fixture(autouse=True)
def _reset(queued: E2E) -> None:
    queued.reset()


def test_a_queued_request_goes_on_when_the_backend_has_room(queued: E2E) -> None:
    queued.set_state(KV_TIGHT, level="low", score="6")
    timer = threading.Timer(0.8, lambda: queued.set_state(IDLE, level="low", score="0"))
    timer.start()
    try:
        took, reply = post(queued)
    finally:
        timer.cancel()
    assert reply.status == 200, reply  # type: ignore[attr-defined]
    waited = int(reply.header("x-ice-queued-ms"))  # type: ignore[attr-defined]
    assert 0 < waited < WAIT_MS and took * 1000 >= waited
    assert reply.header("x-ice-decision") == "pass"  # type: ignore[attr-defined]
    (sent,) = ours(queued)
    assert sent.header("x-ice-queued-ms") == str(waited)
    assert queued.ice_metric("ice_queue_outcomes_total", outcome="admitted") >= 1


def test_a_request_with_no_room_in_time_gets_429_queue_timeout(queued: E2E) -> None:
    queued.set_state(KV_TIGHT, level="low", score="6")
    took, reply = post(queued)
    assert reply.status == 429, reply  # type: ignore[attr-defined]
    error = reply.json()["error"]  # type: ignore[attr-defined]
    assert error["code"] == "queue_timeout"
    assert reply.header("x-ice-reason") == "queue_timeout"  # type: ignore[attr-defined]
    assert int(reply.header("retry-after")) >= 1  # type: ignore[attr-defined]
    assert int(reply.header("x-ice-queued-ms")) >= WAIT_MS  # type: ignore[attr-defined]
    assert took * 1000 >= WAIT_MS  # Envoy waited for ICE past its 1 s message timeout
    assert ours(queued) == []


def test_a_client_that_leaves_while_queued_never_reaches_the_backend(queued: E2E) -> None:
    queued.set_state(KV_TIGHT, level="low", score="6")
    gone = queued.ice_metric("ice_queue_outcomes_total", outcome="gone")
    data = json.dumps(BODY).encode()
    head = (
        f"POST {CHAT} HTTP/1.1\r\nhost: e2e\r\ncontent-type: application/json\r\n"
        f"content-length: {len(data)}\r\n\r\n"
    ).encode()
    sock = socket.create_connection(("127.0.0.1", queued.envoy_port), timeout=10)
    sock.sendall(head + data)
    deadline = time.monotonic() + 5
    while queued.ice_metric("ice_queue_depth") < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert queued.ice_metric("ice_queue_depth") == 1
    sock.close()  # the client leaves
    while queued.ice_metric("ice_queue_depth") > 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert queued.ice_metric("ice_queue_depth") == 0
    assert queued.ice_metric("ice_queue_outcomes_total", outcome="gone") == gone + 1
    queued.set_state(IDLE, level="low", score="0")  # room now: nothing may go on
    time.sleep(0.3)
    assert ours(queued) == []


def test_a_queued_request_goes_on_when_the_running_one_ends_not_when_the_gauge_says(
    queued: E2E,
) -> None:
    # 100 usable blocks of 16 tokens, and the gauge reads them all free the whole time (the
    # dev backend's KV usage never moves): only the first request's reservation (96 blocks,
    # kv_hold: done) keeps the second waiting, until the first one's stream ends
    queued.set_state({**IDLE, "num_gpu_blocks": 101}, level="low", score="0")
    ended: dict[str, float] = {}
    slow = {**BODY, "stream": True}

    def first() -> None:
        reply = request(
            queued.envoy_port,
            "POST",
            CHAT,
            json.dumps(slow).encode(),
            {"content-type": "application/json", "x-dev-stream-delay-ms": "60"},
        )
        ended["first"] = time.monotonic()
        ended["status"] = reply.status

    runner = threading.Thread(target=first)
    runner.start()
    deadline = time.monotonic() + 5
    while not ours(queued) and time.monotonic() < deadline:  # the first is at the backend
        time.sleep(0.02)
    time.sleep(0.3)  # newer views than its arrival: the unseen ledger no longer counts it
    _, reply = post(queued)
    ended["second"] = time.monotonic()
    runner.join(10)
    assert ended["status"] == 200
    assert reply.status == 200, reply  # type: ignore[attr-defined]
    assert int(reply.header("x-ice-queued-ms")) > 0  # type: ignore[attr-defined]
    assert ended["second"] > ended["first"]  # admitted only once the first one was over
    assert len(ours(queued)) == 2
