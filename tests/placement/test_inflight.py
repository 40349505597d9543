"""Requests ICE passed count against the view's free blocks (``ext_proc.placement.poolview``): those
passed since the view was taken (a burst between two scrapes is not judged against the same
free blocks request after request), and, under ``kv_hold: done`` (the default), every request
still in flight with its whole need until its stream ends:
room = min(free − unseen, usable − reserved)."""

from __future__ import annotations

import json
import time

from ext_proc.admit.pipeline import Pipeline, RequestFacts
from ext_proc.placement.inflight import Hold
from ext_proc.policy.load import parse_policy
from ext_proc.schemas import OPENAI_CHAT
from ext_proc.signals.snapshot import BackendSignals, PoolSnapshot

# 11 blocks of 16 tokens, none used: floor((11 − 1) × 1.0) = 10 free blocks
BACKEND = BackendSignals(
    url="u", kv_cache_usage=0.0, num_requests_waiting=0, num_gpu_blocks=11, block_size=16
)
# "x" * 200 → 50 tokens + 4 + 3 = 57 input; + 40 output = 97 tokens = 7 blocks of 16
BODY = json.dumps({"messages": [{"role": "user", "content": "x" * 200}], "max_tokens": 40})


SHED = "profiles: {default: {on_kv_shortfall: shed}}\n"
UNTIL_SEEN = (
    SHED + "pools: {default: {metrics_urls: ['http://127.0.0.1:1/metrics'], kv_hold: seen}}"
)


def judge(pipeline: Pipeline) -> tuple[str, Hold | None]:
    """BODY judged and recorded on the default route: "decision:reason", and its hold."""
    route = pipeline.router.resolve([])
    facts = RequestFacts(adapter=OPENAI_CHAT, priority="standard")
    verdict = pipeline.on_body(route, facts, BODY.encode())
    assert verdict is not None and verdict.decision is not None
    hold = pipeline.recorder.record(route, verdict)
    return f"{verdict.decision.decision}:{verdict.decision.reason}", hold


def used(blocks: int) -> BackendSignals:
    """BACKEND with ``blocks`` of its 10 usable blocks in use (the gauge's view)."""
    return BackendSignals(
        url="u",
        kv_cache_usage=blocks / 10,
        num_requests_waiting=0,
        num_gpu_blocks=11,
        block_size=16,
    )


def test_under_kv_hold_seen_a_passed_request_holds_its_blocks_until_a_newer_view() -> None:
    views = {"now": PoolSnapshot("default", (BACKEND,), time.monotonic() - 1.0)}
    pipeline = Pipeline(parse_policy(UNTIL_SEEN), lambda _: views["now"])
    assert judge(pipeline)[0] == "pass:ok"
    # 10 − 7 = 3 blocks left in this worker's view: 7 do not fit
    assert judge(pipeline)[0] == "reject:kv_exhausted"
    views["now"] = PoolSnapshot("default", (BACKEND,), time.monotonic())  # a newer view
    assert judge(pipeline)[0] == "pass:ok"  # the view now speaks for the first request


def test_a_passed_request_reserves_its_whole_need_until_its_stream_ends() -> None:
    views = {"now": PoolSnapshot("default", (BACKEND,), time.monotonic() - 1.0)}
    pipeline = Pipeline(parse_policy(SHED), lambda _: views["now"])
    got, first = judge(pipeline)
    assert got == "pass:ok" and first is not None
    # newer views: the backend shows the request's prompt (4 blocks: 57 tokens), then none
    # (not yet scheduled); it will hold 7: room = min(10 − u − 0, 10 − 7) = 3 either way
    for in_use in (4, 0):
        views["now"] = PoolSnapshot("default", (used(in_use),), time.monotonic())
        assert judge(pipeline)[0] == "reject:kv_exhausted"
    pipeline.views.release(first)  # its stream ended
    pipeline.views.release(first)  # twice: still one release
    assert pipeline.views.live["default"][""] == 0
    views["now"] = PoolSnapshot("default", (BACKEND,), time.monotonic())
    assert judge(pipeline)[0] == "pass:ok"


