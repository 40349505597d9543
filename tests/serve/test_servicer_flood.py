"""The servicer under a flood, driven in-process: coarse verdicts, late bodies, dropped work.

Scripted ext_proc streams as in test_servicer.py; the worker's ``Backlog`` is set up so that
each case is busy in one precise way.

Every API ICE judges reads a field no body size bounds (``ext_proc.policy.coarse``
``unread_risk``), so every real coarse verdict is a 429 ``ice_busy``
(``test_a_coarse_verdict_on_a_real_api_is_a_429_at_the_headers``). The other cases drive the
servicer's coarse paths (a pass with the body phase off, the queue, the late lane) with a
test double for which ``unread_risk`` finds nothing.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable

import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from prometheus_client import REGISTRY

from ext_proc.admit.backlog import Backlog
from ext_proc.admit.pipeline import Pipeline
from ext_proc.policy import coarse
from ext_proc.serve.servicer import ExtProcServicer
from tests.builders import (
    SERVICER_POLICY as POLICY,
)
from tests.builders import (
    FakeContext,
    body_msg,
    headers_msg,
    response_msg,
    set_headers,
)
from tests.builders import (
    servicer_snapshot as snapshot,
)

MIB = 1024 * 1024
CHAT = json.dumps(
    {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 64}
).encode()
LONG = json.dumps(
    {"model": "m", "messages": [{"role": "user", "content": "word " * 30_000}], "max_tokens": 8}
).encode()  # 150 kB: over the 64 KiB of a short body


REAL_UNREAD_RISK = coarse.unread_risk


@pytest.fixture(autouse=True)
def _nothing_unbounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(coarse, "unread_risk", lambda *_args: None)


def metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def servicer(backlog: Backlog, usage: float = 0.3, waiting: float = 0.0) -> ExtProcServicer:
    snap = snapshot(usage, waiting)
    return ExtProcServicer(Pipeline(POLICY, lambda _pool: snap), backlog=backlog)


def stream(
    s: ExtProcServicer,
    messages: list[pb.ProcessingRequest],
    between: Callable[[], None] | None = None,
) -> list[pb.ProcessingResponse]:
    async def requests() -> AsyncIterator[pb.ProcessingRequest]:
        for i, m in enumerate(messages):
            if i and between is not None:
                between()
            yield m

    async def collect() -> list[pb.ProcessingResponse]:
        ctx = FakeContext((("x-ice-route", "chat"),))
        return [r async for r in s.Process(requests(), ctx)]  # type: ignore[arg-type]

    return asyncio.run(collect())


def test_a_body_past_the_inflight_limit_is_judged_from_its_headers_and_not_sent() -> None:
    backlog = Backlog(max_inflight_bytes=1 * MIB)
    other = backlog.admit(700_000, "inline")  # another stream's body is on its way
    before = metric("ice_coarse_verdicts_total", route="chat", why="bytes")
    out = stream(servicer(backlog), [headers_msg(**{"content-length": "500000"})])
    reply = out[0]
    # 700,000 + 500,000 > 1 MiB × 7/8: continue with the body phase turned off …
    assert reply.HasField("mode_override")
    assert reply.mode_override.request_body_mode == 0  # NONE
    headers = set_headers(reply.request_headers.response.header_mutation)
    assert headers["x-ice-judged"] == "headers" and headers["x-ice-decision"] == "pass"
    echoed = reply.dynamic_metadata.fields["ice"].struct_value.fields
    assert echoed["x-ice-judged"].string_value == "headers"
    assert metric("ice_coarse_verdicts_total", route="chat", why="bytes") == before + 1
    assert backlog.inflight_bytes == 700_000  # only the other stream's promise
    backlog.release(other)  # type: ignore[arg-type]


def test_a_coarse_verdict_on_a_real_api_is_a_429_at_the_headers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A chat names ``n`` in a few bytes: on the calm page, beside another body, a 429
    ``ice_busy`` with Retry-After, not a pass with the body phase off; at the body phase
    too (a chunked body on a full worker)."""
    monkeypatch.setattr(coarse, "unread_risk", REAL_UNREAD_RISK)
    backlog = Backlog(max_inflight_bytes=1 * MIB)
    other = backlog.admit(700_000, "inline")
    out = stream(servicer(backlog, usage=0.0), [headers_msg(**{"content-length": "500000"})])
    ir = out[0].immediate_response
    assert ir.status.code == 429 and not out[0].HasField("mode_override")
    assert json.loads(ir.body)["error"]["code"] == "ice_busy"
    sent = set_headers(ir.headers)
    assert sent["x-ice-judged"] == "headers" and sent["retry-after"] == "1"
    backlog.release(other)  # type: ignore[arg-type]
    full = backlog.admit(1 * MIB, "inline")
    out = stream(servicer(backlog, usage=0.0), [headers_msg(), body_msg(CHAT)])
    ir = out[1].immediate_response
    assert ir.status.code == 429 and json.loads(ir.body)["error"]["code"] == "ice_busy"
    backlog.release(full)  # type: ignore[arg-type]


