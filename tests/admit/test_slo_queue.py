"""``admission: slo`` through the real pipeline and admission queue (ext_proc.admit.slo_queue,
ext_proc.policy.slo_admit; docs/slo.md, "Decisions"): refused at once when the predicted TTFT
misses, judged again as the wait eats into the target, ordered by deadline, bounded by it,
and a request that waited past its target counted."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace

from prometheus_client import REGISTRY

from ext_proc.admit.pipeline import Pipeline
from ext_proc.admit.queue import Waiter
from ext_proc.admit.verdict import RequestFacts
from ext_proc.policy.load import parse_policy
from ext_proc.policy.settings import SloTarget
from ext_proc.signals.scrapes import Derived, Speed
from ext_proc.signals.snapshot import PoolSnapshot
from tests.builders import QUEUE_BODY, QUEUE_IDLE, QUEUE_POLICY, QueueRig
from tests.builders import waiter_headers as headers
from tests.builders import waiter_outcome as outcome

# r = 100 prompt tokens a second, c̄ = 50; the request (QUEUE_BODY) has 57 prompt tokens:
# TTFT = (waiting × 50 + 57) / 100 s
SPEED = Speed(
    prefill_tokens_per_s=100.0,
    computed_prompt_tokens=50.0,
    step_base_s=0.005,
    step_per_running_s=0.005,
)
FAST = replace(QUEUE_IDLE, derived=Derived(window_s=10.0, speed=SPEED))
SLO_POLICY = QUEUE_POLICY.replace(
    "    on_kv_shortfall: shed\n", "    on_kv_shortfall: shed\n    admission: slo\n"
)


class SloRig(QueueRig):
    """The queue's rig with ``admission: slo`` and a backend whose speed is known."""

    def __init__(self, policy: str = SLO_POLICY) -> None:
        super().__init__()
        self.view = PoolSnapshot("default", (FAST,), time.monotonic() - 1.0)
        self.pipeline = Pipeline(parse_policy(policy % (64, 16)), lambda _: self.view)
        self.route = self.pipeline.router.resolve([])

    def slo_facts(self, ttft_ms: float, *, waited_s: float = 0.0) -> RequestFacts:
        facts = replace(
            self.facts(),
            slo=SloTarget(ttft_ms=ttft_ms),
            arrived_s=time.monotonic() - waited_s,
        )
        self.streams[id(facts)] = self.streams.pop(id(self.facts_last))
        return facts

    def facts(self, priority: str = "standard", tenant: str = "") -> RequestFacts:
        got = super().facts(priority, tenant)
        self.facts_last = got
        return got

    def waiting(self, n: float) -> None:
        self.view = PoolSnapshot(
            "default", (replace(FAST, num_requests_waiting=n),), time.monotonic() - 1.0
        )


def _late() -> float:
    return REGISTRY.get_sample_value("ice_slo_waited_late_total", {"pool": "default"}) or 0.0


def test_a_request_that_cannot_start_in_time_is_refused_at_once() -> None:
    rig = SloRig()
    rig.waiting(3)  # (3 × 50 + 57) / 100 = 2.07 s against 2 s
    verdict = rig.judge(rig.slo_facts(2000))
    d = verdict.decision
    assert d is not None and (d.decision, d.reason) == ("reject", "slo_unreachable")
    out = verdict.outcome
    assert getattr(out, "status", None) == 429
    h = dict(out.headers)
    # Retry-After = ceil(2.07 − 2) = 1 s; the API's own error format
    assert h["retry-after"] == "1" and h["x-ice-reason"] == "slo_unreachable"
    body = json.loads(getattr(out, "body", b"{}"))
    assert body["error"]["code"] == "slo_unreachable"
    assert "2070 ms" in body["error"]["message"]
    # 2.5 s of target: it passes
    passed = rig.judge(rig.slo_facts(2500)).decision
    assert passed is not None and passed.decision == "pass"


def test_the_wait_already_spent_counts() -> None:
    rig = SloRig()
    # alone: 0.57 s; with 1.5 s of a 2 s target spent, 0.5 s is left
    d = rig.judge(rig.slo_facts(2000, waited_s=1.5)).decision
    assert d is not None and d.reason == "slo_unreachable"
    d = rig.judge(rig.slo_facts(2000, waited_s=1.0)).decision
    assert d is not None and d.decision == "pass"