def test_the_room_is_the_lesser_of_the_views_free_blocks_and_what_is_not_reserved() -> None:
    views = {"now": PoolSnapshot("default", (BACKEND,), time.monotonic() - 1.0)}
    pipeline = Pipeline(parse_policy(SHED), lambda _: views["now"])
    route = pipeline.router.resolve([])
    facts = RequestFacts(adapter=OPENAI_CHAT, priority="standard")
    holds: list[Hold] = []
    for max_tokens, blocks in ((30, 3), (60, 5)):  # 8 + 30 and 8 + 60 tokens, 16 per block
        body = json.dumps(
            {"messages": [{"role": "user", "content": "x"}], "max_tokens": max_tokens}
        )
        verdict = pipeline.on_body(route, facts, body.encode())
        assert verdict is not None and verdict.features is not None
        assert -(-(verdict.features.input_tokens + max_tokens) // 16) == blocks
        hold = pipeline.recorder.record(route, verdict)
        assert hold is not None
        holds.append(hold)

    def room(in_use: int) -> int:
        views["now"] = PoolSnapshot("default", (used(in_use),), time.monotonic())
        fit = pipeline.views.room(route.profile, views["now"])
        assert fit is not None
        return fit.free_blocks

    # U = 10 usable, L = 3 + 5 = 8 reserved, A = 0 unseen: min(F, U − L) = min(10 − u, 2)
    assert room(2) == 2
    assert room(6) == 2
    pipeline.views.release(holds[1])
    # L = 3: blocks ICE never passed show in F: min(10 − 6, 7) = 4; min(10 − 2, 7) = 7
    assert room(6) == 4
    assert room(2) == 7


def test_the_ledgers_running_total_follows_expiry_and_its_cap() -> None:
    from ext_proc.placement.inflight import MAX_INFLIGHT, Entries

    entries = Entries()
    for i in range(MAX_INFLIGHT + 10):
        entries.add(float(i), 2)
    # the 10 oldest went past the cap: the total is the sum of the entries kept
    assert entries.total == 2 * MAX_INFLIGHT == sum(b for _, b in entries.entries)
    entries.expire(20.0)  # a view taken at t=20 shows the entries up to it (t = 10..20)
    assert entries.total == sum(b for _, b in entries.entries) == 2 * (MAX_INFLIGHT - 11)


def test_workers_sharing_a_ledger_count_each_others_passed_requests() -> None:
    from ext_proc.placement.ledger_shm import LedgerHandle, LedgerSegment

    views = {"now": PoolSnapshot("default", (BACKEND,), time.monotonic() - 1.0)}
    policy = parse_policy(UNTIL_SEEN)
    with LedgerSegment(2) as segment:
        one, two = LedgerHandle(segment.name, 0), LedgerHandle(segment.name, 1)
        try:
            a = Pipeline(policy, lambda _: views["now"], ledger=one)
            b = Pipeline(policy, lambda _: views["now"], ledger=two)
            assert judge(a)[0] == "pass:ok"  # 7 of the 10 free blocks, in worker 0
            assert judge(b)[0] == "reject:kv_exhausted"  # worker 1 sees them: 3 left
            views["now"] = PoolSnapshot("default", (BACKEND,), time.monotonic())
            assert judge(b)[0] == "pass:ok"  # a newer view speaks for worker 0's request
            # a reloaded pipeline keeps the worker's handle
            assert Pipeline(policy, lambda _: views["now"], carry=b).views.shared is two
        finally:
            one.close()
            two.close()


def test_workers_sharing_a_ledger_count_each_others_live_reservations() -> None:
    from ext_proc.placement.ledger_shm import LedgerHandle, LedgerSegment

    views = {"now": PoolSnapshot("default", (BACKEND,), time.monotonic() - 1.0)}
    policy = parse_policy(SHED)
    with LedgerSegment(2) as segment:
        one, two = LedgerHandle(segment.name, 0), LedgerHandle(segment.name, 1)
        try:
            a = Pipeline(policy, lambda _: views["now"], ledger=one)
            b = Pipeline(policy, lambda _: views["now"], ledger=two)
            got, hold = judge(a)
            assert got == "pass:ok"  # 7 of the 10 blocks reserved by worker 0
            views["now"] = PoolSnapshot("default", (BACKEND,), time.monotonic())
            # a newer idle view: worker 0's request is still in flight, so no room in worker 1
            assert judge(b)[0] == "reject:kv_exhausted"
            assert hold is not None
            a.views.release(hold)
            assert judge(b)[0] == "pass:ok"
            # a restarted worker 1 forgets its predecessor's reservation (its streams died)
            two.close()
            two = LedgerHandle(segment.name, 1)
            assert one.others_live() == {}
        finally:
            one.close()
            two.close()
