"""Each tenant's share of the pool through real Envoy and ICE, against the dev backend:
while tenant A's streamed request holds its blocks, A's next request is over A's cap and is
refused with 429 ``tenant_share_exceeded`` (after its short wait in the queue) although the
pool has room, while tenant B's identical request passes; once A's stream ends, A passes."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from .harness import CHAT, E2E, IDLE, Reply, running_stack

WAIT_MS = 300
QUEUE = f"""    queue: {{enabled: true, max_queue_wait_ms: {WAIT_MS}, tenant_header: x-tenant}}
"""
# 101 GPU blocks of 16 tokens: U = 100 usable. A's cap: floor(0.2 × 100) = 20 blocks
SHARES = "    tenant_shares: {cap: 1.0, caps: {A: 0.2}}\n"
ROOMY = {**IDLE, "num_gpu_blocks": 101}
# a short prompt (under 9 tokens) and 200 output tokens: ceil((prompt + 200) / 16) = 13 blocks;
# two are 26 > 20
BODY = {"model": "dev-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 200}


@pytest.fixture(scope="module")
def shares(tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2E]:
    workdir = tmp_path_factory.mktemp("tenant-shares")
    with running_stack(workdir, profile_extra=QUEUE, pool_extra=SHARES) as e2e:
        e2e.set_state(ROOMY, level="low", score="0")
        yield e2e


def post(e2e: E2E, tenant: str) -> Reply:
    return e2e.post(CHAT, BODY, {"x-tenant": tenant})


def test_tenant_a_over_its_cap_is_refused_while_b_passes(shares: E2E) -> None:
    held: list[Reply] = []
    stream = {**BODY, "stream": True}
    slow = {"x-tenant": "A", "x-dev-stream-delay-ms": "150"}  # ~18 events: ~2.7 s in flight
    first = threading.Thread(target=lambda: held.append(shares.post(CHAT, stream, slow)))
    first.start()
    try:
        deadline = time.monotonic() + 10
        while shares.ice_metric("ice_tenant_blocks_held", tenant="A") <= 0:
            assert time.monotonic() < deadline, shares.log_tails()
            time.sleep(0.02)
        assert shares.ice_metric("ice_tenant_blocks_held", tenant="A") == 13
        refused = shares.ice_metric("ice_tenant_share_refusals_total")
        reply = post(shares, "A")  # 13 + 13 = 26 > 20, with 87 blocks free
        assert reply.status == 429, reply
        assert reply.json()["error"]["code"] == "tenant_share_exceeded"
        assert reply.header("x-ice-reason") == "tenant_share_exceeded"
        assert int(reply.header("retry-after") or 0) >= 1
        assert int(reply.header("x-ice-queued-ms") or 0) >= WAIT_MS  # it waited first
        assert shares.ice_metric("ice_tenant_share_refusals_total") == refused + 1
        assert post(shares, "B").status == 200  # B's share is its own
    finally:
        first.join(30)
    assert held and held[0].status == 200
    deadline = time.monotonic() + 10  # the stream ended: its blocks left A's share
    while shares.ice_metric("ice_tenant_blocks_held", tenant="A") > 0:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert post(shares, "A").status == 200
