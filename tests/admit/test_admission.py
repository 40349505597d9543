"""One request's way to a verdict without gRPC (``ext_proc.admit.admission``): the steps each
phase yields, and that every way to a verdict commits it exactly once."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

import pytest

from ext_proc.admit.admission import (
    Admission,
    Coarse,
    Extend,
    Immediate,
    Judged,
    Proceed,
    SkipBody,
    Step,
    Untouched,
)
from ext_proc.admit.backlog import Backlog, BodyClock
from ext_proc.admit.pipeline import BodyVerdict, Pipeline, Route
from ext_proc.admit.queue import AdmissionQueue
from ext_proc.admit.recorder import Recorder
from ext_proc.admit.shared_ledger import view_age_ms
from ext_proc.admit.stream import Stream
from ext_proc.lab.redis_local import RedisServer
from ext_proc.placement.ledger_redis import RedisLedger
from ext_proc.policy import coarse
from ext_proc.policy.load import parse_policy
from ext_proc.signals.snapshot import BackendSignals, PoolSnapshot

# "x" * 200 → 57 input tokens; + 40 output = 97 tokens = 7 blocks of 16
BODY = json.dumps({"messages": [{"role": "user", "content": "x" * 200}], "max_tokens": 40})
QUEUED = (
    "profiles:\n  default:\n    on_kv_shortfall: shed\n    max_model_len: 8192\n"
    "    queue: {enabled: true, max_queue_wait_ms: 5000, poll_ms: 5}\n"
)
NO_QUEUE = "profiles: {default: {on_kv_shortfall: shed}}\n"


def snapshot(gpu_blocks: int, usage: float = 0.0) -> PoolSnapshot:
    """A backend of ``gpu_blocks`` (one of them vLLM's null block), ``usage`` of them used."""
    backend = BackendSignals(
        url="u",
        kv_cache_usage=usage,
        num_requests_waiting=0,
        num_gpu_blocks=gpu_blocks,
        block_size=16,
    )
    return PoolSnapshot("default", (backend,), time.monotonic())


class CountingRecorder(Recorder):
    """The real recorder, which also keeps every verdict it counted in the metrics."""

    counted: list[BodyVerdict]

    def count(self, route: Route, verdict: BodyVerdict) -> None:
        self.counted.append(verdict)
        super().count(route, verdict)


class Rig:
    """One worker's shared parts and a view the test moves."""

    def __init__(self, policy: str, gpu_blocks: int) -> None:
        self.view = {"now": snapshot(gpu_blocks)}
        self.pipeline = Pipeline(parse_policy(policy), lambda _pool: self.view["now"])
        recorder = self.pipeline.recorder
        self.recorder = CountingRecorder(
            recorder.views, recorder.placer, recorder.lookup, recorder.policy
        )
        self.recorder.counted = []
        self.pipeline.recorder = self.recorder
        self.backlog = Backlog()
        self.queue = AdmissionQueue()
        self.route = self.pipeline.router.resolve([])

    def admission(self) -> Admission:
        stream = Stream(self.backlog, self.pipeline.views, self.queue)
        return Admission(
            pipeline=self.pipeline,
            helper=None,
            route=self.route,
            stream=stream,
            backlog=self.backlog,
            gate=asyncio.Lock(),
            queue=self.queue,
            recount=lambda *_args: None,
        )


def headers(body: str = BODY, *, length: bool = True, path: str = "/v1/chat/completions"):  # type: ignore[no-untyped-def]
    pairs = [(":path", path.encode()), (":method", b"POST")]
    pairs.append(("content-type", b"application/json"))
    if length:
        pairs.append(("content-length", str(len(body)).encode()))
    return pairs


async def steps(gen: AsyncIterator[Step]) -> list[Step]:
    return [s async for s in gen]


async def request(a: Admission, body: str = BODY, *, length: bool = True) -> list[Step]:
    got = await steps(a.on_headers(headers(body, length=length), False))
    if isinstance(got[-1], Proceed):
        now = time.perf_counter()
        got += await steps(a.on_body(body.encode(), BodyClock(now, now)))
    return got


def decision(step: Step) -> str:
    assert isinstance(step, Judged | Coarse)
    return dict(step.outcome.headers)["x-ice-decision"]


def test_a_body_that_fits_is_judged_and_committed_once() -> None:
    rig = Rig(QUEUED, gpu_blocks=11)  # 10 usable: 7 fit
    a = rig.admission()
    got = asyncio.run(request(a))
    assert [type(s) for s in got] == [Proceed, Judged] and decision(got[-1]) == "pass"
    assert len(rig.recorder.counted) == 1 and a.stream.committed
    assert a.stream.hold is not None and a.stream.hold.blocks == 7
    assert rig.queue.inflight == {("default", "default"): 1}  # its tenant's slot
    a.commit(rig.recorder.counted[0])  # a second commit does nothing
    assert len(rig.recorder.counted) == 1 and rig.queue.inflight[("default", "default")] == 1
    a.stream.close()
    assert rig.queue.inflight == {} and rig.pipeline.views.live["default"][""] == 0


def test_a_refusal_that_waits_in_the_queue_is_committed_once_when_room_comes() -> None:
    rig = Rig(QUEUED, gpu_blocks=5)  # 4 usable: 7 do not fit

    async def run() -> list[Step]:
        a = rig.admission()
        waiting = asyncio.ensure_future(request(a))
        await asyncio.sleep(0.05)
        assert rig.queue.depth == 1 and rig.recorder.counted == []  # waiting, not counted
        rig.view["now"] = snapshot(11)  # room now
        got = await waiting
        assert len(rig.recorder.counted) == 1 and a.stream.committed
        assert a.stream.hold is not None
        return got

    got = asyncio.run(run())
    assert [type(s) for s in got] == [Proceed, Extend, Judged] and decision(got[-1]) == "pass"
    assert isinstance(got[1], Extend) and got[1].ms == 5000


def test_a_refusal_without_a_queue_is_answered_and_committed_once() -> None:
    rig = Rig(NO_QUEUE, gpu_blocks=5)
    a = rig.admission()
    got = asyncio.run(request(a))
    assert [type(s) for s in got] == [Proceed, Judged] and decision(got[-1]) == "reject"
    assert len(rig.recorder.counted) == 1 and a.stream.committed and a.stream.hold is None


def busy(rig: Rig) -> None:
    """Another body fills the worker's backlog: the next is judged from its size."""
    assert not isinstance(rig.backlog.admit(rig.backlog.window, "inline"), str)


def test_a_busy_worker_judges_at_the_headers_and_commits_once() -> None:
    rig = Rig(QUEUED, gpu_blocks=100_000)  # the worst body: 16 sequences × 512 blocks
    busy(rig)
    a = rig.admission()
    got = asyncio.run(request(a))
    assert [type(s) for s in got] == [Coarse]
    headers = dict(got[0].outcome.headers)  # type: ignore[union-attr]
    assert headers["x-ice-judged"] == "headers" and headers["x-ice-reason"] == "ice_busy"
    assert len(rig.recorder.counted) == 1 and a.stream.committed


def test_a_coarse_refusal_that_waits_is_committed_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # an API that reads no field a body's size leaves unbounded (a test double: every API
    # ICE judges reads media parts, so its coarse verdict is a 429 ice_busy)
    monkeypatch.setattr(coarse, "unread_risk", lambda *_args: None)
    rig = Rig(QUEUED, gpu_blocks=100_000)
    rig.view["now"] = snapshot(100_000, usage=0.95)  # 5,000 free: the worst body needs 8,192
    busy(rig)

    async def run() -> list[Step]:
        a = rig.admission()
        waiting = asyncio.ensure_future(request(a))
        await asyncio.sleep(0.05)
        assert rig.queue.depth == 1 and rig.recorder.counted == []
        rig.view["now"] = snapshot(100_000)
        got = await waiting
        assert len(rig.recorder.counted) == 1 and a.stream.committed
        return got

    got = asyncio.run(run())
    assert [type(s) for s in got] == [Extend, Coarse] and decision(got[-1]) == "pass"


def test_what_is_not_an_inference_request_passes_without_a_verdict() -> None:
    rig = Rig(QUEUED, gpu_blocks=11)
    a = rig.admission()
    got = asyncio.run(steps(a.on_headers(headers(path="/v1/models"), True)))
    assert len(got) == 1 and isinstance(got[0], Immediate | SkipBody)
    assert rig.recorder.counted == [] and not a.stream.committed


def test_a_body_envoy_gave_up_on_goes_on_untouched_and_uncommitted() -> None:
    rig = Rig(QUEUED, gpu_blocks=11)
    a = rig.admission()

    async def run() -> list[Step]:
        got = await steps(a.on_headers(headers(), False))
        started = time.perf_counter() - 10 * rig.backlog.message_timeout_s  # long ago
        return got + await steps(a.on_body(BODY.encode(), BodyClock(started, started)))

    got = asyncio.run(run())
    assert isinstance(got[-1], Untouched | Judged)
    if isinstance(got[-1], Untouched):  # expired: dropped, not counted
        assert rig.recorder.counted == [] and not a.stream.committed
    else:  # late: judged from its size, counted once
        assert len(rig.recorder.counted) == 1


@pytest.mark.parametrize("fits", [True, False], ids=["fits", "refused"])
def test_a_verdict_reserved_in_the_shared_ledger_is_committed_once(
    redis_server: RedisServer, fits: bool
) -> None:
    if not redis_server.running:
        redis_server.restart()
    redis_server.client().flushdb()
    rig = Rig(NO_QUEUE, gpu_blocks=11 if fits else 5)
    live = rig.pipeline.views.live
    ledger = RedisLedger(
        redis_server.url,
        deadline_s=0.5,
        ttl_s=3.0,
        own_totals=lambda: live,
        view_age_ms=lambda _pool: view_age_ms(rig.view["now"]),
        pools=lambda: ("default",),
    )
    rig.pipeline.views.remote = ledger

    async def run() -> list[Step]:
        await ledger.start()
        assert ledger.active
        try:
            a = rig.admission()
            got = await request(a)
            assert len(rig.recorder.counted) == 1 and a.stream.committed
            assert (a.stream.hold is not None) is fits
            return got
        finally:
            await ledger.close()

    got = asyncio.run(run())
    assert decision(got[-1]) == ("pass" if fits else "reject")
