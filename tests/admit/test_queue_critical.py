"""``queue.critical: wait``: a critical request whose blocks do not fit waits in the queue's
top band for room instead of going upstream over it, and is never refused (at its deadline,
when the queue is full, when ICE stops, it goes upstream as it would have without the wait).

The figures are test_queue's: 11 blocks of 16 tokens, 10 free when idle; the body (57 input
tokens + 40 output) needs ceil(97 / 16) = 7 blocks, so one passed request leaves 3 free and a
second does not fit."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest

from ext_proc import telemetry
from ext_proc.admit.pipeline import Pipeline
from ext_proc.admit.queue import H_QUEUED_MS, Waiter, queueable
from ext_proc.admit.verdict import BodyVerdict
from ext_proc.policy.errors import PolicyError
from ext_proc.policy.load import parse_policy
from tests.builders import QUEUE_BODY as BODY
from tests.builders import QUEUE_POLICY as POLICY
from tests.builders import QueueRig as Rig
from tests.builders import waiter_headers as headers
from tests.builders import waiter_outcome as outcome

WAIT = "poll_ms: 59000, critical: wait}"


def waiting_rig(length: int = 64, extra: str = "") -> Rig:
    """test_queue's rig, its profile's queue with ``critical: wait`` (and ``extra`` lines)."""
    rig = Rig(length=length)
    text = (POLICY % (length, 16)).replace("poll_ms: 59000}", WAIT) + extra
    rig.pipeline = Pipeline(parse_policy(text), lambda _: rig.view)
    rig.route = rig.pipeline.router.resolve([])
    return rig


def passed_count(outcome_label: str) -> float:
    sample = telemetry.QUEUE_OUTCOMES.labels(
        pool="default", tenant="default", outcome=outcome_label
    )
    return sample._value.get()  # type: ignore[attr-defined,no-any-return]


def test_the_queue_critical_setting_defaults_to_pass_and_rejects_other_values() -> None:
    profile = parse_policy(POLICY % (64, 16)).profiles["default"]
    assert profile.queue is not None and profile.queue.critical == "pass"
    assert not profile.critical_waits
    waits = parse_policy((POLICY % (64, 16)).replace("poll_ms: 59000}", WAIT))
    assert waits.profiles["default"].critical_waits
    with pytest.raises(PolicyError, match="critical: must be pass or wait"):
        parse_policy((POLICY % (64, 16)).replace("poll_ms: 59000}", "critical: hold}"))


def test_a_critical_request_that_fits_passes_at_once() -> None:
    rig = waiting_rig()
    verdict = rig.judge(rig.facts("critical"))  # 7 of 10 free blocks
    assert verdict.decision is not None and verdict.decision.decision == "pass"


def test_a_critical_request_that_does_not_fit_waits_and_is_admitted_when_room_comes() -> None:
    async def run() -> None:
        rig = waiting_rig()
        rig.pass_one()  # 3 free blocks left; the critical request needs 7
        facts = rig.facts("critical")
        first = rig.judge(facts)
        assert first.decision is not None and first.decision.reason == "kv_exhausted"
        assert queueable(rig.route, first)
        w = rig.offer_as_is(facts, first)
        assert isinstance(w, Waiter) and w.band == "critical"
        rig.queue.tick()
        assert not w.future.done()  # still 3 free
        rig.newer_view(usage=0.0)
        rig.clock.now += 0.5
        rig.queue.tick()
        assert outcome(w) == "pass:ok" and headers(w)[H_QUEUED_MS] == "500"
        assert rig.pipeline.views.held(rig.view) == 7  # recorded at admission

    asyncio.run(run())


def test_without_critical_wait_the_same_request_goes_over_the_room() -> None:
    rig = Rig()  # queue on, critical: pass (the default)
    rig.pass_one()
    verdict = rig.judge(rig.facts("critical"))
    assert verdict.decision is not None and verdict.decision.decision == "pass"


def test_a_critical_waiter_passes_at_its_deadline_instead_of_a_429() -> None:
    async def run() -> None:
        rig = waiting_rig()
        rig.pass_one()
        before = passed_count("passed")
        w = rig.offer(rig.facts("critical"))
        rig.clock.now += 59.0
        rig.queue.tick()
        assert outcome(w) == "pass:ok"  # over the room, as it would have without the queue
        assert headers(w)[H_QUEUED_MS] == "59000"
        assert passed_count("passed") == before + 1
        assert rig.queue.depth == 0

    asyncio.run(run())


def test_critical_waiters_are_admitted_before_standard_ones_queued_earlier() -> None:
    async def run() -> None:
        rig = waiting_rig()
        rig.pass_one()
        standard = rig.offer(rig.facts("standard", tenant="a"))
        critical = rig.offer(rig.facts("critical", tenant="a"))
        rig.newer_view(usage=0.0)  # 10 free: room for one request of 7 blocks, not two
        rig.queue.tick()
        assert outcome(critical) == "pass:ok"
        assert not standard.future.done()

    asyncio.run(run())


def test_a_full_queue_lets_a_critical_request_pass_rather_than_refuse_it() -> None:
    async def run() -> None:
        rig = waiting_rig(length=1)
        rig.pass_one()
        rig.offer(rig.facts("standard"))  # the queue is full
        facts = rig.facts("critical")
        first = rig.judge(facts)
        assert queueable(rig.route, first)
        got = rig.offer_as_is(facts, first)
        assert isinstance(got, BodyVerdict) and got.decision is not None
        assert got.decision.decision == "pass"
        assert rig.queue.depth == 1

    asyncio.run(run())


def test_shutting_down_lets_critical_waiters_and_late_critical_requests_pass() -> None:
    async def run() -> None:
        rig = waiting_rig()
        rig.pass_one()
        critical = rig.offer(rig.facts("critical"))
        standard = rig.offer(rig.facts("standard"))
        rig.queue.close()
        assert outcome(critical) == "pass:ok"
        assert outcome(standard) == "reject:queue_shutdown"
        facts = rig.facts("critical")
        got = rig.offer_as_is(facts, rig.judge(facts))
        assert isinstance(got, BodyVerdict) and got.decision is not None
        assert got.decision.decision == "pass"

    asyncio.run(run())


def test_a_shadow_profile_never_holds_a_critical_request() -> None:
    rig = waiting_rig()
    rig.newer_view(usage=0.8)  # floor(10 × 0.2) = 2 free blocks: the request's 7 do not fit
    assert rig.judge(rig.facts("critical")).decision.reason == "kv_exhausted"  # enforced: waits
    text = (POLICY % (64, 16)).replace("poll_ms: 59000}", WAIT)
    shadow = Pipeline(
        parse_policy(
            text.replace("on_kv_shortfall: shed", "on_kv_shortfall: shed\n    mode: shadow")
        ),
        lambda _: rig.view,
    )
    route = shadow.router.resolve([])
    assert not route.profile.critical_waits
    verdict = shadow.on_body(route, rig.facts("critical"), BODY.encode())
    assert verdict is not None and verdict.shadow is not None
    assert verdict.shadow[0] == "pass"  # what it would do: pass, as without the queue
    assert not queueable(route, verdict)


def test_a_critical_verdict_judged_without_its_body_waits_as_standard_and_times_out() -> None:
    async def run() -> None:
        rig = waiting_rig()
        rig.pass_one()
        facts = rig.facts("critical")
        # a coarse verdict (no body: the worker was busy) cannot be held to its output: it is
        # refused as before, in the standard band, never passed over the room
        first = dataclasses.replace(rig.judge(facts), body=None)
        w = rig.offer_as_is(facts, first)
        assert isinstance(w, Waiter) and w.band == "standard"
        rig.clock.now += 59.0
        rig.queue.tick()
        assert outcome(w) == "reject:queue_timeout"

    asyncio.run(run())


def test_a_request_that_fits_waits_behind_a_waiting_critical_one_and_goes_after_it() -> None:
    async def run() -> None:
        rig = waiting_rig()
        rig.pass_one()  # 3 free blocks left
        critical = rig.offer(rig.facts("critical"))  # needs 7: waits
        # a small request (1 block) fits the 3 free blocks, but would take the room the
        # critical one waits for: it waits behind it, in its own band
        small = rig.facts("standard")
        body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        judged = rig.pipeline.on_body(rig.route, small, body.encode())
        assert judged is not None and judged.decision is not None
        assert judged.decision.decision == "pass"  # on its own it fits
        behind = rig.queue.behind_critical(rig.route, small, judged)
        assert behind is not None and queueable(rig.route, behind)
        w = rig.offer_as_is(small, behind)
        assert isinstance(w, Waiter) and w.band == "standard"
        rig.queue.tick()
        assert not critical.future.done() and not w.future.done()  # the band holds it back
        rig.newer_view(usage=0.0)
        rig.queue.tick()  # room for both (7 + 1 of 10): the critical one first, then it
        assert outcome(critical) == "pass:ok" and outcome(w) == "pass:ok"

    asyncio.run(run())


def test_nothing_waits_behind_when_no_critical_request_waits_or_the_setting_is_pass() -> None:
    rig = waiting_rig()
    facts = rig.facts("standard")
    judged = rig.judge(facts)
    assert rig.queue.behind_critical(rig.route, facts, judged) is judged  # none waits
    plain = Rig()  # critical: pass
    plain.pass_one()
    verdict = plain.judge(plain.facts("standard"))
    assert plain.queue.behind_critical(plain.route, plain.facts(), verdict) is verdict