def test_a_busy_worker_refuses_at_the_headers_under_pressure_in_the_api_format() -> None:
    backlog = Backlog(max_inflight_bytes=1 * MIB)
    backlog.admit(900_000, "inline")
    msg = headers_msg(**{"content-length": "200000", "x-priority": "sheddable"})
    out = stream(servicer(backlog, usage=1.0, waiting=8), [msg])
    ir = out[0].immediate_response
    assert ir.status.code == 429
    assert json.loads(ir.body)["error"]["code"] == "memory_pressure"
    sent = set_headers(ir.headers)
    assert sent["x-ice-judged"] == "headers" and "retry-after" in sent


def test_an_admitted_body_is_judged_in_full_and_releases_its_promise() -> None:
    backlog = Backlog(max_inflight_bytes=1 * MIB)
    s = servicer(backlog, usage=0.7)  # medium: ICE asks for the response headers
    seen: list[int] = []
    out = stream(
        s,
        [headers_msg(**{"content-length": str(len(CHAT))}), body_msg(CHAT)],
        between=lambda: seen.append(backlog.inflight_bytes),
    )
    assert seen == [len(CHAT)]  # promised at the headers
    # the body phase stays on (BUFFERED); the override only asks for the response headers
    assert out[0].mode_override.request_body_mode == 2
    assert out[0].mode_override.response_header_mode == 1  # SEND: ext_proc.admit.overload_answer
    headers = set_headers(out[1].request_body.response.header_mutation)
    assert headers["x-ice-decision"] == "pass" and "x-ice-judged" not in headers
    assert backlog.idle


def test_a_chunked_body_is_promised_nothing_at_its_headers_and_admitted_by_its_size() -> None:
    backlog = Backlog(max_inflight_bytes=64 * MIB)
    s = servicer(backlog)
    seen: list[int] = []
    out = stream(
        s, [headers_msg(), body_msg(CHAT)], between=lambda: seen.append(backlog.inflight_bytes)
    )
    assert seen == [0]  # not the 8 MiB body limit: its size is not known yet
    headers = set_headers(out[1].request_body.response.header_mutation)
    assert headers["x-ice-decision"] == "pass" and "x-ice-judged" not in headers
    assert backlog.idle


def test_a_chunked_body_beside_a_slow_upload_is_judged_in_full() -> None:
    backlog = Backlog(max_inflight_bytes=16 * MIB)
    slow = backlog.admit(8 * MIB, "inline")  # a slow upload's promise: 8 MiB of 16
    before = metric("ice_coarse_verdicts_total", route="chat", why="bytes")
    out = stream(servicer(backlog), [headers_msg(), body_msg(CHAT)])
    # promised 8 MiB at its headers it would have been judged from them (8 + 8 > 14 MiB)
    assert not out[0].HasField("mode_override")
    headers = set_headers(out[1].request_body.response.header_mutation)
    assert headers["x-ice-decision"] == "pass" and "x-ice-judged" not in headers
    assert metric("ice_coarse_verdicts_total", route="chat", why="bytes") == before
    assert backlog.inflight_bytes == 8 * MIB
    backlog.release(slow)  # type: ignore[arg-type]


