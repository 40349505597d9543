"""Through real Envoy, ``admission: slo`` (docs/slo.md, "Decisions"): with a backend whose
scrapes show a prefill speed and a queue, a request whose predicted time to first token misses
its target gets 429 ``slo_unreachable`` at once (Retry-After, the API's error format, nothing
sent upstream); the same request with a target it can make passes to the backend."""

from __future__ import annotations

import json
import time
from pathlib import Path

from ext_proc.lab.slo_page import speed_page as page

from .harness import CHAT, E2E, RETRY_AFTER_S, running_stack

BODY = {"model": "dev-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


def until_judged_by_speed(e2e: E2E, timeout_s: float = 15.0) -> None:
    """Wait until ICE's window holds a prefill speed: a 1 ms target is refused."""
    deadline = time.monotonic() + timeout_s
    while True:
        reply = e2e.post(CHAT, BODY, {"x-llm-d-slo-ttft-ms": "1"})
        if reply.header("x-ice-reason") == "slo_unreachable":
            return
        assert time.monotonic() < deadline, (reply.status, reply.header_list)
        time.sleep(0.1)


def test_slo_unreachable_at_once_and_a_pass_within_target(tmp_path: Path) -> None:
    extra = "    admission: slo\n    slo: {ttft_ms: 2000}\n"
    with running_stack(tmp_path, profile_extra=extra) as e2e:
        e2e.set_raw_metrics(page(1, 40))
        time.sleep(0.5)  # scraped every 0.1 s: one interval with the prefill in it
        e2e.set_raw_metrics(page(2, 40))
        until_judged_by_speed(e2e)
        e2e.backend("DELETE", "/_dev/requests")
        # 40 waiting × 50 tokens ÷ 100 tok/s = 20 s ahead: the profile's 2 s cannot be met
        started = time.monotonic()
        reply = e2e.post(CHAT, BODY)
        took = time.monotonic() - started
        assert reply.status == 429, reply
        assert reply.header("x-ice-decision") == "reject"
        assert reply.header("x-ice-reason") == "slo_unreachable"
        assert reply.header("x-ice-slo-ttft-ms") == "2000"
        # ceil(20.x − 2) s, within the harness's pinned retry_after_min_s..max_s
        assert reply.header("retry-after") == str(RETRY_AFTER_S)
        error = json.loads(reply.body)["error"]
        assert error["code"] == "slo_unreachable" and error["type"]
        assert "its target is 2000 ms" in error["message"]
        assert took < 1.0  # at once, not after a wait (the figure for 5 ms is the bench's)
        assert e2e.backend("GET", "/_dev/requests").json() == []
        # a looser client target may not loosen the profile's: still refused
        looser = e2e.post(CHAT, BODY, {"x-llm-d-slo-ttft-ms": "60000"})
        assert looser.header("x-ice-reason") == "slo_unreachable"
        # the queue drains: 0 waiting, the request alone is well within 2 s
        e2e.set_raw_metrics(page(2, 0))
        deadline = time.monotonic() + 15.0
        while True:
            reply = e2e.post(CHAT, BODY)
            if reply.status == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert reply.status == 200, reply
        assert reply.header("x-ice-decision") == "pass"
        sent = e2e.backend("GET", "/_dev/requests").json()
        assert len(sent) == 1 and dict(sent[0]["headers"]).get("x-ice-slo-ttft-ms") == "2000"
