"""The admission queue (``ext_proc.admit.queue``): a request shed for memory waits for room,
by priority band, then round robin between tenants; it leaves on a timeout, a full queue or
its stream's end."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from ext_proc.admit.identity import MAX_TENANT_CHARS, tenant_key
from ext_proc.admit.pipeline import Pipeline
from ext_proc.admit.queue import H_QUEUED_MS, OTHER_TENANT, Waiter, queueable
from ext_proc.admit.verdict import BodyVerdict
from ext_proc.policy.load import parse_policy
from ext_proc.signals.snapshot import PoolSnapshot
from tests.builders import (
    QUEUE_BODY as BODY,
)
from tests.builders import (
    QUEUE_IDLE as IDLE,
)
from tests.builders import (
    QUEUE_POLICY as POLICY,
)
from tests.builders import (
    QueueRig as Rig,
)
from tests.builders import (
    waiter_headers as headers,
)
from tests.builders import (
    waiter_outcome as outcome,
)


def test_a_queued_request_is_admitted_when_a_newer_view_has_room() -> None:
    async def run() -> None:
        rig = Rig()
        rig.pass_one()  # holds 7 of the 10 free blocks
        w = rig.offer(rig.facts())
        rig.queue.tick()
        assert not w.future.done()  # same view, same ledger: still no room
        rig.newer_view(usage=0.0)  # the first request finished
        rig.clock.now += 0.25
        rig.queue.tick()
        assert outcome(w) == "pass:ok"
        assert headers(w)[H_QUEUED_MS] == "250"
        assert rig.queue.depth == 0
        # it was recorded at admission: its blocks are in the ledger (3 left)
        assert rig.pipeline.views.held(rig.view) == 7

    asyncio.run(run())


def test_a_queued_request_waits_for_the_running_one_to_end_not_for_the_gauge() -> None:
    async def run() -> None:
        rig = Rig()
        verdict = rig.judge(rig.facts())
        running = rig.pipeline.recorder.record(rig.route, verdict)  # 7 of 10 blocks, reserved
        assert running is not None
        w = rig.offer(rig.facts())
        # the backend's gauge reads idle (the running request not yet scheduled, or only its
        # prompt allocated): its 7 blocks are still coming, so still no room
        rig.view = PoolSnapshot("default", (IDLE,), time.monotonic())
        rig.queue.tick()
        assert not w.future.done()
        rig.pipeline.views.release(running)  # its stream ended
        rig.queue.tick()
        assert outcome(w) == "pass:ok"

    asyncio.run(run())


def test_admitted_requests_take_their_blocks_before_the_next_is_judged() -> None:
    async def run() -> None:
        rig = Rig()
        rig.pass_one()
        a, b = rig.offer(rig.facts()), rig.offer(rig.facts())
        rig.newer_view(usage=0.0)  # room for one request of 7 blocks, not two
        rig.queue.tick()
        assert outcome(a) == "pass:ok"
        assert not b.future.done()

    asyncio.run(run())


def test_a_request_waiting_past_its_limit_gets_429_queue_timeout_with_retry_after() -> None:
    async def run() -> None:
        rig = Rig()
        rig.pass_one()
        w = rig.offer(rig.facts())
        rig.clock.now += 59.0
        rig.queue.tick()
        assert outcome(w) == "reject:queue_timeout"
        got = w.future.result().outcome
        assert getattr(got, "status", None) == 429
        h = headers(w)
        assert h["x-ice-reason"] == "queue_timeout" and int(h["retry-after"]) >= 1
        assert h[H_QUEUED_MS] == "59000"
        assert json.loads(getattr(got, "body", b"{}"))["error"]["code"] == "queue_timeout"

    asyncio.run(run())


def test_a_full_queue_refuses_at_once_with_queue_full() -> None:
    async def run() -> None:
        rig = Rig(length=2)
        rig.pass_one()
        rig.offer(rig.facts())
        rig.offer(rig.facts())
        facts = rig.facts()
        first = rig.judge(facts)
        got = rig.offer_as_is(facts, first)
        assert isinstance(got, BodyVerdict) and got.decision is not None
        assert got.decision.reason == "queue_full"
        assert getattr(got.outcome, "status", None) == 429
        assert rig.queue.depth == 2

    asyncio.run(run())


def test_standard_requests_are_admitted_before_sheddable_ones_queued_earlier() -> None:
    async def run() -> None:
        rig = Rig()
        rig.pass_one()
        low = rig.offer(rig.facts("sheddable"))
        high = rig.offer(rig.facts("standard"))
        rig.newer_view()
        rig.queue.tick()
        assert outcome(high) == "pass:ok"
        assert not low.future.done()  # no room left for it in this view
        rig.newer_view()
        rig.queue.tick()
        assert outcome(low) == "pass:ok"

    asyncio.run(run())


def test_a_waiting_higher_band_holds_back_the_lower_one() -> None:
    async def run() -> None:
        rig = Rig()
        rig.pass_one()
        big = json.dumps({"messages": [{"role": "user", "content": "x" * 200}], "max_tokens": 90})
        facts = rig.facts("standard")
        first = rig.pipeline.on_body(rig.route, facts, big.encode())  # 10 blocks: fits idle only
        assert first is not None and queueable(rig.route, first)
        high = rig.offer_as_is(facts, first)
        assert isinstance(high, Waiter)
        low = rig.offer(rig.facts("sheddable"))  # 7 blocks: it would fit at usage 0.2
        rig.newer_view(usage=0.2)  # 8 free: the standard request (10) does not fit
        rig.queue.tick()
        assert not high.future.done() and not low.future.done()
        rig.newer_view(usage=0.0)
        rig.queue.tick()
        assert outcome(high) == "pass:ok" and not low.future.done()

    asyncio.run(run())


def test_tenants_take_turns_so_a_flood_does_not_starve_a_light_tenant() -> None:
    async def run() -> None:
        rig = Rig()
        rig.pass_one()
        waiters = [(rig.offer(rig.facts(tenant="heavy")), "heavy") for _ in range(4)]
        waiters.append((rig.offer(rig.facts(tenant="light")), "light"))
        order: list[str] = []
        done: set[Waiter] = set()
        for _ in range(5):  # room for one request per view
            rig.newer_view()
            rig.queue.tick()
            order += [name for w, name in waiters if w.future.done() and w not in done]
            done.update(w for w, _ in waiters if w.future.done())
        # FIFO within a tenant, turns between them: the light one goes second, not last
        assert order == ["heavy", "light", "heavy", "heavy", "heavy"]

    asyncio.run(run())


def test_the_tenant_with_fewer_requests_in_flight_goes_first() -> None:
    async def run() -> None:
        rig = Rig()
        # heavy's first request went straight in (room then) and is still running
        first_facts = rig.facts(tenant="heavy")
        verdict = rig.judge(first_facts)
        first = rig.stream(first_facts)
        first.hold = rig.pipeline.recorder.record(rig.route, verdict)
        rig.queue.count_started(rig.route, first_facts, first, verdict)
        assert rig.queue.inflight == {("default", "heavy"): 1}
        heavy = rig.offer(rig.facts(tenant="heavy"))
        light = rig.offer(rig.facts(tenant="light"))
        rig.pipeline.views.release(first.hold)  # type: ignore[arg-type]
        rig.view = PoolSnapshot("default", (IDLE,), time.monotonic())
        rig.queue.tick()  # room for one: light (0 in flight) before heavy (1), FIFO or not
        assert outcome(light) == "pass:ok" and not heavy.future.done()
        assert rig.queue.inflight == {("default", "heavy"): 1, ("default", "light"): 1}
        rig.queue.ended(*first.slot)  # type: ignore[misc]
        assert rig.queue.inflight == {("default", "light"): 1}

    asyncio.run(run())


def test_a_cancelled_wait_leaves_the_queue_and_holds_no_blocks() -> None:
    async def run() -> None:
        rig = Rig()
        rig.pass_one()
        w = rig.offer(rig.facts())
        task = asyncio.create_task(rig.queue.wait(w))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert rig.queue.depth == 0
        rig.newer_view()
        rig.queue.tick()  # nothing left to admit
        assert rig.pipeline.views.held(rig.view) == 0

    asyncio.run(run())


def test_absurd_tenant_values_map_to_a_bounded_set_of_queues() -> None:
    async def run() -> None:
        rig = Rig(length=5000, tenants=8)
        rig.pass_one()
        waiters = [rig.offer(rig.facts(tenant=f"t{i}\x00" + "é" * 5000)) for i in range(300)]
        tenants = {w.tenant for w in waiters}
        assert len(tenants) == 9 and OTHER_TENANT in tenants
        assert all(len(t) <= MAX_TENANT_CHARS for t in tenants)
        assert len({w.label for w in waiters}) == 9

    asyncio.run(run())


def test_tenant_key_keeps_printable_ascii_and_falls_back_to_the_route() -> None:
    assert tenant_key("  team-a\r\n", "chat") == "team-a"
    assert tenant_key("\x00\x01", "chat") == "chat"
    assert tenant_key("a" * 1000, "chat") == "a" * MAX_TENANT_CHARS


def test_critical_requests_and_shadow_profiles_are_never_queued() -> None:
    rig = Rig()
    rig.pass_one()
    critical = rig.judge(rig.facts("critical"))
    assert not queueable(rig.route, critical)  # never shed, so never queued
    shadow = Pipeline(
        parse_policy(
            (POLICY % (64, 16)).replace(
                "on_kv_shortfall: shed", "on_kv_shortfall: shed\n    mode: shadow"
            )
        ),
        lambda _: rig.view,
    )
    route = shadow.router.resolve([])
    verdict = shadow.on_body(route, rig.facts(), BODY.encode())
    assert not queueable(route, verdict)


def test_shutting_down_answers_every_waiter_with_429_and_refuses_new_ones() -> None:
    async def run() -> None:
        rig = Rig()
        rig.pass_one()
        w = rig.offer(rig.facts())
        rig.queue.close()
        assert outcome(w) == "reject:queue_shutdown" and rig.queue.depth == 0
        assert "retry-after" in headers(w)
        facts = rig.facts()
        got = rig.offer_as_is(facts, rig.judge(facts))
        assert isinstance(got, BodyVerdict) and got.decision is not None
        assert got.decision.reason == "queue_shutdown"

    asyncio.run(run())