def test_a_chunked_body_on_a_full_worker_is_judged_from_its_size_at_the_body() -> None:
    backlog = Backlog(max_inflight_bytes=1 * MIB)
    other = backlog.admit(1 * MIB, "inline")  # the window is full
    before = metric("ice_coarse_verdicts_total", route="chat", why="bytes")
    out = stream(servicer(backlog), [headers_msg(), body_msg(CHAT)])
    headers = set_headers(out[1].request_body.response.header_mutation)
    assert headers["x-ice-judged"] == "headers" and headers["x-ice-decision"] == "pass"
    assert metric("ice_coarse_verdicts_total", route="chat", why="bytes") == before + 1
    assert backlog.inflight_bytes == 1 * MIB
    backlog.release(other)  # type: ignore[arg-type]


def test_a_coarse_refusal_on_a_route_with_a_queue_waits_in_it_at_the_headers() -> None:
    from ext_proc.policy.load import parse_policy

    policy = parse_policy(
        "profiles:\n  default: {max_model_len: 8192, queue: {enabled: true, "
        "max_queue_wait_ms: 60, poll_ms: 10}}\nroutes:\n  chat: {profile: default}\n"
    )
    snap = snapshot(0.97, 3)  # high: the output cap refuses every unread body
    backlog = Backlog(max_inflight_bytes=1 * MIB)
    other = backlog.admit(900_000, "inline")
    s = ExtProcServicer(Pipeline(policy, lambda _pool: snap), backlog=backlog)
    out = stream(s, [headers_msg(**{"content-length": "200000"})])
    assert out[0].HasField("override_message_timeout")  # Envoy is asked for the wait first
    ir = out[1].immediate_response
    assert ir.status.code == 429
    assert json.loads(ir.body)["error"]["code"] == "queue_timeout"
    assert set_headers(ir.headers)["x-ice-judged"] == "headers"
    backlog.release(other)  # type: ignore[arg-type]


def test_a_body_that_arrives_too_late_to_read_gets_the_coarse_verdict() -> None:
    backlog = Backlog(max_inflight_bytes=64 * MIB)
    before = metric("ice_coarse_verdicts_total", route="chat", why="late")

    def slow_now() -> None:  # after the headers: judging now costs 10 µs per byte
        backlog.cost["inline"] = 1e-5

    out = stream(
        servicer(backlog),
        [headers_msg(**{"content-length": str(len(LONG))}), body_msg(LONG)],
        between=slow_now,
    )
    # 150 kB × 10 µs = 1.5 s > the 0.5 s budget: judged from its size, not parsed
    headers = set_headers(out[1].request_body.response.header_mutation)
    assert headers["x-ice-judged"] == "headers"
    assert metric("ice_coarse_verdicts_total", route="chat", why="late") == before + 1


def test_a_verdict_past_envoys_deadline_is_dropped_uncounted() -> None:
    backlog = Backlog(max_inflight_bytes=64 * MIB, message_timeout_s=0.05)
    s = servicer(backlog)
    judge = s.pipeline.on_body

    def slow(*args: object) -> object:
        time.sleep(0.08)  # longer than the 50 ms message timeout
        return judge(*args)  # type: ignore[arg-type]

    s.pipeline.on_body = slow  # type: ignore[method-assign]
    dropped = metric("ice_bodies_dropped_total", reason="deadline")
    passes = metric("ice_decisions_total", route="chat", decision="pass", reason="ok")
    window = backlog.window
    out = stream(s, [headers_msg(**{"content-length": str(len(CHAT))}), body_msg(CHAT)])
    assert out[1] == pb.ProcessingResponse(request_body=pb.BodyResponse())  # plain continue
    assert metric("ice_bodies_dropped_total", reason="deadline") == dropped + 1
    assert metric("ice_decisions_total", route="chat", decision="pass", reason="ok") == passes
    snap = s.pipeline.lookup("default")
    assert snap is not None and not s.pipeline.views.ledger(snap)  # no blocks held
    assert backlog.window == window / 2 and backlog.idle


