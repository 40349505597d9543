"""Requests ICE passed since its view was taken count against the view's free blocks
(``Pipeline._room``): a burst between two scrapes is not judged against the same free
blocks request after request."""

from __future__ import annotations

import json
import time

from ext_proc.pipeline import HeaderFacts, Pipeline
from ext_proc.policy.load import parse_policy
from ext_proc.schemas import OPENAI_CHAT
from ext_proc.signals.snapshot import BackendSignals, PoolSnapshot

# 11 blocks of 16 tokens, none used: floor((11 − 1) × 1.0) = 10 free blocks
BACKEND = BackendSignals(
    url="u", kv_cache_usage=0.0, num_requests_waiting=0, num_gpu_blocks=11, block_size=16
)
# "x" * 200 → 50 tokens + 4 + 3 = 57 input; + 40 output = 97 tokens = 7 blocks of 16
BODY = json.dumps({"messages": [{"role": "user", "content": "x" * 200}], "max_tokens": 40})


def test_a_passed_request_holds_its_blocks_until_a_newer_view() -> None:
    views = {"now": PoolSnapshot("default", (BACKEND,), time.monotonic() - 1.0)}
    pipeline = Pipeline(
        parse_policy("profiles: {default: {on_kv_shortfall: shed}}"), lambda _: views["now"]
    )
    route = pipeline.router.resolve([])
    facts = HeaderFacts(adapter=OPENAI_CHAT, priority="standard")

    def judge() -> str:
        verdict = pipeline.on_body(route, facts, BODY.encode())
        assert verdict is not None and verdict.decision is not None
        pipeline.record(route, verdict)
        return f"{verdict.decision.decision}:{verdict.decision.reason}"

    assert judge() == "pass:ok"
    # 10 − 7 = 3 blocks left in this worker's view: 7 do not fit
    assert judge() == "reject:kv_exhausted"
    views["now"] = PoolSnapshot("default", (BACKEND,), time.monotonic())  # a newer view
    assert judge() == "pass:ok"  # the view now speaks for the first request


def test_rejected_requests_hold_nothing() -> None:
    views = {"now": PoolSnapshot("default", (BACKEND,), time.monotonic() - 1.0)}
    pipeline = Pipeline(
        parse_policy("profiles: {default: {on_kv_shortfall: shed}}"), lambda _: views["now"]
    )
    route = pipeline.router.resolve([])
    facts = HeaderFacts(adapter=OPENAI_CHAT, priority="standard")
    big = json.dumps({"messages": [{"role": "user", "content": "x" * 200}], "max_tokens": 400})
    for _ in range(3):  # 57 + 400 tokens = 29 blocks > 10: shed, and nothing is held
        verdict = pipeline.on_body(route, facts, big.encode())
        assert verdict is not None and verdict.decision is not None
        assert verdict.decision.decision == "reject"
        pipeline.record(route, verdict)
    verdict = pipeline.on_body(route, facts, BODY.encode())
    assert verdict is not None and verdict.decision is not None
    assert verdict.decision.decision == "pass"


def test_the_ledgers_running_total_follows_expiry_and_its_cap() -> None:
    from ext_proc.poolview import MAX_INFLIGHT, _Entries

    entries = _Entries()
    for i in range(MAX_INFLIGHT + 10):
        entries.add(float(i), 2)
    # the 10 oldest went past the cap: the total is the sum of the entries kept
    assert entries.total == 2 * MAX_INFLIGHT == sum(b for _, b in entries.entries)
    entries.expire(20.0)  # a view taken at t=20 shows the entries up to it (t = 10..20)
    assert entries.total == sum(b for _, b in entries.entries) == 2 * (MAX_INFLIGHT - 11)


def test_workers_sharing_a_ledger_count_each_others_passed_requests() -> None:
    from ext_proc.signals.ledger_shm import LedgerHandle, LedgerSegment

    views = {"now": PoolSnapshot("default", (BACKEND,), time.monotonic() - 1.0)}
    policy = parse_policy("profiles: {default: {on_kv_shortfall: shed}}")
    with LedgerSegment(2) as segment:
        one, two = LedgerHandle(segment.name, 0), LedgerHandle(segment.name, 1)
        try:
            a = Pipeline(policy, lambda _: views["now"], ledger=one)
            b = Pipeline(policy, lambda _: views["now"], ledger=two)
            route = a.router.resolve([])
            facts = HeaderFacts(adapter=OPENAI_CHAT, priority="standard")

            def judge(p: Pipeline) -> str:
                verdict = p.on_body(route, facts, BODY.encode())
                assert verdict is not None and verdict.decision is not None
                p.record(route, verdict)
                return f"{verdict.decision.decision}:{verdict.decision.reason}"

            assert judge(a) == "pass:ok"  # 7 of the 10 free blocks, in worker 0
            assert judge(b) == "reject:kv_exhausted"  # worker 1 sees them: 3 left
            views["now"] = PoolSnapshot("default", (BACKEND,), time.monotonic())
            assert judge(b) == "pass:ok"  # a newer view speaks for worker 0's request
            # a reloaded pipeline keeps the worker's handle
            assert Pipeline(policy, lambda _: views["now"], carry=b).views.shared is two
        finally:
            one.close()
            two.close()
