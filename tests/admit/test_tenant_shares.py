"""Tenant shares on a request's way (``ext_proc.admit.tenant_shares``), through
``Admission`` with the real pipeline and queue: a tenant over its cap is refused with its own
reason (or waits, where the profile has a queue) even when the pool has room, while another
tenant passes; a guaranteed share is kept from the others while its tenant is active."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

from ext_proc import telemetry
from ext_proc.admit.admission import Admission, Extend, Judged, Proceed, Step
from ext_proc.admit.backlog import Backlog, BodyClock
from ext_proc.admit.outcome import Continue, Respond
from ext_proc.admit.pipeline import Pipeline, RequestFacts
from ext_proc.admit.queue import AdmissionQueue
from ext_proc.admit.stream import Stream
from ext_proc.admit.tenant_shares import recheck
from ext_proc.policy.load import parse_policy
from ext_proc.schemas import OPENAI_CHAT
from ext_proc.signals.snapshot import BackendSignals, PoolSnapshot

# "x" * 200 → 57 input tokens; + 40 output = 97 tokens = 7 blocks of 16
BODY = json.dumps({"messages": [{"role": "user", "content": "x" * 200}], "max_tokens": 40})
POOL = "pools:\n  default:\n    metrics_urls: ['http://127.0.0.1:1/metrics']\n"
# 31 GPU blocks: U = 30 usable. cap 0.3 → floor(0.3 × 30) = 9 blocks: one request (7) fits,
# two (14) do not, while the pool has 30 − 7 = 23 free
CAPPED = "profiles: {default: {on_kv_shortfall: shed}}\n" + POOL + "    tenant_shares: {cap: 0.3}\n"
QUEUED = (
    "profiles:\n  default:\n    on_kv_shortfall: shed\n"
    "    queue: {enabled: true, max_queue_wait_ms: 5000, poll_ms: 5, tenant_header: x-tenant}\n"
    + POOL
    + "    tenant_shares: {cap: 0.3}\n"
)


def snapshot(gpu_blocks: int) -> PoolSnapshot:
    backend = BackendSignals(
        url="u",
        kv_cache_usage=0.0,
        num_requests_waiting=0,
        num_gpu_blocks=gpu_blocks,
        block_size=16,
    )
    return PoolSnapshot("default", (backend,), time.monotonic())


class Rig:
    """One worker: the real pipeline over one idle view, its backlog and queue."""

    def __init__(self, policy: str, gpu_blocks: int = 31) -> None:
        view = snapshot(gpu_blocks)
        self.pipeline = Pipeline(parse_policy(policy), lambda _pool: view)
        self.backlog = Backlog()
        self.queue = AdmissionQueue()

    def admission(self, route: str = "") -> Admission:
        metadata = [("x-ice-route", route)] if route else []
        stream = Stream(self.backlog, self.pipeline.views, self.queue)
        return Admission(
            pipeline=self.pipeline,
            helper=None,
            route=self.pipeline.router.resolve(metadata),
            stream=stream,
            backlog=self.backlog,
            gate=asyncio.Lock(),
            queue=self.queue,
            recount=lambda *_args: None,
        )


async def steps(gen: AsyncIterator[Step]) -> list[Step]:
    return [s async for s in gen]


async def request(a: Admission, tenant: str = "", body: str = BODY) -> list[Step]:
    pairs = [(":path", b"/v1/chat/completions"), (":method", b"POST")]
    pairs += [("content-type", b"application/json"), ("content-length", str(len(body)).encode())]
    if tenant:
        pairs.append(("x-tenant", tenant.encode()))
    got = await steps(a.on_headers(pairs, False))
    assert isinstance(got[-1], Proceed)
    now = time.perf_counter()
    return got + await steps(a.on_body(body.encode(), BodyClock(now, now)))


def answer(got: list[Step]) -> str:
    """The last step as "status reason" (200 for a request that goes on)."""
    last = got[-1]
    assert isinstance(last, Judged)
    outcome = last.outcome
    if isinstance(outcome, Continue):
        return "200"
    assert isinstance(outcome, Respond)
    code = json.loads(outcome.body)["error"]["code"]
    return f"{outcome.status} {code}"


def refusals(reason: str) -> float:
    return telemetry.TENANT_SHARE_REFUSALS.labels(pool="default", reason=reason)._value.get()


def test_a_tenant_over_its_cap_is_refused_with_its_own_reason_while_another_passes() -> None:
    async def run() -> None:
        rig = Rig(CAPPED)
        before = refusals("tenant_share_exceeded")
        first = rig.admission("a")  # no queue: the route's name is the tenant
        assert answer(await request(first)) == "200"  # 7 ≤ 9
        second = rig.admission("a")
        got = await request(second)
        assert answer(got) == "429 tenant_share_exceeded"  # 7 + 7 = 14 > 9; 23 blocks free
        last = got[-1]
        assert isinstance(last, Judged) and isinstance(last.outcome, Respond)
        headers = dict(last.outcome.headers)
        assert headers["x-ice-reason"] == "tenant_share_exceeded"
        assert int(headers["retry-after"]) >= 1
        assert refusals("tenant_share_exceeded") == before + 1
        assert answer(await request(rig.admission("b"))) == "200"  # another tenant passes
        assert rig.pipeline.views.tenants.own["default"] == {"a": 7, "b": 7}
        first.stream.close()  # a's first request ends: its blocks leave its share
        assert rig.pipeline.views.tenants.own["default"] == {"b": 7}
        assert answer(await request(rig.admission("a"))) == "200"

    asyncio.run(run())


def test_over_its_cap_a_tenant_waits_in_the_queue_until_its_own_request_ends() -> None:
    async def run() -> None:
        rig = Rig(QUEUED)
        first = rig.admission()
        assert answer(await request(first, "heavy")) == "200"
        waiting = asyncio.ensure_future(request(rig.admission(), "heavy"))
        await asyncio.sleep(0.05)  # several polls: it still waits, the pool has room
        assert not waiting.done()
        assert rig.pipeline.views.tenants.waiting_in("default") == {"heavy"}
        # the light tenant goes straight past it
        assert answer(await request(rig.admission(), "light")) == "200"
        first.stream.close()
        got = await asyncio.wait_for(waiting, 5)
        assert isinstance(got[-2], Extend) and answer(got) == "200"
        assert rig.pipeline.views.tenants.waiting_in("default") == frozenset()

    asyncio.run(run())


def test_a_wait_past_the_limit_is_refused_with_the_tenant_reason() -> None:
    async def run() -> None:
        rig = Rig(QUEUED.replace("max_queue_wait_ms: 5000", "max_queue_wait_ms: 30"))
        assert answer(await request(rig.admission(), "heavy")) == "200"
        got = await asyncio.wait_for(request(rig.admission(), "heavy"), 5)
        assert answer(got) == "429 tenant_share_exceeded"

    asyncio.run(run())


def test_a_guaranteed_share_is_kept_from_others_while_its_tenant_is_active() -> None:
    async def run() -> None:
        # U = 30; light guaranteed floor(0.5 × 30) = 15; caps 1.0
        rig = Rig(CAPPED.replace("{cap: 0.3}", "{guaranteed: {light: 0.5}}"))
        for _ in range(2):  # light idle: heavy takes 14 of 30
            assert answer(await request(rig.admission("heavy"))) == "200"
        light = rig.admission("light")
        assert answer(await request(light)) == "200"  # light active, holds 7 of its 15
        # F = 30 − 21 = 9, 8 of them kept for light: heavy's 7 do not fit beside them
        got = await request(rig.admission("heavy"))
        assert answer(got) == "429 tenant_share_reserved"
        assert answer(await request(rig.admission("light"))) == "200"  # light takes its own

    asyncio.run(run())


def test_a_verdict_judged_elsewhere_is_checked_against_the_tenants_share_here() -> None:
    rig = Rig(CAPPED)
    route = rig.pipeline.router.resolve([("x-ice-route", "a")])
    facts = RequestFacts(adapter=OPENAI_CHAT, priority="standard")
    held = rig.pipeline.on_body(route, facts, BODY.encode())
    assert held is not None and rig.pipeline.recorder.record(route, held, facts) is not None
    # as the helper process judges it: without the worker's tenant ledger (a fresh pipeline)
    helper = Pipeline(rig.pipeline.policy, rig.pipeline.lookup)
    verdict = helper.on_body(route, facts, BODY.encode())
    assert verdict is not None and verdict.decision is not None
    assert verdict.decision.decision == "pass"
    p = rig.pipeline
    again = recheck(p.policy, p.views, p.lookup, route, facts, verdict)
    assert again.decision is not None and again.decision.reason == "tenant_share_exceeded"
    assert isinstance(again.outcome, Respond) and again.outcome.status == 429