def test_a_stream_envoy_closes_while_its_body_waits_is_dropped_and_shrinks_the_window() -> None:
    backlog = Backlog(max_inflight_bytes=32 * MIB)
    s = servicer(backlog)
    dropped = metric("ice_bodies_dropped_total", reason="stream_closed")

    async def scenario() -> None:
        await s._gate.acquire()  # another long body is being judged

        async def requests() -> AsyncIterator[pb.ProcessingRequest]:
            yield headers_msg(**{"content-length": str(len(LONG))})
            yield body_msg(LONG)

        async def consume() -> None:
            ctx = FakeContext((("x-ice-route", "chat"),))
            async for _ in s.Process(requests(), ctx):  # type: ignore[arg-type]
                pass

        task = asyncio.create_task(consume())
        for _ in range(20):
            await asyncio.sleep(0)
        assert backlog.queued_bytes["inline"] == len(LONG)  # waiting for its turn
        task.cancel()  # Envoy's message timeout: it closes the stream
        with pytest.raises(asyncio.CancelledError):
            await task
        s._gate.release()

    asyncio.run(scenario())
    assert metric("ice_bodies_dropped_total", reason="stream_closed") == dropped + 1
    assert backlog.window == 16 * MIB and backlog.idle


class SlowHelper:
    """An offload helper that takes longer than the counting budget (the heavy lane)."""

    heavy_containers = 0

    def __init__(self) -> None:
        self.cancelled = False

    def is_heavy(self, body: bytes) -> bool:
        return True

    def weigh(self, pipeline: object, body: bytes) -> str:
        return "shape"  # the parse belongs in the helper

    async def on_body(self, *args: object) -> object:
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        raise AssertionError("not reached")


def test_exact_counting_past_its_budget_is_judged_from_the_size() -> None:
    from ext_proc.policy.load import parse_policy

    policy = parse_policy(
        "exact_count_budget_ms: 50\nprofiles:\n  default: {max_model_len: 8192}\n"
        "routes:\n  chat: {profile: default}\n"
    )
    snap = snapshot(0.3, 0)
    helper = SlowHelper()
    s = ExtProcServicer(Pipeline(policy, lambda _pool: snap), helper, Backlog())  # type: ignore[arg-type]
    before = metric("ice_coarse_verdicts_total", route="chat", why="budget")
    out = stream(s, [headers_msg(**{"content-length": str(len(CHAT))}), body_msg(CHAT)])
    headers = set_headers(out[1].request_body.response.header_mutation)
    assert headers["x-ice-judged"] == "headers" and headers["x-ice-decision"] == "pass"
    assert metric("ice_coarse_verdicts_total", route="chat", why="budget") == before + 1
    assert helper.cancelled  # the 5 s helper was not waited for
    assert s.backlog.idle


def test_a_coarse_pass_asks_for_its_response_headers_too() -> None:
    backlog = Backlog(max_inflight_bytes=1 * MIB)
    backlog.admit(700_000, "inline")  # the window is taken: judged from its headers
    out = stream(
        servicer(backlog, usage=0.7),  # medium: ICE asks for the response headers
        [headers_msg(**{"content-length": "500000"}), response_msg()],
    )
    assert set_headers(out[0].request_headers.response.header_mutation)["x-ice-judged"] == "headers"
    mode = out[0].mode_override
    assert (mode.request_body_mode, mode.response_header_mode) == (0, 1)  # NONE; SEND
    # a backend's overload 503 after a coarse pass: ICE's answer, as after a full verdict
    ir = out[1].immediate_response
    assert ir.status.code == 503 and set_headers(ir.headers)["x-ice-reason"] == "backend_overloaded"