def test_a_waiter_is_judged_again_and_refused_once_its_target_cannot_be_met() -> None:
    async def run() -> None:
        rig = SloRig()
        rig.pass_one()  # its blocks fill the endpoint: the next waits (kv_exhausted)
        w = rig.offer(rig.slo_facts(10_000))
        rig.queue.tick()
        assert not w.future.done()
        # the view now shows 199 waiting: (199 × 50 + 57) / 100 = 100.07 s > 10 s
        rig.newer_view()
        rig.waiting(199)
        rig.queue.tick()
        assert outcome(w) == "reject:slo_unreachable"
        assert headers(w)["retry-after"] == "60"  # ceil(90.07) clamped to retry_after_max_s

    asyncio.run(run())


def test_waiters_are_ordered_by_deadline_and_leave_at_it() -> None:
    async def run() -> None:
        rig = SloRig()
        rig.pass_one()
        late = rig.offer(rig.slo_facts(30_000))
        soon = rig.offer(rig.slo_facts(5_000))
        none = rig.offer(rig.facts())  # no target: after both, FIFO
        assert soon.ttft_due_s < late.ttft_due_s and none.ttft_due_s == float("inf")
        # bounded by its target: 5 s, not the queue's 59 s
        assert soon.deadline_s - soon.enqueued_s <= 5.0
        assert late.deadline_s - late.enqueued_s <= 30.0
        rig.newer_view()  # room for one: the earliest deadline goes first
        rig.queue.tick()
        assert outcome(soon) == "pass:ok"
        assert not late.future.done() and not none.future.done()
        rig.clock.now += 30.0  # past late's target: it leaves with slo_unreachable
        rig.queue.tick()
        assert outcome(late) == "reject:slo_unreachable"
        assert (
            "its time-to-first-token target (30000 ms) has passed"
            in json.loads(getattr(late.future.result().outcome, "body", b"{}"))["error"]["message"]
        )
        assert not none.future.done()

    asyncio.run(run())


def test_without_admission_slo_the_queue_stays_fifo_and_counts_a_late_admission() -> None:
    async def run() -> None:
        rig = SloRig(QUEUE_POLICY)  # reserve: targets are shown, not judged by
        rig.pass_one()
        first = rig.offer(rig.slo_facts(1_000))
        second = rig.offer(rig.slo_facts(500))
        assert isinstance(first, Waiter) and first.deadline_s - first.enqueued_s > 58.0
        before = _late()
        rig.clock.now += 2.0  # both targets spent in the wait
        rig.newer_view()
        rig.queue.tick()
        assert outcome(first) == "pass:ok"  # FIFO: the first offered
        assert not second.future.done()
        assert _late() == before + 1

    asyncio.run(run())


PICK_POLICY = """
pools:
  default:
    metrics_urls: ["http://a:1/metrics", "http://b:2/metrics"]
    endpoint_pick: ice
profiles:
  default:
    admission: %s
"""


def test_endpoint_pick_ice_places_by_predicted_headroom() -> None:
    from ext_proc.schemas import OPENAI_CHAT

    # a:1: 50 free blocks of 100, no queue: TTFT 57 / 100 = 0.57 s
    # b:2: 100 free, 9 waiting: (9 × 50 + 57) / 100 = 5.07 s
    a = replace(FAST, url="http://a:1/metrics", num_gpu_blocks=101, kv_cache_usage=0.5)
    b = replace(FAST, url="http://b:2/metrics", num_gpu_blocks=101, num_requests_waiting=9)
    view = PoolSnapshot("default", (a, b), time.monotonic() - 1.0)
    for admission, target, where in (
        ("forecast", 2000, "b:2"),  # the most room
        ("slo", None, "b:2"),  # no target: as forecast
        ("slo", 2000, "a:1"),  # only a:1 is within the 2 s
        ("slo", 10_000, "a:1"),  # both within: the most headroom (9.43 s), not the most room
    ):
        pipeline = Pipeline(parse_policy(PICK_POLICY % admission), lambda _: view)
        route = pipeline.router.resolve([])
        facts = RequestFacts(adapter=OPENAI_CHAT, slo=SloTarget(ttft_ms=target))
        verdict = pipeline.on_body(route, facts, QUEUE_BODY.encode())
        assert verdict is not None and verdict.placement is not None
        assert verdict.placement.endpoint == where, (admission, target)
