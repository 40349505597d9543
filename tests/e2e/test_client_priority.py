"""Through real Envoy: a client's ``x-priority: critical`` is not believed by default
(``client_priority: cap``). At full memory 16 prompts of about 2,000 tokens that claim
``critical`` are shed as 16 ``standard`` ones are, and Envoy's access log shows the priority
each was judged at and the claim ICE did not take. A client may still lower its request.

(The rest of the e2e suite runs with ``client_priority: trust``: it plays the mesh that sets
the header, and sends ``critical`` for requests that must not be shed.)"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .harness import (
    CHAT,
    CRITICAL,
    CRITICAL_SCORE,
    E2E,
    HIGH,
    HIGH_SCORE,
    Reply,
    running_stack,
)
from .harness import access_log_entry as _entry

PROMPT = "tokens " * 2000  # about 2,000 prompt tokens
BODY = {"model": "dev-model", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 64}
N = 16


def _burst(e2e: E2E, tag: str, priority: str) -> list[Reply]:
    def send(i: int) -> Reply:
        return e2e.post(f"{CHAT}?t={tag}{i}", BODY, {"x-priority": priority})

    with ThreadPoolExecutor(max_workers=N) as pool:
        return list(pool.map(send, range(N)))


def test_a_client_claiming_critical_is_shed_at_full_memory_as_standard_is(
    tmp_path: Path,
) -> None:
    with running_stack(tmp_path, client_priority="cap") as e2e:
        e2e.set_state(CRITICAL, level="critical", score=CRITICAL_SCORE)
        claimed = _burst(e2e, "claim", "critical")
        standard = _burst(e2e, "std", "standard")
        for reply in (*claimed, *standard):
            assert reply.status == 429, reply
            assert reply.header("x-ice-reason") == "memory_pressure"
        assert e2e.received() == []  # none of the 32 reached the backend
        for i in range(N):
            claim = _entry(e2e, f"{CHAT}?t=claim{i}")
            assert (claim["decision"], claim["reason"]) == ("reject", "memory_pressure")
            assert int(claim["input_tokens"]) >= 1500
            assert (claim["priority"], claim["priority_claimed"]) == ("standard", "critical")
            plain = _entry(e2e, f"{CHAT}?t=std{i}")
            assert (plain["priority"], plain["priority_claimed"]) == ("standard", None)


def test_a_client_may_still_lower_its_request(tmp_path: Path) -> None:
    with running_stack(tmp_path, client_priority="cap") as e2e:
        e2e.set_state(HIGH, level="high", score=HIGH_SCORE)
        body = {**BODY, "messages": [{"role": "user", "content": "hi"}]}
        shed = e2e.post(f"{CHAT}?t=low", body, {"x-priority": "sheddable"})
        assert shed.status == 429 and shed.header("x-ice-reason") == "memory_pressure"
        passed = e2e.post(f"{CHAT}?t=high", body, {"x-priority": "critical"})
        assert passed.status == 200 and passed.header("x-ice-decision") == "pass"
        low, high = _entry(e2e, f"{CHAT}?t=low"), _entry(e2e, f"{CHAT}?t=high")
        assert (low["priority"], low["priority_claimed"]) == ("sheddable", None)
        assert (high["priority"], high["priority_claimed"]) == ("standard", "critical")
